"""Two sweeps side by side, per prompt type and drafter: the traces' best fixed K, its predicted decode
speedup over target-only with the interval over the type's prompts, and tokens per target forward at it, for
this report's sweep and another (``specdec report --beside DB``): greedy beside sampled, one temperature
beside another, or one machine beside another.

Each figure is computed inside its own sweep (a prompt's trace priced with its own calibration block, as the
answer table does: `specdec.report.predicted.trace_grid`); nothing divides the runs of one sweep by the other's,
so the two columns compare like with like only where the sweeps ran the same pair, runtime and prompts (the
table counts each side's prompts).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from specdec.core import stats
from specdec.report.document import Section, ci, f, i, s, table_of
from specdec.report.predicted import trace_best_k
from specdec.report.vocab import FIXED_POLICIES

__all__ = ["beside_section", "beside_table", "sweep_label"]

#: Per side (prefix ``a_`` for the report's sweep, ``b_`` for the other): the columns of `beside_table`.
SIDE = ["best_k", "speedup", "lo", "hi", "verdict", "block_efficiency", "n_prompts"]


def sweep_label(runs: pd.DataFrame, sweep_id: str | None) -> str:
    """``greedy`` or ``T = 0.7`` (the temperature of the sweep's runs; several listed), with the sweep id."""
    col = runs["temperature"] if "temperature" in runs.columns else pd.Series(dtype=float)
    sampled = sorted({float(t) for t in pd.to_numeric(col, errors="coerce").dropna() if t > 0})
    what = "greedy" if not sampled else "T = " + ", ".join(f"{t:g}" for t in sampled)
    return f"{what} ({sweep_id or 'no sweep'})"


def _side(grid: pd.DataFrame) -> pd.DataFrame:
    """Per (config_label, prompt_type, method): `SIDE` at the traces' best fixed K (`trace_best_k`)."""
    best = trace_best_k(grid)
    rows = []
    for r in best.itertuples():
        g = grid[(grid["config_label"] == r.config_label) & (grid["prompt_type"] == r.prompt_type)
                 & (grid["method"] == r.method) & (grid["k"] == r.best_k) & grid["policy"].isin(FIXED_POLICIES)]
        pred = g["predicted"].astype(float)
        ratio = stats.ratio_interval(pred[np.isfinite(pred) & (pred > 0)])
        rows.append({"config_label": r.config_label, "prompt_type": r.prompt_type, "method": r.method,
                     "best_k": int(r.best_k), "speedup": ratio.center, "lo": ratio.lo, "hi": ratio.hi,
                     "verdict": ratio.verdict, "block_efficiency": float(g["block_efficiency"].astype(float).mean()),
                     "n_prompts": int(g["prompt_id"].nunique())})  # fmt: skip
    return pd.DataFrame(rows, columns=["config_label", "prompt_type", "method", *SIDE])


def beside_table(grid_a: pd.DataFrame, grid_b: pd.DataFrame) -> pd.DataFrame:
    """Both sweeps' trace grids (`specdec.report.predicted.trace_grid`) side by side: one row per
    (config_label, prompt_type, method) either sweep priced, columns ``a_<col>`` and ``b_<col>`` for each
    `SIDE` column (NaN where that sweep has no such row). ``speedup`` is the geometric mean over the type's
    prompts of the predicted decode speedup at ``best_k``, ``lo``/``hi`` its 95% t-interval and ``verdict``
    its verdict (5 prompts at least); ``block_efficiency`` the mean tokens per target forward at that K."""
    key = ["config_label", "prompt_type", "method"]
    empty = pd.DataFrame(columns=[*key, *(f"{p}_{c}" for p in "ab" for c in SIDE)])
    sides = [_side(g) if g is not None and len(g) else empty.iloc[:0, :3] for g in (grid_a, grid_b)]
    if all(x.empty for x in sides):
        return empty
    a, b = (x.set_index(key).add_prefix(p + "_") for x, p in zip(sides, "ab", strict=True))
    out = a.join(b, how="outer").reset_index()
    return out.reindex(columns=empty.columns).sort_values(key, kind="stable").reset_index(drop=True)


def _side_text(r: pd.Series, p: str) -> str:
    if pd.isna(r[f"{p}_best_k"]):
        return "-"
    return (f"K={i(r[f'{p}_best_k'])} {f(r[f'{p}_speedup'])}x {ci(r[f'{p}_lo'], r[f'{p}_hi'])}, "
            f"{f(r[f'{p}_block_efficiency'])} tok/fwd ({i(r[f'{p}_n_prompts'])} prompts, {s(r[f'{p}_verdict'])})")


def beside_section(table: pd.DataFrame, label_a: str, label_b: str) -> Section:
    """The report's section of a `beside_table` frame, the two sweeps named by `label_a` and `label_b`."""
    sec = Section(f"Beside {label_b}", "beside-" + re.sub(r"[^a-z0-9]+", "-", label_b.lower()).strip("-"))
    if table.empty:
        sec.blocks.append(f"Neither sweep ({label_a}; {label_b}) has acceptance traces to price.")
        return sec
    t = table_of(table, [
        ("config", lambda r: s(r["config_label"])), ("prompt type", lambda r: s(r["prompt_type"])),
        ("drafter", lambda r: s(r["method"])), (label_a, lambda r: _side_text(r, "a")),
        (label_b, lambda r: _side_text(r, "b")),
    ])  # fmt: skip
    t.caption = ("Per prompt type and drafter, in each sweep: the fixed K its traces price fastest, the predicted "
                 "decode speedup over target-only there (geometric mean over the type's prompts, 95% interval, "
                 "verdict from 5 prompts) and tokens per target forward. Each figure is computed inside its own "
                 "sweep; the columns compare like with like only where both ran the same pair, runtime and "
                 "prompts.")
    sec.blocks.append(t)
    return sec
