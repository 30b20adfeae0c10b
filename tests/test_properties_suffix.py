"""A property search over the suffix drafter (`specdec.drafters.suffix.SuffixDrafter`) against brute force.

Cases are random token streams with planted repeats (random tokens, with earlier segments copied in),
random K (fixed, or a random K every round, 0 included), with and without a corpus of earlier outputs (random
streams with pieces of the prompt and of the target's own output planted in them), every drafter setting
(cost curve, minimum match, occurrence rule, prior, length prior). Properties:

- in the speculative loop (`speculative_generate`, greedy): the output equals target-only greedy output
  (tokens and finish reason) on a target that copies its context's repeats (an induction-like law that
  deviates at hashed contexts), a random table or a float64 tiny GPT-2; EOS ids chosen among the tokens
  the target generates;
- every proposal, in the loop and out of it, is a copy of what followed an earlier occurrence of the
  matched suffix, checked against a brute-force reference: the longest suffix of the committed text that
  occurred before (or, when longer, the longest suffix found in the corpus); nothing when that match is
  shorter than ``min_match``; otherwise a prefix of the continuation after the first occurrence
  (``occurrence="first"``, corpus matches), or after the most recent one (``"recent"``, among the last
  `SuffixDrafter.MAX_CANDIDATES` earlier positions of the last token, as documented), continued
  periodically past the end of the text, never across the end of a corpus document; never more than K;
- the drafter's statistics are the rounds' own: out of the loop, offered / accepted / rounds per source equal
  an independent bookkeeping of a simulated verifier (accept a prefix then reject, accept all, or end inside
  the draft); in the loop, accepted equals the rounds' accepted tokens, offered their accepted tokens plus
  one per rejection, and rounds the rounds that drafted.

Case counts: ``SPECDEC_PROPERTY_EXAMPLES`` (default `EXAMPLES` per property); derandomized unless
``SPECDEC_PROPERTY_SEED`` is set (tests/conftest.py).
"""

from __future__ import annotations

import functools
import random

import pytest

hypothesis = pytest.importorskip("hypothesis")

import torch
from conftest import FnLM, build_tiny_model, property_settings, table_law
from hypothesis import event, given
from hypothesis import strategies as st

from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.decoding import GREEDY, autoregressive_generate, speculative_generate
from specdec.policies.base import RoundPlan
from specdec.runtimes.hf import HFBackend

#: Default cases of each property.
EXAMPLES = 60


# -- brute force -----------------------------------------------------------------------------------------


def ends_of(seq, pat, before: int) -> list[int]:
    """Indices e < `before` where an occurrence of `pat` ends in `seq` (``seq[e - len + 1 : e + 1] == pat``)."""
    n = len(pat)
    return [e for e in range(n - 1, before) if seq[e - n + 1:e + 1] == pat]


