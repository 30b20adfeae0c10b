"""Round-2 fault kinds of the decoding core (shared cases C14-C17, C19, C21, C22), on tiny checkpoints.

Each test turns a case's "right" value into an assertion that failed on the code before its fix.
"""

from __future__ import annotations

import pytest
import torch
from conftest import load_backend

from specdec.decoding import autoregressive_generate, speculative_generate
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.sampling import SamplingParams

V = 1000


@pytest.fixture(scope="module")
def target(tiny_pair):
    return load_backend(tiny_pair.target_dir)


@pytest.fixture(scope="module")
def same_draft(tiny_pair):
    return load_backend(tiny_pair.target_dir)


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
