"""Batched decoding (specdec.engine.decoding, specdec.runtimes.hf_batched, specdec.policies.batch) against single-sequence decoding.

The oracle for greedy rows is `autoregressive_generate` on the single-sequence backend of the same model,
one prompt at a time; for sampled rows with the same seed, `speculative_generate` / `autoregressive_generate`;
and the joint law of a row's first tokens under speculative sampling, on a synthetic table model, against
the target's exact law (as tests/test_joint.py), with a negative control.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import load_backend

import specdec.core.verification as ver
import specdec.runtimes.hf_batched as hfb
from specdec.core.metrics import RoundRecord
from specdec.core.sampling import SamplingParams
from specdec.core.theory import expected_tokens_per_round
from specdec.drafters.base import PerRowDrafters
from specdec.drafters.model import BatchedModelDrafter, ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import GREEDY, autoregressive_generate, generate_batch, speculative_generate
from specdec.policies.batch import FixedBatchK, best_batch_k
from specdec.policies.batch_cost import BatchCostPolicy
from specdec.runtimes.base import BackendError, ContextOverflowError
from specdec.runtimes.hf_batched import BatchedHFBackend

V = 1000
TEXTS = [
    "hello world the quick brown fox",
    "abc abc abc abc abc abc abc abc",
    "zq",
    "one two three four five six seven eight nine ten eleven twelve thirteen",
    "the the the",
    "def f(x): return x + 1",
    "a",
    "lorem ipsum dolor sit amet consectetur",
]
SAMPLED = SamplingParams(temperature=1.0, top_k=40)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    out = [tiny_tokenizer(t).input_ids for t in TEXTS]
    assert len({len(p) for p in out}) >= 6 and min(len(p) for p in out) == 1
    return out


@pytest.fixture(scope="module")
def btarget(target):
    return BatchedHFBackend(target.model)


@pytest.fixture(scope="module")
def bnear(near_draft):
    return BatchedHFBackend(near_draft.model)


class Recorder:
    """Wraps a batched backend; after every `truncate` it records each live row's cache length as the
    backend reports it and as its validity mask counts it."""

    def __init__(self, inner):
        self.inner = inner
        self.after_truncate: list[tuple[list[int], list[int]]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def rows(self):
        return self.inner.rows

    @property
    def cache_lengths(self):
        return self.inner.cache_lengths

    def truncate(self, lengths):
        self.inner.truncate(lengths)
        self.after_truncate.append((self.inner.cache_lengths, self.inner.valid_counts()))


def budgets_and_eos(target, prompts, b):
    """Per-row budgets that differ, and one EOS id that stops row 1 early (at its 4th token)."""
    budgets = [[24, 9, 17, 1, 30, 12, 5, 20][i] for i in range(b)]
    if b < 2:
        return budgets, frozenset()
    ref = autoregressive_generate(target, prompts[1], budgets[1], vocab_size=V).token_ids
    pos = next(j for j in range(3, len(ref)) if ref[j] not in ref[:j])
    return budgets, frozenset({ref[pos]})


def make_drafter(kind, bnear):
    if kind == "model":
        return BatchedModelDrafter(bnear, V)
    if kind == "ngram":
        return PerRowDrafters(PromptLookupDrafter)
    return None


@pytest.mark.parametrize("b", [1, 2, 3, 8])
@pytest.mark.parametrize("kind", ["none", "model", "ngram"])
def test_greedy_rows_equal_single_sequence_target_only(target, btarget, bnear, prompts, b, kind):
    rows = prompts[:b]
    budgets, eos = budgets_and_eos(target, prompts, b)
    refs = [autoregressive_generate(target, p, n, eos_ids=eos, vocab_size=V) for p, n in zip(rows, budgets)]
    rec = Recorder(btarget)
    drafter = make_drafter(kind, bnear)
    out = generate_batch(rec, rows, budgets, drafter=drafter, k=None if drafter is None else 4,
                         eos_ids=eos, vocab_size=V)
    assert [o.token_ids for o in out] == [r.token_ids for r in refs]
    assert [o.finish_reason for o in out] == [r.finish_reason for r in refs]
    if b >= 2:
        assert out[1].finish_reason == "eos" and len(out[1].token_ids) < budgets[1]
        assert len({o.num_rounds for o in out}) > 1, "rows should end at different rounds"
    if kind == "model" and b == 8:
        assert 0 < sum(o.num_accepted for o in out) < sum(o.num_drafted for o in out)
    # after every round each live row's cache holds exactly its committed tokens minus the last
    for r, (lengths, valid) in enumerate(rec.after_truncate):
        live = [i for i in range(b) if out[i].num_rounds > r]
        want = [len(rows[i]) + sum(x.num_emitted for x in out[i].rounds[: r + 1]) - 1 for i in live]
        assert lengths == want and valid == want, r
    assert len(rec.after_truncate) == max(o.num_rounds for o in out)


def test_records_match_single_sequence_speculative(target, near_draft, btarget, bnear, prompts):
    """Per-row rounds (K, accepted, flags, emitted) are the single-sequence loop's for the same K."""
    budgets = [20, 14, 9]
    out = generate_batch(btarget, prompts[:3], budgets, drafter=BatchedModelDrafter(bnear, V), k=3, vocab_size=V)
    for p, n, o in zip(prompts[:3], budgets, out):
        ref = speculative_generate(target, ModelDrafter(near_draft, V), p, n, k=3, vocab_size=V)
        assert o.token_ids == ref.token_ids
        assert [(r.k, r.num_accepted, r.accept_flags, r.num_emitted, r.next_kind) for r in o.rounds] == \
            [(r.k, r.num_accepted, r.accept_flags, r.num_emitted, r.next_kind) for r in ref.rounds]


