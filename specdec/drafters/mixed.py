"""The mixed drafter: each round, the suffix drafter's proposal, the draft model's, or no draft, whichever the
measured costs expect to commit the most tokens per second.

The two drafters win on different rounds: the suffix drafter where the output repeats something earlier
(long drafts that cost nothing to make), the draft model where it does not (short drafts paid in draft
steps). Each round prices the three choices on the measured cost curve (`specdec.core.costs.CostCurve`), with
the expected tokens of a round of K drafts at per-token acceptance alpha, E = sum_{i=0..K} alpha^i
(Leviathan et al. 2023, Eq. 1):

- suffix: its own proposal of L tokens (`SuffixDrafter`: the longest earlier repeat, L chosen on the costs)
  at the acceptance it has observed for matches of that length (`SuffixDrafter.proposal_alpha`), for one
  target forward of L + 1 tokens: E(alpha_s, L) / t(L + 1);
- draft model: the best K <= the round's cap at its running acceptance estimate (a Beta posterior over the
  tokens it has had verified, from ``prior_alpha`` with ``prior_weight`` pseudo-counts), for its catch-up
  forward over the committed tokens it has not cached (the deferred prompt, in the first round it drafts,
  and the tokens the suffix drafter's rounds committed), K - 1 draft steps and a target forward of K + 1
  tokens: E(alpha_m, K) / (draft_forward(pending) + (K - 1) draft_step + t(K + 1));
- no draft: one token per target step, 1 / t(1).

Where no K of the draft model can pay at its estimate (a runtime whose verification is steep, as llama.cpp
on a CPU), the draft model is never run and this is the suffix drafter. The choice depends on the committed
text and on what earlier rounds accepted, never on the target's distribution at the positions drafted, and
each round's draft is an ordinary draft of one drafter (the suffix drafter's a deterministic one, the draft
model's with its distributions), so greedy output equals target-only output and sampled output follows the
target's distribution as with either drafter alone.

Both drafters see every round: the suffix drafter catches up on the committed text (and learns only from
its own verified proposals); the draft model's cache keeps a prefix of the committed sequence and is caught
up the next time it drafts (`BatchedModelDrafter.propose`). One sequence is the batch of one row
(`MixedDrafter`).

The draft model enters through one seam, the batched model drafter (`model`): the live drafter fills it with
the draft model's backend, and the acceptance-trace replay with the trace's teacher-forced tokens
(`specdec.drafters.traced.TracedModelDrafter`), so the rounds the report predicts are chosen by this module's
own code (`BatchedMixedDrafter._choose`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdec.core.sampling import SamplingParams
from specdec.core.theory import expected_tokens_per_round
from specdec.drafters.base import Draft, verified
from specdec.drafters.model import BatchedModelDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.runtimes.base import Backend, OneRow

__all__ = ["BatchedMixedDrafter", "MixedDrafter", "MixedStats"]


@dataclass
class MixedStats:
    """Each drafting round's choice in order (``choices``: ``suffix``, ``model`` or ``none``), and the draft
    model's verified tokens (offered, accepted)."""

    choices: list[str] = field(default_factory=list)
    model_offered: int = 0
    model_accepted: int = 0

    @property
    def rounds(self) -> dict[str, int]:
        """Rounds given to each choice."""
        return {kind: self.choices.count(kind) for kind in ("suffix", "model", "none")}


