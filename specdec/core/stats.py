"""Intervals for speedups that cover what they claim: the unit of evidence is the prompt, not the run.

A speedup is a ratio of two times, so it is summarized on the log scale: the **unit** of evidence is one
prompt (its pair ratios combined into one geometric mean), and the interval is Student's t-interval on the
units' log ratios, mapped back by exp. Log ratios of timings on a drifting machine are close to normal, and
the t-interval is exact for normal data at any n, unlike a percentile bootstrap of a median over a handful of
units (it covers about 1 - 2 * 0.5^n: 50% at n = 2, 85% at n = 4). Below `MIN_UNITS` units no verdict is
given at all: the interval is still reported, the verdict says "too few units".

`coverage` simulates data with a known answer so the claim can be checked (tests/test_stats.py does, at
n = 5, 8 and 12).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

__all__ = ["MIN_UNITS", "RatioInterval", "coverage", "geometric_mean", "ratio_interval"]

#: Fewest units (prompts) for a win / loss verdict.
MIN_UNITS = 5


@dataclass(frozen=True)
class RatioInterval:
    """A ratio's central value and interval.

    Attributes:
        center: geometric mean of the units' ratios (dimensionless, e.g. 1.23 = 1.23x).
        lo, hi: the interval's ends at `confidence` (NaN with fewer than 2 units).
        n: number of units. confidence: nominal coverage (0.95).
        verdict: "win" (lo > 1), "loss" (hi < 1), "no measurable difference", or "too few units"
            (n < `MIN_UNITS`, whatever the interval).
    """

    center: float
    lo: float
    hi: float
    n: int
    confidence: float
    verdict: str

    def __str__(self) -> str:
        if self.n < 2:
            return f"{self.center:.2f}x (n = {self.n}, {self.verdict})"
        return f"{self.center:.2f}x [{self.lo:.2f}, {self.hi:.2f}] (n = {self.n}, {self.verdict})"


def _logs(ratios: Iterable[float], name: str) -> np.ndarray:
    x = np.asarray([float(r) for r in ratios], dtype=float)
    if x.size and (not np.all(np.isfinite(x)) or np.any(x <= 0)):
        raise ValueError(f"{name} must be finite and > 0")
    return np.log(x)


def geometric_mean(ratios: Iterable[float]) -> float:
    """exp(mean(log r)); NaN for no ratios.

    Raises:
        ValueError: a ratio that is not finite and > 0.
    """
    logs = _logs(ratios, "ratios")
    return float(math.exp(logs.mean())) if logs.size else math.nan


def ratio_interval(ratios: Iterable[float], confidence: float = 0.95) -> RatioInterval:
    """Student's t-interval on log ratios, one ratio per independent unit.

    Args:
        ratios: one ratio per unit (> 0), e.g. each prompt's geometric mean of its pair ratios
            (`specdec.report.speedup.paired_ratio_ci`).
        confidence: nominal two-sided coverage, in (0, 1).

    Returns:
        A `RatioInterval`; with 0 units center is NaN, with 1 unit the interval is NaN.

    Raises:
        ValueError: confidence outside (0, 1), or a ratio that is not finite and > 0.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    logs = _logs(ratios, "ratios")
    n = int(logs.size)
    if n == 0:
        return RatioInterval(math.nan, math.nan, math.nan, 0, confidence, "too few units")
    center = float(math.exp(logs.mean()))
    if n < 2:
        return RatioInterval(center, math.nan, math.nan, n, confidence, "too few units")
    half = float(_st.t.ppf(0.5 + confidence / 2, n - 1)) * float(logs.std(ddof=1)) / math.sqrt(n)
    lo, hi = math.exp(logs.mean() - half), math.exp(logs.mean() + half)
    if n < MIN_UNITS:
        verdict = "too few units"
    elif lo > 1.0:
        verdict = "win"
    elif hi < 1.0:
        verdict = "loss"
    else:
        verdict = "no measurable difference"
    return RatioInterval(center, lo, hi, n, confidence, verdict)


def coverage(
    true_ratio: float, n: int, *, sigma: float = 0.1, trials: int = 4000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """Simulate `trials` studies of `n` units whose log ratios are normal around log(true_ratio) with sd
    `sigma`, and report how often `ratio_interval` covers the truth and how often it says "win".

    Returns:
        ``{"coverage": share of intervals containing true_ratio, "win_rate": share of "win" verdicts}``.

    Raises:
        ValueError: n < 2, trials < 1, or true_ratio <= 0.
    """
    if n < 2 or trials < 1 or true_ratio <= 0:
        raise ValueError("need n >= 2, trials >= 1 and true_ratio > 0")
    rng = np.random.default_rng(seed)
    covered = wins = 0
    for _ in range(trials):
        ci = ratio_interval(np.exp(rng.normal(math.log(true_ratio), sigma, n)), confidence)
        covered += ci.lo <= true_ratio <= ci.hi
        wins += ci.verdict == "win"
    return {"coverage": covered / trials, "win_rate": wins / trials}
