"""The speculative engine on tiny real checkpoints: exactness, caches, stopping, budgets (cases C1-C6)."""

from __future__ import annotations

import pytest
import torch
from conftest import CountingBackend, ScriptedDrafter, load_backend

from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.runtimes.base import ContextOverflowError
from specdec.runtimes.compat import IncompatibleTokenizersError, check_tokenizers

V = 1000
PROMPTS = [
    "hello world the quick brown fox",
    "abc abc abc abc abc abc abc abc",
    "zq",
    "one two three four five six seven eight nine ten eleven twelve thirteen",
]






def ids_of(tok, text):
    return tok(text).input_ids


def baseline(target, prompt, n, eos=frozenset()):
    return autoregressive_generate(target, prompt, n, eos_ids=eos, vocab_size=V).token_ids


@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_greedy_identical_to_target_only_and_hf_generate(tiny_pair, tiny_tokenizer, target, far_draft, near_draft, k):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True).eval()
    for text in PROMPTS:
        prompt = ids_of(tiny_tokenizer, text)
        ref = baseline(target, prompt, 40)
        with torch.no_grad():
            gen = hf.generate(
                torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, len(prompt):].tolist()
        assert ref == gen, "our target-only baseline must equal transformers' generate()"
        drafters = [ModelDrafter(far_draft, V), ModelDrafter(near_draft, V), PromptLookupDrafter()]
        for drafter in drafters:
            out = speculative_generate(target, drafter, prompt, 40, k=k, vocab_size=V)
            assert out.token_ids == ref, (drafter.name, text, k)
            assert out.finish_reason == "length"


def test_near_draft_gives_partial_acceptance(tiny_tokenizer, target, near_draft):
    """The fixture exercises the interesting case: some drafts accepted, some rejected."""
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    out = speculative_generate(target, ModelDrafter(near_draft, V), prompt, 64, k=4, vocab_size=V)
    assert 0.2 < out.acceptance_rate < 0.95
    assert any(0 < r.num_accepted < r.k for r in out.rounds)
    assert any(r.num_accepted == r.k for r in out.rounds)


@pytest.mark.parametrize("prompt_len", [1, 12])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_c1_position_bookkeeping(tiny_tokenizer, target, far_draft, near_draft, prompt_len, k):
    prompt = (ids_of(tiny_tokenizer, PROMPTS[3]) * 3)[:prompt_len]
    assert len(prompt) == prompt_len
    ref = baseline(target, prompt, 32)
    for d in (far_draft, near_draft):
        assert speculative_generate(target, ModelDrafter(d, V), prompt, 32, k=k, vocab_size=V).token_ids == ref


@pytest.mark.parametrize("k", [1, 4])
def test_c2_always_wrong_drafter_verifies_first_token(tiny_tokenizer, target, k):
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    ref = baseline(target, prompt, 24)
    full = prompt + ref

    def wrong(committed, kk):
        nxt = full[len(committed)] if len(committed) < len(full) else 5
        return [(nxt + 1 + i) % V for i in range(kk)]  # never the target's argmax at position 1

    out = speculative_generate(target, ScriptedDrafter(wrong), prompt, 24, k=k, vocab_size=V)
    assert out.token_ids == ref
    assert out.num_accepted == 0
    assert all(r.num_emitted == 1 and r.next_kind == "recovered" for r in out.rounds[:-1])
    assert out.num_rounds == 24


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_c2_c4_same_model_accepts_everything(tiny_tokenizer, target, same_draft, k):
    """SAME: acceptance exactly 1.0 and K+1 tokens per target forward, except the budget-clipped last round.
    This fails if the draft cache misses its K-th token after an all-accepted round."""
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    ref = baseline(target, prompt, 64)
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, 64, k=k, vocab_size=V)
    assert out.token_ids == ref
    assert out.acceptance_rate == 1.0
    assert all(r.num_emitted == k + 1 and r.next_kind == "bonus" for r in out.rounds[:-1])
    assert out.rounds[-1].num_emitted == 64 - (k + 1) * (out.num_rounds - 1)


