"""Acceptance traces: the rounds of every K, replayed from one target-only run and one
teacher-forced draft pass, equal the rounds of real speculative runs."""

from __future__ import annotations

import time

import pytest

from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.engine.traces import compare_rounds, record_trace, replay

V = 1000
PROMPTS = {
    "text": "hello world the quick brown fox jumps over the lazy dog and the quick brown fox",
    "short": "a",
    "repeat": "one two three one two three one two three one two",
}




@pytest.fixture(scope="module")
def traces(tiny_tokenizer, target, near_draft):
    out = {}
    for name, text in PROMPTS.items():
        prompt = tiny_tokenizer(text).input_ids
        for budget, eos in ((40, frozenset()), (40, None)):
            ref = autoregressive_generate(target, prompt, budget, vocab_size=V).token_ids
            if eos is None:  # an EOS inside the output: the target's 13th token ends it
                eos = frozenset({ref[12]})
                ref = autoregressive_generate(target, prompt, budget, vocab_size=V, eos_ids=eos).token_ids
            out[(name, eos)] = (prompt, eos, record_trace(prompt, ref, budget, near_draft, vocab_size=V))
    return out


@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_replayed_rounds_equal_the_rounds_of_real_runs(traces, target, near_draft, k, drafter):
    matched = 0
    for (_name, eos), (prompt, _eos, trace) in traces.items():
        d = ModelDrafter(near_draft, V) if drafter == "draft" else PromptLookupDrafter()
        run = speculative_generate(target, d, prompt, trace.max_new_tokens, k=k, vocab_size=V, eos_ids=eos)
        assert tuple(run.token_ids) == trace.target_ids  # greedy: the output does not depend on K
        rep = replay(trace, k=k, drafter=None if drafter == "draft" else PromptLookupDrafter())
        assert compare_rounds(run.rounds, rep) == []
        assert sum(r.num_emitted for r in rep) == len(trace.target_ids)
        matched += sum(r.num_accepted for r in rep)
    assert matched > 0  # the traces exercise acceptance, not only rejections


def test_trace_by_hand(target):
    """A scripted trace of 6 tokens, agreement [T, F, T, T, F, T], K = 2: one accepted + the recovered token;
    two accepted + the bonus; then the budget leaves room for no draft (K = 0, one plain step)."""
    from specdec.engine.traces import AcceptanceTrace

    t = AcceptanceTrace((1,), (5, 6, 7, 8, 9, 10), (5, 0, 7, 8, 0, 10), None, 6)
    assert [(r.k, r.num_accepted, r.num_emitted) for r in replay(t, k=2)] == [(2, 1, 2), (2, 2, 3), (0, 0, 1)]
    # without a budget clamp (a longer budget, output ended by EOS) the last round drafts 2 and stops at the end
    t = AcceptanceTrace((1,), (5, 6, 7, 8, 9, 10), (5, 0, 7, 8, 0, 10), None, 50)
    assert [(r.k, r.num_accepted, r.num_emitted) for r in replay(t, k=2)] == [(2, 1, 2), (2, 2, 3), (2, 1, 1)]


def test_compare_rounds_lists_the_first_mismatch(traces, target, near_draft):
    (prompt, _eos, trace) = traces[("text", frozenset())]
    run = speculative_generate(target, ModelDrafter(near_draft, V), prompt, trace.max_new_tokens, k=4,
                               vocab_size=V)
    wrong = replay(trace, k=2)
    diff = compare_rounds(run.rounds, wrong)
    assert diff and diff[0]["round"] == 0 and diff[0]["timed"][0] == 4 and diff[0]["replayed"][0] == 2


def test_bad_arguments():
    from specdec.engine.traces import AcceptanceTrace

    t = AcceptanceTrace((1,), (5,), None, None, 4)
    with pytest.raises(ValueError, match="no draft tokens"):
        replay(t, k=2)
    with pytest.raises(ValueError, match="exactly one"):
        replay(t)
    with pytest.raises(ValueError, match="K must be"):
        replay(t, k=0, drafter=PromptLookupDrafter())
    with pytest.raises(ValueError, match="empty prompt"):
        record_trace([], [1], 4)


