"""A property search over cross-tokenizer drafting (`specdec.drafters.xtok`) on random tokenizer pairs.

Each case builds two byte-level BPE tokenizers in memory over a small alphabet (``a b c d``, space, newline):
both take merges from one random pool, each its own random subset, so they share some tokens and split
text differently; ids are shuffled, special tokens sit at random ids, the target's EOS is ``<eos>`` and the
draft's ``<eos>`` (a twin by name) or ``</s>`` (none), the draft's tokenizer may put its BOS ``<s>`` first (as
Llama's do), and either may split words first (``use_regex``). Both are wrapped as transformers fast
tokenizers, each with its own tiny model over its own ids.

Properties:

- greedy: `speculative_generate` with the drafter `cross_tokenizer_drafter` gives under greedy decoding
  (`StringMatchDrafter`), or with `IntersectionDrafter`, equals target-only greedy decoding (tokens and
  finish reason), for prompts from the alphabet (encoded, with the target's BOS or not, or spelled one
  character per id: ids that are not the tokenizer's own), random K and budget, and drafts from a random
  tiny GPT-2 over the draft's ids, a random table, or an oracle that follows the target's own continuation
  in draft tokens (sometimes corrupted), so that drafts are accepted too. The target is a float64 tiny
  GPT-2 or a random table (either way verification forwards and one-token steps agree exactly). Along the
  way: every id fed to the draft is one of its ids and never overflows its context (the test backends
  refuse both); the draft's cache holds its BOS once, first, when its tokenizer adds one, else never; a
  string-match proposal spells a continuation of the committed text (decoding committed + proposal
  starts with the committed text) and holds no target special token except a final EOS.
- sampled: the first two tokens of sampled speculative decoding (budget 2-4, K up to 3, temperature /
  top-k / top-p) with `cross_tokenizer_drafter` under sampling (`IntersectionDrafter`, q over the target's
  ids) or `StringMatchDrafter` (one-hot q) follow the target's exact law (enumerated, EOS included): a
  chi-square test at significance 1e-6 over `SAMPLED_DRAWS` generations (outputs expected fewer than 20
  times pooled; small: a share of the cases), with a negative control (a drafter that misreports q) that
  must fail the same test.

Case counts: ``SPECDEC_PROPERTY_EXAMPLES`` (default `EXAMPLES` greedy cases, `SAMPLED_SHARE` of them
sampled, at least 2); derandomized unless ``SPECDEC_PROPERTY_SEED`` is set (tests/conftest.py).
"""

from __future__ import annotations

import functools
import math
import random
from types import SimpleNamespace

import pytest

hypothesis = pytest.importorskip("hypothesis")

import torch
from conftest import FnLM, build_tiny_model, property_settings, table_law
from hypothesis import event, given
from hypothesis import strategies as st

from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.base import Draft
from specdec.drafters.xtok import IntersectionDrafter, StringMatchDrafter, cross_tokenizer_drafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.runtimes.hf import HFBackend

#: Default greedy cases; the sampled property runs `SAMPLED_SHARE` of the count (at least 2).
EXAMPLES = 40
SAMPLED_SHARE = 0.005
#: Generations per sampled case.
SAMPLED_DRAWS = 1000

ALPHABET = "abcd \n"
#: The byte-level spelling of each character (GPT-2's byte-to-unicode map).
BYTE = {"a": "a", "b": "b", "c": "c", "d": "d", " ": "Ġ", "\n": "Ċ"}
_TEXT = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}


# -- random tokenizer pairs ------------------------------------------------------------------------------


def merge_pool(seed: int, n: int = 24) -> list[tuple[str, str]]:
    """`n` random BPE merges over the alphabet's byte-level characters, each made of earlier tokens (at most
    4 characters long), in order."""
    rng = random.Random(seed)
    universe = list(BYTE.values())
    pool: list[tuple[str, str]] = []
    while len(pool) < n:
        a, b = rng.choice(universe), rng.choice(universe)
        if len(a) + len(b) <= 4 and a + b not in universe:
            pool.append((a, b))
            universe.append(a + b)
    return pool


