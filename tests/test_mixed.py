"""The mixed drafter (`specdec.drafters.mixed`): the suffix drafter's proposal, the draft model's or none, by
expected tokens per second on the measured costs; exact like either drafter alone."""

from __future__ import annotations

import pytest
import torch

from specdec.core.costs import CostCurve
from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.mixed import MixedDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate

V = 1000
#: A flat verification curve and a cheap draft step (bf16-like): the draft model pays at its prior.
FLAT = CostCurve({1: 0.10, 2: 0.10, 4: 0.105, 8: 0.11, 17: 0.12}, draft_step_s=0.01)
#: A steep curve and a dear draft step (llama.cpp on a CPU): no K of the draft model pays at its prior.
STEEP = CostCurve({1: 0.03, 2: 0.055, 4: 0.09, 8: 0.17, 17: 0.36}, draft_step_s=0.012)
PROMPTS = ["abc abc abc abc abc", "hello world, the quick brown fox", "x = [1, 2, 3]; y = [1, 2, 3]; z = ["]


def tv_critical(p: torch.Tensor, n: int, quantile: float = 0.999, reps: int = 2000) -> float:
    """The `quantile` of the total-variation distance between p and the histogram of n exact draws from p
    (simulated with a fixed seed): what sampling noise alone reaches at this support and n."""
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(p.expand(reps, -1), n, replacement=True, generator=g)
    hist = torch.zeros(reps, p.numel()).scatter_add_(1, draws, torch.ones(reps, n)) / n
    return float(torch.quantile(0.5 * (hist - p).abs().sum(1), quantile))


def _mixed(draft, cost, **kw) -> MixedDrafter:
    return MixedDrafter(SuffixDrafter(cost), draft, V, cost, **kw)


@pytest.mark.parametrize("cost", [FLAT, STEEP], ids=["flat", "steep"])
def test_greedy_output_equals_target_only(tiny_tokenizer, target, near_draft, cost):
    """Greedy mixed drafting commits the target's own tokens, whichever drafter each round used."""
    used = {"suffix": 0, "model": 0, "none": 0}
    for text in PROMPTS:
        prompt = tiny_tokenizer(text).input_ids
        want = autoregressive_generate(target, prompt, 40, vocab_size=V).token_ids
        d = _mixed(near_draft, cost)
        got = speculative_generate(target, d, prompt, 40, k=8, vocab_size=V)
        assert got.token_ids == want, text
        for kind, n in d.stats.rounds.items():
            used[kind] += n
    if cost is FLAT:
        assert used["model"] > 0 and used["suffix"] > 0  # both drafters took rounds
    else:
        assert used["model"] == 0


def test_the_draft_model_never_runs_where_it_cannot_pay(tiny_tokenizer, target, near_draft):
    """On a steep curve the draft model is never run (its deferred prefill included): the rounds and output
    are the suffix drafter's alone."""
    calls = []
    real = near_draft.forward

    def counted(tokens, **kw):
        calls.append(len(tokens))
        return real(tokens, **kw)

    near_draft.forward = counted
    try:
        for text in PROMPTS:
            prompt = tiny_tokenizer(text).input_ids
            mixed = speculative_generate(target, _mixed(near_draft, STEEP), prompt, 40, k=8, vocab_size=V)
            alone = speculative_generate(target, SuffixDrafter(STEEP), prompt, 40, k=8, vocab_size=V)
            assert [(r.k, r.num_accepted) for r in mixed.rounds] == [(r.k, r.num_accepted) for r in alone.rounds]
    finally:
        near_draft.forward = real
    assert sum(calls) == 0  # no token ever fed (an empty forward is the row's deferred prefill)


def test_the_draft_models_estimate_learns_from_its_verified_tokens(tiny_tokenizer, target, far_draft):
    """A draft that rarely agrees lowers its own estimate below the prior, and the mixed drafter then stops
    giving it rounds (no draft or the suffix drafter's instead)."""
    prompt = tiny_tokenizer("hello world, the quick brown fox").input_ids
    d = _mixed(far_draft, FLAT)
    speculative_generate(target, d, prompt, 60, k=8, vocab_size=V)
    assert d.stats.model_offered > 0 and d.model_alpha() < d.prior_alpha
    first = d.stats.rounds["model"]
    assert first < sum(d.stats.rounds.values())


