"""The suffix drafter: its automaton against brute force, exactness in the speculative loop, and the
cost-aware draft length (nothing where verification cannot pay, long drafts where it is free)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import load_backend

from specdec.drafters.suffix import SuffixAutomaton, SuffixDrafter
from specdec.engine.decoding import GREEDY, autoregressive_generate, speculative_generate

V = 1000


def brute_longest_repeat(seq):
    """Longest suffix of `seq` that also ends at an index < len(seq) - 1."""
    n = len(seq)
    for length in range(n - 1, 0, -1):
        suffix = seq[n - length:]
        for end in range(length - 1, n - 1):
            if seq[end - length + 1:end + 1] == suffix:
                return length
    return 0


@pytest.mark.parametrize("seed", range(30))
def test_automaton_finds_the_longest_earlier_repeat(seed):
    rng = random.Random(seed)
    alphabet = rng.randint(1, 4)
    seq = [rng.randrange(alphabet) for _ in range(rng.randint(1, 60))]
    sam = SuffixAutomaton()
    for i, t in enumerate(seq):
        sam.append(t)
        length, end = sam.longest_repeat()
        prefix = seq[:i + 1]
        assert length == brute_longest_repeat(prefix)
        if length:
            assert end < i and prefix[end - length + 1:end + 1] == prefix[i + 1 - length:]


class Steep:
    """v(n) = n: verifying n tokens costs n steps (nothing can pay)."""

    def v(self, n):
        return float(n)


class Flat:
    def v(self, n):
        return 1.0


def test_a_steep_cost_curve_drafts_nothing():
    d = SuffixDrafter(Steep())
    seq = [1, 2, 3, 4] * 10
    d.prefill(seq[:-1])
    assert d.propose(seq, 8, GREEDY, None).tokens == []


class Sloped:
    """v(n) = 1 + 0.3 (n - 1): each verified token adds 0.3 of a step."""

    def v(self, n):
        return 1.0 + 0.3 * (n - 1)


def test_a_flat_cost_curve_drafts_the_whole_repeat():
    d = SuffixDrafter(Flat())
    seq = [1, 2, 3, 4] * 10
    d.prefill(seq[:-1])
    assert d.propose(seq, 8, GREEDY, None).tokens == [1, 2, 3, 4, 1, 2, 3, 4]


def _rounds_until_it_stops(d, limit=200):
    """Rounds of always-rejected drafts on a long repeat until `d` drafts nothing (None: it never stops)."""
    seq = [1, 2, 3, 4] * 10
    d.prefill(seq[:-1])
    assert len(d.propose(seq, 8, GREEDY, None).tokens) >= 1  # the prior pays for K >= 1 on this curve
    for i in range(limit):
        seq = seq + [100 + i]  # a token never seen before: the draft's first token is rejected
        d.rollback(seq)
        seq = seq + [1, 2, 3, 4] * 3
        if not d.propose(seq, 8, GREEDY, None).tokens:
            assert d.stats.accepted["prompt"] == 0 and d.stats.offered["prompt"] >= 2
            length, _ = SuffixAutomaton(seq).longest_repeat()
            assert d.alpha(length) < 0.5
            return i + 1
    return None


def test_rejections_shrink_the_draft_until_it_stops():
    # a 16+ token match starts at alpha 16/17 (the match is evidence), so it takes more rejections to stop
    # than with the plain Beta(1, 1) prior
    with_length = _rounds_until_it_stops(SuffixDrafter(Sloped()))
    plain = _rounds_until_it_stops(SuffixDrafter(Sloped(), length_prior=0.0))
    assert plain is not None and with_length is not None and plain < with_length
    with pytest.raises(ValueError, match="length_prior"):
        SuffixDrafter(length_prior=-1.0)


def test_a_draft_cut_by_the_end_of_generation_counts_only_what_was_verified():
    d = SuffixDrafter(Flat())
    seq = [5, 6, 7] * 5
    d.prefill(seq[:-1])
    draft = d.propose(seq, 6, GREEDY, None).tokens
    assert len(draft) == 6
    d.rollback(seq + draft[:2])  # generation stopped (EOS) after two accepted tokens
    assert d.stats.offered["prompt"] == 2 and d.stats.accepted["prompt"] == 2


def test_corpus_matches_are_drafted_and_counted_apart():
    corpus = [[10, 11, 12, 13, 14, 15, 16]]
    d = SuffixDrafter(Flat(), corpus=corpus)
    seq = [1, 2, 10, 11, 12]
    d.prefill(seq[:-1])
    draft = d.propose(seq, 3, GREEDY, None).tokens
    assert draft == [13, 14, 15]
    d.rollback(seq + [13, 14, 15, 16])
    assert d.stats.accepted == {"prompt": 0, "corpus": 3}
    # a corpus match stops at the end of that earlier output
    seq2 = [14, 15, 16]
    d.prefill(seq2[:-1])
    assert d.propose(seq2, 4, GREEDY, None).tokens == []


def brute_recent_start(seq, length):
    """The index after the most recent earlier occurrence of `seq`'s last `length` tokens."""
    n = len(seq)
    for end in range(n - 2, length - 2, -1):
        if seq[end - length + 1:end + 1] == seq[n - length:]:
            return end + 1
    return None


