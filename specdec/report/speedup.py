"""Speedup statistics: which baseline run each run is divided by, and the ratio with its interval.

**speedup** (dimensionless) = a method's end-to-end tokens/s / our target-only ``baseline`` tokens/s on
the same ``config_label``, target and prompt. The baseline side of each run is the prompt's baseline run
nearest it in time (`nearest_baseline`: the baseline runs bracket a prompt's other runs, and a resumed
sweep can leave them hours apart). Per prompt, each side is the median over its repeats; the ratio of a
group of runs is the median over prompts of those per-prompt ratios, with a 95 % percentile-bootstrap CI
resampling prompts (:func:`specdec.theory.bootstrap_ratio_ci`, ``paired=True``). With a single aligned
prompt the repeats are resampled instead (per-run ratio to that prompt's reference median); with a single
run there is no interval (CI NaN, verdict :data:`~specdec.report.vocab.SINGLE_RUN`).

**verdict**: :func:`specdec.theory.verdict` of that CI: ``"win"`` (CI above 1), ``"loss"`` (CI below 1),
``"no measurable difference"``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec import theory
from specdec.report.vocab import BASELINE, SINGLE_RUN

__all__ = ["PROMPT_KEY", "nearest_baseline", "per_prompt_median", "ratio_ci"]

#: The columns that name one prompt on one runtime and target: the unit speedups are aligned on.
PROMPT_KEY = ["config_label", "target", "prompt_id"]


def nearest_baseline(ok: pd.DataFrame) -> dict[int, int]:
    """run_id -> run_id of the baseline run of the same `PROMPT_KEY` nearest in time.

    Run_id order is insertion order; ties go to the earlier run. A baseline run maps to itself. A
    prompt's baseline runs bracket its other runs; when a sweep was resumed hours later (or the machine
    changed speed) they can be far apart, and the speedup of a run is then measured against the baseline
    taken closest to it rather than against a median that mixes two machine states.
    """
    base = ok[ok["method"] == BASELINE]
    if base.empty or "run_id" not in ok.columns:
        return {}
    ids_by = {k: np.sort(g["run_id"].to_numpy(dtype=np.int64)) for k, g in base.groupby(PROMPT_KEY)}
    out: dict[int, int] = {}
    for r in ok[["run_id", *PROMPT_KEY]].itertuples(index=False):
        ids = ids_by.get((r.config_label, r.target, r.prompt_id))
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
        point, lo, hi = theory.bootstrap_ratio_ci(num, den, paired=True)
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
        point, lo, hi = theory.bootstrap_ci(sel / float(ref_d[key]))
        over = "repeats (one prompt)"
    out.update(speedup=point, speedup_lo=lo, speedup_hi=hi, verdict=theory.verdict(lo, hi),
               n_aligned=len(common), ci_over=over)
    return out
