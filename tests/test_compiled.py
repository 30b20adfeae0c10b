"""The compiled CPU backend on tiny checkpoints: exactness, static-cache rollback, bucketing, errors.

Compiled backends are module fixtures (each bucket compiles once, a few seconds on the TINY model);
`CompiledHFBackend` runs in its default mode (oneDNN-prepacked linears + inductor) unless a test says not.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import build_tiny_model, load_backend

from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.engine.traces import divergence_with_margin, next_token_logits
from specdec.runtimes.base import Backend, BackendError, ContextOverflowError
from specdec.runtimes.compiled import CompiledHFBackend
from specdec.runtimes.kernels import PackedLinear, grouped_sdpa, pack_linears

V = 1000
BUCKETS = (1, 2, 4, 8, 17)
PROMPTS = [
    "hello world the quick brown fox",
    "abc abc abc abc abc abc abc abc",
    "zq",
    "one two three four five six seven eight nine ten eleven twelve thirteen",
]
ATOL = 1e-4
#: Tests that compile (tens of seconds on a cold inductor cache, under a minute each): the `slow` marker.
slow = pytest.mark.slow


def load_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True).eval()


def load_compiled(path, **kw):
    backend = CompiledHFBackend(load_model(path), **kw)
    backend.warmup()
    return backend


@pytest.fixture(scope="module")
def target(tiny_pair):
    return load_compiled(tiny_pair.target_dir, buckets=BUCKETS)


@pytest.fixture(scope="module")
def target_17(tiny_pair):
    """The same target with one bucket: every forward is padded to 17 tokens."""
    return load_compiled(tiny_pair.target_dir, buckets=(17,))


@pytest.fixture(scope="module")
def draft(near_draft_dir):
    return load_compiled(near_draft_dir, buckets=(1, 2))


@pytest.fixture(scope="module")
def eager_target(tiny_pair):
    return load_backend(tiny_pair.target_dir)


def ids_of(tok, text):
    return tok(text).input_ids


def baseline(backend, prompt, n):
    return autoregressive_generate(backend, prompt, n, vocab_size=V).token_ids


@slow
def test_interface(target):
    assert isinstance(target, Backend)
    assert target.name == "transformers-compiled"
    assert (target.vocab_size, target.max_length, target.device.type) == (V, 128, "cpu")
    assert target.warmup_s is not None and target.warmup_s > 0


@slow
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_target_only_on_compiled_path(tiny_tokenizer, target, draft, eager_target, k):
    for text in PROMPTS:
        prompt = ids_of(tiny_tokenizer, text)
        ref = baseline(target, prompt, 40)
        for drafter in (ModelDrafter(draft, V), PromptLookupDrafter()):
            out = speculative_generate(target, drafter, prompt, 40, k=k, vocab_size=V)
            assert out.token_ids == ref, (drafter.name, text, k)
        # Against eager: identical, or the first difference is a near-tie of the eager target (rounding).
        eager = baseline(eager_target, prompt, 40)
        div = divergence_with_margin(eager, ref, lambda seq: next_token_logits(eager_target, seq), prompt=prompt)
        assert div is None or div["margin"] < 1e-3, div


@slow
def test_partial_acceptance_happens(tiny_tokenizer, target, draft):
    out = speculative_generate(target, ModelDrafter(draft, V), ids_of(tiny_tokenizer, PROMPTS[0]), 64, k=4,
                               vocab_size=V)
    assert any(0 < r.num_accepted < r.k for r in out.rounds)
    assert any(r.num_accepted == r.k for r in out.rounds)


@slow
def test_rollback_after_partial_acceptance_matches_fresh_forward(tiny_tokenizer, target, eager_target):
    prompt = ids_of(tiny_tokenizer, PROMPTS[3])
    ref = baseline(target, prompt, 12)
    target.reset()
    target.forward(prompt[:-1], logits=False)
    # a round [last, d1..d4] whose first two drafts are right and the rest wrong, padded to bucket 8
    d = ref[:2] + [(ref[2] + 1) % V, 7]
    logits = target.forward([prompt[-1]] + d)
    assert logits.shape == (5, V) and target.cache_length == len(prompt) + 4
    assert [int(t) for t in logits[:3].argmax(-1)] == ref[:3]
    committed = prompt + ref[:3]
    target.truncate(len(committed) - 1)
    assert target.cache_length == len(committed) - 1
    step = target.forward([committed[-1]])[0]
    fresh = next_token_logits(target, committed)
    torch.testing.assert_close(step, fresh, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(step, next_token_logits(eager_target, committed), atol=ATOL, rtol=ATOL)
    assert int(step.argmax()) == ref[3]


@slow
def test_stale_slots_are_overwritten(tiny_tokenizer, target):
    """Write 17 slots, roll back to 3, then grow token by token: no stale key ever leaks into attention."""
    seq = (ids_of(tiny_tokenizer, PROMPTS[3]) * 2)[:20]
    target.reset()
    target.forward([9] * 17)
    target.truncate(3)
    target.truncate(0)
    rows = [target.forward([t])[0] for t in seq]
    target.reset()
    full = target.forward(seq)  # one eager forward of 20 tokens (more than the largest bucket)
    torch.testing.assert_close(torch.stack(rows), full, atol=ATOL, rtol=ATOL)


@slow
@pytest.mark.parametrize("start", [0, 5, 30])
def test_padded_buckets_match_unpadded_eager_forward(target, eager_target, start):
    rng = random.Random(start)
    context = [rng.randrange(V) for _ in range(start + 1)]
    for n in [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 20]:
        tokens = [rng.randrange(V) for _ in range(n)]
        got = []
        for backend in (target, eager_target):
            backend.reset()
            backend.forward(context, logits=False)
            got.append(backend.forward(tokens))
            assert backend.cache_length == len(context) + n
        assert got[0].shape == (n, V) and got[0].dtype == torch.float32
        torch.testing.assert_close(got[0], got[1], atol=ATOL, rtol=ATOL)


@slow
@pytest.mark.parametrize("k", [1, 4, 16])
def test_bucket_choice_never_changes_greedy_output(tiny_tokenizer, target, target_17, k):
    for text in PROMPTS[:3]:
        prompt = ids_of(tiny_tokenizer, text)
        ref = baseline(target, prompt, 40)
        assert baseline(target_17, prompt, 40) == ref
        for backend in (target, target_17):
            out = speculative_generate(backend, PromptLookupDrafter(), prompt, 40, k=k, vocab_size=V)
            assert out.token_ids == ref, (text, k)


@slow
def test_filling_the_context_exactly(tiny_tokenizer, target, draft):
    """Near the end of the budget the pads run past max_length: they land in the spare slots."""
    prompt = ids_of(tiny_tokenizer, PROMPTS[3])
    n_fit = target.max_length - len(prompt)
    ref = baseline(target, prompt, n_fit)
    out = speculative_generate(target, ModelDrafter(draft, V), prompt, n_fit, k=16, vocab_size=V)
    assert out.token_ids == ref and len(ref) == n_fit
    with pytest.raises(ContextOverflowError):
        autoregressive_generate(target, prompt, n_fit + 1)
    target.reset()
    target.forward(list(range(120)), logits=False)
    with pytest.raises(ContextOverflowError, match="context"):
        target.forward(list(range(9)))
    target.reset()


@slow
def test_cache_bookkeeping_errors(target):
    target.reset()
    target.forward([1, 2, 3])
    with pytest.raises(ValueError):
        target.truncate(4)
    with pytest.raises(ValueError):
        target.truncate(-1)
    assert target.forward([]).shape == (0, V)
    assert target.forward([], logits=False) is None and target.cache_length == 3
    target.reset()
    assert target.cache_length == 0


def test_construction_errors(tiny_pair):
    model = build_tiny_model(0)
    with pytest.raises(BackendError, match="mode"):
        CompiledHFBackend(model, mode="fastest")
    with pytest.raises(BackendError, match="buckets"):
        CompiledHFBackend(model, buckets=(0, 4))
    with pytest.raises(BackendError, match="context"):
        CompiledHFBackend(model, max_length=4096)
    with pytest.raises(BackendError, match="fp32"):
        CompiledHFBackend(build_tiny_model(0).to(torch.bfloat16))
    unwarmed = CompiledHFBackend(build_tiny_model(0), buckets=(4,))
    with pytest.raises(BackendError, match="warmup"):
        unwarmed.forward([1, 2])
    unwarmed.forward([1, 2], logits=False)  # eager prefill needs no compiled graph
    assert unwarmed.cache_length == 2


def test_compile_failure_is_one_line_backend_error():
    backend = CompiledHFBackend(build_tiny_model(0), buckets=(1,))

    def broken(*args):
        raise RuntimeError("no kernel for this\nlong traceback text")

    backend._compiled = broken
    with pytest.raises(BackendError, match=r"^torch.compile \(onednn\) failed for GPT2LMHeadModel: no kernel") as err:
        backend.warmup()
    assert "\n" not in str(err.value)
    assert backend.cache_length == 0


def test_eager_mode_static_cache(tiny_tokenizer, tiny_pair, eager_target):
    """mode="eager": the same static cache and padding without compilation (no warmup needed)."""
    backend = CompiledHFBackend(load_model(tiny_pair.target_dir), buckets=(1, 8), mode="eager")
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    ref = baseline(eager_target, prompt, 24)
    assert baseline(backend, prompt, 24) == ref
    assert speculative_generate(backend, PromptLookupDrafter(), prompt, 24, k=4, vocab_size=V).token_ids == ref


@pytest.mark.parametrize("keep_dense", [False, True])
def test_pack_linears_matches_dense(keep_dense):
    model = build_tiny_model(3)
    with torch.inference_mode():
        refs = [model(torch.arange(n).unsqueeze(0) + 10).logits for n in (1, 9)]
        assert pack_linears(model, keep_dense=keep_dense) == 2 * 4 + 1  # 4 per GPT-2 block, lm_head
        assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
        packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
        assert len(packed) == 9 and all((m.weight is not None) == keep_dense for m in packed)
        for n, ref in zip((1, 9), refs):
            torch.testing.assert_close(model(torch.arange(n).unsqueeze(0) + 10).logits, ref, atol=ATOL, rtol=ATOL)


def test_divergence_with_margin():
    logits = torch.zeros(10)
    logits[3], logits[7] = 2.0, 1.5

    def fn(seq):
        assert seq == [1, 2, 5, 6]
        return logits

    assert divergence_with_margin([5, 6, 7], [5, 6, 7], fn, prompt=[1, 2]) is None
    div = divergence_with_margin([5, 6, 7], [5, 6, 8], fn, prompt=[1, 2])
    assert div == {"step": 2, "eager_token": 7, "compiled_token": 8, "top1": 3, "top2": 7, "margin": 0.5,
                   "length_only": False}
    assert divergence_with_margin([5, 6], [5, 6, 8], fn, prompt=[1, 2])["length_only"]


@slow
@pytest.mark.parametrize("mode", ["hybrid", "inductor", "max-autotune"])
def test_other_modes_match_eager(tiny_pair, tiny_tokenizer, eager_target, mode):
    backend = load_compiled(tiny_pair.target_dir, buckets=(1, 8), mode=mode)
    prompt = ids_of(tiny_tokenizer, PROMPTS[3])
    for n in (1, 5):
        for b in (backend, eager_target):
            b.reset()
            b.forward(prompt, logits=False)
        torch.testing.assert_close(backend.forward(prompt[:n]), eager_target.forward(prompt[:n]),
                                   atol=ATOL, rtol=ATOL)
    ref = baseline(backend, prompt, 24)
    assert speculative_generate(backend, PromptLookupDrafter(), prompt, 24, k=4, vocab_size=V).token_ids == ref


def test_grouped_sdpa_equals_repeated_kv():
    from transformers.integrations.sdpa_attention import repeat_kv

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for shape in [(1, 12, 5, 16), (1, 2, 40, 16), (1, 2, 40, 16)])
    allowed = torch.arange(40)[None, :] <= (torch.arange(5) + 20)[:, None]
    mask = torch.zeros(5, 40).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    ref = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 6), repeat_kv(v, 6), attn_mask=mask,
                                                           scale=0.3)
    out, weights = grouped_sdpa(None, q, k, v, mask, scaling=0.3)
    assert weights is None and out.shape == (1, 5, 12, 16)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-5, rtol=1e-5)


def tiny_qwen2(seed=0):
    """A tiny Qwen2 (rotary positions, grouped-query attention 4 heads / 2 kv heads), as the default pair."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, initializer_range=0.1)
    return Qwen2ForCausalLM(config).eval()