def _eos_at(ref, pos):
    """Pick the id of the greedy token at 1-based position `pos`, checking it did not occur earlier."""
    tok = ref[pos - 1]
    assert tok not in ref[: pos - 1]
    return tok


@pytest.mark.parametrize("k,kind", [(8, "eos mid-block"), (2, "eos as bonus")])
def test_c5_eos_inside_block(tiny_tokenizer, target, same_draft, k, kind):
    # a prompt whose 3rd greedy token does not occur among the first two
    for text in PROMPTS:
        prompt = ids_of(tiny_tokenizer, text)
        ref = baseline(target, prompt, 20)
        if ref[2] not in ref[:2]:
            break
    eos = frozenset({_eos_at(ref, 3)})
    out = speculative_generate(target, ModelDrafter(same_draft, V), prompt, 20, k=k, eos_ids=eos, vocab_size=V)
    assert out.token_ids == ref[:3]
    assert out.finish_reason == "eos"
    assert out.num_rounds == 1
    if k == 2:
        assert out.rounds[0].next_kind == "bonus"  # the EOS was the bonus token
    base = autoregressive_generate(target, prompt, 20, eos_ids=eos, vocab_size=V)
    assert base.token_ids == ref[:3] and base.finish_reason == "eos"


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_c6_budget_is_exact(tiny_tokenizer, target, same_draft, n):
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    counted = CountingBackend(target)
    out = speculative_generate(counted, ModelDrafter(same_draft, V), prompt, n, k=4, vocab_size=V)
    assert len(out.token_ids) == n
    assert out.token_ids == baseline(target, prompt, n)
    if n == 0:
        assert counted.calls == 0 and out.finish_reason == "empty"
    rep = ids_of(tiny_tokenizer, "abc abc abc abc abc abc abc abc abc abc")
    out = speculative_generate(target, PromptLookupDrafter(), rep, n, k=4, vocab_size=V)
    assert len(out.token_ids) == n


def test_baseline_zero_budget_runs_no_forward(tiny_tokenizer, target):
    counted = CountingBackend(target)
    out = autoregressive_generate(counted, ids_of(tiny_tokenizer, PROMPTS[0]), 0)
    assert out.token_ids == [] and counted.calls == 0


def test_context_limit(tiny_tokenizer, target, near_draft):
    prompt = ids_of(tiny_tokenizer, PROMPTS[3])
    n_fit = 128 - len(prompt)
    with pytest.raises(ContextOverflowError, match="context"):
        speculative_generate(target, ModelDrafter(near_draft, V), prompt, n_fit + 1, k=4, vocab_size=V)
    with pytest.raises(ContextOverflowError):
        autoregressive_generate(target, prompt, n_fit + 1)
    # Exactly filling the context works with a large K: K is clamped near the end.
    ref = baseline(target, prompt, n_fit)
    out = speculative_generate(target, ModelDrafter(near_draft, V), prompt, n_fit, k=16, vocab_size=V)
    assert out.token_ids == ref and len(ref) == n_fit


def test_bad_inputs(tiny_tokenizer, target, near_draft):
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    with pytest.raises(ValueError, match="K must be >= 1"):
        speculative_generate(target, ModelDrafter(near_draft, V), prompt, 4, k=0)
    with pytest.raises(ValueError, match="empty"):
        speculative_generate(target, ModelDrafter(near_draft, V), [], 4, k=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        autoregressive_generate(target, prompt, -1)


def test_tokenizer_mismatch_is_refused(tiny_tokenizer):
    from transformers import PreTrainedTokenizerFast

    other = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer.backend_tokenizer.__class__.from_str(
        tiny_tokenizer.backend_tokenizer.to_str().replace('"abc"', '"abd"')), eos_token="<eos>")
    assert check_tokenizers(tiny_tokenizer, tiny_tokenizer) == V
    with pytest.raises(IncompatibleTokenizersError, match="incompatible tokenizers"):
        check_tokenizers(tiny_tokenizer, PreTrainedTokenizerFast(tokenizer_object=other.backend_tokenizer,
                                                                 eos_token="<bos>"))


