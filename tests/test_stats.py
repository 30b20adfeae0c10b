"""Intervals that mean what they say: t-intervals on log ratios over units, no verdict
below 5 units, and simulated coverage at n = 5, 8, 12."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec.core import stats


@pytest.mark.parametrize("n", [5, 8, 12])
def test_nominal_95_percent_intervals_cover_at_least_90_percent(n):
    for true in (0.8, 1.0, 1.5):
        sim = stats.coverage(true, n, sigma=0.1, trials=3000, seed=n)
        assert sim["coverage"] >= 0.90, (true, n, sim)


@pytest.mark.parametrize("n", [5, 8, 12])
def test_false_win_rate_is_at_most_5_percent_when_there_is_no_speedup(n):
    sim = stats.coverage(1.0, n, sigma=0.1, trials=3000, seed=100 + n)
    assert sim["win_rate"] <= 0.05, sim
    assert stats.coverage(1.25, n, sigma=0.1, trials=500, seed=7)["win_rate"] > 0.9  # power where it is real


def test_negative_control_a_percentile_bootstrap_of_a_median_over_3_units_undercovers():
    """The method this replaces: covers ~75% at n = 3, so the simulation can tell a bad interval apart."""
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(1000):
        x = np.exp(rng.normal(0.0, 0.1, 3))
        boots = np.median(rng.choice(x, size=(500, 3)), axis=1)
        lo, hi = np.quantile(boots, [0.025, 0.975])
        covered += lo <= 1.0 <= hi
    assert covered / 1000 < 0.85


def test_interval_by_hand():
    """Log ratios 0, ln 1.1, ln 1.2, ln 1.3, ln 1.4 around their mean, t(0.975, 4) = 2.776."""
    r = [1.0, 1.1, 1.2, 1.3, 1.4]
    logs = np.log(r)
    half = 2.7764451051977987 * logs.std(ddof=1) / math.sqrt(5)
    ci = stats.ratio_interval(r)
    assert ci.center == pytest.approx(math.exp(logs.mean()))
    assert (ci.lo, ci.hi) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert ci.n == 5 and ci.verdict == "win" and ci.lo > 1.0


def test_no_verdict_below_five_units():
    assert stats.ratio_interval([1.5, 1.6, 1.55, 1.52]).verdict == "too few units"
    assert stats.ratio_interval([0.6, 0.61, 0.62, 0.6, 0.59]).verdict == "loss"
    assert stats.ratio_interval([0.9, 1.1, 1.0, 0.95, 1.05]).verdict == "no measurable difference"
    one = stats.ratio_interval([1.4])
    assert one.center == pytest.approx(1.4) and math.isnan(one.lo) and one.verdict == "too few units"
    assert math.isnan(stats.ratio_interval([]).center)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="finite and > 0"):
        stats.ratio_interval([1.0, 0.0])
    with pytest.raises(ValueError, match="confidence"):
        stats.ratio_interval([1.0, 1.1], confidence=1.0)
