"""The time model that prices an acceptance trace's replayed rounds with a measured cost curve.

Under greedy decoding the rounds of every K and policy follow from one target-only run and one
teacher-forced draft pass (`specdec.engine.traces.replay`); the hardware enters only through the costs. For a
replayed round that drafted k tokens (the realized k: a drafter without a model may draft fewer, or none):

    round_s(k) = draft_s(k) + F(k + 1) + o_spec        target-only step = F(1) + o_base

F = the target's forward time of n tokens (`specdec.core.costs.CostCurve.forward_s`; with padded verification the
cheapest measured shape >= n, `CostCurve.padded_value`); draft_s(k) for the draft model = its catch-up
forward over the round's pending tokens plus k - 1 draft steps (`CostCurve.draft_round_s`,
`specdec.engine.traces.draft_pending`), for a model-free drafter a constant per round; a drafter that chooses
per round whether to draft with the model (the mixed drafter) has each round priced by the drafter that drafted
it (`specdec.engine.traces.ReplayRound.by_model`), its draft-model rounds' catch-up counting the tokens its other
rounds committed; o_spec and o_base = the
per-round overheads outside the forward (0 when unknown, e.g. inside a sweep before any timed run). The
predicted decode speedup is T x (F(1) + o_base) / sum(round_s), T = the output's tokens. The report uses
this model with overheads measured in the store (`specdec.report.predicted`); the sweep uses it to choose,
per prompt, the fixed K its trace predicts fastest (`TraceModel.best_fixed_k`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specdec.core.costs import CostCurve
    from specdec.core.metrics import RoundRecord
    from specdec.engine.sampled_traces import ExpectedRun
    from specdec.engine.traces import AcceptanceTrace, ReplayRound

__all__ = ["POLICY_DRAWS", "TraceModel"]

#: Simulated runs averaged for a K policy's expected run over a sampled trace (`TraceModel.expected_policy`).
POLICY_DRAWS = 32


class TraceModel:
    """One prompt's acceptance trace and cost curve: replays and their predicted times.

    Args:
        trace: the `specdec.engine.traces.AcceptanceTrace`, or a sampled trace
            (`specdec.engine.sampled_traces.SampledTrace`: priced in expectation, `expected`).
        curve: the `CostCurve` the rounds are priced with (None: every time is NaN).
        o_base, o_spec: per-round overheads in seconds (module docstring). ngram_draft_s: seconds a
            model-free drafter spends per round.
        ngram: the prompt-lookup n-gram sizes (max, min). draft_context: the draft model's context length.
        padded: verification is padded to the cheapest measured shape.
    """

    def __init__(self, trace: AcceptanceTrace | None, curve: CostCurve | None, *, o_base: float = 0.0,
                 o_spec: float = 0.0, ngram_draft_s: float = 0.0, ngram: tuple[int, int] = (3, 1),
                 draft_context: int | None = None, padded: bool = False) -> None:
        self.trace, self.curve = trace, curve
        self.o_base, self.o_spec, self.ngram_draft_s = o_base, o_spec, ngram_draft_s
        self.ngram, self.draft_context, self.padded = ngram, draft_context, padded

    def drafter(self, method: str):
        """What the replay drives for drafter `method` (`specdec.catalogue.drafters.replay_drafter`): None for
        the draft model (replayed from the trace's draft tokens), else a fresh row drafter (model-free, or with
        its draft model read from this trace).

        Raises:
            ValueError: a drafter no trace records (or one that needs this trace's draft tokens, or costs, that
                are missing).
        """
        from specdec.catalogue.drafters import replay_drafter

        return replay_drafter(method, costs=self.curve, ngram=self.ngram, trace=self.trace,
                              draft_context=self.draft_context)

    def _from_trace(self, method: str) -> bool:
        """Whether `method`'s rounds come from the trace's draft tokens (a drafter with a model; a round's
        own `ReplayRound.by_model`, where set, says which drafted it)."""
        from specdec.catalogue.drafters import drafter

        return drafter(method).needs_model

    def rounds(self, method: str, k: int, policy: str | None = "fixed",
               clock: Sequence[RoundRecord] | None = None) -> list[ReplayRound]:
        """The replayed rounds of `method` at fixed K or with an adaptive `policy` (K = its maximum); `clock`:
        a timed run's rounds whose seconds the policy is fed while the replay agrees with them
        (`specdec.engine.traces.replay`; None: the priced form, what a prediction uses).

        Raises:
            ValueError: a draft-model replay on a trace without draft tokens; the cost policy without costs.
        """
        from specdec.catalogue.drafters import drafter as drafter_entry
        from specdec.catalogue.policies import make_policy
        from specdec.catalogue.policies import policy as policy_entry
        from specdec.engine.traces import replay

        model = self._from_trace(method)
        if model and self.trace.draft_ids is None:
            raise ValueError("no draft tokens in this trace")
        if policy in (None, "fixed"):
            return replay(self.trace, k=k, drafter=self.drafter(method), draft_context=self.draft_context)
        if policy_entry(policy).needs_costs and self.curve is None:
            raise ValueError(f"the {policy} policy needs measured costs")
        # as the sweep builds it (`specdec.bench.methods`): a drafter that chooses its own length prices none
        pol = make_policy(policy, k, costs=self.curve, pad_verify=self.padded,
                          free_drafts=drafter_entry(method).k_is_cap)
        return replay(self.trace, policy=pol, drafter=self.drafter(method), draft_context=self.draft_context,
                      clock=clock)

    def decode_s(self, method: str, rounds: Sequence[ReplayRound]) -> float:
        """Predicted decode seconds of `rounds` (module docstring); NaN without costs."""
        from specdec.engine.traces import draft_pending

        if self.curve is None:
            return math.nan
        total = 0.0
        model = self._from_trace(method)
        pending = draft_pending(rounds) if model else [1] * len(rounds)
        for r, p in zip(rounds, pending, strict=True):
            by_model = model if getattr(r, "by_model", None) is None else r.by_model
            draft = self.curve.draft_round_s(r.k, p) if by_model else self.ngram_draft_s
            verify = self.curve.padded_value(r.k + 1) if self.padded else self.curve.forward_s(r.k + 1)
            total += draft + verify + self.o_spec
        return total

    def baseline_decode_s(self) -> float:
        """Predicted target-only decode seconds: T x (F(1) + o_base); NaN without costs."""
        if self.curve is None:
            return math.nan
        return len(self.trace.target_ids) * (self.curve.forward_s(1) + self.o_base)

    def speedup(self, method: str, rounds: Sequence[ReplayRound]) -> float:
        """Predicted decode speedup of `rounds` over target-only decoding (NaN without costs)."""
        d = self.decode_s(method, rounds)
        return self.baseline_decode_s() / d if d and math.isfinite(d) and d > 0 else math.nan

    @property
    def sampled(self) -> bool:
        """The trace is a sampled one (`specdec.engine.sampled_traces.SampledTrace`): its K are priced in
        expectation (`expected`), no rounds are replayed."""
        return getattr(self.trace, "sampling", None) is not None

    def expected(self, method: str, k: int) -> tuple[ExpectedRun, float]:
        """A sampled trace's expected fixed-K run of `method` (`specdec.engine.sampled_traces.expected_run`)
        and its predicted decode speedup: a round that drafted kk tokens costs F(kk + 1) + o_spec plus, for
        the draft model, kk draft steps (its catch-up priced at one step: an expectation has no round
        history), for a model-free drafter its per-round seconds. A drafter that chooses per round between the
        draft model and a model-free one has no closed form: the mean of `POLICY_DRAWS` simulated runs at
        fixed K (`simulated`).

        Raises:
            ValueError: a drafter no sampled trace replays or this one did not record.
        """
        from specdec.engine.sampled_traces import DRAFT_MODEL, expected_run

        entry = self._sampled_entry(method)
        if entry.sampled_replay == "drafter+overlap":
            return self.simulated(method, "fixed", k)
        model = entry.sampled_replay == "overlap"
        curve = self.curve

        def round_s(kk: int) -> float:
            draft = curve.draft_round_s(kk) if model else self.ngram_draft_s
            return draft + (curve.padded_value(kk + 1) if self.padded else curve.forward_s(kk + 1)) + self.o_spec

        try:
            run = expected_run(self.trace, DRAFT_MODEL if model else entry.name, int(k),
                               round_s if curve is not None else None)
        except KeyError as e:
            raise ValueError(f"the sampled trace holds no record of drafter {method!r}: {e.args[0]}") from None
        base = self.baseline_decode_s()
        return run, base / run.decode_s if run.decode_s > 0 and math.isfinite(base) else math.nan

    def _sampled_entry(self, method: str):
        """`method`'s `specdec.catalogue.drafters.DrafterEntry`, which a sampled trace replays (ValueError when
        its `sampled_replay` is None)."""
        from specdec.catalogue.drafters import drafter

        entry = drafter(method)
        if entry.sampled_replay is None:
            raise ValueError(f"no sampled replay for drafter {method!r}: choose K with --ks under sampling")
        return entry

    def records(self, method: str) -> bool:
        """Whether this sampled trace holds what `method`'s sampled replay reads: the draft model's overlap
        (``"overlap"``), the drafter's chain (``"chain"``), or both the overlap and its `DrafterEntry.chain`'s
        chain (``"drafter+overlap"``); False for a drafter no sampled trace replays."""
        from specdec.catalogue.drafters import drafter

        entry, overlap, chains = drafter(method), self.trace.overlap is not None, self.trace.chains
        return {"overlap": overlap, "chain": entry.name in chains,
                "drafter+overlap": overlap and entry.chain in chains}.get(entry.sampled_replay or "", False)

    def expected_policy(self, method: str, policy: str, k: int, draws: int = POLICY_DRAWS, seed: int = 0
                        ) -> tuple[float, float, float]:
        """`simulated`'s run of `method` under adaptive K `policy` (largest K `k`) as the mean tokens per target
        forward, the mean drafted tokens per drafting round and the predicted decode speedup."""
        run, speedup = self.simulated(method, policy, k, draws, seed)
        return run.block_efficiency, run.drafted / run.drafting_rounds if run.drafting_rounds else 0.0, speedup

    def simulated(self, method: str, policy: str, k: int, draws: int = POLICY_DRAWS, seed: int = 0
                  ) -> tuple[ExpectedRun, float]:
        """A sampled trace's run of `method` under K `policy` at K `k` (its largest K), averaged over `draws`
        simulated runs (`specdec.engine.sampled_traces.simulate_run`, seeded by `seed`; the policy built as
        `rounds` builds it; a ``"drafter+overlap"`` drafter driven live on the trace, `replay_drafter`): the
        mean run (rounds, drafted, accepted, priced seconds as `decode_s` prices replayed rounds, drafting
        rounds) and the predicted decode speedup (target-only seconds over the mean priced seconds).

        Raises:
            ValueError: a drafter no sampled trace replays or this one did not record; the cost policy without
                costs; draws < 1.
        """
        import random

        from specdec.catalogue.drafters import replay_drafter
        from specdec.catalogue.policies import make_policy
        from specdec.catalogue.policies import policy as policy_entry
        from specdec.engine.sampled_traces import DRAFT_MODEL, ExpectedRun, simulate_run

        entry = self._sampled_entry(method)
        kind = entry.sampled_replay
        if policy_entry(policy).needs_costs and self.curve is None:
            raise ValueError(f"the {policy} policy needs measured costs")
        if draws < 1:
            raise ValueError(f"draws must be >= 1, got {draws}")
        if kind == "drafter+overlap" and not self.records(method):
            raise ValueError(f"the sampled trace holds no record of drafter {method!r}: no {entry.chain} chain "
                             "or no overlap")
        key = DRAFT_MODEL if kind == "overlap" else entry.name
        rng = random.Random(seed)
        totals = [0.0] * 5  # rounds, drafted, accepted, seconds, drafting rounds
        for _ in range(draws):
            pol = make_policy(policy, k, costs=self.curve, pad_verify=self.padded, free_drafts=entry.k_is_cap)
            live = None if kind != "drafter+overlap" else replay_drafter(
                method, costs=self.curve, ngram=self.ngram, trace=self.trace, draft_context=self.draft_context,
                rng=rng)
            try:
                rounds = simulate_run(self.trace, key, pol, rng, live)
            except KeyError as e:
                raise ValueError(f"the sampled trace holds no record of drafter {method!r}: {e.args[0]}") from None
            for i, x in enumerate((len(rounds), sum(r.k for r in rounds), sum(r.num_accepted for r in rounds),
                                   self.decode_s(method, rounds), sum(1 for r in rounds if r.k > 0))):
                totals[i] += x
        rounds_, drafted, accepted, seconds, drafting = (t / draws for t in totals)
        base = self.baseline_decode_s()
        speedup = base / seconds if seconds > 0 and math.isfinite(base) else math.nan
        return ExpectedRun(rounds_, drafted, accepted, seconds, len(self.trace.target_ids), drafting), speedup

    def best_fixed_k(self, method: str, ks: Iterable[int] = range(1, 17)) -> tuple[int, float]:
        """The fixed K in `ks` whose replay (a sampled trace: whose expected run) is predicted fastest, and its
        predicted decode speedup (ties: the smaller K).

        Raises:
            ValueError: no costs (`curve` None), an empty `ks`, or what `rounds` / `expected` raise.
        """
        if self.curve is None:
            raise ValueError("choosing K needs measured costs")
        best: tuple[int, float] | None = None
        for k in ks:
            s = self.expected(method, k)[1] if self.sampled else self.speedup(method, self.rounds(method, k))
            if best is None or s > best[1] * (1 + 1e-12):
                best = (int(k), s)
        if best is None:
            raise ValueError("no K to choose from")
        return best