def test_the_most_recent_occurrence_drafts_by_default():
    seq = [1, 2, 7, 7, 1, 2, 8, 8, 1, 2]  # "1 2" followed by 7 7 first, 8 8 most recently
    recent, first = SuffixDrafter(Flat()), SuffixDrafter(Flat(), occurrence="first")
    for d in (recent, first):
        d.prefill(seq[:-1])
    assert recent.propose(seq, 2, GREEDY, None).tokens == [8, 8]
    assert first.propose(seq, 2, GREEDY, None).tokens == [7, 7]
    with pytest.raises(ValueError, match="occurrence"):
        SuffixDrafter(occurrence="last")


@pytest.mark.parametrize("seed", range(20))
def test_the_recent_start_matches_brute_force(seed):
    rng = random.Random(seed)
    seq = [rng.randrange(rng.randint(1, 3)) for _ in range(rng.randint(2, 80))]
    d = SuffixDrafter(Flat())
    d.prefill(seq[:-1])
    d.propose(seq, 1, GREEDY, None)  # catches the drafter up on the whole sequence
    length, end = d._sam.longest_repeat()
    if length:
        assert d._recent_start(length, end + 1) == brute_recent_start(seq, length)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="min_match"):
        SuffixDrafter(min_match=0)


@pytest.fixture(scope="module")
def tiny_target(tiny_pair):
    return load_backend(tiny_pair.target_dir)


@pytest.mark.parametrize("cost", [None, Flat(), Steep()])
@pytest.mark.parametrize("k", [1, 4, 16])
def test_greedy_equals_target_only(tiny_target, cost, k):
    prompt = [5, 6, 7, 8, 9] * 6 + [3, 4]
    n = 40
    ref = autoregressive_generate(tiny_target, prompt, n, vocab_size=V).token_ids
    out = speculative_generate(tiny_target, SuffixDrafter(cost), prompt, n, k=k, vocab_size=V)
    assert out.token_ids == ref
    assert len(out.token_ids) == n


def test_sampled_generation_is_reproducible_and_within_budget(tiny_target):
    from specdec.core.sampling import SamplingParams

    sp = SamplingParams(temperature=1.0)
    prompt = [5, 6, 7, 8] * 8
    a = speculative_generate(tiny_target, SuffixDrafter(Flat()), prompt, 24, k=4, vocab_size=V, sampling=sp, seed=3)
    b = speculative_generate(tiny_target, SuffixDrafter(Flat()), prompt, 24, k=4, vocab_size=V, sampling=sp, seed=3)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 24
    assert torch.tensor(a.token_ids).max() < V


@pytest.mark.parametrize("cost", [None, Sloped()])
def test_trace_replay_of_the_suffix_drafter_equals_its_real_rounds(tiny_target, cost):
    """The replay drives the drafter as the engine does (prefill, propose, rollback), so a drafter that learns
    from its rounds replays them exactly: same K, accepted and emitted per round."""
    from specdec.engine.traces import record_trace, replay

    prompt = [5, 6, 7, 8, 9] * 6 + [3, 4]
    n = 40
    real = speculative_generate(tiny_target, SuffixDrafter(cost), prompt, n, k=8, vocab_size=V)
    trace = record_trace(prompt, real.token_ids, n, None, vocab_size=V)
    rep = replay(trace, k=8, drafter=SuffixDrafter(cost))
    assert [(r.k, r.num_accepted, r.num_emitted) for r in rep] == [
        (r.k, r.num_accepted, r.num_emitted) for r in real.rounds]
