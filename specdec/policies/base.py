"""K policies: how many draft tokens to propose in the next round.

The engine calls `start(prefill_tokens=, budget=)` once per generation (the draft's deferred prefill and the
new tokens asked for), `next_round()` before every round and `observe(record)` after it. `next_round()`
returns what to do: a `RoundPlan` (K, and the draft's confidence stop for this round, which the engine passes
to ``drafter.propose``); a policy holds no state in the drafter. A policy
only *asks*; the engine clamps K to the token budget and to every model's context, and records both the
asked (``RoundRecord.k_requested``) and the used (``RoundRecord.k``) K, plus `alpha_estimate()`.

Policies (built by name by `specdec.catalogue.policies.make_policy`):

- ``fixed`` (`FixedK`): always K (Leviathan et al. 2023; Chen et al. 2023).
- ``heuristic`` (`HeuristicK`): K += 2 after a fully accepted round, K -= 1 otherwise (K >= 1), restarted
  from its initial K on every generation: transformers' ``AssistedCandidateGenerator`` schedule
  ``"heuristic_transient"``.
- ``confidence`` (`ConfidenceK`): asks for its max K every round and lets the draft model stop early when
  its top-token probability falls below a threshold (llama.cpp ``--draft-p-min``; transformers'
  ``assistant_confidence_threshold``): its `RoundPlan` carries the threshold, and `ModelDrafter.propose`
  stops there (a drafter without probabilities, prompt lookup, ignores it).
- ``cost`` (`CostPolicy`, ours): picks the K in 0..max_k that maximises expected tokens per second under the
  analytical model of Leviathan et al. 2023 (Sec. 3.4; `specdec.core.theory.refined_speedup`) with the measured
  draft step time and target verification cost curve, using a decayed running estimate of alpha; K = 0
  decodes plainly and is left again by periodic probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from specdec.core.metrics import RoundRecord


class KPolicy(Protocol):
    """Chooses K each round (0 = decode one token plainly this round)."""

    name: str

    def start(self, prefill_tokens: int | None = None, budget: int | None = None) -> None:
        """Reset per-generation state (no state carries across generations). `prefill_tokens`: the tokens the
        draft's deferred prefill will feed in its first drafting round (`ModelDrafter.defers_prefill`; None
        when the drafter has none to pay); `budget`: the new tokens asked for (None: unknown). Policies that
        do not price rounds ignore both."""
        ...

    def next_round(self) -> RoundPlan:
        """What to do in the next round: K (>= 0) and the draft's confidence stop (None: none)."""
        ...

    def next_k(self) -> int:
        """K for the next round (>= 0): `next_round`'s K, advancing the policy's state the same way."""
        ...

    def alpha_estimate(self) -> float | None:
        """The acceptance estimate the last `next_k` used, for the trace (None if it uses none)."""
        ...

    def observe(self, record: RoundRecord) -> None:
        """Learn from the round just finished."""
        ...


def check_k(k: object, what: str = "K") -> int:
    if isinstance(k, bool) or int(k) != k or int(k) < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {k!r}")
    return int(k)


@dataclass(frozen=True)
class RoundPlan:
    """A policy's decision for one round.

    Attributes:
        k: draft tokens asked for (0 = one plain decoding step).
        min_confidence: the draft's confidence stop for this round (llama.cpp ``--draft-p-min``): before
            drafting token i >= 2 the draft stops when its top probability is below this; None = no stop.
    """

    k: int
    min_confidence: float | None = None


class KOnly:
    """For policies that only choose K: the round plan is K with no confidence stop."""

    def next_round(self) -> RoundPlan:
        return RoundPlan(self.next_k())  # type: ignore[attr-defined]


class FixedK(KOnly):
    """Always propose K tokens (the classic setting of Leviathan et al.).

    Raises:
        ValueError: k < 1.
    """

    name = "fixed"

    def __init__(self, k: int) -> None:
        if int(k) < 1:
            raise ValueError(f"K must be >= 1, got {k}")
        self.k = int(k)

    def start(self, prefill_tokens: int | None = None, budget: int | None = None) -> None:
        pass

    def next_k(self) -> int:
        return self.k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        pass



class HeuristicK(KOnly):
    """transformers' ``"heuristic_transient"`` schedule (``AssistedCandidateGenerator.update_candidate_strategy``).

    After a round whose every proposed draft token was accepted, K += 2; after a round with a rejection,
    K = max(1, K - 1). A round in which nothing was proposed (K clamped to 0, or a prompt-lookup miss) carries
    no evidence and leaves K unchanged. `start()` restores the initial K: nothing carries across generations
    ("transient"; transformers' plain ``"heuristic"`` would keep K between calls).

    Args:
        k: initial K (tokens, >= 1); also the K after every `start()`.
        max_k: optional cap (tokens, >= k); None = no cap of its own (the engine still clamps K to the
            budget and the context).

    Raises:
        ValueError: k < 1 or max_k < k.
    """

    name = "heuristic"

    def __init__(self, k: int, max_k: int | None = None) -> None:
        self.initial_k = check_k(k)
        self.max_k = None if max_k is None else check_k(max_k, "max_k")
        if self.max_k is not None and self.max_k < self.initial_k:
            raise ValueError(f"max_k ({self.max_k}) must be >= the initial K ({self.initial_k})")
        self.k = self.initial_k

    def start(self, prefill_tokens: int | None = None, budget: int | None = None) -> None:
        self.k = self.initial_k

    def next_k(self) -> int:
        return self.k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        if record.k <= 0:
            return
        if record.num_accepted >= record.k:
            self.k += 2
            if self.max_k is not None:
                self.k = min(self.k, self.max_k)
        else:
            self.k = max(1, self.k - 1)



class ConfidenceK:
    """Ask for `max_k` every round; the draft stops early when its top-token probability is below a threshold.

    Every `RoundPlan` carries the threshold; drafters that have probabilities stop on it
    (`ModelDrafter.propose`): before drafting token i >= 1, if max q_i < `confidence_threshold` the round
    ends with i tokens (always at least one). Sources: llama.cpp ``common_speculative_gen_draft``
    (``p_min``, default 0.75 in ``speculative-simple``) and transformers' ``assistant_confidence_threshold``
    (default 0.4). For a drafter without probabilities (prompt lookup) this is `FixedK(max_k)`.

    Args:
        max_k: K asked for every round (tokens, >= 1).
        confidence_threshold: probability threshold (>= 0; 0 never stops, > 1 always stops after one token).

    Raises:
        ValueError: max_k < 1 or a negative / non-finite threshold.
    """

    name = "confidence"

    def __init__(self, max_k: int, confidence_threshold: float = 0.4) -> None:
        self.max_k = check_k(max_k, "max_k")
        t = float(confidence_threshold)
        if not math.isfinite(t) or t < 0.0:
            raise ValueError(f"confidence_threshold must be finite and >= 0, got {confidence_threshold}")
        self.confidence_threshold = t

    def start(self, prefill_tokens: int | None = None, budget: int | None = None) -> None:
        pass

    def next_k(self) -> int:
        return self.max_k

    def alpha_estimate(self) -> float | None:
        return None

    def observe(self, record: RoundRecord) -> None:
        pass

    def next_round(self) -> RoundPlan:
        return RoundPlan(self.max_k, self.confidence_threshold)
