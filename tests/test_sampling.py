"""`specdec.core.sampling`: what `SamplingParams` refuses, and what `warp` says when it cannot warp."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.core.sampling import SamplingParams, warp


@pytest.mark.parametrize("temperature", [math.inf, math.nan, -0.5])
def test_temperature_must_be_finite_and_non_negative(temperature):
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("kw,needle", [({"top_k": 5}, "top_k 5 needs temperature > 0"),
                                       ({"top_p": 0.5}, "top_p 0.5 needs temperature > 0"),
                                       ({"top_k": 5, "top_p": 0.5}, "top_k 5 and top_p 0.5 need temperature > 0")])
def test_greedy_takes_no_top_k_or_top_p(kw, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams(temperature=0.0, **kw)
    assert SamplingParams().greedy and not SamplingParams(temperature=0.7, **kw).greedy


def test_a_temperature_that_overflows_the_logits_is_named_not_blamed_on_the_logits():
    logits = torch.tensor([[4.0, 3.0, -1.0]])
    with pytest.raises(ValueError, match="temperature 1e-300 is too small"):
        warp(logits, SamplingParams(temperature=1e-300))
    with pytest.raises(ValueError, match="no finite entry"):
        warp(torch.tensor([[float("nan"), 1.0]]), SamplingParams(temperature=1.0))
    probs = warp(logits, SamplingParams(temperature=1e-30))  # tiny but representable: the argmax alone
    assert probs[0].tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("top_k", [2.5, True, -1])
def test_top_k_must_be_a_non_negative_integer(top_k):
    """A fractional top-k is refused here, not by `torch.topk` in the middle of a generation."""
    with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
        SamplingParams(temperature=0.7, top_k=top_k)
    params = SamplingParams(temperature=0.7, top_k=4.0)
    assert type(params.top_k) is int and int((warp(torch.arange(10.0), params) > 0).sum()) == 4
