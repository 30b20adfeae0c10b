"""Fault kinds of the decoding core (shared cases C14-C17, C19, C21, C22), on tiny checkpoints.

Each test turns a case's "right" value into an assertion that failed on the code before its fix.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ScriptedDrafter, load_backend

from specdec.core.sampling import SamplingParams
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate

V = 1000




def greedy(target, prompt, n, eos=frozenset()):
    return autoregressive_generate(target, prompt, n, eos_ids=eos, vocab_size=V).token_ids


# -- C15: prompt lookup fills its budget on short periods -------------------------------------------------


@pytest.mark.parametrize(
    "seq,k,want",
    [
        ([5, 6] * 10, 8, [5, 6] * 4),
        ([7] * 12, 8, [7] * 8),
        ([1, 2, 3] * 3, 7, [1, 2, 3, 1, 2, 3, 1]),
        ([4, 9, 4], 3, [9, 4, 9]),  # a 1-gram match one step back: period 2
    ],
)
def test_c15_prompt_lookup_continues_a_short_period(seq, k, want):
    assert PromptLookupDrafter().propose(seq, k, SamplingParams(), None).tokens == want


def test_c15_no_match_proposes_nothing():
    assert PromptLookupDrafter().propose([9, 4, 5], 4, SamplingParams(), None).tokens == []


def test_c15_long_match_is_a_plain_copy():
    """A match far from the end copies what followed it (unchanged behaviour), most recent match first."""
    seq = [1, 2, 3, 10, 11, 12, 13, 14, 15, 1, 2, 3, 20, 21, 22, 23, 24, 25, 26, 1, 2, 3]
    got = PromptLookupDrafter().propose(seq, 4, SamplingParams(), None).tokens
    assert got == [20, 21, 22, 23]


def test_c15_repetitive_prompt_drafts_full_rounds(tiny_tokenizer, target):
    """On a repetitive prompt every speculative round proposes the K asked for; greedy output unchanged."""
    prompt = tiny_tokenizer("abc abc abc abc abc abc abc abc").input_ids
    ref = greedy(target, prompt, 40)
    for k in (4, 8):
        out = speculative_generate(target, PromptLookupDrafter(), prompt, 40, k=k, vocab_size=V)
        assert out.token_ids == ref
        spec = [r for r in out.rounds if r.k > 0]
        assert spec, "prompt lookup never matched"
        remaining = 40
        for r in out.rounds:
            if r.k > 0:
                assert r.k == min(k, remaining - 1), (r, remaining)
            remaining -= r.num_emitted


# -- C14: counts stop where the output stops ---------------------------------------------------------------


def _prompt_with_new_third_token(tok, target):
    for text in ("hello world the quick brown fox", "abc abc abc abc abc abc abc abc", "zq"):
        prompt = tok(text).input_ids
        ref = greedy(target, prompt, 12)
        if ref[2] not in ref[:2] and ref[1] != ref[0]:
            return prompt, ref
    pytest.skip("no prompt whose first three greedy tokens are distinct")


def test_c14_accepted_counts_stop_at_eos(tiny_tokenizer, target, same_draft):
    """SAME, K = 8, EOS = the 3rd greedy token: one round, 3 tokens out; the 5 drafts the verifier accepted
    after the EOS are not counted (raw count kept as num_accepted_raw)."""
    prompt, ref = _prompt_with_new_third_token(tiny_tokenizer, target)
    eos = frozenset({ref[2]})
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, 20, k=8, eos_ids=eos, vocab_size=V)
    assert out.token_ids == ref[:3] and out.finish_reason == "eos" and out.num_rounds == 1
    r = out.rounds[0]
    assert (r.k, r.num_accepted_raw, r.num_accepted, r.num_emitted) == (8, 8, 3, 3)
    assert not r.rejected  # nothing was rejected before the EOS
    assert out.num_accepted == 3 and out.num_rejections == 0
    assert out.acceptance_rate == 1.0  # the drafts after the EOS are not counted as drafted either
    assert out.alpha_hat == 1.0
    assert out.mean_accepted == 3.0 and out.block_efficiency == 3.0
    assert out.mean_accepted <= out.block_efficiency
    assert out.summary()["num_accepted"] == 3
    assert out.rounds_as_dicts()[0]["num_accepted"] == 3


def test_a_perfect_drafter_reads_acceptance_one_at_an_eos_and_at_the_budget(tiny_tokenizer, target, same_draft):
    """SAME (draft == target), K = 8: every rate whose numerator is cut where the output stops has its
    denominator cut alike, so the acceptance rate is 1.0 whether an EOS stops the output inside a drafted
    block (the 3rd token) or the budget does; the stored counts (summary, per-round dicts) and the trace
    replay agree with the real rounds."""
    from specdec.engine.traces import compare_rounds, record_trace, replay

    prompt, ref = _prompt_with_new_third_token(tiny_tokenizer, target)
    for eos, budget in ((frozenset({ref[2]}), 20), (frozenset(), 11), (frozenset(), 3)):
        out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, budget, k=8, eos_ids=eos,
                                   vocab_size=V)
        base = autoregressive_generate(target, prompt, budget, eos_ids=eos, vocab_size=V)
        assert out.token_ids == base.token_ids
        assert out.acceptance_rate == 1.0 and out.alpha_hat == 1.0 and out.num_rejections == 0, (eos, budget)
        assert out.num_drafted == out.num_accepted == sum(r.num_drafted for r in out.rounds)
        s = out.summary()
        assert s["num_drafted"] == s["num_accepted"] and s["acceptance_rate"] == 1.0
        assert [d["num_drafted"] for d in out.rounds_as_dicts()] == [r.num_drafted for r in out.rounds]
        trace = record_trace(prompt, base.token_ids, budget, same_draft, vocab_size=V)
        rounds = replay(trace, k=8)
        assert compare_rounds(out.rounds, rounds) == []
        assert [r.num_drafted for r in rounds] == [r.num_drafted for r in out.rounds]
    # the EOS case: one round of K = 8 verified, 3 drafts counted (the 5 after the EOS never reached the output)
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, 20, k=8, eos_ids=frozenset({ref[2]}),
                               vocab_size=V)
    assert [(r.k, r.num_drafted, r.num_accepted) for r in out.rounds] == [(8, 3, 3)]
    assert out.counts()["num_drafted"] == 3


def test_c14_rejection_after_eos_is_not_counted(tiny_tokenizer, target):
    """A scripted draft right on g1..g4 and wrong at position 5; EOS = g2: the output is g1 g2, so 2
    accepted and no rejection. With EOS = the recovered token, the rejection did reach the output."""

    prompt, ref = _prompt_with_new_third_token(tiny_tokenizer, target)
    full = prompt + ref

    def script(good):
        def fn(committed, k):
            right = full[len(committed):len(committed) + good]
            return (right + [(full[len(committed) + good] + 1) % V] * k)[:k]
        return fn

    out = speculative_generate(target, ScriptedDrafter(script(4)), prompt, 10, k=6,
                               eos_ids=frozenset({ref[1]}), vocab_size=V)
    assert out.token_ids == ref[:2]
    r = out.rounds[0]
    assert (r.num_accepted_raw, r.num_accepted, r.num_emitted, r.next_kind) == (4, 2, 2, "recovered")
    assert not r.rejected and out.num_rejections == 0 and out.alpha_hat == 1.0

    out = speculative_generate(target, ScriptedDrafter(script(1)), prompt, 10, k=6,
                               eos_ids=frozenset({ref[1]}), vocab_size=V)
    assert out.token_ids == ref[:2]
    r = out.rounds[0]
    assert (r.num_accepted_raw, r.num_accepted, r.num_emitted) == (1, 1, 2)
    assert r.rejected and out.num_rejections == 1 and out.alpha_hat == 0.5


# -- C19: sampling work scales with what is used ----------------------------------------------------------


def _reference_warp(logits, params):
    """`warp`'s contract without shortcuts (every row in full): the oracle the fast paths must equal. Top-p
    drops a token when the tokens strictly more likely than it hold top_p (tied tokens decided together)."""
    x = logits.float() / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        p = torch.softmax(x, dim=-1)
        drop = torch.stack([(row_p[None, :] * (row_x[None, :] > row_x[:, None])).sum(-1) >= params.top_p
                            for row_x, row_p in zip(x, p)])  # [rows, vocab]: mass strictly above each token
        drop[torch.arange(x.shape[0]), x.argmax(-1)] = False
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=50),
    SamplingParams(temperature=1.0, top_k=3000, top_p=0.95),
    SamplingParams(temperature=5.0, top_p=0.99),  # flat: top-p needs more than the first candidates
    SamplingParams(temperature=0.5),
])
def test_c19_fast_warp_equals_full_sort(params):
    from specdec.core.sampling import warp

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5000, generator=g) * 3
    logits[1, 100:110] = logits[1].max() + 1  # a tie at the top
    logits[2, :] = 0.0  # all tied
    logits[3, 7] = float("-inf")
    logits[4, 200:230] = 2.5  # ties around the top-k boundary
    got, want = warp(logits, params), _reference_warp(logits, params)
    assert torch.equal(got > 0, want > 0)
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
    assert torch.allclose(got.sum(-1), torch.ones(6), atol=1e-5)


def test_c19_top_k_prefilters_before_sorting(monkeypatch):
    """With top-k set, nothing of vocabulary width is sorted; with top-p alone on a peaked row, neither."""
    from specdec.core.sampling import warp

    widths = []
    real_sort = torch.sort

    def spy(x, *a, **kw):
        widths.append(x.shape[-1])
        return real_sort(x, *a, **kw)

    monkeypatch.setattr(torch, "sort", spy)
    logits = torch.randn(3, 151_936, generator=torch.Generator().manual_seed(1)) * 4
    warp(logits, SamplingParams(temperature=1.0, top_k=50, top_p=0.9))
    warp(logits, SamplingParams(temperature=0.7, top_p=0.9))
    assert all(w <= 1024 for w in widths), widths


def test_c19_target_rows_warped_only_when_reached(tiny_tokenizer, target, monkeypatch):
    """Per round, the target rows warped are those verification reached: the evaluated draft positions,
    plus the bonus row when every draft was accepted (not all K+1)."""
    import specdec.core.verification as ver
    import specdec.engine.decoding as dec
    from specdec.core.sampling import warp as real_warp

    rows = []

    def counting(logits, params):
        rows.append(1 if logits.dim() == 1 else logits.shape[0])
        return real_warp(logits, params)

    monkeypatch.setattr(dec, "warp", counting)
    monkeypatch.setattr(ver, "warp", counting, raising=False)
    prompt = tiny_tokenizer("hello world the quick brown fox").input_ids
    sp = SamplingParams(temperature=1.0, top_k=20)
    drafter = ScriptedDrafter(lambda c, k: [(c[-1] * 7 + i) % V for i in range(k)])
    out = speculative_generate(target, drafter, prompt, 24, k=8, sampling=sp, seed=0, vocab_size=V)
    reached = sum(len(r.accept_flags) + (r.next_kind == "bonus") for r in out.rounds)
    assert sum(rows) == reached
    assert reached < sum(r.k + 1 for r in out.rounds)  # the check saw early rejections


# -- C21: the draft's own context is respected ------------------------------------------------------------


def test_c21_prompt_longer_than_the_drafts_context(tiny_tokenizer, tiny_pair, target):
    """Draft context 48, target context 64, a 52-token prompt, K = 5, 8 new tokens: no error, target-only
    rounds, output equal to greedy. A prompt that fits the draft but outgrows it during generation
    speculates first and falls back to K = 0 at the draft's limit."""
    from conftest import CountingBackend

    target64 = load_backend(tiny_pair.target_dir, max_length=64)
    draft = CountingBackend(load_backend(tiny_pair.draft_dir, max_length=48))
    text = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    ids = tiny_tokenizer(" ".join([text] * 6)).input_ids
    prompt = ids[:52]
    ref = greedy(target64, prompt, 8)
    out = speculative_generate(target64, ModelDrafter(draft, V), prompt, 8, k=5, vocab_size=V)
    assert out.token_ids == ref and out.finish_reason == "length"
    assert all(r.k == 0 for r in out.rounds) and draft.tokens == 0

    prompt = ids[:40]
    ref = greedy(target64, prompt, 20)
    out = speculative_generate(target64, ModelDrafter(draft, V), prompt, 20, k=5, vocab_size=V)
    assert out.token_ids == ref
    assert out.rounds[0].k == 5 and out.rounds[-1].k == 0
    assert draft.inner.cache_length <= 48


