"""Speedup statistics: which baseline run each run is divided by, and the ratio with its interval.

**speedup** (dimensionless) = a method's end-to-end tokens/s / our target-only ``baseline`` tokens/s on
the same ``config_label``, target, prompt and machine. The baseline side of each run is the prompt's
baseline run nearest it in time on the same machine (`nearest_baseline`: the baseline runs bracket a
prompt's other runs, a resumed sweep can leave them hours apart, and a merged sharded store holds runs of
several machines, never divided by each other). Per prompt, each side is the median over its repeats.

**Interval** (`specdec.stats`, MEASUREMENT.md "Units, not runs"): the unit is the prompt. A group's ratio is
the geometric mean of its per-prompt ratios with Student's t-interval on their logs (nominal 95 %; its
coverage at n = 5, 8, 12 is a test). With a single aligned prompt the units are its runs (each run's ratio
to the prompt's reference median); with a single run there is no interval (verdict
:data:`~specdec.report.vocab.SINGLE_RUN`).

**verdict**: ``"win"`` (interval above 1), ``"loss"`` (below 1), ``"no measurable difference"``, or
``"too few units"`` below `specdec.stats.MIN_UNITS` (5) units, whatever the interval says.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec import stats
from specdec.report.vocab import BASELINE, SINGLE_RUN

__all__ = ["PROMPT_KEY", "nearest_baseline", "per_prompt_median", "ratio_ci"]

#: The columns that name one prompt on one runtime and target: the unit speedups are aligned on.
PROMPT_KEY = ["config_label", "target", "prompt_id"]


def nearest_baseline(ok: pd.DataFrame) -> dict[int, int]:
    """run_id -> run_id of the baseline run of the same `PROMPT_KEY` (and machine) nearest in time.

    Run_id order is insertion order; ties go to the earlier run. A baseline run maps to itself. A
    prompt's baseline runs bracket its other runs; when a sweep was resumed hours later (or the machine
    changed speed) they can be far apart, and the speedup of a run is then measured against the baseline
    taken closest to it rather than against a median that mixes two machine states.
    """
    if "run_id" not in ok.columns:
        return {}
    # runs of a merged (sharded) store carry their machine: only a baseline of the same machine counts
    keys = [*PROMPT_KEY, *(["machine_id"] if "machine_id" in ok.columns else [])]
    if "machine_id" in ok.columns:
        ok = ok.assign(machine_id=ok["machine_id"].astype(object).fillna(""))
    base = ok[ok["method"] == BASELINE]
    if base.empty:
        return {}
    ids_by = {k: np.sort(g["run_id"].to_numpy(dtype=np.int64)) for k, g in base.groupby(keys)}
    out: dict[int, int] = {}
    for r in ok[["run_id", *keys]].itertuples(index=False):
        ids = ids_by.get(tuple(getattr(r, k) for k in keys))
        if ids is None or pd.isna(r.run_id):
            continue
        out[int(r.run_id)] = int(ids[np.argmin(np.abs(ids - int(r.run_id)))])  # argmin: first = earlier
    return out


def per_prompt_median(runs: pd.DataFrame) -> pd.Series:
    """Median tokens/s of `runs` per `PROMPT_KEY` (the reference side of `ratio_ci`)."""
    return runs.groupby(PROMPT_KEY)["tokens_per_s"].median()


def ratio_ci(runs: pd.DataFrame, ref: pd.Series | dict) -> dict:
    """Speedup of `runs` over per-prompt reference medians `ref` (see the module docstring).

    Args:
        runs: prepared runs (``tokens_per_s`` and the `PROMPT_KEY` columns).
        ref: reference tokens/s keyed by `PROMPT_KEY` tuples (a Series or a dict).

    Returns:
        dict with ``speedup``, ``speedup_lo``, ``speedup_hi``, ``verdict``, ``n_aligned`` (prompts with
        both sides) and ``ci_over`` (what the interval resamples).
    """
    out = {"speedup": np.nan, "speedup_lo": np.nan, "speedup_hi": np.nan, "verdict": "",
           "n_aligned": 0, "ci_over": ""}
    if runs.empty or len(ref) == 0:
        return out
    per_prompt = runs.groupby(PROMPT_KEY)["tokens_per_s"].median().to_dict()
    ref_d = ref.to_dict() if isinstance(ref, pd.Series) else ref
    common = [key for key in per_prompt if key in ref_d]
    if not common:
        return out
    num = np.array([per_prompt[key] for key in common], dtype=float)
    den = np.array([ref_d[key] for key in common], dtype=float)
    if len(common) >= 2:
        ci = stats.ratio_interval(num / den)
        over = "prompts"
    else:
        key = common[0]
        mask = np.ones(len(runs), dtype=bool)
        for col, val in zip(PROMPT_KEY, key):
            mask &= (runs[col] == val).to_numpy()
        sel = runs["tokens_per_s"].to_numpy(float)[mask]
        if len(sel) < 2:
            # One run of one prompt: a point, no interval, no verdict (a zero-width "CI" would claim
            # certainty that a single measurement cannot give).
            out.update(speedup=float(sel[0]) / float(ref_d[key]) if len(sel) else float(num[0] / den[0]),
                       verdict=SINGLE_RUN, n_aligned=1, ci_over="none (one run)")
            return out
        ci = stats.ratio_interval(sel / float(ref_d[key]))
        over = "repeats (one prompt)"
    out.update(speedup=ci.center, speedup_lo=ci.lo, speedup_hi=ci.hi, verdict=ci.verdict,
               n_aligned=len(common), ci_over=over)
    return out