def common_suffix(a, a_end: int, b) -> int:
    """How many tokens ``a[: a_end + 1]`` and `b` have in common at their ends."""
    n = 0
    while n <= a_end and n < len(b) and a[a_end - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def longest_earlier_repeat(seq) -> int:
    """The longest suffix of `seq` that also ends at an index < len - 1 (0: none): every earlier end tried."""
    return max((common_suffix(seq, e, seq) for e in range(len(seq) - 1)), default=0)


def joined_corpus(docs) -> list[int]:
    out: list[int] = []
    for d in docs:
        out.extend(d)
        out.append(-1)
    return out


def longest_corpus_match(seq, joined) -> int:
    """The longest suffix of `seq` found anywhere in the corpus (a separator, -1, never matches a token)."""
    return max((common_suffix(joined, c, seq) for c in range(len(joined))), default=0)


def periodic_copy(seq, start: int, k: int) -> list[int]:
    """k tokens of ``seq`` from `start`, continued into the copy itself past its end (an LZ77 copy)."""
    out: list[int] = []
    for j in range(k):
        pos = start + j
        out.append(seq[pos] if pos < len(seq) else out[pos - len(seq)])
    return out


def reference(seq, k: int, docs, min_match: int, occurrence: str) -> tuple[str | None, list[int]]:
    """``(source, continuation)``: what a proposal for `seq` must be a prefix of (None: it must be empty)."""
    lp = longest_earlier_repeat(seq)
    joined = joined_corpus(docs) if docs else []
    lc = longest_corpus_match(seq, joined) if docs else 0
    if docs and lc > lp:
        if lc < min_match:
            return None, []
        c = ends_of(joined, seq[len(seq) - lc:], len(joined))[0]  # the first occurrence
        cont = joined[c + 1:]
        return "corpus", cont[: cont.index(-1)]
    if lp == 0 or lp < min_match:
        return None, []
    n = len(seq)
    ends = ends_of(seq, seq[n - lp:], n - 1)
    start = ends[0] + 1
    if occurrence == "recent":
        # the most recent occurrence is looked for among the last MAX_CANDIDATES earlier positions of the
        # last token (the documented bound); beyond it the first occurrence drafts
        rank = sum(1 for p in range(ends[-1], n - 1) if seq[p] == seq[-1])
        if rank <= SuffixDrafter.MAX_CANDIDATES:
            start = ends[-1] + 1
    return "prompt", periodic_copy(seq, start, k)


def check_proposal(seq, k: int, tokens, docs, min_match: int, occurrence: str) -> str | None:
    """Assert that `tokens`, proposed for `seq` at `k`, is a prefix of the brute-force continuation; returns
    its source (None for an empty proposal)."""
    assert len(tokens) <= max(k, 0), (tokens, k)
    if k <= 0:
        assert tokens == []
        return None
    source, cont = reference(list(seq), k, docs, min_match, occurrence)
    if source is None:
        assert tokens == [], (seq, tokens)
        return None
    assert tokens == cont[: len(tokens)], (seq, k, tokens, cont, source)
    return source if tokens else None


# -- cases -----------------------------------------------------------------------------------------------


@st.composite
def planted_streams(draw, vocab: int, min_size: int = 1, max_size: int = 40):
    """Random tokens with earlier segments copied in (planted repeats)."""
    seq = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6))
    while len(seq) < max_size and draw(st.integers(0, 4)) > 0:
        if draw(st.booleans()):
            start = draw(st.integers(0, len(seq) - 1))
            seq += seq[start:start + draw(st.integers(1, 10))]
        else:
            seq += draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4))
    seq = seq[:max_size]
    return seq if len(seq) >= min_size else seq + [0] * (min_size - len(seq))


class _Curve:
    """A verification cost curve v(n) = 1 + slope (n - 1)."""

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def v(self, n: int) -> float:
        return 1.0 + self.slope * (n - 1)


@st.composite
def drafter_settings(draw):
    curve = draw(st.sampled_from(["none", "flat", "sloped", "steep", "random"]))
    slope = {"none": None, "flat": 0.0, "sloped": 0.3, "steep": 1.0}.get(curve)
    if curve == "random":
        slope = draw(st.floats(0.0, 1.2))
    return {"slope": slope, "min_match": draw(st.integers(1, 4)),
            "occurrence": draw(st.sampled_from(["recent", "first"])),
            "prior": (draw(st.floats(0.1, 3.0)), draw(st.floats(0.1, 3.0))),
            "length_prior": draw(st.sampled_from([1.0, 0.0, 0.5, 2.0]))}


def make_drafter(settings, docs) -> SuffixDrafter:
    cost = None if settings["slope"] is None else _Curve(settings["slope"])
    return SuffixDrafter(cost, min_match=settings["min_match"], corpus=docs, prior=settings["prior"],
                         occurrence=settings["occurrence"], length_prior=settings["length_prior"])


@st.composite
def corpora(draw, vocab: int, plant_from):
    """No corpus, or 1-3 random documents, some with pieces of `plant_from` copied in."""
    if draw(st.booleans()):
        return []
    docs = []
    for _ in range(draw(st.integers(1, 3))):
        doc = draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=6))
        if plant_from and draw(st.booleans()):
            start = draw(st.integers(0, len(plant_from) - 1))
            doc += plant_from[start:start + draw(st.integers(1, 12))]
        doc += draw(st.lists(st.integers(0, vocab - 1), max_size=4))
        docs.append(doc or [0])
    return docs


class CheckedSuffix:
    """Wraps a `SuffixDrafter` in the loop: every proposal is checked against the brute-force reference."""

    def __init__(self, inner: SuffixDrafter, docs, settings) -> None:
        self.inner, self.docs, self.settings = inner, docs, settings
        self.sources: list[str | None] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        d = self.inner.propose(committed, k, sampling, generator, min_confidence)
        assert d.probs is None
        self.sources.append(check_proposal(committed, k, d.tokens, self.docs, self.settings["min_match"],
                                           self.settings["occurrence"]))
        return d


