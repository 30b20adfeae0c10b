"""Speedup statistics: which baseline runs each run is divided by, and the ratio with its interval.

**speedup** (dimensionless) = a method's end-to-end tokens/s / our target-only ``baseline`` tokens/s on
the same ``config_label``, target, prompt and machine, taken **pair by pair** (`paired_reference`): a run
whose neighbours in the store (run_id - 1 and run_id + 1) are baseline runs of the same prompt and machine
is divided by the geometric mean of those two (the sweep's ``pairing="bracket"`` plan puts a baseline on
each side of every run, so a linear drift of the machine's speed cancels); a run with one such neighbour
is divided by it; a run with none (older stores, a resumed sweep) by the prompt's baseline run nearest it
in time (`nearest_baseline`; a merged sharded store holds runs of several machines, never divided by each
other). Per prompt, the ratio is the geometric mean of its runs' ratios (repeats).

**Interval** (`specdec.core.stats`): the unit is the prompt. A group's ratio is
the geometric mean of its per-prompt ratios with Student's t-interval on their logs (nominal 95 %; its
coverage at n = 5, 8, 12 is a test). With a single aligned prompt the units are its runs (each run's ratio
to the prompt's reference median); with a single run there is no interval (verdict
:data:`~specdec.report.vocab.SINGLE_RUN`).

**verdict**: ``"win"`` (interval above 1), ``"loss"`` (below 1), ``"no measurable difference"``, or
``"too few units"`` below `specdec.core.stats.MIN_UNITS` (5) units, whatever the interval says.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec.core import stats
from specdec.report.vocab import BASELINE, SINGLE_RUN

__all__ = ["PROMPT_KEY", "by_machine", "nearest_baseline", "paired_ratio_ci", "paired_reference",
           "per_prompt_median", "ratio_ci"]

#: The columns that name one prompt on one runtime and target: the unit speedups are aligned on.
PROMPT_KEY = ["config_label", "target", "prompt_id"]


def by_machine(runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`runs` and the key every ratio of timings is taken within: `PROMPT_KEY`, plus ``machine_id`` where
    `runs` has it (a merged or resumed store holds several machines; missing ids read as "", so older
    stores keep one unit per prompt)."""
    if "machine_id" not in runs.columns:
        return runs, list(PROMPT_KEY)
    return runs.assign(machine_id=runs["machine_id"].astype(object).fillna("")), [*PROMPT_KEY, "machine_id"]


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
    ok, keys = by_machine(ok)
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
    """Median tokens/s of `runs` per prompt and machine (`PROMPT_KEY` + ``machine_id`` where present): the
    reference side of `ratio_ci`."""
    runs, unit = by_machine(runs)
    return runs.groupby(unit)["tokens_per_s"].median()


def ratio_ci(runs: pd.DataFrame, ref: pd.Series | dict) -> dict:
    """Speedup of `runs` over per-prompt reference medians `ref` (see the module docstring).

    Runs and references are matched per prompt *and machine* (``machine_id``, where the frame has it; a
    merged or resumed store holds several): a prompt whose two sides were timed on different machines
    has no ratio, since dividing them would measure the machines.

    Args:
        runs: prepared runs (``tokens_per_s``, the `PROMPT_KEY` columns, ``machine_id`` optional).
        ref: reference tokens/s keyed like `per_prompt_median` of the same kind of frame (a Series or a
            dict).

    Returns:
        dict with ``speedup``, ``speedup_lo``, ``speedup_hi``, ``verdict``, ``n_aligned`` (prompts with
        both sides) and ``ci_over`` (what the interval resamples).
    """
    out = {"speedup": np.nan, "speedup_lo": np.nan, "speedup_hi": np.nan, "verdict": "",
           "n_aligned": 0, "ci_over": ""}
    if runs.empty or len(ref) == 0:
        return out
    runs, unit = by_machine(runs)
    per_prompt = runs.groupby(unit)["tokens_per_s"].median().to_dict()
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
        for col, val in zip(unit, key, strict=True):
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