@slow
def test_qwen2_gqa_compiled_matches_eager(tiny_tokenizer):
    eager = load_backend_from(tiny_qwen2())
    backend = CompiledHFBackend(tiny_qwen2(), buckets=(1, 5, 17), max_length=200)
    backend.warmup()
    assert backend.max_length == 200
    rng = random.Random(0)
    context = [rng.randrange(V) for _ in range(30)]
    for n in (1, 3, 5, 9, 17, 20):
        tokens = [rng.randrange(V) for _ in range(n)]
        for b in (backend, eager):
            b.reset()
            b.forward(context, logits=False)
        torch.testing.assert_close(backend.forward(tokens), eager.forward(tokens), atol=ATOL, rtol=ATOL)
    prompt = ids_of(tiny_tokenizer, PROMPTS[3])
    ref = baseline(backend, prompt, 40)
    div = divergence_with_margin(baseline(eager, prompt, 40), ref, lambda seq: next_token_logits(eager, seq), prompt=prompt)
    assert div is None or div["margin"] < 1e-3, div
    for k in (1, 4, 16):
        assert speculative_generate(backend, PromptLookupDrafter(), prompt, 40, k=k, vocab_size=V).token_ids == ref


def load_backend_from(model):
    from specdec.runtimes.hf import HFBackend

    return HFBackend(model)


