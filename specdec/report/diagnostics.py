"""Diagnostics: how far the measurement can be trusted and what is missing.

Acceptance by draft position (is acceptance i.i.d. along the draft, as the model assumes?), the failed
and skipped runs, cells measured on fewer prompts than planned, the stability of the baseline behind every
speedup, the machine's drift in speed between a run and its baseline, where greedy runs left the target-only
output (`divergence_table`) and the bandwidth each cell drew (`roofline_table`). A **cell** is defined in
:mod:`specdec.report.vocab`.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import model_drafters
from specdec.report.load import ensure_prepared, is_missing
from specdec.report.model import CostInfo
from specdec.report.speedup import PROMPT_KEY, by_machine, nearest_baseline
from specdec.report.vocab import BASELINE, CELL_KEY, FIXED_POLICIES, SPEC_METHODS

__all__ = [
    "DRIFT_FLAG",
    "baseline_stability_table",
    "coverage_table",
    "divergence_table",
    "drift_cells",
    "drift_runs",
    "gaps_table",
    "position_acceptance",
    "roofline_table",
]

#: |drift| above this marks a run as taken while the machine ran at another speed than its baseline.
DRIFT_FLAG = 0.15

_GROUP = ["config_label", "pair", "prompt_type", "method"]


def position_acceptance(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """P(accept at draft position i | position i reached), pooled over the fixed-K runs of our methods.

    Position i (1-based) is *reached* in a round when the round drafted >= i tokens, positions 1..i-1 were
    accepted and the output had not stopped before position i (an EOS inside the block ends it); it is
    *accepted* when additionally token i was accepted. The accepted prefix is the run of leading '1's of
    ``rounds.accept_flags`` (``num_accepted`` where the flags are NULL), cut at ``num_accepted`` and
    ``num_emitted``: drafts the verifier accepted after an EOS never reached the output.

    Columns: config_label, pair, prompt_type, method, position, reached, accepted, p (= accepted/reached).
    """
    cols = [*_GROUP, "position", "reached", "accepted", "p"]
    if rounds is None or rounds.empty:
        return pd.DataFrame(columns=cols)
    df = ensure_prepared(runs)
    keep = df[df["ok"] & df["method"].isin(SPEC_METHODS) & df["policy"].isin(FIXED_POLICIES)]
    if keep.empty:
        return pd.DataFrame(columns=cols)
    r = rounds.merge(keep[["run_id", *_GROUP]], on="run_id")
    if r.empty:
        return pd.DataFrame(columns=cols)
    flags = r["accept_flags"]
    lead = flags.map(lambda s: len(str(s)) - len(str(s).lstrip("1")) if isinstance(s, str) else np.nan)
    n_acc = pd.to_numeric(r["num_accepted"], errors="coerce")
    emitted = pd.to_numeric(r["num_emitted"], errors="coerce") if "num_emitted" in r else pd.Series(np.nan, r.index)
    prefix = lead.where(lead.notna(), n_acc)
    r["prefix"] = np.fmin(np.fmin(prefix, n_acc), emitted)  # fmin: a NaN bound does not cut
    r["emitted"] = emitted.fillna(np.inf)
    r["kk"] = pd.to_numeric(r["k"], errors="coerce")
    r = r[r["prefix"].notna() & r["kk"].notna() & (r["kk"] > 0)]
    rows = []
    for key, g in r.groupby(_GROUP, sort=True):
        a = g["prefix"].to_numpy(float)
        k = g["kk"].to_numpy(float)
        e = g["emitted"].to_numpy(float)
        for i in range(1, int(k.max()) + 1):
            reached = int(np.sum((k >= i) & (a >= i - 1) & (e >= i)))
            if reached == 0:
                continue
            accepted = int(np.sum((k >= i) & (a >= i)))
            rows.append(dict(zip(_GROUP, key), position=i, reached=reached, accepted=accepted, p=accepted / reached))
    return pd.DataFrame(rows, columns=cols)


def gaps_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Failed runs (``error`` set), one row each: config_label, pair, prompt_id, prompt_type, method,
    policy, k, repeat, kind (``"skipped"`` when the error starts with ``skipped``: a method that cannot run
    on this runtime, planned and recorded as a gap; else ``"failed"``), error."""
    cols = ["config_label", "pair", "prompt_id", "prompt_type", "method", "policy", "k", "repeat", "kind", "error"]
    df = ensure_prepared(runs)
    out = df[df["failed"]].copy()
    out["kind"] = np.where(out["error"].astype(str).str.startswith("skipped"), "skipped", "failed")
    return out[cols].reset_index(drop=True)


