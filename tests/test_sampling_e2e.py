"""Stochastic speculative decoding end to end on tiny checkpoints (C9, seeds)."""

from __future__ import annotations

import pytest
import torch

from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate

V = 1000
C9 = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)




def first_token_p(target, prompt, sampling):
    target.reset()
    p = warp(target.forward(prompt)[-1, :V], sampling)
    target.reset()
    return p


def test_c9_first_token_histogram_matches_target(tiny_tokenizer, target, far_draft):
    """With a draft that disagrees with the target (independent random model), rejections are common and the
    recovered-token path carries the distribution; the first token must still follow warped p exactly."""
    # a prompt whose warped first-token distribution is spread over several tokens
    prompt = tiny_tokenizer("abc abc abc abc").input_ids
    p = first_token_p(target, prompt, C9)
    support = set(torch.nonzero(p).flatten().tolist())
    assert len(support) >= 3
    n = 1000
    counts = torch.zeros(V)
    drafter = ModelDrafter(far_draft, V)
    rejected = 0
    for seed in range(n):
        out = speculative_generate(target, drafter, prompt, 3, k=4, sampling=C9, seed=seed, vocab_size=V)
        counts[out.token_ids[0]] += 1
        rejected += out.rounds[0].num_accepted == 0
    emp = counts / n
    assert set(torch.nonzero(counts).flatten().tolist()) <= support, "a token outside the top-k/top-p set"
    tv = 0.5 * float((emp - p).abs().sum())
    assert tv < 0.07, tv  # sampling noise at n=1000 over this support is ~0.03
    assert rejected > n // 4  # the check exercised the recovered path


def _pit(p: torch.Tensor, tok: int, u: float) -> float:
    """Randomized probability integral transform of `tok` under `p`, tokens ordered from most to least
    likely (ties by id): uniform on (F(tok-), F(tok)] with `u` ~ U(0, 1). For tokens drawn from p it is
    U(0, 1), and along a sequence drawn autoregressively the values of successive steps are i.i.d. U(0, 1)
    (Rosenblatt 1952). Over-sampled unlikely tokens push it towards 1."""
    ids = torch.arange(len(p))
    before = (p > p[tok]) | ((p == p[tok]) & (ids < tok))
    return float(p[before].sum()) + u * float(p[tok])


def _ks(values: list[float]) -> float:
    """Kolmogorov-Smirnov statistic of `values` against U(0, 1)."""
    x = sorted(values)
    n = len(x)
    return max(max((i + 1) / n - v, v - i / n) for i, v in enumerate(x))


def test_c9_every_token_inside_targets_top_p_set(tiny_tokenizer, target, far_draft):
    """Every emitted token lies in the target's top-k/top-p set, and the tokens follow the target's warped
    law at every step, not only the first: the randomized PIT of each emitted token under the target's
    warped distribution at its step is i.i.d. U(0, 1) for a correct sampler. Kolmogorov-Smirnov at
    significance 0.001 (critical value 1.949 / sqrt(n)). Negative control: a sampler that keeps the
    support but draws uniformly inside it fails the same test."""
    prompt = tiny_tokenizer("hello world the quick brown fox").input_ids
    drafter = ModelDrafter(far_draft, V)
    coin = torch.Generator().manual_seed(99)
    pits, wrong = [], []
    for seed in range(30):
        out = speculative_generate(target, drafter, prompt, 12, k=4, sampling=C9, seed=seed, vocab_size=V)
        seq = list(prompt)
        for tok in out.token_ids:
            allowed = first_token_p(target, seq, C9)
            assert allowed[tok] > 0
            pits.append(_pit(allowed, tok, float(torch.rand((), generator=coin))))
            seq.append(tok)
        seq = list(prompt)  # negative control: uniform over the same support
        for _ in range(12):
            allowed = first_token_p(target, seq, C9)
            support = torch.nonzero(allowed).flatten()
            tok = int(support[torch.randint(len(support), (1,), generator=coin)])
            wrong.append(_pit(allowed, tok, float(torch.rand((), generator=coin))))
            seq.append(tok)
    crit = 1.949 / len(pits) ** 0.5
    print(f"KS = {_ks(pits):.3f} (speculative), {_ks(wrong):.3f} (control), critical {crit:.3f}, n = {len(pits)}")
    assert _ks(pits) < crit, (_ks(pits), crit)
    assert _ks(wrong) > crit, (_ks(wrong), crit)


def test_same_seed_same_tokens(tiny_tokenizer, target, far_draft):
    prompt = tiny_tokenizer("hello world").input_ids
    sp = SamplingParams(temperature=1.0)
    runs = [
        speculative_generate(target, ModelDrafter(far_draft, V), prompt, 20, k=3, sampling=sp, seed=s, vocab_size=V)
        .token_ids
        for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    b = [autoregressive_generate(target, prompt, 20, sampling=sp, seed=s, vocab_size=V).token_ids for s in (3, 3)]
    assert b[0] == b[1]


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["t1", "t0.7-top-p"])
@pytest.mark.parametrize("make", [PromptLookupDrafter, lambda: SuffixDrafter(None)], ids=["ngram", "suffix"])
def test_one_hot_drafters_keep_the_targets_law(tiny_tokenizer, target, make, sp):
    """A model-free drafter under sampling (one-hot q: prompt lookup, the suffix drafter): every first round
    drafts the repeat's next token d (K clamped to the budget - 1 = 1), accepts it with probability
    min(1, p(d) / q(d)) = p(d), and the first-token histogram still matches the warped p."""
    prompt = tiny_tokenizer("abc abc abc abc").input_ids
    p = first_token_p(target, prompt, sp)
    probe = make()
    probe.prefill(list(prompt[:-1]))
    d = probe.propose(prompt, 1, sp, None).tokens
    assert len(d) == 1  # the prompt repeats, so there is a match to draft
    n = 800
    counts = torch.zeros(V)
    accepted = 0
    for seed in range(n):
        out = speculative_generate(target, make(), prompt, 2, k=4, sampling=sp, seed=seed, vocab_size=V)
        first = out.rounds[0]
        assert (first.k, first.k_requested) == (1, 4), seed  # drafting happened, K clamped by the budget
        accepted += first.num_accepted
        if first.num_accepted:
            assert out.token_ids[0] == d[0]
        counts[out.token_ids[0]] += 1
    # acceptance frequency against p(d): binomial, 4 standard deviations (plus one draw for tiny p(d))
    p_d = float(p[d[0]])
    assert abs(accepted / n - p_d) <= 4 * (p_d * (1 - p_d) / n) ** 0.5 + 1 / n, (accepted, p_d)
    top = torch.topk(p, 5).indices
    assert float((counts[top] / n - p[top]).abs().max()) < 0.05
    assert float(counts[p == 0].sum()) == 0  # nothing outside the warped support (top-p)