def test_padded_embedding_rows_are_masked(tiny_tokenizer, tmp_path):
    """A target whose embedding has extra rows (padding) must never emit those ids."""
    from conftest import build_tiny_model

    model = build_tiny_model(0, vocab_size=1024)
    with torch.no_grad():
        model.lm_head.weight[1000:] = 50.0  # padding rows that would win every argmax
        model.lm_head.weight[1000:] *= torch.sign(model.transformer.ln_f.bias.sum() + 1)
    model.save_pretrained(tmp_path / "padded")
    tgt = load_backend(tmp_path / "padded")
    prompt = ids_of(tiny_tokenizer, PROMPTS[0])
    out = autoregressive_generate(tgt, prompt, 16, vocab_size=V)
    assert max(out.token_ids) < V
    spec = speculative_generate(tgt, PromptLookupDrafter(), prompt, 16, k=4, vocab_size=V)
    assert spec.token_ids == out.token_ids


def test_rollback_matches_fresh_forward(tiny_tokenizer, target):
    """After a truncate, the next logits equal a fresh forward over the committed sequence."""
    seq = ids_of(tiny_tokenizer, PROMPTS[3])
    target.reset()
    target.forward(seq[:5], logits=False)
    target.forward(seq[5:10])
    target.truncate(7)
    got = target.forward(seq[7:9])[-1]
    target.reset()
    want = target.forward(seq[:9])[-1]
    assert torch.allclose(got, want, atol=1e-5)


def test_synthetic_acceptance_keeps_the_caches_right_and_accepts_at_its_rate():
    """Timing at a set acceptance (llama.cpp's --spec-synth-rates): wrong drafts are committed by the coin, and
    every token the target adds is still the target's argmax after everything committed before it, so both
    caches rolled back and caught up correctly; the mean accepted per round follows alpha (1 - alpha^K) / (1 -
    alpha) and the tokens per round (1 - alpha^(K+1)) / (1 - alpha)."""
    from conftest import FnLM, table_law

    from specdec.core.sampling import SamplingParams
    from specdec.core.theory import expected_accepted_per_round, expected_tokens_per_round

    vocab, alpha, k = 50, 0.6, 4
    law = table_law(vocab, 0)
    target, draft = FnLM(law, vocab, 2048), FnLM(table_law(vocab, 1), vocab, 2048)
    prompt = [1, 2, 3]
    r = speculative_generate(target, ModelDrafter(draft, vocab), prompt, 1200, k=k, synthetic=[alpha] * k, seed=3)
    assert len(r.token_ids) == 1200
    seq, pos = list(prompt), 0
    for rec in r.rounds:
        block = r.token_ids[pos : pos + rec.num_emitted]
        seq.extend(block[: rec.num_accepted])
        if rec.num_emitted > rec.num_accepted:  # the round's own token, from the target
            assert block[rec.num_accepted] == int(law(tuple(seq)).argmax())
            seq.append(block[rec.num_accepted])
        pos += rec.num_emitted
    full = [rec for rec in r.rounds if rec.k == k]
    mean_accepted = sum(rec.num_accepted for rec in full) / len(full)
    assert abs(mean_accepted - expected_accepted_per_round(alpha, k)) < 0.2  # ~450 rounds: s.e. ~0.06
    assert abs(len(r.token_ids) / len(r.rounds) - expected_tokens_per_round(alpha, k)) < 0.2
    real = speculative_generate(target, ModelDrafter(draft, vocab), prompt, 300, k=k).rounds
    assert sum(rec.num_accepted for rec in real) / len(real) < mean_accepted / 3  # the real rule: far fewer
    with pytest.raises(ValueError, match="synthetic acceptance takes greedy"):
        speculative_generate(target, ModelDrafter(draft, vocab), prompt, 8, k=k, synthetic=[0.5] * k,
                             sampling=SamplingParams(temperature=1.0))