def test_sampled_rows_equal_single_sequence_with_the_same_seed(target, near_draft, btarget, bnear, prompts):
    rows, seeds = prompts[:4], [11, 12, 13, 14]
    base = generate_batch(btarget, rows, 16, sampling=SAMPLED, seed=seeds, vocab_size=V)
    spec = generate_batch(btarget, rows, 16, drafter=BatchedModelDrafter(bnear, V), k=3, sampling=SAMPLED,
                          seed=seeds, vocab_size=V)
    for i, p in enumerate(rows):
        a = autoregressive_generate(target, p, 16, sampling=SAMPLED, seed=seeds[i], vocab_size=V)
        s = speculative_generate(target, ModelDrafter(near_draft, V), p, 16, k=3, sampling=SAMPLED,
                                 seed=seeds[i], vocab_size=V)
        assert base[i].token_ids == a.token_ids
        assert spec[i].token_ids == s.token_ids
        assert [r.accept_flags for r in spec[i].rounds] == [r.accept_flags for r in s.rounds]
    assert len({tuple(o.token_ids) for o in base}) == len(rows)


@pytest.mark.parametrize("slack", [hfb.COMPACT_SLACK, 2])
def test_backend_logits_equal_single_sequence_through_rollback_keep_and_compaction(target, btarget, prompts,
                                                                                    monkeypatch, slack):
    """Random forwards of different lengths per row, per-row truncation and row removal: every row's
    logits equal a fresh single-sequence forward over that row's tokens."""
    monkeypatch.setattr(hfb, "COMPACT_SLACK", slack)
    gen = torch.Generator().manual_seed(0)
    seqs = [list(p[:-1]) for p in prompts[:5]]
    btarget.prefill([list(s) for s in seqs])
    widest = 0
    for step in range(12):
        feed = [torch.randint(3, V, (int(torch.randint(0, 5, (1,), generator=gen)),), generator=gen).tolist()
                for _ in seqs]
        got = btarget.forward(feed)
        for s, f, g in zip(seqs, feed, got):
            s.extend(f)
            assert g.shape == (len(f), target.vocab_size)
            if f:
                target.reset()
                want = target.forward(s)[-len(f):]
                assert torch.allclose(g, want, atol=1e-4), step
        widest = max(widest, btarget.physical_length - max(btarget.cache_lengths))
        cut = [max(0, len(s) - int(torch.randint(0, 4, (1,), generator=gen))) for s in seqs]
        btarget.truncate(cut)
        seqs = [s[:c] for s, c in zip(seqs, cut)]
        if step == 6:
            btarget.keep([3, 0, 4])
            seqs = [seqs[3], seqs[0], seqs[4]]
        assert btarget.cache_lengths == [len(s) for s in seqs] == btarget.valid_counts()
    assert widest > 0, "the run must leave holes (masked slots) in some row"
    last = btarget.forward([[7]] * len(seqs), last=1)
    for s, g in zip(seqs, last):
        target.reset()
        assert torch.allclose(g[0], target.forward(s + [7])[-1], atol=1e-4)
    if slack == 2:
        assert btarget.physical_length <= max(btarget.cache_lengths) + 2 + 5


def test_filler_slots_are_zero_and_an_empty_row_that_feeds_nothing_stays_exact(target, btarget):
    """A row with an empty cache that feeds nothing (a one-token prompt whose draft skips a round) has only
    masked keys; its filler slots must not carry anything into later forwards."""
    btarget.prefill([[], [5, 6, 7]])
    btarget.forward([[], [8, 9]])
    for layer in btarget.cache.layers:
        assert not layer.keys[0].any() and not layer.values[0].any()
        assert layer.keys[1, :, 3:5].any()
    got = btarget.forward([[3], [10]])
    target.reset()
    assert torch.allclose(got[0], target.forward([3]), atol=1e-4)
    target.reset()
    assert torch.allclose(got[1], target.forward([5, 6, 7, 8, 9, 10])[-1:], atol=1e-4)


def test_zero_budget_rows_and_one_token_prompts(target, btarget, bnear, prompts):
    rows = [prompts[6], prompts[0], prompts[2]]
    assert len(rows[0]) == 1
    out = generate_batch(btarget, rows, [5, 0, 7], drafter=BatchedModelDrafter(bnear, V), k=2, vocab_size=V)
    assert out[1].token_ids == [] and out[1].finish_reason == "empty" and out[1].rounds == []
    for i in (0, 2):
        want = autoregressive_generate(target, rows[i], [5, 0, 7][i], vocab_size=V).token_ids
        assert out[i].token_ids == want


def test_bad_inputs_and_refusals(btarget, bnear, prompts, mistral_pair):
    with pytest.raises(ValueError, match="no prompts"):
        generate_batch(btarget, [], 4)
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        generate_batch(btarget, [prompts[0], []], 4)
    with pytest.raises(ValueError, match="budgets"):
        generate_batch(btarget, prompts[:2], [4])
    with pytest.raises(ValueError, match="need a drafter"):
        generate_batch(btarget, prompts[:2], 4, k=2)
    with pytest.raises(ValueError, match="exactly one"):
        generate_batch(btarget, prompts[:2], 4, drafter=BatchedModelDrafter(bnear, V))
    with pytest.raises(ValueError, match="K must be >= 1"):
        generate_batch(btarget, prompts[:2], 4, drafter=BatchedModelDrafter(bnear, V), k=0)
    with pytest.raises(ContextOverflowError, match="prompt 0"):
        generate_batch(btarget, prompts[:2], 128)
    with pytest.raises(BackendError, match="full-attention"):
        BatchedHFBackend(load_backend(mistral_pair.target_dir).model)