class RandomK:
    """A K policy asking for a random K in 0..`high` every round (seeded)."""

    name = "random"

    def __init__(self, seed: int, high: int) -> None:
        self.seed, self.high = seed, high

    def start(self, prefill_tokens=None, budget=None) -> None:
        self.rng = random.Random(self.seed)

    def next_round(self) -> RoundPlan:
        return RoundPlan(self.rng.randint(0, self.high))

    def next_k(self) -> int:
        return self.next_round().k

    def alpha_estimate(self):
        return None

    def observe(self, record) -> None:
        pass


def copy_law(vocab: int, seed: int, deviate: int):
    """An induction-like law for `FnLM`: random logits (a table of the last two tokens) plus a large bonus
    for the token that followed the most recent earlier occurrence of the context's last 3, 2 or 1 tokens,
    except at hashed contexts (one in `deviate`), where the table decides."""
    table = table_law(vocab, seed, scale=1.0)

    @functools.cache
    def fn(ctx: tuple[int, ...]) -> torch.Tensor:
        row = table(ctx).clone()
        if hash((seed, ctx[-4:], len(ctx) % 7)) % deviate == 0:
            return row
        n = len(ctx)
        for m in (3, 2, 1):
            if m >= n:
                continue
            for i in range(n - m - 1, -1, -1):
                if ctx[i:i + m] == ctx[n - m:]:
                    row[ctx[i + m]] += 6.0
                    return row
        return row

    return fn


@functools.cache
def tiny_gpt2(vocab: int, seed: int):
    return build_tiny_model(seed, n_layer=1, n_embd=16, vocab_size=vocab, n_positions=128,
                            initializer_range=0.4).double()


@st.composite
def loop_cases(draw):
    vocab = draw(st.sampled_from([2, 4, 8, 30]))
    prompt = draw(planted_streams(vocab, 1, 40))
    return {
        "vocab": vocab, "prompt": prompt, "target": draw(st.sampled_from(["copy", "copy", "table", "gpt2"])),
        "seed": draw(st.integers(0, 20)), "deviate": draw(st.sampled_from([3, 6, 20])),
        "budget": draw(st.integers(8, 40)) if draw(st.sampled_from(["long", "long", "short"])) == "long"
        else draw(st.integers(0, 3)),
        "eos_picks": draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), max_size=1)),
        "k": draw(st.one_of(st.integers(1, 12), st.just("random"))), "k_seed": draw(st.integers(0, 100)),
        "settings": draw(drafter_settings()), "corpus_seed": draw(st.integers(0, 10**6)),
    }  # fmt: skip


def make_target(case):
    vocab = case["vocab"]
    if case["target"] == "gpt2":
        return HFBackend(tiny_gpt2(vocab, case["seed"]))
    if case["target"] == "table":
        return FnLM(table_law(vocab, case["seed"], scale=2.0), vocab, 128)
    return FnLM(copy_law(vocab, case["seed"], case["deviate"]), vocab, 128)


# -- the properties ----------------------------------------------------------------------------------------


@property_settings(EXAMPLES)
@given(case=loop_cases(), data=st.data())
def test_suffix_drafting_in_the_loop_equals_target_only(case, data):
    vocab, prompt = case["vocab"], case["prompt"]
    target = make_target(case)
    n = min(case["budget"], 128 - len(prompt))
    free = autoregressive_generate(target, prompt, n, vocab_size=vocab).token_ids
    firsts = list(dict.fromkeys(reversed(free)))  # EOS ids among the generated tokens, the late ones first
    eos = frozenset(firsts[int(f * len(firsts))] for f in case["eos_picks"]) if free else frozenset()
    ref = autoregressive_generate(target, prompt, n, eos_ids=eos, vocab_size=vocab)
    docs = data.draw(corpora(vocab, list(prompt) + free), label="corpus")
    settings = case["settings"]
    drafter = CheckedSuffix(make_drafter(settings, docs), docs, settings)
    kw = {"k": case["k"]} if case["k"] != "random" else {"policy": RandomK(case["k_seed"], 10)}
    out = speculative_generate(target, drafter, prompt, n, eos_ids=eos, vocab_size=vocab, **kw)
    assert out.token_ids == ref.token_ids, (out.token_ids, ref.token_ids)
    assert out.finish_reason == ref.finish_reason
    # the statistics are the rounds' own
    stats = drafter.inner.stats
    drafted = [r for r in out.rounds if r.k > 0]
    assert sum(stats.rounds.values()) == len(drafted)
    assert sum(stats.accepted.values()) == sum(r.num_accepted for r in drafted)
    assert sum(stats.offered.values()) == sum(r.num_accepted + r.rejected for r in drafted)
    for source in ("prompt", "corpus"):
        assert stats.rounds[source] == sum(1 for s in drafter.sources if s == source)
        assert 0 <= stats.accepted[source] <= stats.offered[source]
    if not docs:
        assert stats.rounds["corpus"] == 0
    for r in out.rounds:
        assert r.k <= (case["k"] if case["k"] != "random" else 10)
    event(f"target {case['target']}, corpus {'yes' if docs else 'no'}")
    if stats.accepted["prompt"]:
        event("prompt drafts accepted")
    if stats.accepted["corpus"]:
        event("corpus drafts accepted")
    if out.finish_reason == "eos":
        event("EOS")


