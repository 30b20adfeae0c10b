"""The measured costs of a model pair as ONE type, with ONE rule for token counts that were not measured.

`CostCurve` holds what decides whether speculative decoding wins on a machine: the target's forward time
for n tokens appended to a warm cache (``target_forward_s``, n = 1 is the single decoding step), the
draft's single step (``draft_step_s``; None when no draft model was measured) and, when measured, the
draft's forward time for n tokens (``draft_forward_s``): a draft-model round starts with one draft forward
over every committed token the draft has not cached yet (its *catch-up*, `specdec.engine.traces.draft_pending`:
1 token, 2 after an all-accepted round, one more per plain round before it), so a round of K costs
``draft_forward(pending) + (K - 1) x draft_step + target_forward(K + 1)``. Measured on the 2-vCPU AMD EPYC
the 2-token catch-up costs 1.75-1.9 draft steps in fp32 transformers and 2.0 on llama.cpp, 1.0 in bf16
(`results/fp32_all.db`, `results/bf16_all.db`, and `fast.db` in commit c3696a3); pricing every round at K draft steps
had made fp32 and llama.cpp predictions optimistic. The analytical model
(`specdec.core.theory`, through `curve_value`), the cost policy (`specdec.policies.cost.CostPolicy`) and the
sweep's duration estimate (`specdec.bench.estimate`) all evaluate the curve through it, so the report's
prediction, the policy's choice of K and the planner's estimate cannot disagree about what a forward costs.

**The rule** (`curve_value`), for a curve measured at the token counts n_1 < ... < n_m:

- at a measured n: the measured value;
- between two measured points: linear interpolation;
- below n_1: the value at n_1 (only reachable for partial curves; every measured curve has n_1 = 1);
- beyond n_m: the value at n_m plus the least-squares slope of the whole measured curve (seconds, or
  target steps, per extra token; never negative) times (n - n_m); with one measured point the cost grows
  in proportion to n (every token costs what the measured tokens cost on average).

Why this rule: a forward's time grows roughly linearly in n once the matrix products are compute-bound, so
clamping to the last value (the analytical model's old rule) understates every verification past the
measured range and flatters large K; extending the last segment's slope (the policy's old rule) follows
whichever step of the CPU kernels' staircase happens to be last (on the default pair v(16) -> v(17) is
+0.05 target steps while v(15) -> v(16) is -1.1), so one noisy point decides. The least-squares slope
over the whole curve uses every measurement and is the slope the planner has always used. Inside the
measured range the three old rules agreed (linear interpolation), so every figure of the published reports,
whose K + 1 never exceeds the measured 17 tokens, is unchanged.

Serialization: the costs dicts of `specdec.measure.timing.measure_costs`, the JSON cost cache and
`specdec.bench.store.Store.load_costs` (``{"target_forward_s": {n: s}, "draft_step_s": s,
"draft_forward_s": {n: s} | None, ...}``, n keys possibly strings after JSON) are read by
`CostCurve.from_costs`; a calibration block's draft rows are role ``draft`` with their token count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from statistics import median
from typing import Any

__all__ = ["DENSE_MAX_N", "DRAFT_CALIBRATION_NS", "DRAFT_PREFILL_NS", "DRAFT_REPEAT_FACTOR", "DRAFT_ROLE",
           "TARGET_ROLE", "TILE_STEP", "CostCurve", "curve_value", "measured_ns"]

#: The roles of measured forwards in stored costs and calibration blocks.
TARGET_ROLE, DRAFT_ROLE = "target", "draft"

#: The draft is timed this many times as often as the target: its forwards are ~3x cheaper, and with 3
#: samples a few slow ones decided the median (the cost-policy sweep `results/policy.db`, in git at f25c101:
#: draft step 137 ms, IQR 149 ms, while the same sweep's drafting ran at 97-106 ms per token), which made the
#: cost policy think drafting dearer.
DRAFT_REPEAT_FACTOR = 3

#: Draft forwards timed by the calibration block: its single step (n = 1) and its catch-up at a round's
#: start (`specdec.engine.traces.draft_pending`: 2 tokens after an all-accepted round, more after plain rounds;
#: a cost policy's plain stretches leave 20-60; beyond 32 the curve's least-squares slope extends it).
DRAFT_CALIBRATION_NS = (1, 2, 3, 4, 8, 16, 32)

#: Draft forwards of a prompt's size, timed beside the short ones by the sweep's costs and the quick costs:
#: the draft's deferred prefill feeds the whole prompt (50-150 tokens for the built-in prompts), and a
#: bucketed backend's curve is flat up to its largest bucket (a frozen graph of 16 tokens runs 17-64 in
#: chunks), so the slope of 1..16 alone priced a 122-token prefill at a third of its time.
DRAFT_PREFILL_NS = (32, 64)

#: Target forwards are timed at every n up to this many tokens (K = 16), and beyond it at the multiples of
#: `TILE_STEP` and one past each (`measured_ns`).
DENSE_MAX_N = 17
#: CPU kernels run a forward's rows in tiles, so its time past a few tokens rises in steps (llama.cpp, Q4_K_M
#: without repacking on a 2-vCPU Xeon: v(16) 3.4, v(17) 4.5, v(32) 4.9, v(33) 6.0, v(64) 8.0 target steps);
#: timing both ends of every step of 8 lets linear interpolation follow a staircase of 8, 16 or 32.
TILE_STEP = 8


def measured_ns(max_n: int) -> list[int]:
    """The target forward sizes a cost curve is measured at for verifications of up to `max_n` tokens: 1 ..
    `DENSE_MAX_N`, then the multiples of `TILE_STEP` and one past each, and `max_n` itself (n <= max_n).

    Raises:
        ValueError: ``max_n < 1``.
    """
    if int(max_n) < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    max_n = int(max_n)
    tiles = {n for n in range(DENSE_MAX_N + 1, max_n + 1) if n % TILE_STEP in (0, 1)}
    return sorted(set(range(1, min(max_n, DENSE_MAX_N) + 1)) | tiles | {max_n})


def _points(curve: Mapping[Any, Any]) -> list[tuple[int, float]]:
    """Sorted ``(n, value)`` pairs of a ``{n: value}`` mapping (string keys allowed), validated.

    Raises:
        ValueError: empty, a key < 1 or not an integer, or a value that is not finite and > 0.
    """
    if not curve:
        raise ValueError("cost curve is empty: give {n_tokens: cost} with at least one point")
    pts = []
    for key, value in curve.items():
        try:
            n = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"cost curve keys must be token counts, got {key!r}") from None
        if isinstance(key, float) and key != n or n < 1:
            raise ValueError(f"cost curve keys must be integers >= 1, got {key!r}")
        y = float(value)
        if not math.isfinite(y) or y <= 0.0:
            raise ValueError(f"cost curve values must be finite and > 0, got {value!r} at n = {n}")
        pts.append((n, y))
    return sorted(pts)


def _slope(pts: list[tuple[int, float]]) -> float:
    """Least-squares slope (cost per token, >= 0) of the points; one point: its average cost per token."""
    if len(pts) == 1:
        n, y = pts[0]
        return y / n
    mx = sum(n for n, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    num = sum((n - mx) * (y - my) for n, y in pts)
    den = sum((n - mx) ** 2 for n, _ in pts)
    return max(0.0, num / den)


def _value(pts: list[tuple[int, float]], slope: float, n: int) -> float:
    lo_n, lo_y = pts[0]
    if n <= lo_n:
        return lo_y
    hi_n, hi_y = pts[-1]
    if n >= hi_n:
        return hi_y + slope * (n - hi_n)
    for (a, ya), (b, yb) in pairwise(pts):
        if a <= n <= b:
            return ya + (yb - ya) * (n - a) / (b - a)
    raise AssertionError("unreachable: n lies between two measured points")


def curve_value(curve: Mapping[Any, Any], n: int) -> float:
    """The cost of an n-token forward on a measured ``{n: cost}`` curve by the module's one rule.

    Args:
        curve: measured points, ``{n_tokens: cost}`` in any unit (seconds, or target steps v(n)); keys
            may be strings (JSON).
        n: tokens in the forward (>= 1).

    Returns:
        The cost in the curve's unit.

    Raises:
        ValueError: an invalid curve (see `_points`) or n < 1.
    """
    if int(n) < 1:
        raise ValueError(f"a forward has at least one token, got n = {n}")
    pts = _points(curve)
    return _value(pts, _slope(pts), int(n))


@dataclass(frozen=True)
class CostCurve:
    """Measured costs of one pair on one runtime and machine (seconds, warm cache).

    Attributes:
        target_forward_s: ``{n: seconds}`` of one target forward over n new tokens; must hold n = 1.
        draft_step_s: seconds of one draft step (one token), or None (no draft model measured; prompt
            lookup drafts for ~0 s: use `with_draft_step(0.0)`). When None and `draft_forward_s` holds
            n = 1, that value.
        draft_forward_s: ``{n: seconds}`` of one draft forward over n tokens (its catch-up at a round's
            start), or None: not measured, and every catch-up is priced at one draft step (the model before
            the catch-up was measured; optimistic where a 2-token forward costs more than one). A curve of
            the n = 1 point alone counts as not measured.

    Raises:
        ValueError: n = 1 missing, an invalid point (see `curve_value`), or a negative / non-finite
            draft step.
    """

    target_forward_s: Mapping[int, float]
    draft_step_s: float | None = None
    draft_forward_s: Mapping[int, float] | None = None
    _pts: list[tuple[int, float]] = field(init=False, repr=False, compare=False)
    _slope_s: float = field(init=False, repr=False, compare=False)
    _draft_pts: list[tuple[int, float]] | None = field(init=False, repr=False, compare=False)
    _draft_slope_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pts = _points(self.target_forward_s)
        if pts[0][0] != 1:
            raise ValueError("target_forward_s must contain n = 1 (the time of a plain decoding step)")
        dpts = _points(self.draft_forward_s) if self.draft_forward_s else None
        if self.draft_step_s is None and dpts is not None and dpts[0][0] == 1:
            object.__setattr__(self, "draft_step_s", dpts[0][1])
        if self.draft_step_s is not None:
            d = float(self.draft_step_s)
            if not math.isfinite(d) or d < 0.0:
                raise ValueError(f"draft_step_s must be finite and >= 0 seconds, got {self.draft_step_s}")
            object.__setattr__(self, "draft_step_s", d)
        if dpts is not None and [n for n, _ in dpts] == [1]:
            dpts = None  # the step alone says nothing about n > 1: not measured
        if dpts is not None and dpts[0][0] != 1 and self.draft_step_s:
            dpts = [(1, float(self.draft_step_s)), *dpts]  # the step is the curve's n = 1
        object.__setattr__(self, "draft_forward_s", dict(dpts) if dpts is not None else None)
        object.__setattr__(self, "_draft_pts", dpts)
        object.__setattr__(self, "_draft_slope_s", _slope(dpts) if dpts is not None else 0.0)
        object.__setattr__(self, "target_forward_s", dict(pts))
        object.__setattr__(self, "_pts", pts)
        object.__setattr__(self, "_slope_s", _slope(pts))

    @classmethod
    def from_costs(cls, costs: Mapping[str, Any]) -> CostCurve:
        """From a costs dict as `measure_costs`, `Store.load_costs` or the JSON cost cache give it
        (``target_forward_s`` required; ``draft_step_s`` optional; other keys ignored).

        Raises:
            ValueError: ``target_forward_s`` missing or invalid.
        """
        if "target_forward_s" not in costs or not costs["target_forward_s"]:
            raise ValueError("costs lack target_forward_s: measure them with `specdec costs`")
        return cls(costs["target_forward_s"], costs.get("draft_step_s"), costs.get("draft_forward_s") or None)

    @classmethod
    def from_calibration(cls, rows: Iterable[Mapping[str, Any]]) -> CostCurve:
        """From calibration rows (the store's ``calibration`` table, one row per block, role and token count:
        ``role`` ``"target"`` or ``"draft"``, ``n_tokens``, ``seconds``; other roles and keys ignored): the
        median over the rows of each role and n, so several blocks of one prompt give one curve. The target
        rows are the forward curve; the draft's n = 1 row is its step and its rows of n > 1 its catch-up curve
        (`draft_forward_s`; not measured when it has the step alone).

        Raises:
            ValueError: no target row at n = 1, or an invalid time (see `CostCurve`).
        """
        samples: dict[str, dict[int, list[float]]] = {"target": {}, "draft": {}}
        for r in rows:
            if r["role"] in samples:
                samples[r["role"]].setdefault(int(r["n_tokens"]), []).append(float(r["seconds"]))
        target = {n: median(v) for n, v in sorted(samples["target"].items())}
        draft = {n: median(v) for n, v in sorted(samples["draft"].items())}
        if 1 not in target:
            raise ValueError("calibration rows lack the target's single step (role 'target', n_tokens 1)")
        return cls(target, draft.get(1), draft if len(draft) > 1 else None)

    def with_draft_step(self, draft_step_s: float) -> CostCurve:
        """The same target curve with another draft step time (0.0 for prompt lookup) and no draft curve."""
        return CostCurve(self.target_forward_s, draft_step_s)

    def with_draft_forward(self, draft_forward_s: Mapping[int, float] | None) -> CostCurve:
        """The same target curve and draft step with another draft forward curve (None: none)."""
        return CostCurve(self.target_forward_s, self.draft_step_s, draft_forward_s)

    def draft_forward(self, n: int) -> float:
        """Seconds of one draft forward over n >= 1 tokens: the measured draft curve by the module's rule
        when there is one (its n = 1 point, when missing, is the draft step), else one draft step for any n
        (0.0 without a draft step).

        Raises:
            ValueError: n < 1.
        """
        if int(n) < 1:
            raise ValueError(f"a forward has at least one token, got n = {n}")
        step = self.draft_step_s or 0.0
        if self._draft_pts is None or int(n) == 1:
            return step
        return _value(self._draft_pts, self._draft_slope_s, int(n))

    def draft_round_s(self, k: int, pending: int = 1) -> float:
        """Seconds the draft model spends in a round that drafts k tokens: its catch-up forward over the
        `pending` uncached committed tokens (`specdec.engine.traces.draft_pending`; it yields the first draft
        token) and k - 1 single steps; 0.0 when k = 0 (no draft forward at all: the catch-up waits for
        the next drafting round).

        Raises:
            ValueError: k < 0 or pending < 1.
        """
        if k < 0 or pending < 1:
            raise ValueError(f"need k >= 0 and pending >= 1, got k = {k}, pending = {pending}")
        if k == 0:
            return 0.0
        return self.draft_forward(pending) + (k - 1) * (self.draft_step_s or 0.0)

    @property
    def target_step_s(self) -> float:
        """Seconds of one target decoding step (the n = 1 forward)."""
        return self._pts[0][1]

    @property
    def c(self) -> float | None:
        """Leviathan's c = draft step / target step (dimensionless); None without a draft step."""
        return None if self.draft_step_s is None else self.draft_step_s / self.target_step_s

    @property
    def max_n(self) -> int:
        """The largest measured token count."""
        return self._pts[-1][0]

    def forward_s(self, n: int) -> float:
        """Seconds of one target forward over n >= 1 tokens, by the module's rule.

        Raises:
            ValueError: n < 1.
        """
        if int(n) < 1:
            raise ValueError(f"a forward has at least one token, got n = {n}")
        return _value(self._pts, self._slope_s, int(n))

    def v(self, n: int) -> float:
        """v(n) = forward_s(n) / target_step_s: an n-token forward in target steps (v(1) = 1)."""
        return self.forward_s(n) / self.target_step_s

    def relative(self) -> dict[int, float]:
        """The measured points in target steps, ``{n: v(n)}`` with v(1) = 1 exactly."""
        t1 = self.target_step_s
        return {n: (1.0 if n == 1 else s / t1) for n, s in self._pts}

    def round_s(self, k: int, *, draft: bool = True, padded: bool = False, pending: int = 1) -> float:
        """Seconds of one speculative round with K = k: the draft's time (`draft_round_s(k, pending)`, when
        `draft` and a draft step is known) plus one target forward of k + 1 tokens (with `padded`, of
        `padded_n(k + 1)` tokens: the forward the engine runs when it pads verification); k = 0 is one
        plain decoding step."""
        d = self.draft_round_s(k, pending) if draft else 0.0
        return d + (self.padded_value(k + 1) if padded else self.forward_s(k + 1))

    def padded_n(self, n: int, max_n: int | None = None) -> int:
        """The cheapest forward that can hold n tokens: the n' >= n with the smallest cost on the curve.

        Why: on a CPU the forward time is a staircase of the kernels' blocking, not a monotone function of
        n (measured fp32 on a 2-vCPU AMD EPYC, Qwen2.5 1.5B: v(3) = 3.0 target steps, v(5) = 1.9), so
        verifying 3 tokens is faster as a forward of 5: the engine appends filler tokens after the real
        ones and discards their logits rows (`specdec.engine.decoding.speculative_generate`'s `pad_to`). Causal
        attention keeps the real rows' logits what they were.

        Only token counts within the measured range are candidates (n' <= `max_n` of the curve: beyond it
        the extrapolated cost is a guess, never a reason to pad); between measured points the cost is the
        module's linear interpolation, so the cheapest n' is n itself or a measured count. Ties go to the
        smallest n' (no padding when padding gains nothing).

        Args:
            n: real tokens in the forward (>= 1).
            max_n: an upper bound on n' (tokens; e.g. the room left in the target's context); None = none.
                When it is below n, n is returned.

        Returns:
            n' in ``n .. max(n, min(max_n, self.max_n))`` (tokens); n itself when n is at or past the
            largest measured count.

        Raises:
            ValueError: n < 1.
        """
        n = int(n)
        if n < 1:
            raise ValueError(f"a forward has at least one token, got n = {n}")
        hi = self.max_n if max_n is None else min(self.max_n, int(max_n))
        best, best_s = n, self.forward_s(n)
        for m in range(n + 1, hi + 1):
            s = self.forward_s(m)
            if s < best_s:
                best, best_s = m, s
        return best

    def padded_value(self, n: int, max_n: int | None = None) -> float:
        """Seconds of the forward the engine runs for n tokens when it pads: ``forward_s(padded_n(n, max_n))``
        (<= ``forward_s(n)``).

        Raises:
            ValueError: n < 1.
        """
        return self.forward_s(self.padded_n(n, max_n))

    def padded_v(self, n: int) -> float:
        """`padded_value` in target steps: the relative cost v'(n) = padded_value(n) / target_step_s
        (a callable `specdec.core.theory` cost model: ``theory.refined_speedup(alpha, k, c, curve.padded_v)``)."""
        return self.padded_value(n) / self.target_step_s