def baseline_stability_table(runs: pd.DataFrame) -> pd.DataFrame:
    """How steady the denominator of every speedup is: one row per (config_label, target, prompt_id).

    Columns: ``prompt_type``, ``n_runs`` (successful baseline runs), ``median_tok_s``, ``min_tok_s``,
    ``max_tok_s``, ``spread`` = (max - min) / median (0 with one run; a large spread means the machine
    changed speed while the prompt's runs were taken, and every speedup of that prompt carries it), and
    ``hf_generate_tok_s`` / ``vs_hf_generate`` (median baseline / transformers' generate() on the same
    prompt, when that peer ran: a third, independent measurement of target-only decoding).
    """
    cols = [*PROMPT_KEY, "prompt_type", "n_runs", "median_tok_s", "min_tok_s", "max_tok_s", "spread",
            "hf_generate_tok_s", "vs_hf_generate"]
    df = ensure_prepared(runs)
    ok = df[df["ok"]]
    base = ok[ok["method"] == BASELINE]
    if base.empty:
        return pd.DataFrame(columns=cols)
    gen = ok[ok["method"] == "hf_generate"].groupby(PROMPT_KEY)["tokens_per_s"].median().to_dict()
    rows = []
    for k, g in base.groupby(PROMPT_KEY, sort=True):
        tps = g["tokens_per_s"].astype(float)
        med = float(tps.median())
        hf = gen.get(k, np.nan)
        rows.append({"config_label": k[0], "target": k[1], "prompt_id": k[2],
                     "prompt_type": g["prompt_type"].iloc[0], "n_runs": len(g), "median_tok_s": med,
                     "min_tok_s": float(tps.min()), "max_tok_s": float(tps.max()),
                     "spread": float((tps.max() - tps.min()) / med) if med > 0 else np.nan,
                     "hf_generate_tok_s": hf, "vs_hf_generate": med / hf if hf and not is_missing(hf) else np.nan})
    return pd.DataFrame(rows, columns=cols)


