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

from specdec.core.metrics import RoundRecord
from specdec.core.theory import expected_tokens_per_round
from specdec.policies.base import RoundPlan

__all__ = ["MAX_BATCH_TOKENS", "BatchKPolicy", "FixedBatchK", "batch_committed", "batch_k_max", "best_batch_k"]


def batch_committed(alphas: Sequence[float], k: int, caps: Sequence[int]) -> float:
    """Expected tokens a round of K commits over the batch when row i drafts ``min(K, caps[i])`` tokens at
    acceptance ``alphas[i]``: ``sum_i E(alphas[i], min(K, caps[i]))`` (`specdec.core.theory.expected_tokens_per_round`)."""
    return sum(expected_tokens_per_round(float(a), min(k, c)) for a, c in zip(alphas, caps, strict=True))


def best_batch_k(
    alphas: Sequence[float],
    target_cost: Callable[[int], float],
    *,
    max_k: int,
    draft_cost: Callable[[int, int], float] | None = None,
    caps: Sequence[int] | None = None,
) -> int:
    """The K in ``0..max_k`` maximising expected committed tokens per second over the batch (ties: smaller K).

    Args:
        alphas: per-row acceptance estimates in [0, 1] (B = ``len(alphas)`` >= 1 rows).
        target_cost: seconds of one target forward over n tokens in total (n = B x (K + 1) here), > 0.
        max_k: largest K considered (>= 0).
        draft_cost: seconds of drafting K tokens for B rows, ``draft_cost(B, K)`` (>= 0; ``draft_cost(B, 0)``
            is taken as 0 whatever it returns). None: free drafting (prompt lookup).
        caps: per row, the most tokens it can draft this round (>= 0; a free drafter's proposal length, known
            before the round); row i drafts ``min(K, caps[i])`` and the round verifies
            ``B x (min(K, max(caps)) + 1)`` tokens (ragged rows padded to the widest). None: no limit.

    Returns:
        K; 0 when no K > 0 beats plain decoding (``B / target_cost(B)`` tokens per second).

    Raises:
        ValueError: no rows, an alpha outside [0, 1], max_k < 0, caps not one non-negative entry per row, or a
            cost that is not finite and positive (target) / non-negative (draft).
    """
    if not alphas:
        raise ValueError("best_batch_k needs at least one row")
    if max_k < 0:
        raise ValueError(f"max_k must be >= 0, got {max_k}")
    b = len(alphas)
    if caps is None:
        caps = [max_k] * b
    elif len(caps) != b or min(caps) < 0:
        raise ValueError(f"caps must hold one count >= 0 per row ({b} rows), got {list(caps)}")
    best_k, best_rate = 0, -1.0
    for k in range(min(max_k, max(caps)) + 1):  # no row drafts past the largest cap: no wider K to price
        t = float(target_cost(b * (k + 1)))
        if not (math.isfinite(t) and t > 0.0):
            raise ValueError(f"target_cost({b * (k + 1)}) = {t}: must be finite and > 0")
        d = float(draft_cost(b, k)) if (draft_cost is not None and k > 0) else 0.0
        if not (math.isfinite(d) and d >= 0.0):
            raise ValueError(f"draft_cost({b}, {k}) = {d}: must be finite and >= 0")
        rate = batch_committed(alphas, k, caps) / (t + d)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k


#: The batch cost policy's default largest K is capped so that a round's verification, B x (K + 1) tokens,
#: stays within this many tokens.
MAX_BATCH_TOKENS = 128


def batch_k_max(rows: int, context: int | None = None) -> int:
    """The batch cost policy's default largest K for batches of `rows` rows: 16, capped so that
    ``rows x (K + 1) <= MAX_BATCH_TOKENS`` (and below `context`, so that one forward of that many tokens can
    be timed), never below 1."""
    cap = MAX_BATCH_TOKENS if context is None else min(MAX_BATCH_TOKENS, int(context) - 1)
    return max(1, min(16, cap // int(rows) - 1))


class BatchKPolicy(Protocol):
    """Chooses the batch's K each round; rows are the original prompt indices still decoding."""

    def start(self, n_rows: int, *, context_lens: Sequence[int] | None = None,
              budgets: Sequence[int] | None = None, timed: bool = False) -> None:
        """A new batch of `n_rows` rows (forget everything observed); `context_lens` are the rows' prompt
        lengths in tokens and `budgets` their new-token budgets (None: unknown); `timed`: the rounds' records
        will carry their wall-clock seconds (the decoding loop; not a replay)."""
        ...

    def next_round(self, rows: Sequence[int], available: Sequence[int] | None = None) -> RoundPlan:
        """What to do this round for the live `rows`: K (0: a plain step) and the draft's confidence stop;
        `available`, where the drafter is free to ask before the round
        (`specdec.drafters.base.PerRowDrafters.preview`), is the most tokens each row (in `rows` order) has to
        draft this round (None: not known)."""
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

    def start(self, n_rows: int, *, context_lens=None, budgets=None, timed=False) -> None:
        pass

    def next_k(self, rows, available=None) -> int:
        return self.k

    def next_round(self, rows, available=None) -> RoundPlan:
        return RoundPlan(self.next_k(rows, available))

    def alpha_estimate(self, rows) -> float | None:
        return None

    def observe(self, row, record) -> None:
        pass
