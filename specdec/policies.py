"""K policies: how many draft tokens to propose in the next round.

The engine calls `start()` once per generation, `next_k()` before every round and `observe(record)` after
it. A policy only *asks*; the engine clamps K to the token budget and to every model's context, and records
both the asked and the used K.
"""

from __future__ import annotations

from typing import Protocol

from specdec.metrics import RoundRecord


class KPolicy(Protocol):
    """Chooses K each round (0 = decode one token plainly this round)."""

    name: str

    def start(self) -> None:
        """Reset per-generation state (no state carries across generations)."""
        ...

    def next_k(self) -> int:
        """K for the next round (>= 0)."""
        ...

    def alpha_estimate(self) -> float | None:
        """The acceptance estimate the last `next_k` used, for the trace (None if it uses none)."""
        ...

    def observe(self, record: RoundRecord) -> None:
        """Learn from the round just finished."""
        ...


class FixedK:
    """Always propose K tokens (the classic setting of Leviathan et al.).

    Raises:
        ValueError: k < 1.
    """

    name = "fixed"

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        self.k = int(k)

    def start(self) -> None:
        pass

    def next_k(self) -> int:
        return self.k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        pass
