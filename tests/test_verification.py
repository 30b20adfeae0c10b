"""Verification as pure tensor functions, the stochastic rule's exactness, and metric definitions (C7-C13)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specdec.core.metrics import GenerationResult, RoundRecord
from specdec.core.sampling import SamplingParams, residual, warp
from specdec.core.verification import accepted_count, greedy_verify, stochastic_verify, synthetic_verify


def logits_with_argmax(argmaxes, vocab=10):
    x = torch.zeros(len(argmaxes), vocab)
    for i, a in enumerate(argmaxes):
        x[i, a] = 5.0
    return x


# --- greedy, hand-built logits -------------------------------------------------------------------


def test_greedy_all_accepted_gives_bonus():
    v = greedy_verify([3, 4, 5], logits_with_argmax([3, 4, 5, 6]))
    assert (v.num_accepted, v.next_token, v.next_kind) == (3, 6, "bonus")
    assert v.committed_tokens([3, 4, 5]) == [3, 4, 5, 6]


def test_greedy_early_mismatch_gives_target_token():
    v = greedy_verify([3, 9, 5], logits_with_argmax([3, 4, 5, 6]))
    assert (v.num_accepted, v.next_token, v.next_kind) == (1, 4, "recovered")
    assert v.accept_flags == (True, False)
    assert v.committed_tokens([3, 9, 5]) == [3, 4]


def test_greedy_first_token_mismatch_and_empty_draft():
    v = greedy_verify([7], logits_with_argmax([3, 4]))
    assert (v.num_accepted, v.next_token) == (0, 3)
    v = greedy_verify([], logits_with_argmax([8]))
    assert (v.num_accepted, v.next_token, v.next_kind) == (0, 8, "bonus")
    with pytest.raises(ValueError, match="K\\+1"):
        greedy_verify([1, 2], logits_with_argmax([1, 2]))


def test_c10_accepted_count_is_leading_run():
    assert accepted_count([1, 0, 1, 1]) == 1
    assert accepted_count([0, 1, 0, 0]) == 0
    assert accepted_count([1, 1, 1]) == 3
    assert accepted_count([]) == 0


# --- stochastic rule ----------------------------------------------------------------------------


def emitted_distribution(p, q, trials, *, lie=False, seed=0):
    """Run K=1 speculative sampling `trials` times and return the empirical distribution of the first token.

    `lie`: the drafter takes argmax(q) but reports q (the fault of C7's negative control)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor(p)
    q = torch.tensor(q)
    counts = torch.zeros(len(p))
    target = torch.stack([p, p])  # [K+1, vocab]; the bonus row is irrelevant to the first token
    for _ in range(trials):
        d = int(q.argmax()) if lie else int(torch.multinomial(q, 1, generator=g))
        v = stochastic_verify([d], q.unsqueeze(0), target, g)
        counts[v.committed_tokens([d])[0]] += 1
    return counts / trials


def tv(a, b):
    return 0.5 * float((torch.as_tensor(a) - torch.as_tensor(b)).abs().sum())


def test_c7_emitted_tokens_follow_p():
    p, q = [0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]
    assert tv(emitted_distribution(p, q, 200_000), p) < 0.01


def test_c7_negative_control_lying_drafter_fails():
    p, q = [0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]
    assert tv(emitted_distribution(p, q, 20_000, lie=True), p) > 0.05


def test_wrong_rule_fails_the_same_check():
    """A known-wrong rule (always accept the draft) gives q, not p: the TV check must catch it."""
    p, q = torch.tensor([0.5, 0.3, 0.15, 0.05]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(q, 20_000, replacement=True, generator=g)
    wrong = torch.bincount(draws, minlength=4).float() / 20_000
    assert tv(wrong, p) > 0.05


def test_c8_residual_is_exact():
    r = residual(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.2, 0.6]))
    assert torch.allclose(r, torch.tensor([0.75, 0.25, 0.0]))
    # after a rejection token 2 is never emitted
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2], [0.3, 0.3, 0.4]])
    q = torch.tensor([[0.2, 0.2, 0.6]])
    for _ in range(3000):
        v = stochastic_verify([2], q, p, g)
        if v.num_accepted == 0:
            assert v.next_token != 2


