"""The rates declared once (`specdec.core.metrics.RATES`): one definition for GenerationResult, the sweep's console
line and the report's pooled counts."""

from __future__ import annotations

import math

import pytest

from specdec.core.metrics import COUNTS, RATES, GenerationResult, RoundRecord, rates


def _result() -> GenerationResult:
    # K=4: 2 accepted then rejected (recovered); K=4 all accepted (bonus); K=0 plain step; K=2: 0 accepted
    rounds = [
        RoundRecord(4, 2, (True, True, False), "recovered", 3),
        RoundRecord(4, 4, (True,) * 4, "bonus", 5),
        RoundRecord(0, 0, (), "bonus", 1),
        RoundRecord(2, 0, (False,), "recovered", 1),
    ]
    return GenerationResult("speculative", [1, 2], list(range(10)), "length", rounds, prefill_s=0.5,
                            total_s=2.5, ttft_s=0.7)


def test_generation_result_rates_follow_the_declarations():
    res = _result()
    counts = res.counts()
    assert set(counts) == set(COUNTS)
    assert counts == {"new_tokens": 10, "num_rounds": 4, "num_speculative_rounds": 3, "num_drafted": 10,
                      "num_accepted": 6, "num_rejections": 2, "num_emitted": 10, "total_s": 2.5,
                      "prefill_s": 0.5, "decode_s": 2.0}
    # hand-computed from the four rounds above
    assert res.acceptance_rate == pytest.approx(6 / 10)
    assert res.alpha_hat == pytest.approx(6 / 8)
    assert res.mean_accepted == pytest.approx(6 / 3)
    assert res.block_efficiency == pytest.approx(10 / 4)
    assert res.tokens_per_s == pytest.approx(4.0) and res.decode_tokens_per_s == pytest.approx(5.0)
    summary = res.summary()
    for name in ("acceptance_rate", "alpha_hat", "mean_accepted", "block_efficiency", "tokens_per_s",
                 "decode_tokens_per_s"):
        assert summary[name] == pytest.approx(RATES[name].of(counts)), name
    assert rates(counts, ["mean_k"]) == {"mean_k": pytest.approx(10 / 3)}


def test_rates_pool_summed_counts_and_say_nan_when_undefined():
    a, b = _result().counts(), GenerationResult("baseline", [1], [7, 8], "length",
                                                [RoundRecord(0, 0, (), "bonus", 1)] * 2, 0.1, 1.0).counts()
    pooled = {c: a[c] + b[c] for c in COUNTS}
    # pooling sums numerators and denominators (not a mean of per-run rates)
    assert RATES["acceptance_rate"].of(pooled) == pytest.approx(6 / 10)
    assert RATES["block_efficiency"].of(pooled) == pytest.approx(12 / 6)
    assert RATES["tokens_per_s"].of(pooled) == pytest.approx(12 / 3.5)
    assert math.isnan(RATES["acceptance_rate"].of(b))  # nothing drafted
    assert math.isnan(RATES["alpha_hat"].of({"num_accepted": 1}))  # a count missing (e.g. a peer's NULL)
    assert math.isnan(RATES["tokens_per_s"].of({"new_tokens": 3, "total_s": None}))
    assert _result().summary()["acceptance_rate"] == pytest.approx(0.6)
    empty = GenerationResult("speculative", [1], [], "empty").summary()
    assert empty["acceptance_rate"] is None and empty["tokens_per_s"] is None
    with pytest.raises(KeyError):
        rates({}, ["speedup"])


def test_alpha_hat_is_the_per_token_acceptance_estimate():
    """accepted / (accepted + rejections): each accepted draft a success, each rejection a failure (the
    maximum-likelihood alpha of Leviathan et al.'s i.i.d. model); no trials: NaN, not an error."""
    def alpha(acc, rej):
        return RATES["alpha_hat"].of({"num_accepted": acc, "num_rejections": rej})

    assert (alpha(8, 2), alpha(0, 5), alpha(5, 0)) == (0.8, 0.0, 1.0)
    assert math.isnan(alpha(0, 0))


def test_acceptance_record_in_the_serving_engines_shape():
    """vLLM's definitions on hand-counted rounds: drafts are rounds whose draft reached verification, mean
    acceptance length counts the bonus/recovered token per draft, per-position counts are survival counts."""
    rec = _result().acceptance_record()
    # drafts: K=4 (2 accepted), K=4 (4 accepted), K=2 (0 accepted); the K=0 step is no draft
    assert rec["num_drafts"] == 3 and rec["num_draft_tokens"] == 10 and rec["num_accepted_tokens"] == 6
    assert rec["draft_acceptance_rate"] == pytest.approx(0.6)
    assert rec["mean_acceptance_length"] == pytest.approx(1 + 6 / 3)
    assert rec["acceptance_histogram"] == [1, 0, 1, 0, 1]
    assert rec["accepted_per_position"] == [2, 2, 1, 1]
    assert sum(rec["acceptance_histogram"]) == rec["num_drafts"]
    assert sum(rec["accepted_per_position"]) == rec["num_accepted_tokens"]
    # an EOS inside an accepted block cuts drafted and accepted alike (RoundRecord.num_drafted)
    cut = GenerationResult("s", [1], [5, 6], "eos", [RoundRecord(4, 2, (True,) * 4, "bonus", 2, num_accepted_raw=4)])
    assert cut.acceptance_record()["acceptance_histogram"] == [0, 0, 1]
    assert cut.acceptance_record()["mean_acceptance_length"] == pytest.approx(3.0)
    plain = GenerationResult("target_only", [1], [5], "length", [RoundRecord(0, 0, (), "bonus", 1)])
    assert plain.acceptance_record() == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                         "draft_acceptance_rate": None, "mean_acceptance_length": None,
                                         "acceptance_histogram": [], "accepted_per_position": []}
    assert _result().summary()["acceptance"] == rec