# -- batch-aware K ---------------------------------------------------------------------------------------


def brute_k(alphas, cost, max_k, draft=None):
    rates = [sum(expected_tokens_per_round(a, k) for a in alphas)
             / (cost(len(alphas) * (k + 1)) + (draft(len(alphas), k) if draft and k else 0.0))
             for k in range(max_k + 1)]
    return rates.index(max(rates))


def test_expected_committed():
    assert expected_tokens_per_round(0.0, 5) == 1.0
    assert expected_tokens_per_round(1.0, 5) == 6.0
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.5, 2)


def test_batch_k_shrinks_as_the_batch_fills_a_flat_then_linear_curve():
    """GPU-like: a forward costs the same up to 64 tokens, then grows linearly."""
    def gpu(n):
        return 1.0 + max(0, n - 64) / 64

    ks = {b: best_batch_k([0.8] * b, gpu, max_k=16) for b in (1, 4, 16, 64)}
    assert ks[1] == 16 and ks[1] >= ks[4] >= ks[16] >= ks[64]
    assert ks[16] == 3 and ks[64] == 0
    for b, k in ks.items():
        assert k == brute_k([0.8] * b, gpu, 16)


def test_batch_k_is_zero_when_nothing_pays():
    def cpu(n):
        return 0.01 * n  # every token costs a full step: no K > 0 can win for alpha < 1

    assert best_batch_k([0.9, 0.95, 0.5], cpu, max_k=8) == 0
    assert best_batch_k([0.0] * 4, lambda n: 1.0, max_k=8) == 0  # nothing is ever accepted
    # a dear draft cancels a flat target curve
    assert best_batch_k([0.6] * 2, lambda n: 1.0, max_k=8, draft_cost=lambda b, k: 2.0 * k) == 0


def test_batch_k_matches_brute_force_on_random_curves():
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        b = int(torch.randint(1, 17, (1,), generator=gen))
        alphas = torch.rand(b, generator=gen).tolist()
        base, slope, knee = torch.rand(3, generator=gen).tolist()

        def cost(n, base=base, slope=slope, knee=knee):
            return 0.1 + base + slope * max(0.0, n - 100 * knee)

        step = float(torch.rand((), generator=gen)) * 0.1
        def draft(bb, k, step=step):
            return step * k

        assert best_batch_k(alphas, cost, max_k=10, draft_cost=draft) == brute_k(alphas, cost, 10, draft)


def test_batch_k_bad_inputs():
    with pytest.raises(ValueError, match="at least one row"):
        best_batch_k([], lambda n: 1.0, max_k=4)
    with pytest.raises(ValueError, match="finite and > 0"):
        best_batch_k([0.5], lambda n: 0.0, max_k=4)
    with pytest.raises(ValueError, match="max_k"):
        best_batch_k([0.5], lambda n: 1.0, max_k=-1)
    with pytest.raises(ValueError):
        FixedBatchK(0)


def test_batch_cost_policy_estimates_per_row_and_drives_the_loop(target, btarget, bnear, prompts):
    def cost(n):
        return 1.0 + 0.4 * (n - 1)

    policy = BatchCostPolicy(cost, max_k=6, prior_alpha=0.6)
    policy.start(2)
    for _ in range(5):
        policy.observe(0, RoundRecord(4, 4, (True,) * 4, "bonus", 5))
        policy.observe(1, RoundRecord(4, 0, (False,), "recovered", 1))
        policy.observe(1, RoundRecord(0, 0, (), "bonus", 1))  # plain rounds carry no evidence
    assert policy.alpha(0) > 0.9 and policy.alpha(1) < 0.25
    assert policy.next_k([0]) == brute_k([policy.alpha(0)], cost, 6) >= 3
    assert policy.next_k([1]) == 0
    assert policy.next_k([0, 1]) == brute_k([policy.alpha(0), policy.alpha(1)], cost, 6)
    assert policy.alpha_estimate([0, 1]) == pytest.approx((policy.alpha(0) + policy.alpha(1)) / 2)
    # a prior worth 4 trials: the ledger judges the first rounds at the estimate, not at the worst case
    policy = BatchCostPolicy(cost, max_k=6, prior_alpha=0.9, prior_weight=4.0)
    rows = prompts[:3]
    out = generate_batch(btarget, rows, 20, drafter=BatchedModelDrafter(bnear, V), policy=policy, vocab_size=V)
    for p, o in zip(rows, out):
        assert o.token_ids == autoregressive_generate(target, p, 20, vocab_size=V).token_ids
    for j in range(max(o.num_rounds for o in out)):  # one K per round for the whole batch
        assert len({o.rounds[j].k_requested for o in out if o.num_rounds > j}) == 1
    assert any(r.k > 0 for r in out[0].rounds)
    never = BatchCostPolicy(lambda n: float(n), max_k=6)
    out = generate_batch(btarget, rows, 10, drafter=BatchedModelDrafter(bnear, V), policy=never, vocab_size=V)
    assert all(r.k == 0 for o in out for r in o.rounds)


class CountingBackend(Recorder):
    """A `Recorder` that also counts the tokens fed to the backend's forwards and prefills."""

    def __init__(self, inner):
        super().__init__(inner)
        self.forward_tokens = 0
        self.prefill_tokens = 0

    def prefill(self, contexts):
        self.prefill_tokens += sum(len(c) for c in contexts)
        self.inner.prefill(contexts)

    def forward(self, tokens, *, last=None):
        self.forward_tokens += sum(len(t) for t in tokens)
        return self.inner.forward(tokens, last=last)