def aa_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The A/A noise floor: target-only against target-only, per runtime configuration.

    Per prompt and machine (``machine_id``, where the store has one) with at least two successful baseline
    runs, the A/A ratio is the tokens/s of its last baseline run over its first (they bracket the prompt's
    other runs, so the ratio is the drift the prompt's speedups are exposed to). A prompt resumed on another
    machine gives one ratio per machine and none across them: dividing two machines' timings measures the
    machines, not the noise. Pooled per config_label over prompts like any speedup
    (`specdec.core.stats.ratio_interval`: geometric mean, t-interval, no verdict below 5 prompts), with the
    median |ratio - 1|: a speedup within that of 1 is not a measurable difference on this machine.

    Columns: config_label, n_prompts, aa_ratio, aa_lo, aa_hi, verdict, median_abs_dev (fraction).
    """
    from specdec.core import stats

    cols = ["config_label", "n_prompts", "aa_ratio", "aa_lo", "aa_hi", "verdict", "median_abs_dev"]
    df = ensure_prepared(runs)
    base, keys = by_machine(df[df["ok"] & (df["method"] == BASELINE)].sort_values("run_id"))
    rows = []
    for label, g in base.groupby("config_label", sort=True):
        ratios = [float(p["tokens_per_s"].iloc[-1]) / float(p["tokens_per_s"].iloc[0])
                  for _, p in g.groupby(keys) if len(p) >= 2 and p["tokens_per_s"].iloc[0] > 0]
        if not ratios:
            continue
        ci = stats.ratio_interval(ratios)
        rows.append({"config_label": label, "n_prompts": len(ratios), "aa_ratio": ci.center, "aa_lo": ci.lo,
                     "aa_hi": ci.hi, "verdict": ci.verdict,
                     "median_abs_dev": float(np.median(np.abs(np.asarray(ratios) - 1.0)))})
    return pd.DataFrame(rows, columns=cols)


def _run_step_s(ok: pd.DataFrame, rounds: pd.DataFrame, infos: dict[str, CostInfo]) -> pd.Series | None:
    """Per run_id: the median over its traced rounds of verify_s / v(k + 1) (seconds per target step);
    None when no round has a measured v."""
    r = rounds[["run_id", "k", "verify_s"]].copy()
    r["k"] = pd.to_numeric(r["k"], errors="coerce")
    r["verify_s"] = pd.to_numeric(r["verify_s"], errors="coerce")
    r = r.merge(ok[["run_id", "config_label"]], on="run_id")
    r = r[np.isfinite(r["k"]) & np.isfinite(r["verify_s"]) & (r["verify_s"] > 0)]
    parts = []
    for label, g in r.groupby("config_label"):
        info = infos.get(label)
        if info is None or not info.v:
            continue
        rel = (g["k"].astype(int) + 1).map(info.v).astype(float)  # NaN where n was not measured
        parts.append(g.assign(eq=g["verify_s"] / rel).dropna(subset=["eq"]))
    if not parts:
        return None
    return pd.concat(parts).groupby("run_id")["eq"].median().rename("step_s")


def drift_runs(runs: pd.DataFrame, rounds: pd.DataFrame, infos: dict[str, CostInfo]) -> pd.DataFrame:
    """Each run's own target speed, inferred from its round trace, against its prompt's baseline runs.

    A shared CPU (a VM whose neighbours take memory bandwidth) can change speed by 2x within minutes, and a
    speedup divides two runs taken minutes apart. Every traced round times one target forward over
    ``k + 1`` tokens (``verify_s``); dividing by the configuration's measured relative cost ``v(k + 1)``
    gives that round's *equivalent single-step time*, and its median over the run's rounds is the run's
    ``step_s`` (seconds per target step while it ran). Only n within the measured cost curve are used.

    One row per successful run with a trace: the run's keys, ``step_s``, ``baseline_step_s`` (``step_s`` of
    the prompt's baseline run nearest in time, as in the cell table), ``drift`` = step_s / baseline_step_s
    - 1 (> 0: the machine was slower than during the baseline) and ``speedup`` (tokens/s over that
    baseline's). A diagnostic only: no speedup is "normalized" by it any more. The inferred step time rests
    on a cost curve measured elsewhere (its error was biased per K), so dividing it out moved that
    error into every figure; paired timing (`specdec.report.speedup.paired_reference`) removes the drift
    at its source instead.
    """
    cols = ["run_id", "config_label", "pair", "target", "prompt_id", "prompt_type", "method", "policy", "k",
            "step_s", "baseline_step_s", "drift", "speedup"]
    df = ensure_prepared(runs)
    ok = df[df["ok"] & df["method"].isin([BASELINE, *SPEC_METHODS])]
    if ok.empty or rounds is None or rounds.empty:
        return pd.DataFrame(columns=cols)
    step = _run_step_s(ok, rounds, infos)
    if step is None:
        return pd.DataFrame(columns=cols)
    out = ok.join(step, on="run_id")
    out = out[out["step_s"].notna()].copy()
    near = nearest_baseline(df[df["ok"]])
    step_of = dict(zip(out["run_id"].astype(int), out["step_s"], strict=True))
    tps_of = dict(zip(df["run_id"], df["tokens_per_s"], strict=False))
    nb = out["run_id"].astype(int).map(near)
    out["baseline_step_s"] = nb.map(step_of).astype(float)
    out["baseline_tok_s"] = nb.map(tps_of).astype(float)
    out["drift"] = out["step_s"] / out["baseline_step_s"] - 1.0
    out["speedup"] = out["tokens_per_s"] / out["baseline_tok_s"]
    return out[cols].reset_index(drop=True)


def drift_cells(dr: pd.DataFrame) -> pd.DataFrame:
    """`drift_runs` per cell (median over its runs): ``n_runs``, ``drift``, ``speedup``, ``flagged``
    (|drift| > `DRIFT_FLAG`). Baseline rows are left out."""
    cols = [*CELL_KEY, "n_runs", "drift", "speedup", "flagged"]
    d = dr[(dr["method"] != BASELINE) & dr["drift"].notna()] if len(dr) else dr
    if d is None or d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(CELL_KEY, sort=True)
    out = pd.DataFrame({"n_runs": g.size(), "drift": g["drift"].median(),
                        "speedup": g["speedup"].median()}).reset_index()
    out["flagged"] = out["drift"].abs() > DRIFT_FLAG
    return out[cols]


def coverage_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells holding fewer prompts than the sweep has of their type (n_prompts < n_prompts_expected):
    by plan (secondary prompts run only some K) or because runs failed."""
    cols = [*CELL_KEY, "n_prompts", "n_prompts_expected", "n_failed"]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    return cells[cells["n_prompts"] < cells["n_prompts_expected"]][cols].reset_index(drop=True)


def divergence_table(runs: pd.DataFrame, traces: pd.DataFrame) -> pd.DataFrame:
    """Greedy runs whose output left the target-only output: where, and the target's top-2 margin there
    (from the prompt's trace, teacher forced; NaN without a trace). Columns: run_id, config_label,
    prompt_id, method, policy, k, first_divergence, target_margin."""
    cols = ["run_id", "config_label", "prompt_id", "method", "policy", "k", "first_divergence", "target_margin"]
    df = ensure_prepared(runs)
    if df.empty or "first_divergence" not in df.columns:
        return pd.DataFrame(columns=cols)
    d = df[df["ok"] & pd.to_numeric(df["first_divergence"], errors="coerce").notna()]
    margins = {}
    if traces is not None and len(traces):
        for t in traces.itertuples(index=False):
            tm = json.loads(t.target_margin) if isinstance(t.target_margin, str) else t.target_margin
            margins[(t.config_label, t.prompt_id)] = tm
    rows = []
    for r in d.itertuples(index=False):
        pos = int(r.first_divergence)
        tm = margins.get((r.config_label, r.prompt_id))
        rows.append({"run_id": int(r.run_id), "config_label": r.config_label, "prompt_id": r.prompt_id,
                     "method": r.method, "policy": r.policy, "k": r.k, "first_divergence": pos,
                     "target_margin": float(tm[pos]) if tm is not None and pos < len(tm) else np.nan})
    return pd.DataFrame(rows, columns=cols)


def roofline_table(runs: pd.DataFrame, roofline: pd.DataFrame) -> pd.DataFrame:
    """Per cell: decode tokens/s next to the weight bytes it read per second and the share of the machine's
    memory bandwidth (`specdec.measure.roofline`; gpt-fast's "achieved bandwidth").

    Bytes read in a run's decode = target weight bytes x target forwards (its rounds) + draft weight bytes x
    draft steps (its drafted tokens; the draft model only); achieved GB/s = that / decode_s / 1e9; share =
    achieved / the machine's streaming-copy GB/s. Columns: config_label, prompt_type, method, policy, k,
    n_runs, decode_tok_s, target_gb (per target step), achieved_gbps, bandwidth_gbps, share (medians over
    the cell's runs). Empty without roofline rows or rounds counts (peers are left out).
    """
    cols = ["config_label", "prompt_type", "method", "policy", "k", "n_runs", "decode_tok_s", "target_gb",
            "achieved_gbps", "bandwidth_gbps", "share"]
    df = ensure_prepared(runs)
    if df.empty or roofline is None or roofline.empty:
        return pd.DataFrame(columns=cols)
    ok = df[df["ok"] & pd.to_numeric(df["num_rounds"], errors="coerce").notna()].copy()
    rl = roofline.assign(machine_id=roofline["machine_id"].astype(object).fillna(""))
    info = {(r.config_label, r.machine_id): r for r in rl.itertuples(index=False)}
    by_label = {r.config_label: r for r in rl.itertuples(index=False)}
    rows = []
    for r in ok.itertuples(index=False):
        mid = "" if is_missing(getattr(r, "machine_id", None)) else str(r.machine_id)
        x = info.get((r.config_label, mid)) or by_label.get(r.config_label)
        dec = float(r.decode_s) if not is_missing(r.decode_s) else np.nan
        if x is None or is_missing(x.target_weight_bytes) or not np.isfinite(dec) or dec <= 0:
            continue
        draft_b = (0.0 if r.method not in model_drafters() or is_missing(x.draft_weight_bytes)
                   else float(x.draft_weight_bytes))
        moved = float(x.target_weight_bytes) * float(r.num_rounds) + draft_b * float(r.num_drafted or 0)
        gbps = moved / dec / 1e9
        bw = float(x.bandwidth_gbps) if not is_missing(x.bandwidth_gbps) else np.nan
        rows.append({"config_label": r.config_label, "prompt_type": r.prompt_type, "method": r.method,
                     "policy": r.policy, "k": r.k, "decode_tok_s": float(r.new_tokens) / dec,
                     "target_gb": float(x.target_weight_bytes) / 1e9, "achieved_gbps": gbps,
                     "bandwidth_gbps": bw, "share": gbps / bw if bw and np.isfinite(bw) else np.nan})
    if not rows:
        return pd.DataFrame(columns=cols)
    d = pd.DataFrame(rows)
    key = ["config_label", "prompt_type", "method", "policy", "k"]
    g = d.groupby(key, dropna=False, sort=True)
    out = g[["decode_tok_s", "target_gb", "achieved_gbps", "bandwidth_gbps", "share"]].median().reset_index()
    out["n_runs"] = g.size().to_numpy()
    return out[cols]
