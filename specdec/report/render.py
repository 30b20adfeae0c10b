"""The report documents: one self-contained HTML page and a Markdown summary.

The page is built once as a list of sections holding plain-text paragraphs, tables of plain strings and
figures, then rendered twice. Every string is escaped at rendering time (``html.escape`` for HTML, the
same plus ``|`` for Markdown tables), so text from the store (prompt ids and types, model names, error
messages, configuration) can never inject markup. The HTML has no external reference: figures are
embedded as base64 PNG data URIs, the CSS is inline, there is no script, and ``://`` in store text is
written as ``:&#47;&#47;`` so not even a URL string appears in the source.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from specdec.report import tables as T
from specdec.report.analysis import Analysis, analyze
from specdec.report.cells import best_fixed, spec_fixed_cells
from specdec.report.diagnostics import DRIFT_FLAG
from specdec.report.load import load_store
from specdec.report.plots import FigureEntry, make_figures
from specdec.report.vocab import ADAPTIVE_POLICIES, ALL_PROMPTS, PEER_METHODS, SINGLE_RUN, SPEC_METHODS

__all__ = ["ReportResult", "render_html", "render_markdown", "write_report"]


# --------------------------------------------------------------------------------------------------
# document model
# --------------------------------------------------------------------------------------------------


@dataclass
class Table:
    """A table of plain strings. `md`: also in the Markdown summary; `collapsed`: folded in HTML."""

    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    md: bool = True
    collapsed: bool = False
    limit: int | None = None  # rows shown (the rest counted)


@dataclass
class Section:
    title: str
    anchor: str
    blocks: list[Any] = field(default_factory=list)  # str (paragraph) | Table | Pre | Bullets | FigureEntry


@dataclass
class Pre:
    text: str
    md: bool = True


@dataclass
class Bullets:
    items: list[str]
    md: bool = True


# --------------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def f(x: Any, digits: int = 2, empty: str = "-") -> str:
    """A number with `digits` decimals; NaN/None -> `empty`; inf -> 'never'."""
    v = _num(x)
    if v is None:
        return empty
    if math.isinf(v):
        return "never" if v > 0 else "-inf"
    return f"{v:.{digits}f}"


def pct(x: Any) -> str:
    v = _num(x)
    return "-" if v is None else f"{100 * v:.0f}%"


def ci(lo: Any, hi: Any, digits: int = 2) -> str:
    if _num(lo) is None or _num(hi) is None:
        return "-"
    return f"[{f(lo, digits)}, {f(hi, digits)}]"


def i(x: Any) -> str:
    v = _num(x)
    return "-" if v is None else str(int(v))


def yn(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "yes" if bool(x) else "no"


def s(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return str(x)


def _rows(df: pd.DataFrame, spec: list[tuple[str, Any]]) -> Table:
    """Table from `df` with columns `spec` = [(header, row -> str)]."""
    headers = [h for h, _ in spec]
    rows = [[fn(r) for _, fn in spec] for _, r in df.iterrows()] if df is not None and len(df) else []
    return Table(headers, rows)


# --------------------------------------------------------------------------------------------------
# building the sections
# --------------------------------------------------------------------------------------------------

HOW_TO_READ = [
    ("tokens/s: new tokens / end-to-end seconds of one generation (prefill included); the figure every "
     "speedup is quoted on."),
    ("speedup: a method's tokens/s / our target-only baseline's tokens/s on the same runtime (config), target "
     "and prompt, the baseline being the prompt's baseline run nearest in time to each run (they bracket the "
     "prompt's runs). Per prompt each side is the median over repeats; a cell's speedup is the median over its "
     "prompts, with a 95 % percentile-bootstrap CI resampling prompts (repeats when a cell has one prompt)."),
    ("verdict: 'win' when the whole CI is above 1, 'loss' when it is below 1, otherwise 'no measurable "
     "difference'. A loss is a result, reported as plainly as a win. A cell with one run of one prompt (the "
     "default CPU plan: one prompt per type, one repeat) has a point estimate and no interval ('single run'); "
     "its spread is taken across prompts in the '(all prompts)' rows."),
    ("cells can hold different prompt sets (secondary prompts run only some K): the 'prompts' columns say "
     "how many each holds."),
    "acceptance rate = accepted / drafted draft tokens. Excludes the bonus/recovered token.",
    ("alpha-hat = accepted / (accepted + rejections): the per-token acceptance estimate; unlike the "
     "acceptance rate it does not fall as K grows. Excludes the bonus token."),
    "mean accepted tokens = accepted draft tokens per speculative round. Excludes the bonus token.",
    ("block efficiency = tokens committed per target forward. INCLUDES the bonus/recovered token (>= 1; "
     "target-only decoding has exactly 1). The model's expected tokens per round (1 - a^(K+1)) / (1 - a) "
     "also includes it."),
    ("c = one draft step / one target step (warm, single token); v(n) = one target forward over n tokens / "
     "one single-token step. Verifying K drafts costs v(K+1). Prompt lookup is modelled with c = 0."),
    ("ideal speedup = (1 - a^(K+1)) / ((1 - a)(K c + 1)) (Leviathan et al. 2023, which assume v(K+1) = 1); "
     "refined speedup divides by (K c + v(K+1)) with the measured v. Break-even alpha: the smallest alpha "
     "whose predicted speedup reaches 1 ('never' when even alpha = 1 cannot)."),
    ("efficiency = measured speedup / refined prediction: how much of the model's promise the runtime "
     "delivers (below 1: overheads the model ignores, such as rollback, bookkeeping, non-i.i.d. acceptance)."),
    ("time shares: seconds summed over runs in prefill, drafting (draft_s), verification (verify_s: target "
     "forward plus acceptance) and everything else, as fractions of the total."),
    ("best K: the K with the highest median speedup, chosen after the fact, so optimistic; adaptive policies "
     "are compared against it."),
    "failed runs (error set) are left out of every number and listed under Gaps.",
]


def _flatten(d: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(d, dict):
        out: list[tuple[str, str]] = []
        for k, v in d.items():
            out.extend(_flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(d, list):
        return [(prefix[:-1], json.dumps(d))]
    return [(prefix[:-1] or "value", s(d))]


def _source_section(a: Analysis) -> Section:
    st = a.store
    sec = Section("Where the data came from", "source")
    sw = st.sweep or {}
    info = [
        ["store", st.db_path],
        ["sweep id", s(st.sweep_id)],
        ["sweep name", s(sw.get("name"))],
        ["status", s(sw.get("status"))],
        ["created", s(sw.get("created_at"))],
        ["git commit", s(sw.get("git_commit"))],
        ["schema version", s(st.meta.get("schema_version"))],
        ["runs", f"{len(st.runs)} ({len(a[T.GAPS])} failed)"],
        ["configs (runtimes)", ", ".join(sorted(set(st.runs["config_label"].dropna().astype(str)))) or "-"],
    ]
    sec.blocks.append(Table(["field", "value"], info))
    machine = a.machine
    if machine:
        sec.blocks.append("Machine and library versions (sweeps.machine_json):")
        sec.blocks.append(Table(["key", "value"], [[k, v] for k, v in _flatten(machine)]))
    else:
        sec.blocks.append("Machine: not recorded in this store.")
    stab = a[T.BASELINE_STABILITY]
    if len(stab):
        t = _rows(stab, [("config", lambda r: s(r["config_label"])), ("prompt", lambda r: s(r["prompt_id"])),
                         ("baseline runs", lambda r: i(r["n_runs"])), ("median tok/s", lambda r: f(r["median_tok_s"])),
                         ("min", lambda r: f(r["min_tok_s"])), ("max", lambda r: f(r["max_tok_s"])),
                         ("spread", lambda r: pct(r["spread"])),
                         ("generate() tok/s", lambda r: f(r["hf_generate_tok_s"])),
                         ("baseline / generate()", lambda r: f(r["vs_hf_generate"]))])
        multi = stab[stab["n_runs"] > 1]
        t.caption = ("Baseline stability: the target-only runs behind every speedup, per prompt. spread = "
                     "(max - min) / median; a large one means the machine changed speed during that prompt's "
                     "runs. generate(): transformers' own target-only decoding of the same prompt, an "
                     "independent measurement." + (
                         f" Median spread {pct(multi['spread'].median())}, largest {pct(multi['spread'].max())} "
                         f"({multi.loc[multi['spread'].idxmax(), 'prompt_id']})." if len(multi) else ""))
        sec.blocks.append(t)
    cfg = a.sweep_config
    if cfg is not None:
        sec.blocks.append("Sweep configuration (sweeps.config_json):")
        sec.blocks.append(Pre(json.dumps(cfg, indent=2, sort_keys=True, default=str), md=True))
    else:
        sec.blocks.append("Sweep configuration: not recorded in this store.")
    return sec


def _summary_section(a: Analysis) -> Section:
    sec = Section("Summary", "summary")
    ov = a[T.OVERALL]
    best = a[T.BEST_K]
    lines: list[str] = []
    if ov.empty or "speedup" not in ov.columns:
        sec.blocks.append("No successful measurement in this store, so no speedup to summarise.")
        return sec
    spec = spec_fixed_cells(ov)
    for (label, pair, method), g in spec.groupby(["config_label", "pair", "method"], sort=True):
        b = best_fixed(g)
        line = (f"{method} on {label} ({pair}): over all prompts the best fixed K is {int(b['k'])}, speedup "
                f"{f(b['speedup'])}x {ci(b['speedup_lo'], b['speedup_hi'])} ({b['verdict']})")
        if len(best):
            bt = best[(best["config_label"] == label) & (best["pair"] == pair) & (best["method"] == method)]
            if len(bt):
                n = len(bt)
                counts = bt["verdict"].value_counts()
                line += (f"; at each prompt type's best K: {counts.get('win', 0)} of {n} types win, "
                         f"{counts.get('loss', 0)} lose, {counts.get('no measurable difference', 0)} show no "
                         "measurable difference")
                if counts.get(SINGLE_RUN, 0):
                    line += (f", {counts.get(SINGLE_RUN)} rest on a single run (no interval; "
                             f"{int((bt['speedup'] > 1).sum())} of {n} types are above 1 at their best K)")
                top = bt.sort_values("speedup", ascending=False).iloc[0]
                line += f"; highest: {top['prompt_type']} {f(top['speedup'])}x at K={top['best_k']}"
        lines.append(line + ".")
    eq = a[T.EQUALITY]
    if len(eq):
        ours = eq[eq["method"].isin(SPEC_METHODS)]
        if len(ours):
            n_eq, n = int(ours["n_equal"].sum()), int(ours["n_checked"].sum())
            lines.append(f"Output equality (greedy): {n_eq} of {n} speculative runs of ours produced exactly the "
                         "baseline's tokens" + ("." if n_eq == n else
                                                " -- a mismatch means a bug or a numerical near-tie; see the "
                                                "equality table."))
    peers = a[T.PEERS]
    if len(peers):
        for r in peers[peers["prompt_type"] == ALL_PROMPTS].itertuples():
            lines.append(f"Ours vs peer on {r.config_label}: {r.ours} runs at {f(r.ratio)}x the tokens/s of "
                         f"{r.peer} {ci(r.ratio_lo, r.ratio_hi)} over {r.n_prompts} prompts ({r.verdict}).")
    dc = a[T.DRIFT]
    if len(dc) and dc["flagged"].any():
        lines.append(f"Machine drift: {int(dc['flagged'].sum())} of {len(dc)} cells ran while the target step "
                     f"was more than {100 * DRIFT_FLAG:.0f}% slower or faster than during their prompt's "
                     "baseline; see 'Machine drift' for their step-normalized speedups.")
    base = ov[ov["method"] == "baseline"]
    for r in base.itertuples():
        lines.append(f"Target-only baseline on {r.config_label}: median {f(r.tok_s, 1)} tokens/s over "
                     f"{r.n_prompts} prompts.")
    sec.blocks.append(Bullets(lines or ["No speculative cell with a measured speedup."]))
    return sec


def _speedup_section(a: Analysis) -> Section:
    sec = Section("Speedup by cell", "speedup")
    ov = a[T.OVERALL]
    cells = a[T.CELLS]
    if cells.empty or "tok_s" not in cells.columns:
        sec.blocks.append("No successful run: nothing to tabulate.")
        return sec
    common = [
        ("method", lambda r: s(r["method"])), ("policy", lambda r: s(r["policy"])), ("K", lambda r: i(r["k"])),
    ]
    t = _rows(ov, [("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])), *common,
                   ("prompts", lambda r: i(r["n_prompts"])), ("runs", lambda r: i(r["n_runs"])),
                   ("failed", lambda r: i(r["n_failed"])), ("tok/s", lambda r: f(r["tok_s"], 1)),
                   ("speedup", lambda r: f(r["speedup"])), ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])),
                   ("verdict", lambda r: s(r["verdict"])), ("accept rate", lambda r: f(r.get("acceptance_rate"), 3)),
                   ("alpha-hat", lambda r: f(r.get("alpha_hat"), 3)),
                   ("mean accepted", lambda r: f(r.get("mean_accepted"))),
                   ("block eff. (+bonus)", lambda r: f(r.get("block_efficiency"))),
                   ("equal output", lambda r: pct(r.get("match_rate")))])
    t.caption = "All prompt types pooled (speedup CI over prompts)."
    sec.blocks.append(t)
    t = _rows(cells, [
        ("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
        ("prompt type", lambda r: s(r["prompt_type"])), *common,
        ("prompts", lambda r: f"{i(r['n_prompts'])}/{i(r['n_prompts_expected'])}"),
        ("runs", lambda r: i(r["n_runs"])), ("failed", lambda r: i(r["n_failed"])),
        ("tok/s", lambda r: f(r["tok_s"], 1)), ("baseline tok/s", lambda r: f(r["baseline_tok_s"], 1)),
        ("TTFT ms", lambda r: f(r.get("ttft_ms"), 1)), ("decode tok/s", lambda r: f(r.get("decode_tok_s"), 1)),
        ("speedup", lambda r: f(r["speedup"])), ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])),
        ("CI over", lambda r: s(r["ci_over"])),
        ("verdict", lambda r: s(r["verdict"])), ("accept rate", lambda r: f(r.get("acceptance_rate"), 3)),
        ("alpha-hat", lambda r: f(r.get("alpha_hat"), 3)), ("mean accepted", lambda r: f(r.get("mean_accepted"))),
        ("block eff. (+bonus)", lambda r: f(r.get("block_efficiency"))), ("mean K", lambda r: f(r.get("mean_k"))),
        ("prefill", lambda r: pct(r.get("share_prefill"))), ("draft", lambda r: pct(r.get("share_draft"))),
        ("verify", lambda r: pct(r.get("share_verify"))), ("other", lambda r: pct(r.get("share_other"))),
        ("equal output", lambda r: pct(r.get("match_rate"))),
    ])
    t.caption = ("Every cell (config x pair x prompt type x method x policy x K). Time shares are fractions "
                 "of end-to-end time. Full table in report.html.")
    t.md, t.collapsed = False, True
    sec.blocks.append(t)
    best = a[T.BEST_K]
    sub = "Best fixed K per prompt type"
    if best.empty:
        sec.blocks.append(f"{sub}: no fixed-K cell with a measured speedup.")
    else:
        t = _rows(best, [
            ("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
            ("prompt type", lambda r: s(r["prompt_type"])), ("method", lambda r: s(r["method"])),
            ("best K", lambda r: i(r["best_k"])), ("speedup", lambda r: f(r["speedup"])),
            ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])), ("verdict", lambda r: s(r["verdict"])),
            ("alpha-hat", lambda r: f(r["alpha_hat"], 3)), ("K tried", lambda r: s(r["ks_tried"])),
            ("prompts", lambda r: i(r["n_prompts"])),
            ("same prompts for every K", lambda r: yn(r["same_prompts"])),
        ])
        t.caption = f"{sub} (highest median speedup; chosen after the fact)."
        sec.blocks.append(t)
    return sec


def _condition_section(a: Analysis) -> Section:
    sec = Section("The speedup condition", "condition")
    sec.blocks.append(
        "Speculation pays when the measured per-token acceptance alpha-hat exceeds the break-even alpha of "
        "its K, computed from the measured c and verification cost v(K+1). 'yes' marks a prompt type whose "
        "alpha-hat clears it.")
    be = a[T.BREAK_EVEN]
    if be.empty:
        sec.blocks.append("Not available: needs the costs table (draft and target step times) and fixed-K "
                          "speculative cells.")
        return sec
    t = _rows(be, [
        ("config", lambda r: s(r["config_label"])), ("method", lambda r: s(r["method"])),
        ("K", lambda r: i(r["k"])), ("c", lambda r: f(r["c"], 3)), ("v(K+1)", lambda r: f(r["v_k1"], 3)),
        ("break-even alpha (ideal, v=1)", lambda r: f(r["break_even_ideal"], 3)),
        ("break-even alpha (refined, measured v)", lambda r: f(r["break_even_refined"], 3)),
        ("v extrapolated", lambda r: yn(r["v_extrapolated"])),
    ])
    t.caption = "Minimum per-token acceptance at which each K breaks even ('never': no alpha <= 1 does)."
    sec.blocks.append(t)
    cond = a[T.CONDITION]
    if cond.empty:
        return sec
    for (label, pair, method), g in cond.groupby(["config_label", "pair", "method"], sort=True):
        ks = sorted(set(g["k"].astype(int)))
        thresholds = {int(r.k): r.break_even for r in g.itertuples()}
        headers = ["prompt type"] + [f"K={k} (needs {f(thresholds[k], 2)})" for k in ks]
        rows = []
        for ptype, h in g.groupby("prompt_type", sort=True):
            by_k = {int(r.k): r for r in h.itertuples()}
            row = [str(ptype)]
            for k in ks:
                r = by_k.get(k)
                row.append("-" if r is None else
                           f"{f(r.alpha_hat, 2)} {'yes' if r.clears else 'no'} ({s(r.verdict)})")
            rows.append(row)
        model = g["model"].iloc[0]
        sec.blocks.append(Table(headers, rows, caption=(
            f"{label} / {pair} / {method}: measured alpha-hat, whether it clears the {model} break-even alpha, "
            "and the measured verdict.")))
    agree = cond["agrees"].dropna()
    if len(agree):
        sec.blocks.append(f"Where the measurement gave a verdict (win or loss), the break-even test agrees "
                          f"with it in {int(agree.sum())} of {len(agree)} cells.")
    return sec


def _model_section(a: Analysis) -> Section:
    sec = Section("The analytical model against the measurement", "model")
    m = a[T.MODEL]
    if m.empty:
        sec.blocks.append("Not available: needs costs (c, v) and fixed-K speculative cells with acceptance counts.")
    else:
        eff = m["efficiency"].dropna()
        if len(eff):
            sec.blocks.append(
                f"Efficiency (measured / refined prediction) over {len(eff)} cells: median {f(eff.median())}, "
                f"range {f(eff.min())} to {f(eff.max())}.")
        t = _rows(m, [
            ("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
            ("prompt type", lambda r: s(r["prompt_type"])), ("method", lambda r: s(r["method"])),
            ("K", lambda r: i(r["k"])), ("alpha-hat", lambda r: f(r["alpha_hat"], 3)), ("c", lambda r: f(r["c"], 3)),
            ("v(K+1)", lambda r: f(r["v_k1"], 3)), ("E[tokens/round] model", lambda r: f(r["expected_tokens"])),
            ("block eff. measured", lambda r: f(r["block_efficiency"])), ("ideal", lambda r: f(r["ideal"])),
            ("refined", lambda r: f(r["refined"])), ("measured", lambda r: f(r["speedup"])),
            ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])), ("efficiency", lambda r: f(r["efficiency"])),
        ])
        t.caption = "Predicted vs measured speedup per fixed-K cell (expected tokens and block efficiency include the bonus token)."
        t.md, t.collapsed = False, True
        sec.blocks.append(t)
    opt = a[T.OPTIMAL_K]
    if len(opt):
        t = _rows(opt, [
            ("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
            ("prompt type", lambda r: s(r["prompt_type"])), ("method", lambda r: s(r["method"])),
            ("alpha (pooled)", lambda r: f(r["alpha_pooled"], 3)), ("model", lambda r: s(r["model"])),
            ("predicted best K", lambda r: i(r["predicted_k"])),
            ("predicted speedup", lambda r: f(r["predicted_speedup"])), ("measured best K", lambda r: i(r["best_k"])),
            ("measured speedup", lambda r: f(r["speedup"])), ("agree", lambda r: yn(r["agree"])),
        ])
        t.caption = "The model's optimal K (over the K values tried) against the measured best K."
        sec.blocks.append(t)
    return sec


def _drift_section(a: Analysis) -> Section:
    sec = Section("Machine drift", "drift")
    dc = a[T.DRIFT]
    if dc.empty:
        sec.blocks.append("No round traces with a measured cost curve: the machine's speed during each run "
                          "cannot be inferred.")
        return sec
    sec.blocks.append(
        "Each run's own target step time is inferred from its round trace (each round's verification forward "
        "divided by the measured relative cost v(K+1), median over the run). drift = that step time / the "
        "step time during the prompt's baseline runs - 1: above 0 the machine was slower than during the "
        f"baseline. Cells with |drift| > {100 * DRIFT_FLAG:.0f}% are flagged: their raw speedup mixes the "
        "method with a change of machine speed. 'normalized' = raw speedup x (1 + drift), the speedup had the "
        "machine kept the baseline's speed, assuming draft and target slowed alike; a model-based correction "
        "shown next to the raw figure, never instead of it.")
    n_flag = int(dc["flagged"].sum())
    sec.blocks.append(f"{n_flag} of {len(dc)} cells are flagged; median |drift| "
                      f"{pct(dc['drift'].abs().median())}, largest {pct(dc['drift'].abs().max())}.")
    t = _rows(dc, [("config", lambda r: s(r["config_label"])), ("prompt type", lambda r: s(r["prompt_type"])),
                   ("method", lambda r: s(r["method"])), ("policy", lambda r: s(r["policy"])),
                   ("K", lambda r: i(r["k"])), ("runs", lambda r: i(r["n_runs"])),
                   ("drift", lambda r: pct(r["drift"])), ("speedup (raw)", lambda r: f(r["speedup"])),
                   ("normalized", lambda r: f(r["normalized_speedup"])),
                   ("flagged", lambda r: "yes" if r["flagged"] else "")])
    t.caption = "Per cell, median over its runs."
    t.collapsed = True
    sec.blocks.append(t)
    return sec


def _peer_section(a: Analysis) -> Section:
    sec = Section("Our implementation against the peers", "peers")
    p = a[T.PEERS]
    if p.empty:
        sec.blocks.append(f"No peer measured alongside ours in this sweep ({', '.join(PEER_METHODS)}).")
    else:
        spec = [("config", lambda r: s(r["config_label"])), ("target", lambda r: s(r["target"])),
                ("prompt type", lambda r: s(r["prompt_type"])), ("ours", lambda r: s(r["ours"])),
                ("peer", lambda r: s(r["peer"])), ("ours / peer tok/s", lambda r: f(r["ratio"])),
                ("95% CI", lambda r: ci(r["ratio_lo"], r["ratio_hi"])), ("verdict (ours)", lambda r: s(r["verdict"])),
                ("prompts", lambda r: i(r["n_prompts"])), ("ours tok/s", lambda r: f(r["ours_tok_s"], 1)),
                ("peer tok/s", lambda r: f(r["peer_tok_s"], 1)), ("ours equal", lambda r: pct(r["ours_match"])),
                ("peer equal", lambda r: pct(r["peer_match"]))]
        t = _rows(p[p["prompt_type"] == ALL_PROMPTS], spec)
        t.caption = ("Pooled over prompt types. Ratio > 1: ours is faster ('win'). 'equal': share of runs whose "
                     "tokens equal our baseline's (greedy).")
        sec.blocks.append(t)
        t = _rows(p[p["prompt_type"] != ALL_PROMPTS], spec)
        t.caption = "By prompt type."
        t.md, t.collapsed = False, True
        sec.blocks.append(t)
    eq = a[T.EQUALITY]
    if len(eq):
        t = _rows(eq, [("config", lambda r: s(r["config_label"])), ("method", lambda r: s(r["method"])),
                       ("policy", lambda r: s(r["policy"])), ("K", lambda r: i(r["k"])),
                       ("runs checked", lambda r: i(r["n_checked"])), ("equal", lambda r: i(r["n_equal"])),
                       ("equal rate", lambda r: pct(r["equal_rate"]))])
        t.caption = "Output equality with our baseline (matches_baseline, recorded under greedy decoding)."
        sec.blocks.append(t)
    return sec


def _adaptive_section(a: Analysis) -> Section:
    sec = Section("Adaptive K policies", "adaptive")
    ad = a[T.ADAPTIVE]
    if ad.empty:
        sec.blocks.append(f"No adaptive-policy run ({', '.join(ADAPTIVE_POLICIES)}) in this sweep.")
        return sec
    t = _rows(ad, [
        ("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
        ("prompt type", lambda r: s(r["prompt_type"])), ("method", lambda r: s(r["method"])),
        ("policy", lambda r: s(r["policy"])), ("K cap", lambda r: i(r["k_cap"])), ("mean K", lambda r: f(r["mean_k"])),
        ("speedup", lambda r: f(r["speedup"])), ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])),
        ("verdict", lambda r: s(r["verdict"])), ("best fixed K", lambda r: i(r["best_fixed_k"])),
        ("best fixed speedup", lambda r: f(r["best_fixed_speedup"])),
        ("adaptive / best fixed", lambda r: f(r["vs_best_fixed"])),
        ("95% CI ", lambda r: ci(r["vs_best_lo"], r["vs_best_hi"])),
        ("vs best fixed", lambda r: s(r["vs_best_verdict"])),
    ])
    t.caption = ("Adaptive policies vs the baseline (speedup) and vs the best fixed K chosen after the fact "
                 "(ratio of tokens/s per prompt; > 1: the policy beats the best fixed K).")
    sec.blocks.append(t)
    return sec


def _runtime_section(a: Analysis) -> Section:
    sec = Section("Runtimes side by side", "runtimes")
    rt = a[T.RUNTIMES]
    if rt.empty:
        sec.blocks.append("No runtime configuration with data.")
        return sec
    if len(rt) == 1:
        sec.blocks.append("This sweep measured one runtime configuration.")
    t = _rows(rt, [
        ("config", lambda r: s(r["config_label"])), ("target step ms", lambda r: f(r["target_step_ms"], 2)),
        ("draft step ms", lambda r: f(r["draft_step_ms"], 2)), ("c", lambda r: f(r["c"], 3)),
        ("v(2)", lambda r: f(r["v(2)"])), ("v(5)", lambda r: f(r["v(5)"])), ("v(9)", lambda r: f(r["v(9)"])),
        ("v(17)", lambda r: f(r["v(17)"])), ("baseline tok/s", lambda r: f(r["baseline_tok_s"], 1)),
        ("best (all prompts)", lambda r: f"{s(r['best_method'])} K={i(r['best_k'])}" if _num(r["best_k"]) else "-"),
        ("speedup", lambda r: f(r["best_speedup"])), ("verdict", lambda r: s(r["best_verdict"])),
        ("median efficiency", lambda r: f(r["median_efficiency"])),
    ])
    t.caption = "Costs, baseline throughput, best pooled K and the runtime's median efficiency per config."
    sec.blocks.append(t)
    bt = a[T.RUNTIMES_BY_TYPE]
    if len(bt):
        cols = list(bt.columns)
        sec.blocks.append(Table(["prompt type", *cols[1:]], [[s(v) for v in row] for row in bt.itertuples(index=False)],
                                caption="Best K, speedup and verdict per prompt type and runtime."))
    return sec


def _gaps_section(a: Analysis, figures: list[FigureEntry]) -> Section:
    sec = Section("Gaps: what is missing or failed", "gaps")
    missing = list(a.missing)
    skipped = [f"figure '{e.kind}' not drawn: {e.skipped}" for e in figures if e.skipped]
    if missing or skipped:
        sec.blocks.append(Bullets(missing + skipped))
    else:
        sec.blocks.append("Nothing is missing: every table and figure has data.")
    gaps = a[T.GAPS]
    if len(gaps):
        n_cells = gaps.groupby(["config_label", "pair", "prompt_id", "method", "policy", "k"]).ngroups
        n_skip = int((gaps["kind"] == "skipped").sum())
        sec.blocks.append(f"{len(gaps) - n_skip} failed and {n_skip} skipped run(s) in {n_cells} cell(s); they "
                          "are excluded from every number.")
        t = _rows(gaps, [("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
                         ("prompt", lambda r: s(r["prompt_id"])), ("prompt type", lambda r: s(r["prompt_type"])),
                         ("method", lambda r: s(r["method"])), ("policy", lambda r: s(r["policy"])),
                         ("K", lambda r: i(r["k"])), ("repeat", lambda r: i(r["repeat"])),
                         ("kind", lambda r: s(r["kind"])), ("error", lambda r: s(r["error"])[:300])])
        t.limit = 200
        sec.blocks.append(t)
    else:
        sec.blocks.append("No failed run.")
    cov = a[T.COVERAGE]
    if len(cov):
        t = _rows(cov, [("config", lambda r: s(r["config_label"])), ("pair", lambda r: s(r["pair"])),
                        ("prompt type", lambda r: s(r["prompt_type"])), ("method", lambda r: s(r["method"])),
                        ("policy", lambda r: s(r["policy"])), ("K", lambda r: i(r["k"])),
                        ("prompts measured", lambda r: i(r["n_prompts"])),
                        ("prompts of the type", lambda r: i(r["n_prompts_expected"]))])
        t.caption = ("Cells measured on fewer prompts than the sweep holds of their type (by plan: secondary "
                     "prompts run only some K; or because runs failed).")
        t.limit, t.md, t.collapsed = 200, False, True
        sec.blocks.append(t)
    return sec


def _figures_section(figures: list[FigureEntry]) -> Section:
    sec = Section("Figures", "figures")
    drawn = [e for e in figures if not e.skipped]
    if not drawn:
        sec.blocks.append("No figure could be drawn from this store (see Gaps).")
    sec.blocks.extend(drawn)
    return sec


def build_sections(a: Analysis, figures: list[FigureEntry]) -> list[Section]:
    """The report's sections, in order."""
    how = Section("How to read this", "how")
    how.blocks.append(Bullets(HOW_TO_READ))
    return [
        _summary_section(a), _source_section(a), how, _speedup_section(a), _drift_section(a),
        _condition_section(a),
        _model_section(a), _peer_section(a), _adaptive_section(a), _runtime_section(a),
        _figures_section(figures), _gaps_section(a, figures),
    ]


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.85em;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
caption{caption-side:top;text-align:left;font-style:italic;padding:.2em 0}
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.85em}
figure{margin:1.5em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#444}nav a{margin-right:1em}
.win{color:#2e7d32;font-weight:bold}.loss{color:#c62828;font-weight:bold}
"""


def esc(text: Any) -> str:
    """HTML-escape `text` (quotes included); '://' is written as ':&#47;&#47;' so the page holds no URL."""
    return html.escape(str(text), quote=True).replace("://", ":&#47;&#47;")


def _html_cell(text: str) -> str:
    cls = {"win": "win", "loss": "loss"}.get(text)
    return f'<td class="{cls}">{esc(text)}</td>' if cls else f"<td>{esc(text)}</td>"


def _html_table(t: Table) -> str:
    rows = t.rows if t.limit is None else t.rows[: t.limit]
    parts = ["<table>"]
    if t.caption:
        parts.append(f"<caption>{esc(t.caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in t.headers) + "</tr></thead><tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>")
    parts.append("</tbody></table>")
    if t.limit is not None and len(t.rows) > t.limit:
        parts.append(f"<p>... and {len(t.rows) - t.limit} more rows.</p>")
    body = "\n".join(parts)
    if t.collapsed:
        return f"<details><summary>{esc(t.caption or 'table')} ({len(t.rows)} rows)</summary>\n{body}\n</details>"
    return body


def _html_figure(e: FigureEntry) -> str:
    data = base64.b64encode(Path(e.png).read_bytes()).decode("ascii") if e.png else ""
    return (f'<figure id="{esc(e.name)}"><img alt="{esc(e.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{esc(e.title)}.</b> {esc(e.caption)} "
            f"(Files: figures/{esc(e.name)}.png, figures/{esc(e.name)}.svg)</figcaption></figure>")


def render_html(a: Analysis, figures: list[FigureEntry]) -> str:
    """The report as one self-contained HTML page (inline CSS, figures as base64 PNG, no script)."""
    sections = build_sections(a, figures)
    title = "Speculative decoding report"
    if a.store.sweep and a.store.sweep.get("name"):
        title += f": {a.store.sweep['name']}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
           "<nav>" + "".join(f'<a href="#{sec.anchor}">{esc(sec.title)}</a>' for sec in sections) + "</nav>"]
    for sec in sections:
        out.append(f'<section id="{sec.anchor}"><h2>{esc(sec.title)}</h2>')
        for b in sec.blocks:
            if isinstance(b, str):
                out.append(f"<p>{esc(b)}</p>")
            elif isinstance(b, Table):
                out.append(_html_table(b))
            elif isinstance(b, Pre):
                out.append(f"<pre>{esc(b.text)}</pre>")
            elif isinstance(b, Bullets):
                out.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in b.items) + "</ul>")
            elif isinstance(b, FigureEntry):
                out.append(_html_figure(b))
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------


def _md(text: Any) -> str:
    """Text for Markdown (outside code fences): '&' and '<' escaped so a viewer that renders raw HTML
    shows store text verbatim instead of running it; pipes and newlines neutralised for tables."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;")
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_table(t: Table) -> str:
    rows = t.rows if t.limit is None else t.rows[: t.limit]
    out = []
    if t.caption:
        out.append(f"*{_md(t.caption)}*\n")
    out.append("| " + " | ".join(_md(h) for h in t.headers) + " |")
    out.append("|" + "|".join("---" for _ in t.headers) + "|")
    out.extend("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)
    if not rows:
        out.append("| " + " | ".join("-" for _ in t.headers) + " |")
    if t.limit is not None and len(t.rows) > t.limit:
        out.append(f"\n... and {len(t.rows) - t.limit} more rows.")
    return "\n".join(out)


def render_markdown(a: Analysis, figures: list[FigureEntry]) -> str:
    """The Markdown summary: the key tables, figure links (``figures/<name>.png``) and the gaps."""
    sections = build_sections(a, figures)
    title = "Speculative decoding report"
    if a.store.sweep and a.store.sweep.get("name"):
        title += f": {a.store.sweep['name']}"
    out = [f"# {_md(title)}", ""]
    for sec in sections:
        out += [f"## {_md(sec.title)}", ""]
        for b in sec.blocks:
            if isinstance(b, str):
                out += [_md(b), ""]
            elif isinstance(b, Table):
                if b.md:
                    out += [_md_table(b), ""]
                else:
                    out += [f"*{_md(b.caption)}* ({len(b.rows)} rows, in report.html)", ""]
            elif isinstance(b, Pre) and b.md:
                out += ["```json", b.text.replace("```", "'''"), "```", ""]
            elif isinstance(b, Bullets) and b.md:
                out += [f"- {_md(x)}" for x in b.items] + [""]
            elif isinstance(b, FigureEntry):
                out += [f"![{_md(b.title).replace('[', '(').replace(']', ')')}](figures/{b.name}.png)", "",
                        f"*{_md(b.caption)}*", ""]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


@dataclass
class ReportResult:
    """Paths written by `write_report` and what they were built from."""

    html: Path
    markdown: Path
    figures_dir: Path
    figures: list[FigureEntry]
    analysis: Analysis

    @property
    def drawn(self) -> list[FigureEntry]:
        return [e for e in self.figures if not e.skipped]

    @property
    def skipped(self) -> list[FigureEntry]:
        return [e for e in self.figures if e.skipped]


def write_report(db: str | Path, out: str | Path, sweep: str | None = None) -> ReportResult:
    """Analyse the store `db` and write ``out/report.html``, ``out/report.md`` and ``out/figures/``.

    Args:
        db: results store (SQLite, schema of ``specdec/bench/store.py``).
        out: output directory (created if needed); existing report files are overwritten.
        sweep: sweep id or unique prefix; None = the newest sweep.

    Returns:
        `ReportResult` with the paths, the figure entries (drawn and skipped) and the analysis.

    Raises:
        FileNotFoundError: `db` does not exist.
        ValueError: `db` is not an SQLite store, or `sweep` matches no sweep or several.
        OSError: `out` cannot be written.
    """
    store = load_store(db, sweep)
    analysis = analyze(store)
    out_dir = Path(out)
    fig_dir = out_dir / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = make_figures(analysis, fig_dir)
    html_path = out_dir / "report.html"
    md_path = out_dir / "report.md"
    html_path.write_text(render_html(analysis, figures), encoding="utf-8")
    md_path.write_text(render_markdown(analysis, figures), encoding="utf-8")
    return ReportResult(html_path, md_path, fig_dir, figures, analysis)