def test_batched_draft_defers_its_prefill_to_its_first_drafting_round(target, btarget, bnear, prompts):
    rows = prompts[:4]
    draft = CountingBackend(bnear)
    never = BatchCostPolicy(lambda n: float(n), max_k=4, draft_cost=lambda b, k: 0.1 * k)
    out = generate_batch(btarget, rows, 6, drafter=BatchedModelDrafter(draft, V), policy=never, vocab_size=V)
    assert all(r.k == 0 for o in out for r in o.rounds)
    assert draft.prefill_tokens == 0 and draft.forward_tokens == 0  # a batch that never drafts never runs the draft
    draft = CountingBackend(bnear)
    out = generate_batch(btarget, rows, 6, drafter=BatchedModelDrafter(draft, V), k=2, vocab_size=V)
    assert draft.prefill_tokens == 0
    # the first drafting round feeds every row's whole prompt (the deferred prefill), then 1-2 tokens per row
    assert draft.forward_tokens >= sum(len(p) for p in rows)
    for p, o in zip(rows, out):
        assert o.token_ids == autoregressive_generate(target, p, 6, vocab_size=V).token_ids


def _drive(policy, rows, rounds, accept):
    """Run `policy` for `rounds` rounds over `rows`, each row accepting ``accept(k)`` of its K drafts; returns
    the K chosen per round."""
    ks = []
    for _ in range(rounds):
        k = policy.next_k(rows)
        ks.append(k)
        for r in rows:
            a = min(k, accept(k))
            kind = "bonus" if a == k else "recovered"
            policy.observe(r, RoundRecord(k, a, (True,) * a + ((False,) if a < k else ()), kind, a + 1))
    return ks


def test_batch_cost_policy_prices_the_deferred_draft_prefill_as_an_investment():
    def cost(n):
        return 1.0 + 0.05 * (n - 1)  # a flat curve: speculation pays at a high acceptance

    def draft(b, k):
        return 0.1 * k

    # long prompts, short budgets: the draft's prefill (about 0.1 x 250 tokens of the target's curve) cannot be
    # paid back in 4 tokens per row, so the policy stays plain and never runs the draft
    short = BatchCostPolicy(cost, max_k=4, draft_cost=draft, prior_alpha=0.9)
    short.start(2, context_lens=[500, 500], budgets=[4, 4])
    assert _drive(short, [0, 1], 4, lambda k: k) == [0, 0, 0, 0]
    assert short.invested_rounds == 0 and short.declined == 4
    # the same prompts with 400 tokens left per row: the prefill pays, made once, then speculation goes on
    long = BatchCostPolicy(cost, max_k=4, draft_cost=draft, prior_alpha=0.9)
    long.start(2, context_lens=[500, 500], budgets=[400, 400])
    ks = _drive(long, [0, 1], 6, lambda k: k)
    assert all(k > 0 for k in ks) and long.invested_rounds == 1
    # after an all-accepted round the catch-up is 2 tokens per row: priced, but less than a draft step
    assert 0.0 < long.catch_up_s([0, 1]) < draft(2, 1)
    # without a draft model (free drafting) nothing is pending
    free = BatchCostPolicy(cost, max_k=4, prior_alpha=0.9)
    free.start(2, context_lens=[500, 500], budgets=[400, 400])
    assert free.catch_up_s([0, 1]) == 0.0 and free.next_k([0, 1]) > 0


def test_batch_cost_policy_probes_on_its_optimistic_estimate_after_an_unlucky_round():
    def cost(n):
        return 1.0 + 0.4 * (n - 1)  # K = 1 pays above alpha = 0.4

    ks = {}
    for z in (1.0, 0.0):
        policy = BatchCostPolicy(cost, max_k=4, explore_z=z)
        policy.start(1, budgets=[100])
        first = policy.next_k([0])
        policy.observe(0, RoundRecord(first, 0, (False,), "recovered", 1))  # every draft rejected once
        assert policy.alpha(0) == pytest.approx(0.4)  # at the estimate K = 1 only breaks even
        ks[z] = policy.next_k([0])
    assert ks[1.0] == 1 and ks[0.0] == 0  # z = 0 is the control: one round ends speculation


def test_batch_cost_policy_prices_a_round_on_the_prior_at_its_worst_case():
    def cost(n):
        return 1.0 + 0.2 * (n - 1)  # 8 rows: 1 token each 2.4 s, 2 tokens each 4.0 s

    # on the prior alone (2 trials) a round is priced as if every draft failed: K = 1 then loses 1.6 s, 0.67
    # plain steps, more than the allowance of a 32-token budget (1% of it: 0.32 steps), so the batch decodes
    # plainly; with 128 tokens (allowance 1 step) it drafts, and so does a prior worth 3 trials, judged at its
    # estimate
    for budget, weight, want in ((32, 2.0, 0), (128, 2.0, 1), (32, 3.0, 1)):
        policy = BatchCostPolicy(cost, max_k=4, prior_alpha=0.9, prior_weight=weight, explore_z=0.0)
        policy.start(8, budgets=[budget] * 8)
        assert min(policy.next_k(list(range(8))), 1) == want, (budget, weight)
    flat = BatchCostPolicy(lambda n: 1.0 + 0.01 * (n - 1), max_k=4, prior_alpha=0.9)
    flat.start(8, budgets=[32] * 8)
    assert flat.next_k(list(range(8))) >= 1  # a cheap worst case fits: it drafts from the first round


