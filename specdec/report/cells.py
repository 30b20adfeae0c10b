"""The cell table: one row per **cell** (defined in :mod:`specdec.report.vocab`), and the best fixed K.

Every rate is evaluated here on raw counts summed over the cell's runs, by its one definition in
`specdec.core.metrics.RATES`; the speedup statistics come from :mod:`specdec.report.speedup`. Runs whose
``error`` is set are failed runs: they count in ``n_failed`` and in no other column.

Units: tokens/s, seconds (``*_s``), milliseconds (``*_ms``); shares are fractions of ``total_s``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec.core.metrics import rates
from specdec.report.load import ROUND_COLUMNS, empty_frame, ensure_prepared, run_rate, with_round_stats
from specdec.report.speedup import paired_ratio_ci, paired_reference
from specdec.report.vocab import ALL_PROMPTS, BASELINE, CELL_KEY, FIXED_POLICIES, SPEC_METHODS

__all__ = [
    "CELL_RATES",
    "best_cell",
    "best_fixed",
    "best_k_table",
    "cell_table",
    "fixed_k_cells",
    "on_most_prompts",
    "spec_fixed_cells",
]

_LEAD_COLUMNS = [*CELL_KEY, "n_prompts", "n_prompts_expected", "n_runs", "n_failed", "tok_s", "baseline_tok_s",
                 "speedup", "speedup_lo", "speedup_hi", "verdict", "n_aligned", "ci_over"]


#: The rates of a cell, each by its one definition in `specdec.core.metrics.RATES`.
CELL_RATES = ("acceptance_rate", "alpha_hat", "mean_accepted", "block_efficiency", "mean_k")


def _counts(g: pd.DataFrame) -> dict:
    """Raw counts summed over the runs of `g` and the `CELL_RATES` evaluated on them (`specdec.core.metrics.RATES`)."""
    def total(col):
        s = g[col].dropna()
        return float(s.sum()) if len(s) else np.nan

    with_rounds = g[g["num_rounds"].fillna(0) > 0]
    counts = {
        "num_drafted": total("num_drafted"),
        "num_accepted": total("num_accepted"),
        "num_rejections": total("num_rejections"),
        "num_rounds": total("num_rounds"),
        "num_speculative_rounds": total("spec_rounds"),
        "num_emitted": float(with_rounds["emitted"].sum()) if len(with_rounds) else np.nan,
    }
    shown = ("num_drafted", "num_accepted", "num_rejections", "num_rounds")
    return {**{c: counts[c] for c in shown}, **rates(counts, CELL_RATES)}


def _times(g: pd.DataFrame) -> dict:
    """Time shares (fractions of total_s, summed over runs) and ms per new token of each phase."""
    t = g[(g["total_s"] > 0) & g["new_tokens"].notna()]
    total = float(t["total_s"].sum()) if len(t) else np.nan
    tokens = float(t["new_tokens"].sum()) if len(t) else np.nan
    out = {}
    parts = {}
    for name, col in (("prefill", "prefill_s"), ("draft", "draft_s"), ("verify", "verify_s")):
        s = t[col]
        parts[name] = float(s.sum()) if len(s) and s.notna().all() else np.nan
    known = [v for v in parts.values() if np.isfinite(v)]
    parts["other"] = max(total - sum(known), 0.0) if (np.isfinite(total) and known) else np.nan
    for name, secs in parts.items():
        out[f"share_{name}"] = secs / total if (np.isfinite(total) and total > 0) else np.nan
        out[f"{name}_ms_per_token"] = 1000 * secs / tokens if (np.isfinite(tokens) and tokens > 0) else np.nan
    out["total_ms_per_token"] = 1000 * total / tokens if (np.isfinite(tokens) and tokens > 0) else np.nan
    return out


def _latency(g: pd.DataFrame) -> dict:
    """Median end-to-end tokens/s, time to first token (ms) and decode tokens/s over the runs of `g`."""
    ttft = g["ttft_s"].dropna()
    decode_s = g["decode_s"].where(g["decode_s"].notna(), g["total_s"] - g["prefill_s"])
    dec = run_rate(g.assign(decode_s=decode_s), "decode_tokens_per_s").dropna()
    return {"tok_s": float(g["tokens_per_s"].median()) if len(g) else np.nan,
            "ttft_ms": 1000 * float(ttft.median()) if len(ttft) else np.nan,
            "decode_tok_s": float(dec.median()) if len(dec) else np.nan}


def _cell_row(rec: dict, g: pd.DataFrame, ref: dict[int, float], adj: dict[int, int]) -> dict:
    """Fill the measured columns of one cell's row `rec` from its successful runs `g` and the per-run
    baseline references `ref` (`specdec.report.speedup.paired_reference`)."""
    rec["n_prompts"] = int(g["prompt_id"].nunique())
    rec["n_runs"] = len(g)
    rec.update(_latency(g))
    refs = [ref[int(i)] for i in g["run_id"] if int(i) in ref]
    rec["baseline_tok_s"] = float(np.median(refs)) if refs else np.nan
    rec["n_paired"] = sum(1 for i in g["run_id"] if adj.get(int(i), 0) > 0)
    if rec["method"] == BASELINE and len(g):
        rec.update(speedup=1.0, speedup_lo=1.0, speedup_hi=1.0, verdict="baseline",
                   n_aligned=rec["n_prompts"], ci_over="")
        rec["n_paired"] = 0
    else:
        rec.update(paired_ratio_ci(g, ref))
    rec.update(_counts(g) if len(g) else {})
    rec.update(_times(g) if len(g) else {})
    mb = g["matches_baseline"].dropna()
    rec["match_rate"] = float(mb.mean()) if len(mb) else np.nan
    rec["n_matched_checked"] = len(mb)
    return rec


def cell_table(runs: pd.DataFrame, rounds: pd.DataFrame | None = None, *, pool_prompt_types: bool = False
               ) -> pd.DataFrame:
    """One row per cell, or per pooled row when `pool_prompt_types` (``prompt_type`` = ``"(all prompts)"``).

    `runs` is a raw or `prepare_runs` frame; failed runs count in ``n_failed`` only.

    Columns: the cell key; ``n_prompts``, ``n_prompts_expected`` (prompts of that type in the sweep),
    ``n_runs``, ``n_failed``; ``tok_s`` (median end-to-end tokens/s over runs), ``ttft_ms`` (median time
    to first token), ``decode_tok_s`` (median new tokens / decode seconds), ``baseline_tok_s`` (median of the
    runs' baseline references), ``n_paired`` (runs with a baseline adjacent in time), ``speedup``/``speedup_lo``/``speedup_hi``/``verdict``/``n_aligned``/
    ``ci_over`` (:mod:`specdec.report.speedup`; the baseline's own rows have speedup 1 and verdict
    ``"baseline"``); raw counts and ``acceptance_rate``, ``alpha_hat``, ``mean_accepted``,
    ``block_efficiency``, ``mean_k`` (drafted per speculative round); ``share_{prefill,draft,verify,other}``
    and ``*_ms_per_token``; ``match_rate`` (mean of ``matches_baseline`` where recorded).
    """
    df = ensure_prepared(runs)
    key = [c for c in CELL_KEY if not (pool_prompt_types and c == "prompt_type")]
    if df.empty:
        return pd.DataFrame(columns=[*CELL_KEY, "speedup"])
    ok = with_round_stats(df[df["ok"]], rounds if rounds is not None else empty_frame(ROUND_COLUMNS))
    ref, adj = paired_reference(ok)
    expected = df.groupby(["config_label", "prompt_type"])["prompt_id"].nunique()
    expected_all = df.groupby("config_label")["prompt_id"].nunique()
    skipped = df["error"].astype(str).str.startswith("skipped") if "error" in df.columns else False
    failed_counts = df[df["failed"] & ~skipped].groupby(key).size()  # a skipped run is a gap, not a failure
    groups = dict(list(ok.groupby(key, sort=True)))
    rows = []
    for cell in sorted(set(groups) | set(failed_counts.index), key=lambda t: tuple(map(str, t))):
        rec = dict(zip(key, cell))
        if pool_prompt_types:
            rec["prompt_type"] = ALL_PROMPTS
            rec["n_prompts_expected"] = int(expected_all.get(rec["config_label"], 0))
        else:
            rec["n_prompts_expected"] = int(expected.get((rec["config_label"], rec["prompt_type"]), 0))
        rec["n_failed"] = int(failed_counts.get(cell, 0))
        rows.append(_cell_row(rec, groups.get(cell, ok.iloc[0:0]), ref, adj))
    out = pd.DataFrame(rows)
    return out[_LEAD_COLUMNS + [c for c in out.columns if c not in _LEAD_COLUMNS]]


def fixed_k_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells (or pooled rows) with one K throughout: a fixed policy (or none), K > 0, a finite speedup."""
    if cells.empty:
        return cells
    m = cells["policy"].isin(FIXED_POLICIES) & (cells["k"] > 0) & np.isfinite(cells["speedup"].astype(float))
    return cells[m]


def spec_fixed_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """`fixed_k_cells` of our speculative methods (the cells the analytical model speaks about)."""
    fx = fixed_k_cells(cells)
    return fx[fx["method"].isin(SPEC_METHODS)] if len(fx) else fx


def on_most_prompts(cells: pd.DataFrame, col: str = "n_aligned") -> pd.DataFrame:
    """The rows of `cells` measured on the most prompts by `col` (``n_aligned``, the prompts a speedup is
    paired over, or ``n_prompts``); `cells` unchanged when it lacks `col` or is empty.

    Every after-the-fact pick of a best cell goes through here: among cells of different prompt counts, a
    cell of one prompt (a K timed on the primary only) would win by chance over cells of five, whose
    medians are over other prompts."""
    if cells.empty or col not in cells.columns:
        return cells
    n = cells[col].fillna(0)
    return cells[n == n.max()]


def best_cell(cells: pd.DataFrame, col: str = "n_aligned") -> pd.Series | None:
    """The after-the-fact pick every "best" in the reports makes: among the rows of `cells` measured on the most
    prompts (`on_most_prompts` by `col`), the one with the highest paired speedup, ties to the smaller K; None
    when `cells` is empty. The speedup, not tokens/s, decides: one store's cells may have been timed on
    machines of different speed (resumed shards), and only the speedup is paired within prompt and machine."""
    wide = on_most_prompts(cells, col)
    if wide.empty:
        return None
    return wide.sort_values(["speedup", "k"], ascending=[False, True]).iloc[0]


def best_fixed(cells: pd.DataFrame) -> pd.Series | None:
    """The best fixed K among `cells`: among the fixed-K rows measured on the most prompts (column
    ``n_prompts``, where present), the one with the highest median speedup, ties to the smaller K; None
    when `cells` hold no fixed-K row with a speedup. Chosen after the fact (optimistic).

    A K timed on one prompt is not preferred to a K timed on every prompt of the type (`on_most_prompts`,
    the rule of the headline's best cell too)."""
    return best_cell(fixed_k_cells(cells), "n_prompts")


def best_k_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Best fixed K per (config_label, pair, prompt_type, method): the K with the highest median speedup
    among those measured on the most prompts (`best_fixed`).

    Columns: the group key, ``best_k``, ``speedup``, ``speedup_lo``, ``speedup_hi``, ``verdict``,
    ``alpha_hat``, ``ks_tried`` (comma-separated K values), ``n_prompts``, ``same_prompts`` (every K
    measured on as many prompts; False when, e.g., secondary prompts only ran some K, so the K values
    are compared on different prompt sets). Ties go to the smaller K (`best_fixed`).
    Empty when no fixed-K cell has a speedup.
    """
    cols = ["config_label", "pair", "prompt_type", "method", "best_k", "speedup", "speedup_lo", "speedup_hi",
            "verdict", "alpha_hat", "ks_tried", "n_prompts", "same_prompts"]
    fx = fixed_k_cells(cells)
    if fx.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in fx.groupby(["config_label", "pair", "prompt_type", "method"], sort=True):
        b = best_fixed(g)
        rows.append({
            "config_label": key[0], "pair": key[1], "prompt_type": key[2], "method": key[3],
            "best_k": int(b["k"]), "speedup": b["speedup"], "speedup_lo": b["speedup_lo"],
            "speedup_hi": b["speedup_hi"], "verdict": b["verdict"], "alpha_hat": b.get("alpha_hat", np.nan),
            "ks_tried": ",".join(str(k) for k in sorted(g["k"].astype(int))), "n_prompts": b["n_prompts"],
            "same_prompts": g["n_prompts"].nunique() == 1,
        })
    return pd.DataFrame(rows, columns=cols)