@slow
def test_load_pair_with_compile_compiles_at_load_and_stays_exact(tiny_pair, near_draft_dir, tiny_tokenizer):
    """`load_pair(compile=True)` (the CLI's --compile, the sweep's transformers-compiled config) compiles every
    bucket while loading, so the first forward needs no warm-up call and no compilation is ever timed; greedy
    speculative decoding on that path equals greedy target-only decoding on it."""
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(tiny_pair.target_dir), str(near_draft_dir), compile=True)
    assert pair.target.compiled and pair.draft.compiled
    assert 0 < pair.target.compile_s <= pair.target.load_s and 0 < pair.draft.compile_s <= pair.draft.load_s
    assert isinstance(pair.target.backend, CompiledHFBackend) and pair.target.backend.warmup_s > 0
    # target: packed oneDNN GEMMs (multi-token verification); draft: inductor (1-2 token steps)
    assert (pair.target.backend.mode, pair.draft.backend.mode) == ("onednn", "inductor")
    for text in PROMPTS[:2]:
        prompt = ids_of(tiny_tokenizer, text)
        ref = autoregressive_generate(pair.target.backend, prompt, 24, vocab_size=pair.vocab_size).token_ids
        out = speculative_generate(pair.target.backend, ModelDrafter(pair.draft.backend, pair.vocab_size), prompt,
                                   24, k=4, vocab_size=pair.vocab_size)
        assert out.token_ids == ref