def test_zero_residual_falls_back_to_p_and_p_zero_is_never_accepted():
    p = torch.tensor([0.25, 0.25, 0.5, 0.0])
    assert torch.equal(residual(p, p.clone()), p)
    g = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 0.0, 0.0, 1.0]])  # the draft insists on a token the target gives p = 0
    target = torch.stack([p, p])
    for _ in range(500):
        v = stochastic_verify([3], q, target, g)
        assert v.num_accepted == 0 and v.next_token != 3
        assert not math.isnan(float(residual(p, q[0]).sum()))


def test_prompt_lookup_drafts_use_one_hot_q():
    """A deterministic proposal (q = one-hot) is accepted with probability p(d): output still follows p."""
    p = torch.tensor([0.6, 0.3, 0.1])
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(3)
    n = 60_000
    for _ in range(n):
        v = stochastic_verify([2], None, torch.stack([p, p]), g)
        counts[v.committed_tokens([2])[0]] += 1
    assert tv(counts / n, p) < 0.01


def test_q_zero_for_draft_token_is_an_error():
    with pytest.raises(ValueError, match="q = 0"):
        stochastic_verify([1], torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5], [0.5, 0.5]]), None)


def test_warp_top_k_top_p_and_no_nan():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, -float("inf")]])
    probs = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs[0, 2:] == 0).all() and abs(float(probs.sum()) - 1) < 1e-6
    probs = warp(logits, SamplingParams(temperature=0.7, top_p=0.5))
    assert int((probs[0] > 0).sum()) == 1  # the top token alone already reaches 0.5
    assert not torch.isnan(warp(torch.full((1, 5), -1e30), SamplingParams(temperature=0.01))).any()
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)


# --- metrics (C11-C13) --------------------------------------------------------------------------


def rec(k, acc, emitted=None, draft_s=0.0, verify_s=0.0):
    flags = tuple([True] * acc + ([False] if acc < k else []))
    return RoundRecord(k, acc, flags, "bonus" if acc == k else "recovered", acc + 1 if emitted is None else emitted,
                       draft_s, verify_s)


def test_c11_metric_definitions():
    r = GenerationResult("speculative", [1], [0] * 9, "length", [rec(4, 4), rec(4, 2), rec(4, 0)])
    assert r.num_drafted == 12 and r.num_accepted == 6
    assert r.acceptance_rate == 0.5
    assert r.block_efficiency == 3.0
    assert r.mean_accepted == 2.0
    assert r.num_rejections == 2 and r.alpha_hat == 6 / 8


def test_c12_tokens_per_second_with_fake_clock():
    """100 ms prefill, then 10 rounds of 3 tokens at 30 ms each -> decode 100 tok/s, end-to-end 75 tok/s."""
    from conftest import ScriptedDrafter

    from specdec.engine.decoding import speculative_generate

    class FakeBackend:
        name, vocab_size, max_length, device = "fake", 8, 1000, torch.device("cpu")

        def __init__(self):
            self.n = 0

        @property
        def cache_length(self):
            return self.n

        def forward(self, tokens, *, logits=True, last=None):
            self.n += len(tokens)
            clock.t += 0.100 if not logits else 0.030
            if not logits:
                return None
            rows = logits_with_argmax([1] * len(tokens), vocab=8)  # target always predicts token 1
            return rows if last is None else rows[-last:]

        def truncate(self, length):
            self.n = length

        def reset(self):
            self.n = 0

        def synchronize(self):
            pass

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    r = speculative_generate(FakeBackend(), ScriptedDrafter(lambda c, k: [1] * k), [5, 5, 5], 30, k=2, clock=clock)
    assert r.num_tokens == 30 and r.num_rounds == 10
    assert math.isclose(r.prefill_s, 0.1) and math.isclose(r.total_s, 0.4)
    assert math.isclose(r.decode_tokens_per_s, 100.0)
    assert math.isclose(r.tokens_per_s, 75.0)
    assert math.isclose(r.ttft_s, 0.13)