class BatchedMixedDrafter:
    """The mixed drafter for B rows (module docstring); a `specdec.drafters.base.BatchedDrafter`. Each row
    chooses on its own; the rows that choose the draft model draft in one batched call (`BatchedModelDrafter`,
    the others asking it for 0 tokens), each row's suffix drafter proposes for its row.

    Args:
        suffix: builds one suffix drafter per row (priced on the same `cost`).
        model: the draft model's batched drafter (`BatchedModelDrafter`; on `specdec.runtimes.base.OneRow` for
            one sequence), or anything with its interface and its `cached_lens` (the trace replay's
            `specdec.drafters.traced.TracedModelDrafter`).
        cost: the measured costs of one sequence: the target's forward curve and the draft step
            (``draft_step_s``; its forward curve ``draft_forward_s`` prices the catch-up when measured, else
            one step). A row of a batch is priced as one sequence would be; the batch's K policy caps K.
        prior_alpha: the draft model's acceptance before any of its tokens is verified, in [0, 1].
        prior_weight: the prior's weight in pseudo-tokens, >= 0.
        budget: new tokens a row is expected to generate (>= 1): the horizon over which the draft model's
            deferred prefill must pay back.
        invest_margin: how many times its price the deferred prefill must be expected to save (> 0), as the
            cost policy's `invest_margin`.

    Raises:
        ValueError: `cost` without a draft step, a prior, budget or margin out of range.
    """

    name = "mixed"
    #: The draft model's prefill is deferred to the first round it drafts (never, where it cannot pay).
    defers_prefill = True

    def __init__(self, suffix: Callable[[], SuffixDrafter], model: BatchedModelDrafter, cost, *,
                 prior_alpha: float = 0.6, prior_weight: float = 2.0, budget: int = 128,
                 invest_margin: float = 2.0) -> None:
        if cost is None or getattr(cost, "draft_step_s", None) is None:
            raise ValueError("the mixed drafter needs measured costs with the draft model's step (draft_step_s)")
        if not 0.0 <= prior_alpha <= 1.0 or not prior_weight >= 0.0:
            raise ValueError(f"need prior_alpha in [0, 1] and prior_weight >= 0, got {prior_alpha}, {prior_weight}")
        if budget < 1 or not invest_margin > 0.0:
            raise ValueError(f"need budget >= 1 and invest_margin > 0, got {budget}, {invest_margin}")
        self.suffix_factory, self.model, self.cost = suffix, model, cost
        self.prior_alpha, self.prior_weight = float(prior_alpha), float(prior_weight)
        self.budget, self.invest_margin = int(budget), float(invest_margin)
        self._prompt_lens: list[int] = []
        self.suffixes: list[SuffixDrafter] = []
        #: one per row started by `prefill`, kept when rows finish (`keep`); live row i is ``stats[live[i]]``
        self.stats: list[MixedStats] = []
        self.live: list[int] = []
        #: each live row's choice in the latest `propose` (``suffix``, ``model`` or ``none``)
        self.round_choices: list[str] = []
        self._pending: list[tuple[int, list[int]] | None] = []

    def prefill(self, contexts: list[list[int]]) -> None:
        """Start one row per context: its suffix drafter afresh, the draft model's row empty (its prefill
        deferred), its statistics new."""
        self.suffixes = [self.suffix_factory() for _ in contexts]
        for d, ctx in zip(self.suffixes, contexts, strict=True):
            d.prefill(list(ctx))
        self.model.prefill(contexts)
        self._prompt_lens = [len(c) for c in contexts]
        self.stats = [MixedStats() for _ in contexts]
        self.live = list(range(len(contexts)))
        self.round_choices = []
        self._pending = [None] * len(contexts)

    def max_k(self, committed_lens: list[int]) -> list[int]:
        return [d.max_k(n) for d, n in zip(self.suffixes, committed_lens, strict=True)]

    def model_alpha(self, row: int = 0) -> float:
        """Live row `row`'s draft-model acceptance estimate: (prior_weight * prior_alpha + accepted) /
        (prior_weight + offered), over the tokens of its drafts that were verified."""
        s = self.stats[self.live[row]]
        den = self.prior_weight + s.model_offered
        return (self.prior_weight * self.prior_alpha + s.model_accepted) / den if den else 0.0

    def _model_plan(self, row: int, committed_len: int, k: int) -> tuple[int, float, float]:
        """Row `row`'s best draft-model K in 1..k (capped by the draft's context), its tokens per second and
        the seconds its catch-up costs beyond the steady rounds' ((0, 0.0, 0.0) when it cannot draft).

        While the draft model's prefill is deferred (nothing of the row cached), the round's catch-up feeds
        the whole committed sequence: an investment, priced apart (its seconds beyond a one-token catch-up),
        the rate then that of the rounds after it; afterwards the catch-up is the tokens other rounds
        committed, in the rate."""
        k = min(k, self.model.max_k([committed_len])[0])
        cached = self.model.cached_lens[row]
        pending = max(1, committed_len - cached)
        invest = 0.0
        if cached == 0:
            invest = max(0.0, self.cost.draft_forward(pending) - self.cost.draft_forward(1))
            pending = 1
        alpha = min(self.model_alpha(row), 0.999)
        best_k, best = 0, 0.0
        for kk in range(1, k + 1):
            rate = expected_tokens_per_round(alpha, kk) / self.cost.round_s(kk, pending=pending)
            if rate > best:
                best_k, best = kk, rate
        return best_k, best, invest

    def _invest_pays(self, row: int, committed_len: int, model_rate: float, other_rate: float, invest: float) -> bool:
        """Whether the deferred prefill (`invest` seconds) is expected to save `invest_margin` times itself over
        the row's tokens left (`budget` minus those generated): left x (1 / other_rate - 1 / model_rate)."""
        if invest <= 0.0:
            return True
        left = max(0, self.budget - (committed_len - self._prompt_lens[self.live[row]]))
        return left * (1.0 / other_rate - 1.0 / model_rate) >= self.invest_margin * invest

    def _choose(self, row: int, committed: list[int], k: int, sampling: SamplingParams) -> tuple[str, Draft, int]:
        """Row `row`'s choice this round: (``"suffix"``, its draft, 0), (``"model"``, -, K) or (``"none"``, -, 0)."""
        suffix = self.suffixes[row]
        offer = suffix.propose(committed, k, sampling, None)
        if k <= 0:
            return "none", offer, 0
        n = len(offer.tokens)
        plain = 1.0 / self.cost.forward_s(1)
        suffix_rate = expected_tokens_per_round(min(suffix.proposal_alpha, 0.999), n) / self.cost.forward_s(n + 1) if n else 0.0
        model_k, model_rate, invest = self._model_plan(row, len(committed), k)
        other = max(suffix_rate, plain)
        if model_rate > other and self._invest_pays(row, len(committed), model_rate, other, invest):
            suffix.withdraw()
            return "model", offer, model_k
        if n and suffix_rate >= plain:
            return "suffix", offer, 0
        suffix.withdraw()
        return "none", Draft([], None), 0

    def propose(self, committed: list[list[int]], ks: list[int], sampling: SamplingParams,
                generators: list[torch.Generator | None], min_confidence: float | None = None) -> list[Draft]:
        choices = [self._choose(i, c, k, sampling) for i, (c, k) in enumerate(zip(committed, ks, strict=True))]
        self.round_choices = [kind for kind, _, _ in choices]
        model_ks = [mk if kind == "model" else 0 for kind, _, mk in choices]
        model_drafts = self.model.propose(committed, model_ks, sampling, generators, min_confidence)
        out = []
        for i, ((kind, offer, _), md) in enumerate(zip(choices, model_drafts, strict=True)):
            self._pending[i] = (len(committed[i]), list(md.tokens)) if kind == "model" else None
            if ks[i] > 0:
                self.stats[self.live[i]].choices.append(kind)
            d = md if kind == "model" else offer if kind == "suffix" else Draft([], None)
            d.source = kind
            out.append(d)
        return out

    def rollback(self, committed: list[list[int]]) -> None:
        """Every row's drafters drop what the target rejected; a row's verified draft-model tokens update its
        acceptance estimate (a rejection counts where the target decided the next position)."""
        for i, c in enumerate(committed):
            if self._pending[i] is not None:
                acc, offered = verified(self._pending[i][1], c, self._pending[i][0])
                stats = self.stats[self.live[i]]
                stats.model_accepted += acc
                stats.model_offered += offered
                self._pending[i] = None
            self.suffixes[i].rollback(c)
        self.model.rollback(committed)

    def keep(self, rows: list[int]) -> None:
        self.model.keep(rows)
        self.suffixes = [self.suffixes[r] for r in rows]
        self.live = [self.live[r] for r in rows]
        self.round_choices = [self.round_choices[r] for r in rows] if self.round_choices else []
        self._pending = [self._pending[r] for r in rows]