@pytest.mark.parametrize(("text", "prior", "first"), [("abc abc abc abc", 0.1, "suffix"),
                                                     ("hello world, the quick brown fox", 0.9, "model")])
def test_sampled_first_token_follows_the_target(tiny_tokenizer, target, near_draft, text, prior, first):
    """Under sampling each round's draft is one drafter's ordinary draft (the suffix drafter's one-hot, the
    draft model's with its q), so the first token follows warped p whichever drafter drafted it (a draft
    that often agrees: a q misreported to the verifier would pull the law towards the draft's)."""
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)
    prompt = tiny_tokenizer(text).input_ids
    target.reset()
    p = warp(target.forward(prompt)[-1, :V], sp)
    target.reset()
    n = 500
    counts = torch.zeros(V)
    rejected = 0
    for seed in range(n):
        d = _mixed(near_draft, FLAT, prior_alpha=prior)
        out = speculative_generate(target, d, prompt, 3, k=4, sampling=sp, seed=seed, vocab_size=V)
        assert d.stats.choices[0] == first and out.rounds[0].k > 0
        counts[out.token_ids[0]] += 1
        rejected += out.rounds[0].num_accepted == 0
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(torch.nonzero(p).flatten().tolist())
    tv = 0.5 * float((counts / n - p).abs().sum())
    assert tv < tv_critical(p, n), tv
    assert rejected > n // 10  # the recovered-token path carried part of the law


def test_refuses_costs_without_a_draft_step(near_draft):
    with pytest.raises(ValueError, match="draft_step_s"):
        MixedDrafter(SuffixDrafter(None), near_draft, V, CostCurve({1: 0.1, 2: 0.1}))


def test_a_batch_of_rows_each_choosing_its_drafter_equals_target_only(tiny_tokenizer, target, near_draft):
    """`BatchedMixedDrafter`: rows that choose the draft model draft in one batched call, the others by their
    suffix drafters or not at all; every greedy row equals its target-only output and the rows' choices
    differ within rounds."""
    from specdec.drafters.mixed import BatchedMixedDrafter
    from specdec.drafters.model import BatchedModelDrafter
    from specdec.engine.decoding import generate_batch
    from specdec.runtimes.hf_batched import BatchedHFBackend

    prompts = [tiny_tokenizer(t).input_ids for t in PROMPTS]
    want = [autoregressive_generate(target, p, 30, vocab_size=V).token_ids for p in prompts]
    d = BatchedMixedDrafter(lambda: SuffixDrafter(FLAT), BatchedModelDrafter(BatchedHFBackend(near_draft.model), V),
                            FLAT)
    out = generate_batch(BatchedHFBackend(target.model), prompts, 30, drafter=d, k=6, vocab_size=V)
    assert [r.token_ids for r in out] == want
    first = [s.choices[0] for s in d.stats]
    assert "model" in first and "suffix" in first  # one round, rows on different drafters


def test_mixed_rounds_are_priced_by_the_drafter_that_drafted_them():
    """`PromptModel.speedup("mixed", ...)`: a suffix round costs what a model-free round costs, a draft-model
    round its catch-up over the tokens committed since the draft last fed (the suffix round's included) and
    its K - 1 steps."""
    from specdec.engine.traces import AcceptanceTrace, ReplayRound
    from specdec.report.predicted import PromptModel

    curve = CostCurve({1: 0.10, 17: 0.26}, draft_step_s=0.01, draft_forward_s={1: 0.01, 9: 0.05})
    trace = AcceptanceTrace((5, 6), tuple(range(10, 20)), tuple(range(10, 20)), (1.0,) * 10, 10)
    m = PromptModel(("c", "p", ""), "t", trace, curve, 0.0, 0.0, 0.003, (3, 1), None)
    rounds = [ReplayRound(3, 3, 4, by_model=False), ReplayRound(2, 2, 3, by_model=True),
              ReplayRound(2, 0, 1, by_model=True), ReplayRound(0, 0, 1), ReplayRound(1, 1, 1, by_model=True)]
    f = curve.forward_s
    want = ((0.003 + f(4)) + (curve.draft_forward(5) + 0.01 + f(3)) + (curve.draft_forward(2) + 0.01 + f(3))
            + f(1) + (curve.draft_forward(2) + f(2)))
    assert m.decode_s("mixed", rounds) == pytest.approx(want)
    assert m.speedup("mixed", rounds) == pytest.approx(10 * f(1) / want)