@slow
def test_c22_last_row_graphs(near_draft_dir, tiny_pair):
    """With last_row_graphs, forward(tokens, last=1) on 2..17 tokens runs a compiled graph that scores the
    last real row only (no recompilation under fail_on_recompile) and equals the all-rows graph's row."""
    backend = load_compiled(near_draft_dir, buckets=(1, 2, 5), mode="inductor", last_row_graphs=True)
    seq = list(range(300, 320))
    for n in (1, 2, 3, 5):
        backend.reset()
        backend.forward(seq[:4], logits=False)
        got = backend.forward(seq[4:4 + n], last=1)
        backend.reset()
        backend.forward(seq[:4], logits=False)
        want = backend.forward(seq[4:4 + n])[-1:]
        assert got.shape == (1, want.shape[-1]) and torch.allclose(got, want, atol=ATOL)
    prompt = seq[:6]
    eager = load_backend(tiny_pair.target_dir)
    ref = autoregressive_generate(eager, prompt, 16, vocab_size=V).token_ids
    out = speculative_generate(eager, ModelDrafter(backend, V), prompt, 16, k=4, vocab_size=V)
    assert out.token_ids == ref


@slow
def test_frozen_mode_folds_the_weights_and_stays_exact(tiny_pair, tiny_tokenizer, eager_target):
    """mode="frozen": the compiled graphs hold the weights as constants and every forward runs through them
    (prefill and forwards wider than the largest bucket in bucket-sized chunks), so an in-place change of
    the model's weights after warmup changes no output; logits match eager (rows chosen by `last` too),
    greedy speculative decoding equals greedy target-only decoding, and inductor's global freezing setting
    is switched back off after the compile (other models compiled in the process are not frozen)."""
    import torch._inductor.config as inductor_config

    model = load_model(tiny_pair.target_dir)
    backend = CompiledHFBackend(model, buckets=(1, 8), mode="frozen")
    backend.warmup()
    assert inductor_config.freezing is False
    prompt = ids_of(tiny_tokenizer, PROMPTS[3])
    assert len(prompt) > 8  # the prefill below takes more than one chunk
    for n, last in ((1, None), (5, None), (8, 1), (13, None), (13, 6), (len(prompt), 2)):
        for b in (backend, eager_target):
            b.reset()
            b.forward(prompt, logits=False)
        torch.testing.assert_close(backend.forward(prompt[:n], last=last), eager_target.forward(prompt[:n], last=last),
                                   atol=ATOL, rtol=ATOL)
        assert backend.cache_length == eager_target.cache_length == len(prompt) + n
    ref = baseline(backend, prompt, 24)
    assert ref == baseline(eager_target, prompt, 24)
    for k in (1, 4, 7, 12):
        assert speculative_generate(backend, PromptLookupDrafter(), prompt, 24, k=k, vocab_size=V).token_ids == ref

    def outputs():
        backend.reset()
        short = backend.forward(prompt[:3])
        backend.reset()
        backend.forward(prompt, logits=False)
        return short, backend.forward(prompt[:11])

    before = outputs()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(0.5)
    for old, new in zip(before, outputs()):
        assert torch.equal(old, new)
    assert not torch.allclose(load_backend_from(model).forward(prompt[:3]), before[0], atol=1e-3)  # a real change