class MixedDrafter:
    """The mixed drafter of one sequence: `BatchedMixedDrafter` with one row, the draft model on its
    single-sequence backend (`specdec.runtimes.base.OneRow`); a `specdec.drafters.base.Drafter`.

    Args:
        suffix: the suffix drafter. model: the draft model's backend. vocab_size: the shared vocabulary.
        cost, prior_alpha, prior_weight: as `BatchedMixedDrafter`.
    """

    name = "mixed"
    defers_prefill = True

    def __init__(self, suffix: SuffixDrafter, model: Backend, vocab_size: int, cost, **prior: float) -> None:
        self.batch = BatchedMixedDrafter(lambda: suffix, BatchedModelDrafter(OneRow(model), vocab_size), cost,
                                         **prior)

    @classmethod
    def on_model_drafter(cls, suffix: SuffixDrafter, model, cost, **prior: float) -> MixedDrafter:
        """The mixed drafter of one sequence whose draft model is `model`, a batched model drafter of one row
        (`BatchedMixedDrafter`'s `model`: the trace replay's `specdec.drafters.traced.TracedModelDrafter`)."""
        self = cls.__new__(cls)
        self.batch = BatchedMixedDrafter(lambda: suffix, model, cost, **prior)
        return self

    @property
    def drafted_by_model(self) -> bool:
        """The latest proposal is the draft model's (the trace replay prices that round as a draft-model
        round, `specdec.engine.traces.ReplayRound.by_model`)."""
        return self.batch.round_choices[:1] == ["model"]

    @property
    def stats(self) -> MixedStats:
        return self.batch.stats[0]

    @property
    def prior_alpha(self) -> float:
        return self.batch.prior_alpha

    def model_alpha(self) -> float:
        return self.batch.model_alpha(0)

    def prefill(self, context: list[int]) -> None:
        self.batch.prefill([context])

    def max_k(self, committed_len: int) -> int:
        return self.batch.max_k([committed_len])[0]

    def propose(self, committed: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None,
                min_confidence: float | None = None) -> Draft:
        return self.batch.propose([committed], [k], sampling, [generator], min_confidence)[0]

    def rollback(self, committed: list[int]) -> None:
        self.batch.rollback([committed])
