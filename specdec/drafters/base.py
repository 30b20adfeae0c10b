"""Drafters: anything that proposes K tokens for the target to verify.

One small interface (as transformers' candidate generators, with the field's names): `prefill` once per
generation, `propose` each round, `rollback` after each verification. Two real drafters:

- `ModelDrafter`: a smaller causal LM behind a `Backend` (the classic draft model).
- `PromptLookupDrafter`: n-gram matching against the prompt and the text generated so far; no model
  (Saxena 2023, "prompt lookup decoding"; transformers' ``prompt_lookup_num_tokens``; vLLM's ``ngram``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.core.sampling import SamplingParams


@dataclass
class Draft:
    """A proposal: ``tokens`` (length <= K) and, for drafters that sample, ``probs`` ``[len(tokens), vocab]``
    — the warped distributions each token was drawn from (None for deterministic drafters).

    ``stopped``: the draft model stopped on its confidence before K tokens; it then fed its last token
    to decide so (one more draft step than an unstopped round of as many tokens, and its cache holds every
    drafted token: `specdec.engine.traces.draft_pending`).

    ``source``: which of a combining drafter's parts proposed it (the mixed drafter: ``"suffix"``, ``"model"``
    or ``"none"``), recorded per round (`specdec.core.metrics.RoundRecord.draft_source`); None for a drafter
    of one kind."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    stopped: bool = False
    source: str | None = None


def verified(tokens: list[int], committed: list[int], at: int) -> tuple[int, int]:
    """``(accepted, offered)`` of a draft `tokens` proposed at position `at`, read from the committed sequence
    after its round: accepted = the draft's prefix that the committed sequence kept; offered = the draft tokens
    the target judged (accepted + 1 where it rejected the next one; only the accepted where the generation
    ended inside the draft, at an EOS or the budget)."""
    got = committed[at:at + len(tokens)]
    acc = 0
    while acc < len(got) and got[acc] == tokens[acc]:
        acc += 1
    return acc, (min(len(tokens), acc + 1) if at + acc < len(committed) else acc)


class Drafter(Protocol):
    """What the speculative loop needs from a drafter."""

    name: str

    def prefill(self, context: list[int]) -> None:
        """Start a generation; `context` is the prompt minus its last token (the loop's cache invariant)."""
        ...

    def propose(
        self, committed: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None,
        min_confidence: float | None = None,
    ) -> Draft:
        """Propose up to `k` tokens to follow `committed` (prompt + generated, last token included).

        `min_confidence` is this round's confidence stop (`specdec.policies.base.RoundPlan`); drafters without
        probabilities ignore it."""
        ...

    def rollback(self, committed: list[int]) -> None:
        """Called once after each round with the new committed sequence; drop any state past it."""
        ...

    def max_k(self, committed_len: int) -> int:
        """Largest K this drafter can propose without overflowing its own context."""
        ...


class BatchedDrafter(Protocol):
    """What the batched loop needs from a drafter: `specdec.drafters.base.Drafter` for B rows at once."""

    name: str

    def prefill(self, contexts: list[list[int]]) -> None:
        """Start one row per context (the prompt minus its last token)."""
        ...

    def propose(self, committed: list[list[int]], ks: list[int], sampling: SamplingParams,
                generators: list[torch.Generator | None], min_confidence: float | None = None) -> list[Draft]:
        """Up to ``ks[i]`` tokens for row i (``ks[i] == 0``: an empty draft, nothing run for that row);
        sampled drafts draw from ``generators[i]`` only; `min_confidence` is the round's confidence stop
        (`Drafter.propose`)."""
        ...

    def rollback(self, committed: list[list[int]]) -> None:
        """After verification: drop any state past each row's committed sequence."""
        ...

    def keep(self, rows: list[int]) -> None:
        """Keep only rows `rows` (as `BatchedBackend.keep`)."""
        ...

    def max_k(self, committed_lens: list[int]) -> list[int]:
        """Largest K per row that fits the drafter's context (<= 0: the row cannot draft)."""
        ...


class PerRowDrafters:
    """A `BatchedDrafter` made of one single-sequence `Drafter` per row, built by ``factory()``.

    For drafters without a model (`specdec.drafters.ngram.PromptLookupDrafter`, `specdec.drafters.suffix`,
    scripted drafters) nothing is there to batch; a drafter with a model serves one row on its own backend
    (`one`: B = 1, the single-sequence path), and `specdec.drafters.model.BatchedModelDrafter` serves a batch.
    The round's confidence stop goes to every row's drafter.
    """

    def __init__(self, factory: Callable[[], Drafter], *, rows: int | None = None) -> None:
        self.factory = factory
        self.max_rows = rows
        self.drafters: list[Drafter] = []
        sample = factory()
        self.name = sample.name
        #: the drafter caches nothing before its first drafting round (its prefill is priced by the policy)
        self.defers_prefill = bool(getattr(sample, "defers_prefill", False))
        #: drafting costs nothing, so the loop may ask what each row has to draft before choosing K (`preview`)
        self.free = bool(getattr(sample, "free", False))
        # a shorter K proposes a prefix of a longer K's proposal: a preview's drafts serve the round itself
        self._prefix_drafts = bool(getattr(sample, "prefix_drafts", False))
        self._previewed: tuple[list[int], list[int], list[Draft]] | None = None

    @classmethod
    def one(cls, drafter: Drafter) -> PerRowDrafters:
        """`drafter` itself as the one row of a batch of one (any drafter, a model's included)."""
        return cls(lambda: drafter, rows=1)

    def prefill(self, contexts):
        if self.max_rows is not None and len(contexts) > self.max_rows:
            raise ValueError(f"drafter {self.name!r} serves {self.max_rows} row(s), got {len(contexts)}")
        self.drafters = [self.factory() for _ in contexts]
        for d, ctx in zip(self.drafters, contexts, strict=True):
            d.prefill(list(ctx))

    def preview(self, committed: list[list[int]], ks: list[int], sampling: SamplingParams) -> list[int]:
        """For a free drafter (`free`): how many tokens row i would draft at up to ``ks[i]``, before the round's
        K is chosen (`specdec.policies.batch_cost.BatchCostPolicy` prices rows without a match at 1 token). Where shorter
        drafts are prefixes of longer ones the proposals serve this round's `propose`.

        Raises:
            TypeError: the drafter is not free (drafting it would cost a draft forward).
        """
        if not self.free:
            raise TypeError(f"drafter {self.name!r} is not free: its drafts cannot be previewed")
        drafts = [d.propose(c, k, sampling, None) for d, c, k in zip(self.drafters, committed, ks, strict=True)]
        if self._prefix_drafts:
            self._previewed = ([len(c) for c in committed], list(ks), drafts)
        return [len(d.tokens) for d in drafts]

    def propose(self, committed, ks, sampling, generators, min_confidence=None):
        previewed, self._previewed = self._previewed, None
        out = []
        for j, (d, c, k, g) in enumerate(zip(self.drafters, committed, ks, generators, strict=True)):
            if previewed is not None and previewed[0][j] == len(c) and k <= previewed[1][j]:
                out.append(Draft(previewed[2][j].tokens[:max(0, k)], None))
            else:
                out.append(d.propose(c, k, sampling, g, min_confidence))
        return out

    def rollback(self, committed):
        for d, c in zip(self.drafters, committed, strict=True):
            d.rollback(c)

    def keep(self, rows):
        self.drafters = [self.drafters[r] for r in rows]

    def max_k(self, committed_lens):
        return [d.max_k(n) for d, n in zip(self.drafters, committed_lens, strict=True)]