@slow
def test_load_pair_frozen_compiles_target_and_draft_frozen(tiny_pair, near_draft_dir, tiny_tokenizer):
    """`load_pair(compile=True, compile_mode="frozen")` (the transformers-bf16-frozen configuration's models,
    here in fp32): target frozen on FROZEN_BUCKETS, draft frozen on FROZEN_DRAFT_BUCKETS without last-row graphs;
    greedy speculative decoding with the draft model equals greedy target-only decoding on the frozen target."""
    from specdec.catalogue.runtimes import RUNTIME_CONFIGS
    from specdec.runtimes.compiled import FROZEN_BUCKETS, FROZEN_DRAFT_BUCKETS
    from specdec.runtimes.loading import load_pair

    rc = RUNTIME_CONFIGS["transformers-bf16-frozen"]
    kw = rc.load_kwargs("float32")
    assert rc.compile and kw == {"dtype": "bfloat16", "compile_mode": "frozen"}
    pair = load_pair(str(tiny_pair.target_dir), str(near_draft_dir), compile=True, compile_mode="frozen")
    t, d = pair.target.backend, pair.draft.backend
    assert (t.mode, t.buckets, t.last_row_graphs) == ("frozen", FROZEN_BUCKETS, False)
    assert (d.mode, d.buckets, d.last_row_graphs) == ("frozen", FROZEN_DRAFT_BUCKETS, False)
    for text in PROMPTS[:2]:
        prompt = ids_of(tiny_tokenizer, text)
        ref = autoregressive_generate(t, prompt, 24, vocab_size=pair.vocab_size).token_ids
        for k in (2, 7, 15):
            out = speculative_generate(t, ModelDrafter(d, pair.vocab_size), prompt, 24, k=k,
                                       vocab_size=pair.vocab_size)
            assert out.token_ids == ref