def test_c13_mock_models_independent_acceptance():
    """Independent acceptance alpha = 0.8, K = 4, 5000 rounds -> mean accepted within 0.05 of 2.3616."""
    from conftest import ScriptedDrafter

    from specdec.engine.decoding import speculative_generate

    rng = torch.Generator().manual_seed(0)
    truth = {}

    def oracle(pos):  # the target's deterministic greedy token at absolute position pos
        if pos not in truth:
            truth[pos] = int(torch.randint(2, 50, (1,), generator=rng))
        return truth[pos]

    class OracleBackend:
        name, vocab_size, max_length, device = "oracle", 50, 10**7, torch.device("cpu")

        def __init__(self):
            self.n = 0

        @property
        def cache_length(self):
            return self.n

        def forward(self, tokens, *, logits=True, last=None):
            start = self.n
            self.n += len(tokens)
            if not logits:
                return None
            rows = logits_with_argmax([oracle(start + i + 1) for i in range(len(tokens))], vocab=50)
            return rows if last is None else rows[-last:]

        def truncate(self, length):
            self.n = length

        def reset(self):
            self.n = 0

        def synchronize(self):
            pass

    coin = torch.Generator().manual_seed(1)

    def drafter(committed, k):
        out = []
        for i in range(k):
            right = oracle(len(committed) + i)
            out.append(right if float(torch.rand((), generator=coin)) < 0.8 else 1)
        return out

    r = speculative_generate(OracleBackend(), ScriptedDrafter(drafter), [0], 5000 * 6, k=4)
    rounds = r.rounds[:5000]
    mean_acc = sum(x.num_accepted for x in rounds) / len(rounds)
    assert abs(mean_acc - 0.8 * (1 - 0.8**4) / 0.2) < 0.05


def test_synthetic_verify_accepts_by_its_probabilities_whatever_the_tokens():
    """llama.cpp's --spec-synth-rates rule: acceptance by coin, the target's argmax after the accepted prefix."""
    logits = logits_with_argmax([3, 4, 5, 6])  # the drafts below are all wrong for the target
    rng = random.Random(0)
    v = synthetic_verify([9, 9, 9], logits, [1.0, 1.0, 1.0], rng)
    assert (v.num_accepted, v.next_token, v.next_kind) == (3, 6, "bonus")
    assert v.committed_tokens([9, 9, 9]) == [9, 9, 9, 6]
    v = synthetic_verify([3, 4, 5], logits, [0.0, 1.0, 1.0], rng)  # right drafts, refused by the coin
    assert (v.num_accepted, v.accept_flags, v.next_token, v.next_kind) == (0, (False,), 3, "recovered")
    v = synthetic_verify([9, 9, 9], logits, [1.0, 0.0, 1.0], rng)
    assert (v.num_accepted, v.next_token) == (1, 4)
    # iid alpha: P(n accepted) = alpha^n (1 - alpha) for n < K; mean accepted E = alpha (1 - alpha^K) / (1 - alpha)
    alpha, k, n = 0.7, 4, 20_000
    counts = [synthetic_verify([9] * k, logits_with_argmax([1] * (k + 1)), [alpha] * k, rng).num_accepted
              for _ in range(n)]
    expected = alpha * (1 - alpha**k) / (1 - alpha)
    assert abs(sum(counts) / n - expected) < 0.03
    assert abs(counts.count(0) / n - (1 - alpha)) < 0.015
    with pytest.raises(ValueError, match="2 synthetic acceptance probabilities for K = 3"):
        synthetic_verify([1, 2, 3], logits, [0.5, 0.5], rng)
