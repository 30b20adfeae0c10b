"""Choosing one K per round for a batch of B rows, from per-row acceptance estimates and a batch cost curve.

A batched round of K verifies ``B x (K + 1)`` tokens in one target forward and runs K draft steps over the
batch; row i commits ``E(a_i, K) = (1 - a_i^(K+1)) / (1 - a_i)`` tokens in expectation (Leviathan et al.
2023, Thm. 3.8; ``K + 1`` at a_i = 1). `best_batch_k` picks the K maximising committed tokens per second,
``sum_i E(a_i, K) / (target_cost(B (K + 1)) + draft_cost(B, K))``; K = 0 (one plain step per row) wins
whenever no K pays. On a GPU the target's cost is flat in the token count until the batch fills the
device, so K shrinks as B grows; on a CPU it grows almost linearly and speculation rarely pays at any B.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

from specdec.metrics import RoundRecord

__all__ = ["BatchCostPolicy", "BatchKPolicy", "FixedBatchK", "best_batch_k", "expected_committed"]


def expected_committed(alpha: float, k: int) -> float:
    """Expected tokens one row commits in a round of K drafts at per-token acceptance `alpha` (bonus
    included): ``sum_{j=0..K} alpha^j``.

    Raises:
        ValueError: alpha outside [0, 1] or K < 0.
    """
    if not (0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"K must be >= 0, got {k}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def best_batch_k(
    alphas: Sequence[float],
    target_cost: Callable[[int], float],
    *,
    max_k: int,
    draft_cost: Callable[[int, int], float] | None = None,
) -> int:
    """The K in ``0..max_k`` maximising expected committed tokens per second over the batch (ties: smaller K).

    Args:
        alphas: per-row acceptance estimates in [0, 1] (B = ``len(alphas)`` >= 1 rows).
        target_cost: seconds of one target forward over n tokens in total (n = B x (K + 1) here), > 0.
        max_k: largest K considered (>= 0).
        draft_cost: seconds of drafting K tokens for B rows, ``draft_cost(B, K)`` (>= 0; ``draft_cost(B, 0)``
            is taken as 0 whatever it returns). None: free drafting (prompt lookup).

    Returns:
        K; 0 when no K > 0 beats plain decoding (``B / target_cost(B)`` tokens per second).

    Raises:
        ValueError: no rows, an alpha outside [0, 1], max_k < 0, or a cost that is not finite and positive
            (target) / non-negative (draft).
    """
    if not alphas:
        raise ValueError("best_batch_k needs at least one row")
    if max_k < 0:
        raise ValueError(f"max_k must be >= 0, got {max_k}")
    b = len(alphas)
    best_k, best_rate = 0, -1.0
    for k in range(max_k + 1):
        t = float(target_cost(b * (k + 1)))
        if not (math.isfinite(t) and t > 0.0):
            raise ValueError(f"target_cost({b * (k + 1)}) = {t}: must be finite and > 0")
        d = float(draft_cost(b, k)) if (draft_cost is not None and k > 0) else 0.0
        if not (math.isfinite(d) and d >= 0.0):
            raise ValueError(f"draft_cost({b}, {k}) = {d}: must be finite and >= 0")
        rate = sum(expected_committed(float(a), k) for a in alphas) / (t + d)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


class BatchKPolicy(Protocol):
    """Chooses the batch's K each round; rows are the original prompt indices still decoding."""

    def start(self, n_rows: int) -> None:
        """A new batch of `n_rows` rows (forget everything observed)."""
        ...

    def next_k(self, rows: Sequence[int]) -> int:
        """K for this round of the live `rows` (0: a plain step)."""
        ...

    def alpha_estimate(self, rows: Sequence[int]) -> float | None:
        """The mean acceptance estimate over `rows` used for this round's K (None when not estimated)."""
        ...

    def observe(self, row: int, record: RoundRecord) -> None:
        """Row `row` finished a round with `record`."""
        ...


class FixedBatchK:
    """The same K every round.

    Raises:
        ValueError: K < 1.
    """

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        self.k = int(k)

    def start(self, n_rows: int) -> None:
        pass

    def next_k(self, rows) -> int:
        return self.k

    def alpha_estimate(self, rows) -> float | None:
        return None

    def observe(self, row, record) -> None:
        pass


class BatchCostPolicy:
    """K from `best_batch_k` with a decayed per-row acceptance estimate.

    Row i's estimate is ``(w * prior_alpha + S_i) / (w + S_i + F_i)``, where after each of its rounds with
    K > 0 ``S_i <- decay * S_i + accepted`` and ``F_i <- decay * F_i + rejected`` (1 when a rejected
    draft ended the round's output, else 0): the alpha-hat of `specdec.metrics`, decayed. Rounds with K = 0
    carry no evidence, so once the batch's K is 0 it stays 0 for that batch (no probing, unlike
    `specdec.policies.CostPolicy`): a deliberate simplification for a first batch-aware rule.

    Args:
        target_cost: seconds of one target forward over n tokens in total (e.g. a measured
            `specdec.costs.CostCurve`'s ``target`` evaluated at n).
        max_k: largest K (>= 1).
        draft_cost: ``draft_cost(B, K)`` seconds of drafting, None for free drafting.
        prior_alpha, prior_weight, decay: the estimate's prior (in [0, 1]), its weight in pseudo-trials
            (>= 0) and the per-round decay in (0, 1].

    Raises:
        ValueError: a parameter out of range.
    """

    def __init__(self, target_cost: Callable[[int], float], max_k: int = 8, *,
                 draft_cost: Callable[[int, int], float] | None = None, prior_alpha: float = 0.6,
                 prior_weight: float = 2.0, decay: float = 0.8) -> None:
        if int(max_k) < 1:
            raise ValueError(f"max_k must be >= 1, got {max_k}")
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha}")
        if not (math.isfinite(prior_weight) and prior_weight >= 0.0):
            raise ValueError(f"prior_weight must be finite and >= 0, got {prior_weight}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.target_cost = target_cost
        self.draft_cost = draft_cost
        self.max_k = int(max_k)
        self.prior_alpha, self.prior_weight, self.decay = float(prior_alpha), float(prior_weight), float(decay)
        self.start(0)

    def start(self, n_rows: int) -> None:
        self._succ = [0.0] * n_rows
        self._fail = [0.0] * n_rows

    def alpha(self, row: int) -> float:
        """Row `row`'s acceptance estimate in [0, 1]."""
        w = self.prior_weight
        den = w + self._succ[row] + self._fail[row]
        return (w * self.prior_alpha + self._succ[row]) / den if den > 0.0 else self.prior_alpha

    def next_k(self, rows) -> int:
        return best_batch_k([self.alpha(r) for r in rows], self.target_cost, max_k=self.max_k,
                            draft_cost=self.draft_cost)

    def alpha_estimate(self, rows) -> float | None:
        return sum(self.alpha(r) for r in rows) / len(rows) if rows else None

    def observe(self, row, record) -> None:
        if record.k <= 0:
            return
        self._succ[row] = self.decay * self._succ[row] + record.num_accepted
        self._fail[row] = self.decay * self._fail[row] + (1.0 if record.rejected else 0.0)
