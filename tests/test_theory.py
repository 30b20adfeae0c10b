"""Known-answer tests for the analytical speculative-decoding model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specdec.core.metrics import RATES
from specdec.core.theory import (
    break_even_alpha,
    cost_at,
    expected_accepted_per_round,
    expected_tokens_per_round,
    ideal_speedup,
    optimal_k,
    refined_speedup,
)

# ---------------------------------------------------------------------------- expected tokens


def test_expected_tokens_known_value():
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert expected_tokens_per_round(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2, rel=1e-14)


@pytest.mark.parametrize("k", [0, 1, 4, 16])
def test_expected_tokens_limits(k):
    assert expected_tokens_per_round(1.0, k) == k + 1
    assert expected_tokens_per_round(0.0, k) == 1.0
    assert isinstance(expected_tokens_per_round(0.5, k), float)


def test_expected_tokens_k0_is_one():
    assert expected_tokens_per_round(0.37, 0) == 1.0


def test_expected_tokens_continuous_near_one():
    # closed form suffers cancellation there; the value must approach K+1 smoothly
    assert expected_tokens_per_round(1 - 1e-12, 5) == pytest.approx(6.0, abs=1e-9)


def test_expected_tokens_vectorised_matches_scalar():
    alphas = np.array([0.0, 0.25, 0.8, 1.0])
    out = expected_tokens_per_round(alphas, 4)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [expected_tokens_per_round(float(a), 4) for a in alphas], rtol=1e-15)


@pytest.mark.parametrize("bad", [-0.1, 1.1, float("nan")])
def test_expected_tokens_rejects_bad_alpha(bad):
    with pytest.raises(ValueError):
        expected_tokens_per_round(bad, 4)
    with pytest.raises(ValueError):
        expected_tokens_per_round(np.array([0.5, bad]), 4)


def test_rejects_bad_k():
    with pytest.raises(ValueError):
        expected_tokens_per_round(0.5, -1)
    with pytest.raises(TypeError):
        expected_tokens_per_round(0.5, 2.5)


# ---------------------------------------------------------------------------- expected accepted


def test_expected_accepted_known_value():
    assert expected_accepted_per_round(0.8, 4) == pytest.approx(2.3616, abs=1e-12)
    assert expected_accepted_per_round(0.8, 4) == pytest.approx(0.8 * (1 - 0.8**4) / 0.2, rel=1e-14)
    assert expected_accepted_per_round(1.0, 4) == 4.0
    assert expected_accepted_per_round(0.0, 4) == 0.0
    assert expected_accepted_per_round(0.8, 0) == 0.0


def test_expected_accepted_monte_carlo():
    alpha, k, rounds = 0.8, 4, 5000
    rng = np.random.default_rng(1234)
    ok = rng.random((rounds, k)) < alpha
    # accepted drafts = index of the first rejection, or K if none
    accepted = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))
    assert accepted.mean() == pytest.approx(expected_accepted_per_round(alpha, k), abs=0.05)
    # and the count estimator recovers alpha
    rejections = int((~ok.all(axis=1)).sum())
    alpha_hat = RATES["alpha_hat"].of({"num_accepted": int(accepted.sum()), "num_rejections": rejections})
    assert alpha_hat == pytest.approx(alpha, abs=0.02)


# ---------------------------------------------------------------------------- speedups


def test_ideal_speedup_known_value():
    assert ideal_speedup(0.8, 4, 0.46) == pytest.approx(3.3616 / (1 + 4 * 0.46), rel=1e-12)
    assert ideal_speedup(0.3, 0, 0.9) == 1.0


def test_ideal_speedup_rejects_bad_c():
    with pytest.raises(ValueError):
        ideal_speedup(0.5, 2, -0.1)
    with pytest.raises(ValueError):
        ideal_speedup(0.5, 2, float("inf"))


def test_refined_speedup_callable_and_mapping():
    # v == 1 everywhere reduces to the ideal model
    assert refined_speedup(0.8, 4, 0.46, lambda n: 1.0) == pytest.approx(ideal_speedup(0.8, 4, 0.46))
    v = {1: 1.0, 2: 1.1, 5: 1.4}
    assert refined_speedup(0.8, 4, 0.46, v) == pytest.approx(3.3616 / (1.84 + 1.4), rel=1e-12)


def test_cost_interpolation_and_extrapolation():
    v = {1: 1.0, 3: 1.2, 9: 2.4}
    assert cost_at(v, 1) == 1.0
    assert cost_at(v, 2) == pytest.approx(1.1)
    assert cost_at(v, 6) == pytest.approx(1.8)
    # beyond the largest measured n: the least-squares slope of the whole curve (specdec.core.costs' one rule)
    slope = np.polyfit([1, 3, 9], [1.0, 1.2, 2.4], 1)[0]
    assert cost_at(v, 17) == pytest.approx(2.4 + 8 * slope)
    assert cost_at(v, 17) > cost_at(v, 9)  # a longer verification never comes out cheaper
    assert cost_at({2: 1.3}, 1) == pytest.approx(1.3)  # below the smallest measured n: its value


def test_cost_mapping_validation():
    with pytest.raises(ValueError):
        cost_at({}, 2)
    with pytest.raises(ValueError):
        cost_at({1: 0.012, 2: 0.013}, 2)  # seconds, not relative
    with pytest.raises(ValueError):
        cost_at({1: 1.0, 2: -1.0}, 2)
    with pytest.raises(TypeError):
        cost_at(3.0, 2)


# ---------------------------------------------------------------------------- break-even


def test_break_even_hand_solved():
    # K=1, c=0.5, v(2)=1: (1 + a) / 1.5 = 1  ->  a = 0.5
    assert break_even_alpha(1, 0.5, {1: 1.0, 2: 1.0}) == pytest.approx(0.5, abs=1e-9)
    assert break_even_alpha(1, 0.5) == pytest.approx(0.5, abs=1e-9)  # ideal model, same v
    # v(2)=1.5: (1 + a) / 2 = 1  ->  a = 1 exactly
    assert break_even_alpha(1, 0.5, {1: 1.0, 2: 1.5}) == 1.0
    # v(2)=1.6: cannot break even
    assert break_even_alpha(1, 0.5, {1: 1.0, 2: 1.6}) == math.inf
    assert break_even_alpha(1, 0.5, lambda n: 1.6) == math.inf


def test_break_even_is_a_root():
    k, c, v = 4, 0.3, {1: 1.0, 5: 1.25}
    a = break_even_alpha(k, c, v)
    assert 0 < a < 1
    assert refined_speedup(a, k, c, v) >= 1 - 1e-9
    assert refined_speedup(a - 1e-6, k, c, v) < 1


def test_break_even_free_and_k0():
    assert break_even_alpha(2, 0.0) == 0.0  # free draft, free verification
    assert break_even_alpha(0, 0.5) == 0.0  # plain decoding always "breaks even"


def test_break_even_monotone_in_c():
    cs = [0.05, 0.1, 0.2, 0.3, 0.45]
    alphas = [break_even_alpha(3, c, {1: 1.0, 4: 1.1}) for c in cs]
    assert all(a < b for a, b in itertools.pairwise(alphas))


# ---------------------------------------------------------------------------- optimal K


def test_optimal_k_high_alpha_cheap_draft_is_large():
    k, s = optimal_k(0.99, 0.01)
    assert k >= 12
    assert s == pytest.approx(ideal_speedup(0.99, k, 0.01))
    assert s > 5


def test_optimal_k_low_alpha_expensive_draft():
    k, s = optimal_k(0.1, 0.9)
    assert k == 1
    assert s < 1
    assert optimal_k(0.1, 0.9, ks=range(17)) == (0, 1.0)


def test_optimal_k_refined_uses_v():
    # verification cost growing linearly in n pushes the optimum down versus the ideal model
    k_ideal, _ = optimal_k(0.9, 0.05)
    k_ref, _ = optimal_k(0.9, 0.05, v=lambda n: 1.0 + 0.2 * (n - 1))
    assert k_ref < k_ideal


def test_optimal_k_errors():
    with pytest.raises(ValueError):
        optimal_k(0.5, 0.1, ks=[])
    with pytest.raises(ValueError):
        optimal_k(np.array([0.5, 0.6]), 0.1)