def test_batch_cost_policy_counts_a_row_that_drafted_nothing_as_one_token():
    def cost(n):
        return 1.0 + 0.3 * (n - 1)  # 4 rows: 1 token each 1.9 s, 2 tokens each 3.1 s

    # rows 1..3 found no match (a free drafter drafted nothing for them), row 0 accepted everything: at the
    # rows' estimates K = 1 would pay, but only row 0 can draft, so the batch decodes plainly
    rows = [0, 1, 2, 3]
    policy = BatchCostPolicy(cost, max_k=4, prior_alpha=0.9, prior_weight=4.0)
    policy.start(4, budgets=[100] * 4)
    k = policy.next_k(rows)
    assert k > 0
    policy.observe(0, RoundRecord(k, k, (True,) * k, "bonus", k + 1))
    for r in rows[1:]:
        policy.observe(r, RoundRecord(0, 0, (), "bonus", 1))
    assert policy.expected_alpha(1) == 0.0 and policy.alpha(1) == pytest.approx(0.9)
    assert best_batch_k([policy.alpha(r) for r in rows], cost, max_k=4) > 0  # control: the estimates draft
    assert policy.next_k(rows) == 0
    # the plain round passes: every row may have a match again, and the batch drafts
    for r in rows:
        policy.observe(r, RoundRecord(0, 0, (), "bonus", 1))
    assert policy.next_k(rows) > 0 and policy.expected_alpha(1) == pytest.approx(0.9)


def test_best_batch_k_prices_each_row_at_what_it_has_to_draft():
    def cost(n):
        return 1.0 + 0.1 * (n - 1)

    alphas, caps = [0.9, 0.9, 0.5, 0.2], [3, 0, 1, 0]

    def rate(k):  # rows draft min(K, cap); the round is padded to the widest row
        width = min(k, max(caps)) + 1
        return sum(expected_tokens_per_round(a, min(k, c)) for a, c in zip(alphas, caps)) / cost(4 * width)

    want = max(range(4), key=lambda k: (rate(k), -k))
    assert best_batch_k(alphas, cost, max_k=8, caps=caps) == want > 0
    assert best_batch_k(alphas, cost, max_k=8) > want  # control: without caps every row drafts K
    assert best_batch_k(alphas, cost, max_k=8, caps=[0] * 4) == 0  # nothing to draft: plain
    # a row with nothing to draft commits one token whatever its acceptance
    assert best_batch_k([0.9, 1.0], cost, max_k=8, caps=[2, 0]) == best_batch_k([0.9, 0.0], cost, max_k=8,
                                                                               caps=[2, 0])
    for bad in ([1, 2], [1, -1, 0, 0]):
        with pytest.raises(ValueError, match="caps"):
            best_batch_k(alphas, cost, max_k=4, caps=bad)


def test_batch_cost_policy_drafts_only_for_rows_with_something_to_draft():
    def cost(n):
        return 1.0 + 0.3 * (n - 1)  # 4 rows: 1 token each 1.9 s, 2 tokens each 3.1 s

    def policy():
        p = BatchCostPolicy(cost, max_k=4, prior_alpha=0.9, prior_weight=4.0)
        p.start(4, budgets=[100] * 4)
        return p

    rows = [0, 1, 2, 3]
    assert policy().next_k(rows) > 0  # control: unknown matches, the estimates draft
    assert policy().next_k(rows, [4, 4, 4, 4]) > 0
    assert policy().next_k(rows, [4, 0, 0, 0]) == 0  # one row's draft cannot pay for three plain rows
    p = policy()
    assert p.next_k(rows, [0, 0, 0, 0]) == 0 and p.declined == 0  # no row has a match: plain, nothing declined
    with pytest.raises(ValueError, match="available"):
        policy().next_k(rows, [1, 1])


class _NoModel:
    """A drafter without the `free` flag (drafting it would cost): it proposes its scripted token K times."""

    name = "scripted"

    def prefill(self, context):
        pass

    def max_k(self, n):
        return 1 << 30

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        from specdec.drafters.base import Draft
        return Draft([7] * max(0, k), None)

    def rollback(self, committed):
        pass


def test_per_row_drafters_preview_what_each_row_would_draft(prompts):
    rows = [prompts[1], prompts[0], prompts[4]]  # repetitive, no repeat, short repeat
    d = PerRowDrafters(PromptLookupDrafter)
    assert d.free
    d.prefill([p[:-1] for p in rows])
    one = PromptLookupDrafter()
    direct = [one.propose(p, 4, GREEDY, None).tokens for p in rows]
    assert d.preview(rows, [4, 4, 4], GREEDY) == [len(t) for t in direct]
    assert any(direct) and not all(direct)
    # the round then drafts a prefix of the preview, as a direct proposal at that K
    got = d.propose(rows, [2, 0, 3], GREEDY, [None] * 3)
    assert [g.tokens for g in got] == [one.propose(p, k, GREEDY, None).tokens for p, k in zip(rows, [2, 0, 3])]
    scripted = PerRowDrafters(_NoModel)
    assert not scripted.free
    scripted.prefill([p[:-1] for p in rows])
    with pytest.raises(TypeError, match="not free"):
        scripted.preview(rows, [2, 2, 2], GREEDY)