def random_bpe(seed: int, pool, keep: float, specials: list[str], *, eos: str, bos: str | None = None,
               bos_first: bool = False, regex: bool = True):
    """A byte-level BPE fast tokenizer over the alphabet: every character a token, the merges of `pool` kept
    with probability `keep` (in pool order, when both parts are tokens), ids shuffled, `specials` added as
    special tokens at random ids; ``bos_first``: a post-processor puts `bos` first."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    tokens = list(BYTE.values())
    merges = []
    for a, b in pool:
        if rng.random() < keep and a in tokens and b in tokens and a + b not in tokens:
            merges.append((a, b))
            tokens.append(a + b)
    rng.shuffle(tokens)
    for s in specials:
        tokens.insert(rng.randrange(len(tokens) + 1), s)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in specials])
    if bos_first:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos)


@functools.cache
def tokenizer_pair(seed: int, draft_eos: str, draft_bos_first: bool, t_regex: bool, d_regex: bool):
    """(target, draft) tokenizers: merges from one pool, different subsets and ids."""
    pool = merge_pool(seed)
    target = random_bpe(1000 + seed, pool, 0.6, ["<eos>", "<bos>"], eos="<eos>", bos="<bos>", regex=t_regex)
    draft = random_bpe(2000 + seed, pool, 0.6, [draft_eos, "<s>"], eos=draft_eos, bos="<s>",
                       bos_first=draft_bos_first, regex=d_regex)
    return target, draft


@functools.cache
def tiny_gpt2(vocab: int, seed: int, dtype: torch.dtype):
    return build_tiny_model(seed, n_layer=1, n_embd=16, vocab_size=vocab, n_positions=128,
                            initializer_range=0.4).to(dtype)


# -- cases -----------------------------------------------------------------------------------------------


@st.composite
def pairs(draw):
    return {"pair_seed": draw(st.integers(0, 30)), "draft_eos": draw(st.sampled_from(["<eos>", "</s>"])),
            "draft_bos_first": draw(st.booleans()), "t_regex": draw(st.booleans()), "d_regex": draw(st.booleans())}


def tokenizers_of(case):
    return tokenizer_pair(case["pair_seed"], case["draft_eos"], case["draft_bos_first"], case["t_regex"],
                          case["d_regex"])


@st.composite
def prompt_texts(draw):
    """Text from the alphabet, or a short piece of it repeated."""
    if draw(st.booleans()):
        return draw(st.text(ALPHABET, min_size=1, max_size=24))
    piece = draw(st.text(ALPHABET, min_size=1, max_size=5))
    return (piece * draw(st.integers(1, 6)))[:24]


def prompt_ids(t_tok, text: str, form: str) -> list[int]:
    """The prompt as target ids: the tokenizer's own (``"encoded"``), after its BOS (``"bos"``), or one
    character per id (``"chars"``: ids that are not the tokenizer's own)."""
    if form == "chars":
        return t_tok.convert_tokens_to_ids([BYTE[c] for c in text])
    ids = t_tok.encode(text, add_special_tokens=False)
    return [t_tok.bos_token_id, *ids] if form == "bos" else ids


@st.composite
def greedy_cases(draw):
    return {
        **draw(pairs()), "text": draw(prompt_texts()), "form": draw(st.sampled_from(["encoded", "bos", "chars"])),
        "target": draw(st.sampled_from(["gpt2", "table"])), "target_seed": draw(st.integers(0, 5)),
        "draft": draw(st.sampled_from(["oracle", "gpt2", "table"])), "draft_seed": draw(st.integers(0, 5)),
        "corrupt": draw(st.sampled_from([0, 3, 7])), "draft_ctx": draw(st.sampled_from([None, None, 6, 12])),
        "drafter": draw(st.sampled_from(["auto", "intersection"])), "k": draw(st.integers(1, 6)),
        "budget": draw(st.integers(0, 20)),
    }  # fmt: skip


def make_target(case, vocab: int):
    if case["target"] == "gpt2":
        return HFBackend(tiny_gpt2(vocab, case["target_seed"], torch.float64))
    return FnLM(table_law(vocab, case["target_seed"], scale=2.0), vocab, 128)


def oracle_law(t_tok, d_tok, text: str, d_eos: int, corrupt: int, salt: int):
    """A draft that continues `text` (the target's prompt and greedy output) in draft tokens: its context
    decoded (special tokens skipped), the next token of what remains re-tokenized, its EOS at the end, a
    hashed token off the text, and every `corrupt`-th context (hashed) a hashed token instead (0: never)."""
    vocab = len(d_tok)

    def one_hot(i: int) -> torch.Tensor:
        x = torch.full((vocab,), -4.0)
        x[i] = 4.0
        return x

    @functools.cache
    def fn(ctx: tuple[int, ...]) -> torch.Tensor:
        h = hash((ctx, salt)) & 0x7FFFFFFF
        if corrupt and h % corrupt == 0:
            return one_hot(h % vocab)
        seen = d_tok.decode(list(ctx), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if text.startswith(seen):
            rest = d_tok.encode(text[len(seen):], add_special_tokens=False)
            return one_hot(rest[0] if rest else d_eos)
        return one_hot(h % vocab)

    return fn


def pair_of(t_tok, d_tok, backend, vocab: int):
    """What `cross_tokenizer_drafter` reads of a loaded pair."""
    draft = SimpleNamespace(backend=backend, tokenizer=d_tok, eos_ids=frozenset({d_tok.eos_token_id}))
    return SimpleNamespace(draft=draft, target=SimpleNamespace(tokenizer=t_tok), vocab_size=vocab)


class CheckedProposals:
    """Wraps a cross-tokenizer drafter: after every proposal, the draft's cache holds its BOS once, first
    (when its tokenizer adds one; else never), and a string-match proposal (its final special token aside,
    the draft's EOS by name) spells, after the committed text, a prefix of the text the draft drafted (what
    `draft_text` returned), with no target special token before its end."""

    def __init__(self, inner, backend) -> None:
        self.inner, self.backend = inner, backend
        d_tok = inner.draft_tok
        self.bos = d_tok.convert_tokens_to_ids("<s>")
        self.adds_bos = d_tok("a")["input_ids"][:1] == [self.bos]
        self.drafted_text: str | None = None
        draft_text = inner.draft_text

        def spy(context, drafted):
            self.drafted_text = draft_text(context, drafted)
            return self.drafted_text

        inner.draft_text = spy

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        self.drafted_text = None
        d = self.inner.propose(committed, k, sampling, generator, min_confidence)
        assert len(d.tokens) <= k
        cache = self.backend.seq
        if not self.adds_bos:
            assert self.bos not in cache, cache
        elif cache:
            assert cache[0] == self.bos and cache.count(self.bos) == 1, cache
        if type(self.inner) is StringMatchDrafter and d.tokens:
            tok = self.inner.target_tok
            specials = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
            assert not specials & set(d.tokens[:-1]), d.tokens
            body = d.tokens[:-1] if d.tokens[-1] in specials else d.tokens
            before = tok.decode(list(committed), **_TEXT)
            spelled = tok.decode(list(committed) + body, **_TEXT)
            assert spelled.startswith(before), (committed, d.tokens)
            assert self.drafted_text is not None and self.drafted_text.startswith(spelled[len(before):]), \
                (committed, d.tokens, spelled[len(before):], self.drafted_text)
        return d


class Recorded:
    """Wraps a draft `Backend` so that its cache content is visible (`seq`) whatever it is."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seq: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_length(self):
        return self.inner.cache_length

    def forward(self, tokens, **kw):
        assert all(0 <= int(t) < self.inner.vocab_size for t in tokens), tokens
        out = self.inner.forward(tokens, **kw)
        self.seq.extend(int(t) for t in tokens)
        assert len(self.seq) == self.inner.cache_length
        return out

    def truncate(self, length):
        self.inner.truncate(length)
        del self.seq[length:]

    def reset(self):
        self.inner.reset()
        self.seq = []


def make_draft_backend(case, t_tok, d_tok, text: str):
    vocab = len(d_tok)
    ctx = case["draft_ctx"] or 128
    if case["draft"] == "gpt2":
        return Recorded(HFBackend(tiny_gpt2(vocab, 10 + case["draft_seed"], torch.float32), max_length=ctx))
    if case["draft"] == "table":
        return Recorded(FnLM(table_law(vocab, 10 + case["draft_seed"], scale=2.0), vocab, ctx))
    return Recorded(FnLM(oracle_law(t_tok, d_tok, text, d_tok.eos_token_id, case["corrupt"], case["draft_seed"]),
                         vocab, ctx))


# -- greedy ------------------------------------------------------------------------------------------------


@property_settings(EXAMPLES)
@given(case=greedy_cases())
def test_greedy_cross_tokenizer_drafting_equals_target_only(case):
    t_tok, d_tok = tokenizers_of(case)
    vt = len(t_tok)
    prompt = prompt_ids(t_tok, case["text"], case["form"])
    hypothesis.assume(prompt)
    eos = frozenset({t_tok.eos_token_id})
    target = make_target(case, vt)
    n = min(case["budget"], 128 - len(prompt))
    ref = autoregressive_generate(target, prompt, n, eos_ids=eos, vocab_size=vt)
    text = t_tok.decode(prompt + ref.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    backend = make_draft_backend(case, t_tok, d_tok, text)
    pair = pair_of(t_tok, d_tok, backend, vt)
    inner = (cross_tokenizer_drafter(pair, SamplingParams()) if case["drafter"] == "auto" else
             IntersectionDrafter(backend, t_tok, d_tok, draft_eos_ids=pair.draft.eos_ids, target_vocab_size=vt))
    assert type(inner) is (StringMatchDrafter if case["drafter"] == "auto" else IntersectionDrafter)
    drafter = CheckedProposals(inner, backend)
    out = speculative_generate(target, drafter, prompt, n, k=case["k"], eos_ids=eos, vocab_size=vt)
    assert out.token_ids == ref.token_ids, (out.token_ids, ref.token_ids)
    assert out.finish_reason == ref.finish_reason
    assert len(out.token_ids) <= n and all(t not in eos for t in out.token_ids[:-1])
    assert sum(r.num_emitted for r in out.rounds) == len(out.token_ids)
    for r in out.rounds:
        assert 0 <= r.num_accepted <= r.k <= case["k"]
    event(f"drafter {inner.name}, draft {case['draft']}")
    if out.num_accepted:
        event(f"drafts accepted ({case['draft']} draft)")
    if out.finish_reason == "eos":
        event("EOS")


# -- sampled: the joint law of the first tokens --------------------------------------------------------------


def chi2_critical(df: int, z: float = 4.753) -> float:
    """Upper quantile of chi-square with `df` degrees of freedom at the normal quantile `z` (Wilson-Hilferty;
    z = 4.753: significance 1e-6, so that a search over many cases does not fail a correct engine by
    chance)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def exact_law(fn, vocab: int, prompt, n: int, eos, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """``{first tokens: probability}`` of target-only sampling: `n` tokens, or fewer ending at an EOS."""
    law: dict[tuple[int, ...], float] = {}

    def walk(out: tuple[int, ...], prob: float) -> None:
        if len(out) == n or (out and out[-1] in eos):
            law[out] = law.get(out, 0.0) + prob
            return
        p = warp(fn(tuple(prompt) + out), params)
        for t in range(vocab):
            if float(p[t]) > 0.0:
                walk(out + (t,), prob * float(p[t]))

    walk((), 1.0)
    return law


#: Outputs expected fewer times than this are pooled into one cell (see `chi_square`).
MIN_EXPECTED = 20.0


def chi_square(observed: dict, law: dict, draws: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom. Every output expected fewer than `MIN_EXPECTED` times is
    pooled into one cell (from the least likely up, and the pool until it expects that much): with a
    vocabulary of ~20 ids two tokens have hundreds of outputs, and pooling only up to 5 expected leaves
    so many small cells that the statistic's spread is 1.5-2 times chi-square's (measured: a standard
    deviation of 27-37 where chi-square(183) has 19), which would make the 1e-6 critical value fail a correct
    sampler about once in a few hundred cases. An output of probability 0 is an infinite statistic."""
    if any(o not in law for o in observed):
        return math.inf, 1
    cells = sorted((draws * prob, observed.get(out, 0)) for out, prob in law.items())
    pool_e, pool_o, i = 0.0, 0, 0
    while i < len(cells) and (pool_e < MIN_EXPECTED or cells[i][0] < MIN_EXPECTED):
        pool_e += cells[i][0]
        pool_o += cells[i][1]
        i += 1
    merged = ([(pool_e, pool_o)] if i > 0 else []) + cells[i:]
    return sum((o - e) ** 2 / e for e, o in merged if e > 0.0), max(len(merged) - 1, 1)


class LyingQ:
    """A drafter that reports the distributions it drew from with half their mass moved to the uniform law
    (the negative control: an acceptance rule fed the wrong q)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        d = self.inner.propose(committed, k, sampling, generator, min_confidence)
        if d.probs is None:
            return d
        return Draft(d.tokens, 0.5 * d.probs + 0.5 / d.probs.shape[-1], d.stopped)


@st.composite
def sampled_cases(draw):
    return {
        **draw(pairs()), "text": draw(prompt_texts()), "form": draw(st.sampled_from(["encoded", "bos", "chars"])),
        "target_seed": draw(st.integers(0, 20)), "draft_seed": draw(st.integers(0, 20)),
        "scale": draw(st.sampled_from([1.0, 2.5])), "drafter": draw(st.sampled_from(["auto", "string"])),
        "k": draw(st.integers(1, 3)), "extra": draw(st.integers(0, 2)),
        "sampling": SamplingParams(draw(st.sampled_from([0.7, 1.0, 1.5])), draw(st.sampled_from([0, 3])),
                                   draw(st.sampled_from([1.0, 0.8]))),
    }  # fmt: skip


def sampled_joint(case, draws: int, *, lie: bool = False) -> tuple[float, float, float, int]:
    """``(statistic, critical value, total variation, tokens drafted)`` of the first two tokens of `draws` sampled
    generations (budget 2 + ``extra``) against the target's exact law."""
    t_tok, d_tok = tokenizers_of(case)
    vt, vd = len(t_tok), len(d_tok)
    prompt = prompt_ids(t_tok, case["text"], case["form"])
    law_fn = table_law(vt, case["target_seed"], scale=case["scale"])
    target = FnLM(law_fn, vt, 128)
    backend = FnLM(table_law(vd, 50 + case["draft_seed"], scale=case["scale"]), vd, 128)
    pair = pair_of(t_tok, d_tok, backend, vt)
    params = case["sampling"]
    drafter = (cross_tokenizer_drafter(pair, params) if case["drafter"] == "auto" else
               StringMatchDrafter(backend, t_tok, d_tok, draft_eos_ids=pair.draft.eos_ids))
    assert type(drafter) is (IntersectionDrafter if case["drafter"] == "auto" else StringMatchDrafter)
    if lie:
        drafter = LyingQ(drafter)
    eos = frozenset({t_tok.eos_token_id})
    observed: dict[tuple[int, ...], int] = {}
    drafted = 0
    for i in range(draws):
        out = speculative_generate(target, drafter, prompt, 2 + case["extra"], k=case["k"], sampling=params,
                                   eos_ids=eos, vocab_size=vt, seed=i)
        drafted += out.num_drafted
        first = tuple(out.token_ids[:2])
        observed[first] = observed.get(first, 0) + 1
    law = exact_law(law_fn, vt, prompt, 2, eos, params)
    stat, df = chi_square(observed, law, draws)
    tv = 0.5 * sum(abs(observed.get(o, 0) / draws - law.get(o, 0.0)) for o in set(law) | set(observed))
    return stat, chi2_critical(df), tv, drafted


@property_settings(EXAMPLES, share=SAMPLED_SHARE, minimum=2)
@given(case=sampled_cases())
def test_sampled_cross_tokenizer_drafting_follows_the_target_law(case):
    prompt = prompt_ids(tokenizers_of(case)[0], case["text"], case["form"])
    hypothesis.assume(prompt)
    stat, crit, tv, drafted = sampled_joint(case, SAMPLED_DRAWS)
    assert stat < crit, (stat, crit, tv)
    event(f"drafter {case['drafter']}, tokens drafted: {'some' if drafted else 'none'}")


def test_sampled_negative_control_a_drafter_that_misreports_q_fails():
    """The same test on an intersection drafter whose q has half its mass moved to uniform must fail it
    (the test has the power to see a wrong acceptance rule at this number of draws), while the honest
    drafter passes on the same case."""
    case = {"pair_seed": 3, "draft_eos": "<eos>", "draft_bos_first": True, "t_regex": False, "d_regex": False,
            "text": "ab", "form": "encoded", "target_seed": 1, "draft_seed": 2, "scale": 2.5, "drafter": "auto",
            "k": 3, "extra": 2, "sampling": SamplingParams(1.0)}
    good, crit, tv_good, drafted = sampled_joint(case, SAMPLED_DRAWS)
    bad, crit_bad, tv_bad, _ = sampled_joint(case, SAMPLED_DRAWS, lie=True)
    assert drafted > SAMPLED_DRAWS
    assert good < crit and bad > crit_bad, (good, crit, bad, crit_bad)
    assert tv_bad > tv_good