class _FirstForwardLog:
    """Wraps the draft backend and records the size of each round's first forward (its catch-up)."""

    def __init__(self, inner):
        self.inner, self.sizes, self._fresh = inner, [], False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, tokens, **kw):
        if self._fresh:
            self.sizes.append(len(tokens))
            self._fresh = False
        return self.inner.forward(tokens, **kw)


class _LoggingDrafter(ModelDrafter):
    def propose(self, committed, k, *args, **kw):
        self.backend._fresh = k > 0
        return super().propose(committed, k, *args, **kw)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_draft_pending_is_what_the_engine_feeds(traces, target, near_draft, k):
    """`draft_pending` (the catch-up the time model prices) equals the tokens the real ModelDrafter feeds
    at the start of each drafting round: the whole prompt in the first (the draft's prefill is deferred), 1
    after a rejection, 2 after an all-accepted round, one more per plain round in between (a scripted policy
    inserts plain rounds)."""
    from specdec.engine.traces import draft_pending
    from specdec.policies.base import RoundPlan

    class Script:  # K, K, 0, 0, K, 0, K, ... (a policy that sometimes decodes plainly)
        def __init__(self):
            self.i = 0

        def start(self, prefill_tokens=None, budget=None):
            self.i = 0

        def next_round(self):
            self.i += 1
            return RoundPlan(0 if self.i % 5 in (3, 4) else k)

        def observe(self, record):
            pass

        def alpha_estimate(self):
            return None

    seen = {"all": 0, "plain": 0}
    for (_name, eos), (prompt, _eos, trace) in traces.items():
        for policy in (None, Script()):
            log = _FirstForwardLog(near_draft)
            d = _LoggingDrafter(log, V)
            run = speculative_generate(target, d, prompt, trace.max_new_tokens, k=None if policy else k,
                                       policy=policy, vocab_size=V, eos_ids=eos)
            pending = draft_pending(run.rounds, prompt_len=len(prompt))  # the draft prefill is deferred
            assert log.sizes == [p for p, r in zip(pending, run.rounds) if r.k > 0]
            assert log.sizes[0] == len(prompt)  # the first drafting round feeds the whole prompt
            seen["all"] += sum(p == 2 for p in log.sizes)
            seen["plain"] += sum(p > 2 for p in log.sizes)
    assert seen["all"] > 0 and seen["plain"] > 0  # both kinds of catch-up occurred


class _DearVerification:
    """A target whose forwards of more than one token take 20 ms longer than its calibration says: a
    verification dearer in the decoding loop than priced, which the cost policy's measured ledger catches."""

    def __init__(self, backend) -> None:
        self._backend = backend

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def forward(self, tokens, **kw):
        if len(tokens) > 1:
            time.sleep(0.02)
        return self._backend.forward(tokens, **kw)


def test_a_policy_replayed_on_the_timed_runs_clock_decides_as_it_did_live(traces, target):
    """The cost policy's ledger weighs measured seconds once plain rounds are timed, so a live run whose
    verification is dearer than its curve stops speculating where the priced replay goes on; fed the run's
    round seconds (``clock``), the replay takes the live run's rounds."""
    from specdec.core.costs import CostCurve
    from specdec.policies.cost import CostPolicy

    curve = CostCurve({1: 0.001, 17: 0.0012}, draft_step_s=0.0001)  # every K pays on the curve
    (prompt, eos, trace) = traces[("text", frozenset())]
    run = speculative_generate(_DearVerification(target), PromptLookupDrafter(), prompt, trace.max_new_tokens,
                               policy=CostPolicy.from_costs(curve, max_k=8), vocab_size=V, eos_ids=eos)
    assert tuple(run.token_ids) == trace.target_ids
    priced = replay(trace, policy=CostPolicy.from_costs(curve, max_k=8), drafter=PromptLookupDrafter())
    assert compare_rounds(run.rounds, priced) != []  # the priced ledger would have gone on drafting
    timed = replay(trace, policy=CostPolicy.from_costs(curve, max_k=8), drafter=PromptLookupDrafter(),
                   clock=run.rounds)
    assert compare_rounds(run.rounds, timed) == []