def test_batch_cost_policy_sees_prompt_lookup_matches_and_stays_exact(target, btarget, prompts):
    class Spy(BatchCostPolicy):
        def next_k(self, rows, available=None):
            self.seen.append(None if available is None else list(available))
            return super().next_k(rows, available)

    policy = Spy(lambda n: 1.0 + 0.02 * (n - 1), max_k=4, prior_alpha=0.9)
    policy.seen = []
    rows = prompts[:5]
    out = generate_batch(btarget, rows, 12, drafter=PerRowDrafters(PromptLookupDrafter), policy=policy,
                         vocab_size=V)
    for p, o in zip(rows, out):
        assert o.token_ids == autoregressive_generate(target, p, 12, vocab_size=V).token_ids
    assert policy.seen and all(a is not None for a in policy.seen)
    assert any(r.k > 0 for o in out for r in o.rounds)
    for j, avail in enumerate(policy.seen):  # no row drafts more than it had to draft
        live = [o for o in out if o.num_rounds > j]
        assert len(live) == len(avail)
        assert all(o.rounds[j].k <= a for o, a in zip(live, avail))
        if max(avail) == 0:
            assert all(o.rounds[j].k_requested == 0 for o in live)


def _drive_timed(policy, rows, rounds, accept, cost, spec_factor):
    """`_drive` with wall-clock seconds in the records: a plain round takes its curve price, a speculative one
    `spec_factor` times it (a round dearer in the decoding loop than in the calibration)."""
    ks = []
    for _ in range(rounds):
        k = policy.next_k(rows)
        ks.append(k)
        seconds = cost(len(rows) * (k + 1)) * (spec_factor if k > 0 else 1.0)
        for r in rows:
            a = min(k, accept(k))
            kind = "bonus" if a == k else "recovered"
            policy.observe(r, RoundRecord(k, a, (True,) * a + ((False,) if a < k else ()), kind, a + 1,
                                          verify_s=seconds))
    return ks


def test_batch_cost_policy_prices_speculative_rounds_at_their_measured_overhead():
    def cost(n):
        return 1.0 + 0.1 * (n - 1)  # 4 rows: K = 1 costs 1.7 s against 1.3 s plain

    rows = [0, 1, 2, 3]
    ks = {}
    for factor in (1.0, 1.6):
        policy = BatchCostPolicy(cost, max_k=4, prior_alpha=0.5, prior_weight=4.0)
        policy.start(4, budgets=[1000] * 4, timed=True)
        ks[factor] = _drive_timed(policy, rows, 60, lambda k: min(k, 1), cost, factor)
        assert ks[factor][:3] == [0, 0, 0]  # the timed reference: three plain rounds first
        if factor > 1.0:
            assert policy.overhead() == pytest.approx(factor)
    # on the curve, 2 tokens per row for a K = 1 round pay (2 x 1.3 > 1.7 s): the control drafts throughout
    assert all(k > 0 for k in ks[1.0][3:])
    # 1.6x dearer in the loop (2.72 s for 2 tokens a row) they do not: after the first measured round, plain
    assert sum(k > 0 for k in ks[1.6]) <= 2 and ks[1.6][-1] == 0
    untimed = BatchCostPolicy(cost, max_k=4, prior_alpha=0.5, prior_weight=4.0)
    untimed.start(4, budgets=[1000] * 4)
    assert untimed.next_k(rows) > 0  # rounds without times (replays): no reference rounds
    with pytest.raises(ValueError, match="reference_rounds"):
        BatchCostPolicy(cost, reference_rounds=-1)


def test_batch_cost_policy_ledger_counts_the_measured_loss():
    def cost(n):
        return 1.0 + 0.1 * (n - 1)

    # a prior held fixed at a high acceptance, every draft accepted on the curve's terms but 3x dearer in the
    # loop, and no overhead pricing (its median is dominated by cheap rounds): the measured ledger stops it
    policy = BatchCostPolicy(cost, max_k=1, prior_alpha=0.9, prior_weight=1e9, decay=1.0)
    policy.start(2, budgets=[1000] * 2, timed=True)
    policy.overhead = lambda: 1.0  # isolate the ledger
    ks = _drive_timed(policy, [0, 1], 200, lambda k: 0, cost, 3.0)
    assert 0 < sum(k > 0 for k in ks) < 10
    assert policy.net_loss() > policy.ledger.priced_loss_s  # the measured loss is the larger
    priced_only = BatchCostPolicy(cost, max_k=1, prior_alpha=0.9, prior_weight=1e9, decay=1.0)
    priced_only.start(2, budgets=[1000] * 2)  # untimed: the same rounds, priced only
    priced_only.overhead = lambda: 1.0
    assert sum(k > 0 for k in _drive_timed(priced_only, [0, 1], 200, lambda k: 0, cost, 1.0)) > \
        sum(k > 0 for k in ks)


def test_batch_cost_policy_ledger_bounds_the_loss_of_a_wrong_estimate():
    def cost(n):
        return 1.0 + 0.1 * (n - 1)

    # a prior held fixed (huge weight): the estimate never learns that nothing is accepted, only the ledger
    # can stop speculating
    stubborn = {"max_k": 4, "prior_alpha": 0.8, "prior_weight": 1e9, "decay": 1.0}
    policy = BatchCostPolicy(cost, **stubborn)
    policy.start(4, budgets=[1000] * 4)
    rows = [0, 1, 2, 3]
    ks = _drive(policy, rows, 300, lambda k: 0)
    spec = [k for k in ks if k > 0]
    assert 0 < len(spec) < 20
    priced = sum(cost(4 * (k + 1)) for k in ks)  # every round commits 1 token per row, as a plain step does
    plain = len(ks) * cost(4)
    bound = policy.probe_allowance * cost(4) + policy.probe_budget * priced + max(cost(4 * (k + 1)) for k in ks)
    assert priced - plain <= bound
    unbounded = BatchCostPolicy(cost, **stubborn, probe_budget=math.inf)
    unbounded.start(4, budgets=[1000] * 4)
    assert all(k > 0 for k in _drive(unbounded, rows, 50, lambda k: 0))  # negative control: no ledger
    with pytest.raises(ValueError):
        BatchCostPolicy(cost, probe_budget=0.0)
    with pytest.raises(ValueError):
        BatchCostPolicy(cost, invest_margin=-1.0)