# -- C16: a cache that cannot be rolled back is handled or refused ----------------------------------------


def test_c16_sliding_window_model_is_exact_on_the_eager_backend(mistral_pair, tiny_tokenizer):
    """MISTRAL target and draft (sliding_window 8, no use_sliding_window field), a 13-token prompt, K = 4,
    20 new tokens: no error, speculative output = target-only greedy = transformers' own generate()."""
    from transformers import AutoModelForCausalLM

    target = load_backend(mistral_pair.target_dir)
    draft = load_backend(mistral_pair.draft_dir)
    prompt = tiny_tokenizer("one two three four five six seven eight nine ten eleven twelve").input_ids[:13]
    assert len(prompt) == 13
    ref = greedy(target, prompt, 20)
    hf = AutoModelForCausalLM.from_pretrained(mistral_pair.target_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        gen = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ref == gen, "the full-state cache must still attend through the sliding window"
    for k in (1, 4, 8):
        for drafter in (ModelDrafter(draft, V), ModelDrafter(load_backend(mistral_pair.target_dir), V),
                        PromptLookupDrafter()):
            out = speculative_generate(target, drafter, prompt, 20, k=k, vocab_size=V)
            assert out.token_ids == ref, (k, drafter.name)


def test_c16_rollback_past_the_window_matches_a_fresh_forward(mistral_pair):
    """Logits after crops that reach behind the window equal one uncached forward (windowed mask); the
    window matters for these logits (a full-attention copy of the weights gives other ones)."""
    from conftest import build_tiny_mistral

    backend = load_backend(mistral_pair.target_dir)
    seq = list(range(100, 130))
    backend.reset()
    backend.forward(seq[:12], logits=False)
    backend.forward(seq[12:20] + [7, 7, 7])  # 3 wrong tokens past the window
    backend.truncate(20)
    backend.forward(seq[20:26])
    backend.truncate(21)  # 5 removed
    got = backend.forward(seq[21:30])
    with torch.no_grad():
        want = backend.model(torch.tensor([seq])).logits[0, 21:30]
        full = build_tiny_mistral(0, sliding_window=None)
        full.load_state_dict(backend.model.state_dict())
        no_window = full(torch.tensor([seq])).logits[0, 21:30]
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(no_window, want, atol=1e-3)


def test_c16_compiled_backend_refuses_at_load(mistral_pair):
    from transformers import AutoModelForCausalLM

    from specdec.runtimes.base import BackendError
    from specdec.runtimes.compiled import CompiledHFBackend

    model = AutoModelForCausalLM.from_pretrained(mistral_pair.target_dir, dtype=torch.float32).eval()
    attn = model.config._attn_implementation
    for mode in ("eager", "inductor", "onednn"):
        with pytest.raises(BackendError, match="sliding") as err:
            CompiledHFBackend(model, mode=mode)
        assert "\n" not in str(err.value)
    # refused before touching the model (the oneDNN modes repack its linears in place)
    assert isinstance(model.lm_head, torch.nn.Linear) and model.config._attn_implementation == attn


def test_c16_layer_kinds_come_from_the_cache_not_one_config_field():
    """Sliding windows declared through layer_types (Qwen2, Gemma 2), chunked attention (Llama 4) and
    linear attention (Qwen3-Next): all detected; linear attention is refused, the others become full."""
    from transformers import Gemma2Config, Llama4TextConfig, Qwen2Config, Qwen3NextConfig

    from specdec.runtimes.base import BackendError
    from specdec.runtimes.hf import cache_layer_kinds, rollback_cache

    qwen = Qwen2Config(num_hidden_layers=4, sliding_window=8, use_sliding_window=True, max_window_layers=2)
    assert cache_layer_kinds(qwen) == ["full", "full", "sliding", "sliding"]
    assert cache_layer_kinds(Qwen2Config(num_hidden_layers=2, sliding_window=8)) == ["full", "full"]
    assert cache_layer_kinds(Gemma2Config(num_hidden_layers=2)) == ["sliding", "full"]
    llama4 = Llama4TextConfig(num_hidden_layers=4, attention_chunk_size=8, no_rope_layers=[1, 1, 1, 0])
    assert "sliding" in cache_layer_kinds(llama4)
    for config in (qwen, llama4):
        assert not any(rollback_cache(config).is_sliding)
    nxt = Qwen3NextConfig(num_hidden_layers=4)
    assert any(k not in ("full", "sliding", "none") for k in cache_layer_kinds(nxt))
    with pytest.raises(BackendError, match="cannot be rolled back"):
        rollback_cache(nxt)


def test_rollback_cache_works_on_transformers_without_dummy_layer(monkeypatch):
    """transformers 5.17 (the H200 image's) has no ``DummyLayer``: layer kinds are still read, rollback works."""
    from transformers import Qwen2Config, cache_utils

    from specdec.runtimes.hf import cache_layer_kinds, rollback_cache

    monkeypatch.delattr(cache_utils, "DummyLayer", raising=False)
    qwen = Qwen2Config(num_hidden_layers=4, sliding_window=8, use_sliding_window=True, max_window_layers=2)
    assert cache_layer_kinds(qwen) == ["full", "full", "sliding", "sliding"]
    assert not any(rollback_cache(qwen).is_sliding)


# -- C22: the draft computes only what it uses -----------------------------------------------------------


class _HeadRows:
    """Counts the rows that go through a model's output layer (LM head), per call."""

    def __init__(self, model):
        self.rows: list[int] = []
        self.handle = model.get_output_embeddings().register_forward_hook(
            lambda mod, args, out: self.rows.append(int(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
        )


@pytest.mark.parametrize("backend_kind", ["hf", "compiled-eager"])
def test_c22_last_rows_only_through_the_lm_head(tiny_pair, backend_kind):
    """forward(tokens, last=r) returns the last r rows of the full forward, and only those r rows go
    through the LM head (bucketed, chunked and prefill forwards alike)."""
    from specdec.runtimes.compiled import CompiledHFBackend

    if backend_kind == "hf":
        backend = load_backend(tiny_pair.target_dir)
    else:
        backend = CompiledHFBackend(load_backend(tiny_pair.target_dir).model, mode="eager", buckets=(1, 2, 5))
    head = _HeadRows(backend.model)
    seq = list(range(200, 240))
    for n, last in [(2, 1), (5, 2), (4, 1), (30, 1), (30, 3), (1, 1), (3, 7)]:
        backend.reset()
        backend.forward(seq[:3], logits=False)
        head.rows.clear()
        got = backend.forward(seq[3:3 + n], last=last)
        assert sum(head.rows) == min(last, n), (n, last, head.rows)
        backend.reset()
        want = backend.forward(seq[:3 + n])[-min(last, n):]
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)
    backend.reset()
    head.rows.clear()
    backend.forward(seq, logits=False)
    assert sum(head.rows) <= 1  # prefill: at most one row (transformers' logits_to_keep=1), not 40
    with pytest.raises(ValueError, match="last"):
        backend.forward(seq[:2], last=0)


def test_c22_draft_scores_one_row_per_step(tiny_tokenizer, target, same_draft):
    """SAME, K = 4: after each all-accepted round the draft feeds 2 pending tokens; it scores one row.
    After a stretch without drafting (the draft 20 tokens behind), still one row."""
    head = _HeadRows(same_draft.model)
    prompt = tiny_tokenizer("hello world the quick brown fox").input_ids
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, 40, k=4, vocab_size=V)
    assert out.acceptance_rate == 1.0
    assert head.rows and all(r == 1 for r in head.rows), head.rows

    drafter = ModelDrafter(same_draft, V)
    committed = prompt + out.token_ids[:20]
    drafter.prefill(prompt[:-1])
    head.rows.clear()
    drafter.propose(committed, 1, SamplingParams(), None)  # 21 pending tokens, one draft token
    assert head.rows == [1]
    head.handle.remove()


@pytest.mark.parametrize("seed", range(6))
def test_ngram_hf_proposals_equal_transformers_prompt_lookup(seed):
    """Issue 16 item 5: `PromptLookupDrafter(2, 1, match="earliest", continue_past_end=False)` (the sweep's
    ``ngram_hf``) proposes exactly what transformers' `PromptLookupCandidateGenerator` does, on random
    sequences with repeats; our default rule differs from it on some of them (a negative control)."""
    import random

    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from specdec.engine.decoding import GREEDY

    rng = random.Random(seed)
    hf_rule = PromptLookupDrafter(2, 1, match="earliest", continue_past_end=False)
    ours = PromptLookupDrafter()
    differ = 0
    for _ in range(200):
        seq = [rng.randrange(6) for _ in range(rng.randrange(2, 30))]
        k = rng.randrange(1, 9)
        gen = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=2, max_length=10_000)
        cand, _ = gen.get_candidates(torch.tensor([seq]))
        want = cand[0, len(seq):].tolist()
        assert hf_rule.propose(seq, k, GREEDY, None).tokens == want, (seq, k)
        differ += ours.propose(seq, k, GREEDY, None).tokens != want
    assert differ > 0
