"""Analytical model of speculative decoding: expected tokens per round, speedup, break-even and optimal K.

The model follows Leviathan, Kalman & Matias (2023), "Fast Inference from Transformers via
Speculative Decoding", Sec. 3 (Theorem 3.8 and the walltime analysis of Sec. 3.4), which is the same
analysis as Chen et al. (2023), "Accelerating Large Language Model Decoding with Speculative
Sampling".

Terms and units used throughout:

* ``alpha`` -- per-token acceptance probability, dimensionless, in ``[0, 1]``.  The model assumes the
  acceptance of each draft token is an i.i.d. Bernoulli(alpha) trial (Leviathan et al., Sec. 3.1).
* ``k`` -- number of draft tokens proposed per round (Leviathan's gamma), an ``int >= 0``.
* ``c`` -- time of one draft step divided by time of one target single-token step, dimensionless,
  ``>= 0`` (Leviathan's c).
* ``v(n)`` -- time of one target forward over ``n`` new tokens with a warm KV cache, in units of one
  target single-token step, so ``v(1) == 1``.  Verifying ``k`` drafts is one target forward over
  ``n = k + 1`` tokens.  ``v`` may be a callable ``n -> float`` or a mapping ``{n: relative_cost}``
  (see :func:`cost_at`).  Leviathan et al. assume ``v(k + 1) == 1`` (verification is as cheap as one
  step), which is the "ideal" model; measured ``v`` gives the "refined" model.

All "speedup" values are the expected ratio of target-only walltime per token to speculative
walltime per token; ``> 1`` means speculative decoding is predicted to be faster.

Scalars in give Python floats out.  The functions that take ``alpha`` also accept numpy arrays and
are then vectorised elementwise (returning ``numpy.ndarray``); the scalar path uses plain Python
float arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real

import numpy as np

from specdec.core.costs import curve_value

__all__ = [
    "CostModel",
    "break_even_alpha",
    "cost_at",
    "expected_accepted_per_round",
    "expected_tokens_per_round",
    "ideal_speedup",
    "optimal_k",
    "refined_speedup",
]

#: A relative target cost model: a callable ``n -> v(n)`` or a mapping ``{n: v(n)}``.
CostModel = Callable[[int], float] | Mapping[int, float]

_BISECTION_TOL = 1e-9


# --------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------


def _check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    k = int(k)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return k


def _check_c(c: object) -> float:
    if isinstance(c, bool) or not isinstance(c, Real):
        raise TypeError(f"c must be a real number, got {type(c).__name__}")
    c = float(c)
    if not math.isfinite(c) or c < 0.0:
        raise ValueError(f"c must be finite and >= 0, got {c}")
    return c


def _check_alpha(alpha: object) -> float | np.ndarray:
    """Return a Python float for scalar input, a float64 ndarray for array input."""
    if np.ndim(alpha) == 0:
        try:
            a = float(alpha)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}") from exc
        if not (0.0 <= a <= 1.0):  # also rejects NaN
            raise ValueError(f"alpha must be in [0, 1], got {a}")
        return a
    arr = np.asarray(alpha, dtype=float)
    if not np.all((arr >= 0.0) & (arr <= 1.0)):  # also rejects NaN
        raise ValueError("alpha must be in [0, 1] elementwise (no NaN)")
    return arr


def _geometric_sum(a: float | np.ndarray, k: int) -> float | np.ndarray:
    """``1 + a + a^2 + ... + a^k`` by Horner's rule (no cancellation near ``a == 1``; exact ``k+1``
    at ``a == 1`` and exact ``1`` at ``a == 0``)."""
    acc = 1.0 if isinstance(a, float) else np.ones_like(a)
    for _ in range(k):
        acc = 1.0 + a * acc
    return acc


# --------------------------------------------------------------------------------------------------
# the analytical model
# --------------------------------------------------------------------------------------------------


def expected_tokens_per_round(alpha, k):
    """Expected number of tokens produced by one speculative round (accepted drafts plus the one
    token the target always contributes: the correction on rejection, or the bonus token when all
    ``k`` drafts are accepted).

    Formula (Leviathan et al. 2023, Eq. 1 / Theorem 3.8)::

        E[tokens] = (1 - alpha^(k+1)) / (1 - alpha)  =  sum_{i=0..k} alpha^i

    with the limit ``k + 1`` at ``alpha == 1`` and ``1`` at ``alpha == 0`` or ``k == 0``.  Evaluated
    as the geometric sum by Horner's rule, which is accurate near ``alpha == 1``; cost O(k).

    Units: tokens per round.  ``alpha`` may be a scalar (returns ``float``) or an array (returns
    ``ndarray``, elementwise).

    Raises:
        ValueError: ``alpha`` outside ``[0, 1]`` (or NaN), or ``k < 0``.
        TypeError: ``k`` not an integer.
    """
    k = _check_k(k)
    a = _check_alpha(alpha)
    return _geometric_sum(a, k)


def expected_accepted_per_round(alpha, k):
    """Expected number of *draft* tokens accepted per round (excludes the target's bonus /
    correction token).

    Formula (Leviathan et al. 2023, Sec. 3.1; i.i.d. acceptance, stop at the first rejection)::

        E[accepted] = alpha (1 - alpha^k) / (1 - alpha)  =  sum_{i=1..k} alpha^i
                    = expected_tokens_per_round(alpha, k) - 1

    with the limit ``k`` at ``alpha == 1``.  E.g. ``alpha = 0.8, k = 4 -> 2.3616``.

    Units: tokens per round.  Scalar or array ``alpha`` as in :func:`expected_tokens_per_round`.

    Raises:
        ValueError: ``alpha`` outside ``[0, 1]`` (or NaN), or ``k < 0``.
        TypeError: ``k`` not an integer.
    """
    k = _check_k(k)
    a = _check_alpha(alpha)
    if k == 0:
        return 0.0 if isinstance(a, float) else np.zeros_like(a)
    return a * _geometric_sum(a, k - 1)


def ideal_speedup(alpha, k, c):
    """Expected walltime speedup of speculative decoding over target-only decoding, ideal model.

    Formula (Leviathan et al. 2023, Theorem 3.8)::

        speedup = E[tokens per round] / (k c + 1)
                = (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))

    i.e. a round costs ``k`` draft steps (``c`` each) plus one target forward assumed to cost the same
    as a single-token step (``v(k+1) == 1``), and produces ``E[tokens]`` tokens, versus one token per
    target step for the baseline.

    Units: dimensionless ratio (``> 1`` is faster).  ``c`` = draft step time / target step time.
    Scalar or array ``alpha``.

    Raises:
        ValueError: ``alpha`` outside ``[0, 1]``, ``k < 0``, or ``c`` negative / non-finite.
        TypeError: ``k`` not an integer or ``c`` not a real number.
    """
    k = _check_k(k)
    c = _check_c(c)
    return expected_tokens_per_round(alpha, k) / (k * c + 1.0)


def cost_at(v: CostModel, n: int) -> float:
    """Relative target forward cost ``v(n)`` (units of one target single-token step).

    ``v`` is either a callable ``n -> float`` (called as ``v(n)``) or a mapping ``{n: v(n)}`` of
    measured points.  For a mapping, ``v(n)`` follows the one rule of :mod:`specdec.core.costs`
    (:func:`specdec.core.costs.curve_value`): linear interpolation between measured ``n``, the smallest
    measured value below them, and beyond the largest measured ``n`` the least-squares slope of the whole
    curve (the rule the cost policy and the sweep's estimate use too).  A mapping that contains
    ``n == 1`` must have ``v[1] == 1`` (to 1e-6): passing raw seconds is an error; convert them with
    :meth:`specdec.core.costs.CostCurve.relative` first.

    Raises:
        ValueError: empty mapping, non-positive keys, ``v[1] != 1``, or a non-finite or
            non-positive cost.
        TypeError: ``v`` neither callable nor a mapping.
    """
    n = _check_k(n)
    if isinstance(v, Mapping):
        if not v:
            raise ValueError("cost mapping v is empty")
        xs = np.array(sorted(int(key) for key in v), dtype=float)
        if xs[0] < 1:
            raise ValueError("cost mapping keys (token counts n) must be >= 1")
        ys = np.array([float(v[int(x)]) for x in xs], dtype=float)
        if not np.all(np.isfinite(ys)) or np.any(ys <= 0.0):
            raise ValueError("cost mapping values must be finite and > 0")
        if 1 in v and abs(float(v[1]) - 1.0) > 1e-6:
            raise ValueError(
                f"cost mapping must be relative (v[1] == 1), got v[1] = {float(v[1])}; "
                "convert seconds with CostCurve(seconds).relative()"
            )
        value = curve_value(v, n)
    elif callable(v):
        value = float(v(n))
    else:
        raise TypeError(f"v must be a callable or a mapping, got {type(v).__name__}")
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"v({n}) must be finite and > 0, got {value}")
    return value


def refined_speedup(alpha, k, c, v: CostModel):
    """Expected walltime speedup with a measured verification cost.

    Formula (Leviathan et al. 2023, Sec. 3.4, with their "v(k+1) == 1" assumption replaced by the
    measured relative cost of a (k+1)-token target forward)::

        speedup = E[tokens per round] / (k c + v(k + 1))

    ``v`` as in :func:`cost_at` (callable or ``{n: relative_cost}`` mapping, evaluated by the rule of
    :mod:`specdec.core.costs`).  Units: dimensionless ratio.  Scalar or array ``alpha``.

    Raises:
        ValueError: ``alpha`` outside ``[0, 1]``, ``k < 0``, ``c`` negative / non-finite, or an
            invalid ``v`` (see :func:`cost_at`).
        TypeError: ``k`` not an integer, ``c`` not real, ``v`` neither callable nor mapping.
    """
    k = _check_k(k)
    c = _check_c(c)
    return expected_tokens_per_round(alpha, k) / (k * c + cost_at(v, k + 1))


def break_even_alpha(k, c, v: CostModel | None = None) -> float:
    """Smallest ``alpha`` at which the predicted speedup is ``>= 1``.

    Solves ``E[tokens](alpha, k) = k c + v(k + 1)`` (``v(k + 1) = 1`` when ``v is None``, i.e. the ideal
    model of :func:`ideal_speedup`; otherwise the refined model of :func:`refined_speedup`).
    ``E[tokens]`` rises monotonically from 1 at ``alpha = 0`` to ``k + 1`` at ``alpha = 1``, so the root
    is found by bisection to an interval width of 1e-9; the returned value is the upper end of the
    final bracket (the speedup there is ``>= 1`` up to rounding).  Follows Leviathan et al. 2023,
    Sec. 3.4 / Corollary 3.9.

    Returns (dimensionless):
        * ``0.0`` if the cost of a round is ``<= 1`` target step (breaks even at any ``alpha``;
          includes ``k == 0`` with ``v(1) == 1``);
        * ``1.0`` exactly if only perfect acceptance breaks even (``k c + v(k+1) == k + 1``);
        * ``math.inf`` if even ``alpha = 1`` cannot break even (``k c + v(k+1) > k + 1``);
        * otherwise the root in ``(0, 1)``.

    Raises:
        ValueError: ``k < 0``, ``c`` negative / non-finite, or an invalid ``v``.
        TypeError: ``k`` not an integer, ``c`` not real, ``v`` neither callable nor mapping.
    """
    k = _check_k(k)
    c = _check_c(c)
    round_cost = k * c + (1.0 if v is None else cost_at(v, k + 1))
    if round_cost <= 1.0:
        return 0.0
    max_tokens = float(k + 1)
    if round_cost > max_tokens:
        return math.inf
    if round_cost == max_tokens:
        return 1.0
    lo, hi = 0.0, 1.0  # tokens(lo) < round_cost < tokens(hi)
    while hi - lo > _BISECTION_TOL:
        mid = 0.5 * (lo + hi)
        if _geometric_sum(mid, k) >= round_cost:
            hi = mid
        else:
            lo = mid
    return hi


def optimal_k(alpha, c, v: CostModel | None = None, ks: Iterable[int] = range(1, 17)) -> tuple[int, float]:
    """Number of draft tokens ``k`` (among ``ks``) that maximises the predicted speedup.

    Evaluates :func:`ideal_speedup` (``v is None``) or :func:`refined_speedup` for each ``k`` in
    ``ks`` and returns ``(k, speedup)`` for the best one; ties go to the smallest ``k``.  ``k == 0``
    (plain target-only decoding, speedup ``1 / v(1)`` = 1.0) is only considered if ``ks`` contains it,
    so with the default ``ks = range(1, 17)`` the result may have speedup ``< 1``, which means
    speculative decoding is predicted to lose at every ``k``.  Follows Leviathan et al. 2023,
    Sec. 3.4 (their Fig. 3 / Table of optimal gamma).

    ``alpha`` must be a scalar here.  Units: ``k`` in tokens, speedup dimensionless.

    Raises:
        ValueError: ``alpha`` not a scalar in ``[0, 1]``, ``ks`` empty or containing a negative ``k``,
            ``c`` invalid, or an invalid ``v``.
        TypeError: an element of ``ks`` not an integer, ``c`` not real, ``v`` of the wrong type.
    """
    if np.ndim(alpha) != 0:
        raise ValueError("optimal_k takes a scalar alpha")
    a = _check_alpha(alpha)
    c = _check_c(c)
    best: tuple[int, float] | None = None
    for k in ks:
        k = _check_k(k)
        s = ideal_speedup(a, k, c) if v is None else refined_speedup(a, k, c, v)
        if best is None or s > best[1] or (s == best[1] and k < best[0]):
            best = (k, float(s))
    if best is None:
        raise ValueError("ks is empty")
    return best