# -- joint law of sampled rows on a synthetic table model --------------------------------------------------

VOCAB3 = 3
CHI2_CRIT_DF78_A001 = 122.35  # scipy.stats.chi2.ppf(0.999, 78): three rows of 27 cells


def _law(seed: int, ctx) -> torch.Tensor:
    key = tuple(ctx[-2:])
    g = torch.Generator().manual_seed(1000 * seed + sum((t + 1) * 10**i for i, t in enumerate(key)) + 7 * len(key))
    w = torch.rand(VOCAB3, generator=g) + 0.25
    return w / w.sum()


class TableLM:
    """A `BatchedBackend` whose next-token law is a table of the last two tokens (``_law(seed, ctx)``);
    logits are log-probabilities, so temperature-1 sampling draws from the table exactly."""

    name = "table"
    vocab_size = VOCAB3
    max_length = 64
    max_rows = None
    device = torch.device("cpu")

    def __init__(self, seed):
        self.seed = seed
        self.seqs = []

    @property
    def rows(self):
        return len(self.seqs)

    @property
    def cache_lengths(self):
        return [len(s) for s in self.seqs]

    def prefill(self, contexts):
        self.seqs = [list(c) for c in contexts]

    def forward(self, tokens, *, last=None):
        out = []
        for s, t in zip(self.seqs, tokens):
            rows = []
            for tok in t:
                s.append(tok)
                rows.append(torch.log(_law(self.seed, s)))
            rows = rows[-last:] if last else rows
            out.append(torch.stack(rows) if rows else torch.empty(0, VOCAB3))
        return out

    def truncate(self, lengths):
        self.seqs = [s[:n] for s, n in zip(self.seqs, lengths)]

    def keep(self, rows):
        self.seqs = [self.seqs[r] for r in rows]

    def synchronize(self):
        pass


JOINT_PROMPTS = [[0], [2, 1], [1, 1, 0]]


def joint_chi_square(n_draws: int) -> float:
    """Sum over the rows of Pearson's chi-square of the first three tokens against the target's law."""
    target, draft = TableLM(1), TableLM(2)
    counts = [dict.fromkeys(itertools.product(range(VOCAB3), repeat=3), 0) for _ in JOINT_PROMPTS]
    sampling = SamplingParams(temperature=1.0)
    for n in range(n_draws):
        seeds = [n * len(JOINT_PROMPTS) + i for i in range(len(JOINT_PROMPTS))]
        out = generate_batch(target, JOINT_PROMPTS, 4, drafter=BatchedModelDrafter(draft, VOCAB3), k=3,
                             sampling=sampling, seed=seeds)
        for c, o in zip(counts, out):
            c[tuple(o.token_ids[:3])] += 1
    stat = 0.0
    for p, c in zip(JOINT_PROMPTS, counts):
        for (a, b_, d), m in c.items():
            expected = n_draws * float(_law(1, p)[a] * _law(1, p + [a])[b_] * _law(1, p + [a, b_])[d])
            stat += (m - expected) ** 2 / expected
    return stat


def test_joint_law_of_each_sampled_row_is_the_targets():
    stat = joint_chi_square(2000)
    print(f"chi2 = {stat:.1f} (df 78, critical {CHI2_CRIT_DF78_A001} at alpha 0.001)")
    assert stat < CHI2_CRIT_DF78_A001, stat


def test_joint_negative_control_recovered_token_from_p(monkeypatch):
    monkeypatch.setattr(ver, "residual", lambda p, q: p)
    stat = joint_chi_square(800)
    print(f"chi2 = {stat:.1f}")
    assert stat > CHI2_CRIT_DF78_A001, stat
    assert math.isfinite(stat)


# -- llama.cpp: each row its own sequence ------------------------------------------------------------------

LLAMA_TEXTS = ["The capital of France is", "def fib(n):\n    ", "one two three four five six", "Hello",
               "Write a haiku about the sea.", "1, 2, 3, 4, 5,", "The quick brown fox", "Once upon a time"]


@pytest.fixture(scope="module")
def llama(smollm2_gguf):
    pytest.importorskip("llama_cpp")
    from specdec.runtimes.llamacpp import load_llamacpp
    from specdec.runtimes.llamacpp_batched import BatchedLlamaCppBackend

    single = load_llamacpp(smollm2_gguf, n_ctx=128, n_threads=1)
    bt = BatchedLlamaCppBackend(smollm2_gguf, max_rows=8, n_ctx=128, n_threads=1)
    bd = BatchedLlamaCppBackend(smollm2_gguf, max_rows=8, n_ctx=128, n_threads=1)
    yield single, bt, bd
    for be in (single, bt, bd):
        be.close()


