"""The report's sections, in order (`build_sections`): how to read it, the headline, summary, speedup by
cell, traces, roofline, machine drift, the comparisons of :mod:`specdec.report.sections_compare`, figures,
gaps, and the appendices (definitions; where the data came from). Each section reads the analysis through
the table registry's handles (:mod:`specdec.report.tables`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from specdec.core.stats import MIN_UNITS
from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.cells import best_fixed, spec_fixed_cells
from specdec.report.diagnostics import DRIFT_FLAG
from specdec.report.document import Bullets, Pre, Section, Table, ci, f, i, key_columns, pct, s, table_of, yn
from specdec.report.headline import HOW_TO_READ_FIRST, headline_section
from specdec.report.plots import FigureEntry
from specdec.report.sections_answer import answer_section
from specdec.report.sections_compare import (
    adaptive_section,
    condition_section,
    model_section,
    peer_section,
    runtime_section,
)
from specdec.report.sections_drafters import drafters_section
from specdec.report.sections_traces import aa_line, roofline_section, traces_section
from specdec.report.vocab import ALL_PROMPTS, OUR_DRAFTERS, SINGLE_RUN

__all__ = ["HOW_TO_READ", "build_sections"]

# --------------------------------------------------------------------------------------------------
# building the sections
# --------------------------------------------------------------------------------------------------

HOW_TO_READ = [
    ("tokens/s: new tokens / end-to-end seconds of one generation (prefill included); the figure every "
     "speedup is quoted on."),
    ("speedup: a method's tokens/s / our target-only baseline's tokens/s on the same runtime (config), target "
     "and prompt, the baseline being the prompt's baseline run nearest in time to each run (they bracket the "
     "prompt's runs) on the same machine. Per prompt each side is the median over repeats; a cell's speedup is "
     "the geometric mean of its per-prompt ratios, with a 95 % Student-t interval on their logs: the unit is "
     "the prompt (its runs when a cell has one prompt). Simulated, these intervals cover >= 90 % at 5-12 units."),
    ("verdict: 'win' when the whole CI is above 1, 'loss' when it is below 1, otherwise 'no measurable "
     "difference'; below 5 units no verdict is given ('too few units'), whatever the interval says. A loss is "
     "a result, reported as plainly as a win. A cell with one run of one prompt (the "
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


def _machine_blocks(st) -> list:
    """The machines that timed this sweep's runs (sharded or merged stores): one row each, with its runs.
    Speedups divide only runs of one machine (`specdec.report.speedup.nearest_baseline`)."""
    steps = _machine_steps(st.machine_costs)
    rows = [[mid, label, str(n), str(nb), steps.get(mid, "-")] for mid, label, n, nb in st.machine_runs()]
    if not rows:
        return []
    text = (f"{len(rows)} machines timed this sweep's runs: every speedup divides runs of one machine only."
            if len(rows) > 1 else "One machine timed this sweep's runs.")
    blocks: list = [text, Table(["machine id", "machine", "runs", "baseline runs",
                                 "start-up target / draft step ms"], rows)]
    if (mid := st.costs_machine()) and len(rows) > 1:
        blocks.append(f"The sweep-level costs (the speedup condition, the analytical model, the runtimes) are "
                      f"machine {mid}'s.")
    return blocks


def _machine_steps(machine_costs: pd.DataFrame) -> dict[str, str]:
    """``machine_id -> "target / draft"`` single-step times in ms from the store's ``machine_costs`` (seconds),
    one entry per configuration (prefixed with its label when there are several); '-' for a missing step."""
    if machine_costs is None or machine_costs.empty:
        return {}
    one = machine_costs[pd.to_numeric(machine_costs["n_tokens"], errors="coerce") == 1]
    labels = sorted(one["config_label"].astype(str).unique())
    out = {}
    for mid, g in one.groupby("machine_id", sort=True):
        parts = []
        for label in labels:
            h = g[g["config_label"].astype(str) == label]
            if h.empty:
                continue
            step = {str(r.role): f(1000 * float(r.seconds), 1) for r in h.itertuples()}
            text = f"{step.get('target', '-')} / {step.get('draft', '-')}"
            parts.append(f"{label}: {text}" if len(labels) > 1 else text)
        out[str(mid)] = "; ".join(parts) or "-"
    return out


def _runs_line(n: int, gaps: pd.DataFrame) -> str:
    """``"108 (1 failed, 2 skipped)"``: a skipped run (a method that could not run here, or a K chosen from a
    trace the store lacks until ``--resume`` takes it) is not a failure."""
    n_skip = int((gaps["kind"] == "skipped").sum()) if len(gaps) else 0
    return f"{n} ({len(gaps) - n_skip} failed" + (f", {n_skip} skipped)" if n_skip else ")")


def _source_section(a: Analysis) -> Section:
    st = a.store
    sec = Section("Appendix: where the data came from", "source")
    sw = st.sweep or {}
    info = [
        ["store", st.db_path],
        ["sweep id", s(st.sweep_id)],
        ["sweep name", s(sw.get("name"))],
        ["status", s(sw.get("status"))],
        ["created", s(sw.get("created_at"))],
        ["git commit", s(sw.get("git_commit"))],
        ["schema version", s(st.meta.get("schema_version"))],
        ["runs", _runs_line(len(st.runs), a[T.GAPS])],
        ["configs (runtimes)", ", ".join(sorted(set(st.runs["config_label"].dropna().astype(str)))) or "-"],
    ]
    sec.blocks.append(Table(["field", "value"], info))
    machine = a.machine
    if machine:
        sec.blocks.append("Machine and library versions (sweeps.machine_json):")
        sec.blocks.append(Table(["key", "value"], [[k, v] for k, v in _flatten(machine)]))
    else:
        sec.blocks.append("Machine: not recorded in this store.")
    sec.blocks += _machine_blocks(st)
    stab = a[T.BASELINE_STABILITY]
    if len(stab):
        t = table_of(stab, [*key_columns("config", "prompt"),
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
                if counts.get("too few units", 0):
                    line += f", {counts.get('too few units')} have too few units (under 5) for a verdict"
                if counts.get(SINGLE_RUN, 0):
                    line += (f", {counts.get(SINGLE_RUN)} rest on a single run (no interval; "
                             f"{int((bt['speedup'] > 1).sum())} of {n} types are above 1 at their best K)")
                top = bt.sort_values("speedup", ascending=False).iloc[0]
                line += f"; highest: {top['prompt_type']} {f(top['speedup'])}x at K={top['best_k']}"
        lines.append(line + ".")
    eq = a[T.EQUALITY]
    if len(eq):
        ours = eq[eq["method"].isin(OUR_DRAFTERS)]
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
    lines.extend(aa_line(a))
    for r in a[T.AA].itertuples():
        few = r.n_prompts < MIN_UNITS
        lines.append(f"A/A noise floor on {r.config_label}: the last baseline run of a prompt over its first "
                     f"(they bracket its other runs) {f(r.aa_ratio)}x {ci(r.aa_lo, r.aa_hi)} over {r.n_prompts} "
                     f"prompts{' (too few units: a rough floor)' if few else ''}, median |ratio - 1| = "
                     f"{pct(r.median_abs_dev)}: speedups within that of 1 are noise on this machine.")
    dc = a[T.DRIFT]
    if len(dc) and dc["flagged"].any():
        lines.append(f"Machine drift: {int(dc['flagged'].sum())} of {len(dc)} cells ran while the target step "
                     f"was more than {100 * DRIFT_FLAG:.0f}% slower or faster than during their prompt's "
                     "baseline (see 'Machine drift'); each speedup divides by its adjacent (else nearest) baselines.")
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
        *key_columns("method", "policy", "K"),
    ]
    t = table_of(ov, [*key_columns("config", "pair"), *common,
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
    t = table_of(cells, [
        *key_columns("config", "pair", "prompt type"), *common,
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
        t = table_of(best, [
            *key_columns("config", "pair", "prompt type", "method"),
            ("best K", lambda r: i(r["best_k"])), ("speedup", lambda r: f(r["speedup"])),
            ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])), ("verdict", lambda r: s(r["verdict"])),
            ("alpha-hat", lambda r: f(r["alpha_hat"], 3)), ("K tried", lambda r: s(r["ks_tried"])),
            ("prompts", lambda r: i(r["n_prompts"])),
            ("same prompts for every K", lambda r: yn(r["same_prompts"])),
        ])
        t.caption = (f"{sub} (highest median speedup among the K values measured on the most prompts of the "
                     "type; chosen after the fact).")
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
        f"baseline. Cells with |drift| > {100 * DRIFT_FLAG:.0f}% are flagged. A diagnostic only: no speedup "
        "is corrected by it (the inferred step time rests on a cost curve measured elsewhere, whose error was "
        "biased per K); paired timing - each run between two baselines - removes drift at the source, and "
        "the A/A runs measure what is left.")
    n_flag = int(dc["flagged"].sum())
    sec.blocks.append(f"{n_flag} of {len(dc)} cells are flagged; median |drift| "
                      f"{pct(dc['drift'].abs().median())}, largest {pct(dc['drift'].abs().max())}.")
    t = table_of(dc, [*key_columns("config", "prompt type", "method", "policy", "K"),
                   ("runs", lambda r: i(r["n_runs"])),
                   ("drift", lambda r: pct(r["drift"])), ("speedup", lambda r: f(r["speedup"])),
                   ("flagged", lambda r: "yes" if r["flagged"] else "")])
    t.caption = "Per cell, median over its runs."
    t.collapsed = True
    sec.blocks.append(t)
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
        t = table_of(gaps, [*key_columns("config", "pair", "prompt", "prompt type", "method", "policy", "K"),
                         ("repeat", lambda r: i(r["repeat"])),
                         ("kind", lambda r: s(r["kind"])), ("error", lambda r: s(r["error"])[:300])])
        t.limit = 200
        sec.blocks.append(t)
    else:
        sec.blocks.append("No failed run.")
    cov = a[T.COVERAGE]
    if len(cov):
        t = table_of(cov, [*key_columns("config", "pair", "prompt type", "method", "policy", "K"),
                        ("prompts measured", lambda r: i(r["n_prompts"])),
                        ("prompts of the type", lambda r: i(r["n_prompts_expected"]))])
        t.caption = ("Cells measured on fewer prompts than the sweep holds of their type (by plan: secondary "
                     "prompts run only some K; or because runs failed).")
        t.limit, t.md, t.collapsed = 200, False, True
        sec.blocks.append(t)
    return sec


def _figures_section(figures: list[FigureEntry]) -> Section:
    sec = Section("Figures", "figures")
    drawn = [e for e in figures if not e.skipped and e.kind != "headline"]  # the headline has its own section
    if not drawn:
        sec.blocks.append("No figure could be drawn from this store (see Gaps).")
    sec.blocks.extend(drawn)
    return sec


def build_sections(a: Analysis, figures: list[FigureEntry], extra: Sequence[Section] = ()) -> list[Section]:
    """The report's sections, in reading order: the answer per prompt type (:mod:`specdec.report.sections_answer`),
    a short "how to read this", the timed cells' headline (figure and five-line verdict,
    :mod:`specdec.report.headline`), the summary, the tables and comparisons (`extra` ones before
    the figures), the gaps, then the appendices: the definitions of every metric and where the data came
    from (provenance, machine, the raw sweep configuration)."""
    how = Section("How to read this", "how")
    how.blocks.append(Bullets(HOW_TO_READ_FIRST))
    definitions = Section("Appendix: definitions", "definitions")
    definitions.blocks.append(Bullets(HOW_TO_READ))
    return [
        answer_section(a, figures), how, headline_section(a, figures), _summary_section(a), _speedup_section(a), traces_section(a),
        roofline_section(a), _drift_section(a), condition_section(a), model_section(a), peer_section(a),
        adaptive_section(a), runtime_section(a), drafters_section(a), *extra, _figures_section(figures), _gaps_section(a, figures),
        definitions, _source_section(a),
    ]