@st.composite
def simulated_cases(draw):
    vocab = draw(st.sampled_from([2, 3, 6, 20]))
    stream = draw(planted_streams(vocab, 2, 40))
    return {"vocab": vocab, "stream": stream, "settings": draw(drafter_settings()),
            "docs": draw(corpora(vocab, stream)), "rounds": draw(st.integers(1, 25)), "seed": draw(st.integers(0, 10**6))}


@property_settings(EXAMPLES)
@given(case=simulated_cases())
def test_suffix_proposals_and_statistics_against_brute_force(case):
    """Out of the loop, against a simulated verifier: random K every round (0 included); the verifier accepts
    a random prefix then rejects (a token other than the draft's), accepts everything and adds a bonus
    token, or ends the generation inside the draft; between rounds the text may grow by a copied earlier
    segment (a planted repeat). Every proposal is checked against brute force, and the drafter's
    statistics against this bookkeeping."""
    vocab, settings, docs = case["vocab"], case["settings"], case["docs"]
    rng = random.Random(case["seed"])
    seq = list(case["stream"])
    d = make_drafter(settings, docs)
    d.prefill(seq[:-1])
    want = {key: {"prompt": 0, "corpus": 0} for key in ("offered", "accepted", "rounds")}
    for _ in range(case["rounds"]):
        k = rng.randint(0, 10)
        draft = d.propose(list(seq), k, GREEDY, None)
        source = check_proposal(seq, k, draft.tokens, docs, settings["min_match"], settings["occurrence"])
        tokens = draft.tokens
        end = False
        if tokens:
            acc = rng.randint(0, len(tokens))
            fate = rng.choice(["verify", "verify", "end"])
            seq += tokens[:acc]
            if fate == "end" and acc > 0:  # an EOS among the accepted drafts: nothing after it was verified
                offered, end = acc, True
            elif acc < len(tokens):  # rejected at acc: the target's token is another one
                seq.append(rng.choice([t for t in range(vocab) if t != tokens[acc]] or [tokens[acc]]))
                offered = acc + 1
            else:  # all accepted, and the bonus token
                seq.append(rng.randrange(vocab))
                offered = len(tokens)
            want["offered"][source] += offered
            want["accepted"][source] += acc
            want["rounds"][source] += 1
        else:
            seq.append(rng.randrange(vocab))  # a plain step
        if not end and rng.random() < 0.3 and len(seq) > 1:  # a planted repeat
            start = rng.randrange(len(seq) - 1)
            seq += seq[start:start + rng.randint(1, 6)]
        d.rollback(list(seq))
        if end:
            break
    s = d.stats
    assert (s.offered, s.accepted, s.rounds) == (want["offered"], want["accepted"], want["rounds"])
    for source in ("prompt", "corpus"):
        assert 0 <= s.accepted[source] <= s.offered[source]
    if s.rounds["corpus"]:
        event("corpus drafts")
    if s.accepted["prompt"]:
        event("prompt drafts accepted")


def test_brute_force_reference_examples():
    """The reference itself, on cases worked by hand."""
    seq = [1, 2, 7, 7, 1, 2, 8, 8, 1, 2]
    assert longest_earlier_repeat(seq) == 2
    assert reference(seq, 3, [], 1, "recent") == ("prompt", [8, 8, 1])
    assert reference(seq, 3, [], 1, "first") == ("prompt", [7, 7, 1])
    assert reference(seq, 3, [], 3, "recent") == (None, [])
    assert reference([5, 6] * 4, 5, [], 1, "recent") == ("prompt", [5, 6, 5, 6, 5])  # periodic past the end
    assert reference([3, 9, 1, 2], 4, [[0, 1, 2, 4, 5], [1, 2, 6]], 1, "recent") == ("corpus", [4, 5])
    assert reference([3, 4, 5], 4, [[4, 5]], 1, "recent") == ("corpus", [])  # at a document's end
    assert longest_earlier_repeat([4]) == 0 and longest_earlier_repeat([4, 4]) == 1