def test_llamacpp_ragged_rows_are_padded_and_the_fillers_removed(llama):
    """A forward whose rows feed 3, 1 and 0 tokens: the fillers that make it one micro-batch leave no trace -
    every row's scored logits are those of its own sequence fed alone (single-sequence backend, same
    positions), and llama.cpp's cache holds exactly the real tokens of each row afterwards."""
    single, bt, _ = llama
    ctxs = [single.tokenize(t) for t in LLAMA_TEXTS[:3]]
    feeds = [[11, 12, 13], [14], []]
    got = {}
    decode = bt._decode
    fed = []
    for pad in (True, False):
        bt.pad_ragged = pad
        bt.prefill(ctxs)
        bt._decode = lambda entries: fed.append(len(entries)) or decode(entries)
        try:
            got[pad] = bt.forward(feeds)
        finally:
            del bt._decode
        assert fed.pop() == (6 if pad else 4)  # padded: 3 + 3 tokens, one micro-batch
        assert bt.cache_lengths == [len(c) + len(f) for c, f in zip(ctxs, feeds)]
        assert bt.valid_counts() == bt.cache_lengths  # no filler left in llama.cpp's cache
        assert bt.forward([[7], [7], [7]])[0].shape[0] == 1  # and the rows go on from their real lengths
    bt.pad_ragged = True
    for i, (ctx, feed) in enumerate(zip(ctxs, feeds)):
        assert got[True][i].shape == (len(feed), bt.vocab_size)
        if feed:
            single.reset()
            ref = single.forward(ctx + feed)[-len(feed):]
            assert torch.allclose(got[True][i], ref, atol=1e-3), i
            assert torch.allclose(got[True][i], got[False][i], atol=1e-3), i


def test_llamacpp_keep_moves_live_rows_into_consecutive_sequence_ids(llama):
    """After rows finish, the live rows hold sequence ids 0..n-1 (llama.cpp runs only consecutive ids in
    one micro-batch), the moved rows keep their caches, and their next logits equal their own sequence fed
    alone, bitwise."""
    single, bt, _ = llama
    ctxs = [single.tokenize(t) for t in LLAMA_TEXTS[:5]]
    bt.prefill(ctxs)
    bt.keep([1, 3, 4])  # rows 0 and 2 finished: ids 3 and 4 move into the freed 0 and 2
    assert sorted(bt._seqs) == [0, 1, 2] and bt.cache_lengths == [len(ctxs[i]) for i in (1, 3, 4)]
    assert bt.valid_counts() == bt.cache_lengths
    assert [int(bt._lib.llama_memory_seq_pos_max(bt._mem, s)) for s in (3, 4)] == [-1, -1]  # freed
    feeds = [[21, 22], [23, 24], [25, 26]]
    got = bt.forward(feeds)
    for row, i in enumerate((1, 3, 4)):
        single.reset()
        ref = single.forward(ctxs[i] + feeds[row])[-2:]
        assert torch.equal(got[row], ref), i
    assert bt.valid_counts() == [len(ctxs[i]) + 2 for i in (1, 3, 4)]
    bt.keep([2, 0])  # reordered and shrunk: still consecutive, in any order
    assert sorted(bt._seqs) == [0, 1] and bt.valid_counts() == bt.cache_lengths


def divergence_margin(single, prompt, out, ref) -> str:
    """Where `out` first leaves `ref`, and the oracle's top-2 logit margin there."""
    j = next((j for j, (x, y) in enumerate(zip(out.token_ids, ref.token_ids)) if x != y), None)
    if j is None:
        return f"lengths {len(out.token_ids)} vs {len(ref.token_ids)}"
    single.reset()
    top = single.forward(list(prompt) + ref.token_ids[:j])[-1].topk(2).values
    return f"first differs at token {j}; oracle top-2 margin {float(top[0] - top[1]):.4f} logits"


@pytest.mark.slow
def test_llamacpp_batched_greedy_rows_equal_single_sequence(llama):
    """B = 3 and 8 on llama.cpp (one seq_id per row), target-only, draft model (the same GGUF: every draft
    accepted) and prompt lookup; per-row budgets and an EOS; cache positions per row after every round.
    With one KV stream per row the rows' logits are bitwise the single-sequence ones here, so the oracle is
    strict; a failure reports the oracle's top-2 margin where the row first differs (a near tie points at
    kernel rounding, a wide margin at a bug)."""
    single, bt, bd = llama
    prompts = [single.tokenize(t) for t in LLAMA_TEXTS]
    budgets = [20, 9, 16, 1, 24, 12, 5, 18]
    first = autoregressive_generate(single, prompts[1], budgets[1]).token_ids
    eos = frozenset({first[next(j for j in range(3, len(first)) if first[j] not in first[:j])]})
    refs = [autoregressive_generate(single, p, n, eos_ids=eos) for p, n in zip(prompts, budgets)]
    assert refs[1].finish_reason == "eos"
    with pytest.raises(ValueError, match="rows"):
        generate_batch(bt, prompts + prompts[:1], 4)
    for b in (3, 8):
        for kind in ("none", "model", "ngram"):
            drafter = {"none": None, "model": BatchedModelDrafter(bd, bt.vocab_size),
                       "ngram": PerRowDrafters(PromptLookupDrafter)}[kind]
            rec = Recorder(bt)
            out = generate_batch(rec, prompts[:b], budgets[:b], drafter=drafter,
                                 k=None if drafter is None else 4, eos_ids=eos)
            for i, (o, r) in enumerate(zip(out, refs)):
                assert o.token_ids == r.token_ids, (b, kind, i, divergence_margin(single, prompts[i], o, r))
                assert o.finish_reason == r.finish_reason
            if kind == "model":
                assert all(o.num_accepted == o.num_drafted for o in out)  # the draft is the target
            for r, (lengths, valid) in enumerate(rec.after_truncate):
                live = [i for i in range(b) if out[i].num_rounds > r]
                want = [len(prompts[i]) + sum(x.num_emitted for x in out[i].rounds[: r + 1]) - 1 for i in live]
                assert lengths == want and valid == want, (b, kind, r)
            assert len({o.num_rounds for o in out}) > 1