def paired_reference(ok: pd.DataFrame, col: str = "tokens_per_s") -> tuple[dict[int, float], dict[int, int]]:
    """Per run: the baseline value of `col` it is divided by, and how many adjacent baselines gave it.

    Args:
        ok: prepared successful runs (``run_id``, `PROMPT_KEY`, ``method``, `col`; ``machine_id`` optional).
        col: the rate to pair (``tokens_per_s``, or a decode rate the caller added).

    Returns:
        ``(ref, n_adjacent)``: run_id -> reference value (geometric mean of the adjacent baselines' `col`, or
        the nearest baseline's when none is adjacent) and run_id -> 2, 1 or 0 adjacent baselines. Baseline
        runs map to their own value. Runs whose baselines lack `col` are left out.
    """
    if ok.empty or "run_id" not in ok.columns:
        return {}, {}
    df, keys = by_machine(ok)
    val = dict(zip(df["run_id"].astype(int), pd.to_numeric(df[col], errors="coerce"), strict=True))
    base_key = {int(r.run_id): tuple(getattr(r, k) for k in keys)
                for r in df[df["method"] == BASELINE][["run_id", *keys]].itertuples(index=False)}
    near = nearest_baseline(ok)
    ref: dict[int, float] = {}
    adj: dict[int, int] = {}
    for r in df[["run_id", "method", *keys]].itertuples(index=False):
        rid = int(r.run_id)
        if r.method == BASELINE:
            if np.isfinite(val.get(rid, np.nan)):
                ref[rid], adj[rid] = val[rid], 0
            continue
        key = tuple(getattr(r, k) for k in keys)
        sides = [val[b] for b in (rid - 1, rid + 1) if base_key.get(b) == key and np.isfinite(val.get(b, np.nan))
                 and val[b] > 0]
        if sides:
            ref[rid], adj[rid] = float(np.exp(np.mean(np.log(sides)))), len(sides)
        elif rid in near and np.isfinite(val.get(near[rid], np.nan)) and val[near[rid]] > 0:
            ref[rid], adj[rid] = float(val[near[rid]]), 0
    return ref, adj


def paired_ratio_ci(runs: pd.DataFrame, ref: dict[int, float], col: str = "tokens_per_s") -> dict:
    """Speedup of `runs` from per-run ratios ``col / ref[run_id]`` (`paired_reference`), with its interval.

    Per prompt: the geometric mean of its runs' ratios. Two or more prompts: the interval is over prompts
    (`specdec.core.stats.ratio_interval`); one prompt with two or more runs: over its runs; one run: a point.

    Returns:
        dict with ``speedup``, ``speedup_lo``, ``speedup_hi``, ``verdict``, ``n_aligned`` (prompts with a
        ratio) and ``ci_over``.
    """
    out = {"speedup": np.nan, "speedup_lo": np.nan, "speedup_hi": np.nan, "verdict": "",
           "n_aligned": 0, "ci_over": ""}
    if runs.empty:
        return out
    r = runs.assign(_ref=runs["run_id"].map(lambda i: ref.get(int(i), np.nan)),
                    _val=pd.to_numeric(runs[col], errors="coerce"))
    r = r[np.isfinite(r["_ref"]) & np.isfinite(r["_val"]) & (r["_val"] > 0) & (r["_ref"] > 0)]
    if r.empty:
        return out
    r = r.assign(_log=np.log(r["_val"] / r["_ref"]))
    per_prompt = np.exp(r.groupby(PROMPT_KEY)["_log"].mean().to_numpy(float))
    if len(per_prompt) >= 2:
        ci, over = stats.ratio_interval(per_prompt), "prompts"
    elif len(r) >= 2:
        ci, over = stats.ratio_interval(np.exp(r["_log"].to_numpy(float))), "repeats (one prompt)"
    else:
        out.update(speedup=float(per_prompt[0]), verdict=SINGLE_RUN, n_aligned=1, ci_over="none (one run)")
        return out
    out.update(speedup=ci.center, speedup_lo=ci.lo, speedup_hi=ci.hi, verdict=ci.verdict,
               n_aligned=len(per_prompt), ci_over=over)
    return out
