"""Sampled acceptance traces (`specdec.engine.sampled_traces`): the expected rounds of a fixed-K run from one
seeded target-only sampled run, checked by hand, against a from-scratch forward, and against timed sampled
runs of the engine."""

from __future__ import annotations

import statistics

import pytest
import torch

from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.engine.sampled_traces import SampledTrace, expected_run, record_sampled_trace
from specdec.engine.traces import next_token_logits

V = 1000
HOT = SamplingParams(temperature=1.0)
WARM = SamplingParams(temperature=0.7, top_p=0.9)
COLD = SamplingParams(temperature=0.1)  # the tiny target's law is flat: a cold one gives one-hot drafts acceptance
TEXTS = ["hello world the quick brown fox jumps over the lazy dog and the quick brown fox",
         "one two three one two three one two three one two"]


def _const(alpha: float, n: int, budget: int | None = None) -> SampledTrace:
    return SampledTrace((1,), tuple(range(n)), budget or n, HOT, overlap=(alpha,) * n)


def test_expected_run_by_hand():
    """T = 3, K = 2, overlap (a, b, c): from 0 a round accepts 0 (1 - a), 1 (a (1 - b)) or 2 (a b) tokens; the
    budget clamps K to 1 at position 1 and to 0 at position 2."""
    a, b, c = 0.5, 0.8, 0.3
    t = SampledTrace((1,), (7, 8, 9), 3, HOT, overlap=(a, b, c))
    r1 = 1 + b * 0 + (1 - b) * 1  # from 1: K = 1; accept -> done (3), reject -> position 2, one plain round
    r0 = 1 + (1 - a) * r1 + a * (1 - b) * 1 + a * b * 0
    got = expected_run(t, "draft", 2, round_s=lambda k: 1.0 + k)
    assert got.rounds == pytest.approx(r0)
    assert got.block_efficiency == pytest.approx(3 / r0)
    d1 = 1 + (1 - b) * 0  # drafted from 1
    assert got.drafted == pytest.approx(2 + (1 - a) * d1)
    acc1 = b * 1
    assert got.accepted == pytest.approx(a * (1 - b) * 1 + a * b * 2 + (1 - a) * acc1)
    assert got.drafting_rounds == pytest.approx(1 + (1 - a) * 1)  # position 2 drafts nothing (K clamped to 0)
    s1 = 2.0 + (1 - b) * 1.0
    assert got.decode_s == pytest.approx(3.0 + (1 - a) * s1 + a * (1 - b) * 1.0)


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.9])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_constant_overlap_gives_the_papers_expected_tokens_per_round(alpha, k):
    """With beta = alpha everywhere, tokens per round are E(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha)
    (Leviathan et al. 2023, eq. 1) away from the output's end."""
    from specdec.core.theory import expected_tokens_per_round

    got = expected_run(_const(alpha, 4000), "draft", k)
    assert got.block_efficiency == pytest.approx(expected_tokens_per_round(alpha, k), rel=0.01)
    # every round drafts K and accepts sum_j alpha^j of them (a rejection's later tokens are drafted, not accepted)
    assert got.acceptance_rate == pytest.approx(sum(alpha**j for j in range(1, k + 1)) / k, rel=0.01)


def test_bad_arguments(target):
    t = _const(0.5, 4)
    with pytest.raises(ValueError, match="K must be"):
        expected_run(t, "draft", 0)
    with pytest.raises(KeyError, match="ngram"):
        expected_run(t, "ngram", 2)
    with pytest.raises(ValueError, match="temperature > 0"):
        record_sampled_trace(target, [1, 2], [3], 4, SamplingParams())
    with pytest.raises(ValueError, match="budget"):
        record_sampled_trace(target, [1, 2], [3, 4, 5], 2, HOT)


def test_a_draft_equal_to_the_target_is_always_accepted(tiny_tokenizer, target):
    prompt = tiny_tokenizer(TEXTS[0]).input_ids
    out = autoregressive_generate(target, prompt, 20, vocab_size=V, sampling=HOT, seed=3).token_ids
    t = record_sampled_trace(target, prompt, out, 20, HOT, draft=target, vocab_size=V)
    assert t.overlap == pytest.approx([1.0] * 20, abs=1e-4)
    assert expected_run(t, "draft", 4).rounds == pytest.approx(20 / 5, abs=1e-2)  # every round K + 1 tokens


@pytest.mark.parametrize("sampling", [HOT, WARM], ids=["t1", "t0.7-top-p"])
def test_chain_probabilities_equal_the_targets_law_after_the_proposal(tiny_tokenizer, target, sampling,
                                                                       monkeypatch):
    """Each recorded acceptance probability of prompt lookup's tokens is the target's warped probability of
    that token after prompt + output[:i] + the proposal's earlier tokens, computed from scratch (no chain
    pruned: `CHAIN_FLOOR` 0; with a floor of 1 every token after the proposal leaves the output is 0)."""
    from specdec.engine import sampled_traces

    monkeypatch.setattr(sampled_traces, "CHAIN_FLOOR", 0.0)
    prompt = tiny_tokenizer(TEXTS[1]).input_ids
    out = autoregressive_generate(target, prompt, 24, vocab_size=V, sampling=sampling, seed=5).token_ids
    t = record_sampled_trace(target, prompt, out, 24, sampling, drafters={"ngram": PromptLookupDrafter},
                             vocab_size=V)
    d = PromptLookupDrafter()
    d.prefill(list(prompt[:-1]))
    checked = off = 0
    proposals = []
    for i, probs in enumerate(t.chains["ngram"]):
        committed = list(prompt) + list(out[:i])
        tokens = d.propose(committed, min(16, 24 - i - 1), sampling, None).tokens if i < 23 else []
        proposals.append(list(tokens))
        d.rollback(list(prompt) + list(out[:i + 1]))
        assert len(probs) == min(len(tokens), len(out) - i)
        for j, pr in enumerate(probs):
            ctx = committed + list(tokens[:j])
            want = warp(next_token_logits(target, ctx)[:V].float(), sampling)[tokens[j]]
            assert pr == pytest.approx(float(want), abs=1e-5), (i, j)
            checked += 1
            off += list(tokens[:j]) != list(out[i:i + j])
    assert checked > 10 and off > 0  # the check reaches tokens after a proposal left the output
    monkeypatch.setattr(sampled_traces, "CHAIN_FLOOR", 1.0)
    pruned = record_sampled_trace(target, prompt, out, 24, sampling, drafters={"ngram": PromptLookupDrafter},
                                  vocab_size=V)
    for i, (tokens, full, cut) in enumerate(zip(proposals, t.chains["ngram"], pruned.chains["ngram"], strict=True)):
        leave = next((j for j, tok in enumerate(tokens[:len(full)]) if tok != out[i + j]), len(full))
        assert cut == pytest.approx(full[:leave + 1] + (0.0,) * (len(full) - leave - 1), abs=1e-6), i


class GreedyChain:
    """A deterministic drafter with real acceptance under sampling: the draft model's greedy continuation of
    the committed text (recomputed from scratch; q one-hot, as prompt lookup's)."""

    name = "greedy_chain"

    def __init__(self, model) -> None:
        self.model = model

    def prefill(self, context):
        pass

    def rollback(self, committed):
        pass

    def max_k(self, committed_len):
        return 1 << 30

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        from specdec.drafters.base import Draft

        ids = list(committed)
        for _ in range(k):
            ids.append(int(next_token_logits(self.model, ids)[:V].argmax()))
        return Draft(ids[len(committed):])


def _seeded_traces(target, draft, prompt, sampling, n, drafters, new=40) -> list[SampledTrace]:
    """The sampled traces of `n` seeded target-only runs of `new` tokens (seeds 100, 101, ...)."""
    out = []
    for seed in range(n):
        ids = autoregressive_generate(target, prompt, new, vocab_size=V, sampling=sampling, seed=100 + seed).token_ids
        out.append(record_sampled_trace(target, prompt, ids, new, sampling, draft=draft, drafters=drafters,
                                        vocab_size=V))
    return out


def test_the_expectation_matches_timed_sampled_runs(tiny_tokenizer, target, near_draft):
    """The predicted block efficiency (mean over 6 seeded target-only runs' traces) against the measured one
    (mean over 16 seeded speculative runs) for the draft model, prompt lookup and a deterministic drafter
    with real acceptance (`GreedyChain`) at K = 2 and 4, at
    temperature 1, 0.7 with top-p and 0.1: within 15% per cell (16 runs: ~4% standard error) and 4% pooled;
    the one-hot drafts reach a block efficiency well above 1 (their path is checked, not only their
    rejections). The negative control, the overlap
    replaced by the chance that the two models' draws coincide (sum_x p(x) q(x), a sample-and-match
    verifier's acceptance), is off."""
    ratios, match_ratios, efficiency = [], [], {}
    for sampling in (HOT, WARM, COLD):
        for text in TEXTS:
            prompt = tiny_tokenizer(text).input_ids
            chain = {"ngram": PromptLookupDrafter, "greedy_chain": lambda: GreedyChain(near_draft)}
            traces = _seeded_traces(target, near_draft, prompt, sampling, 6, chain)
            for name in ("draft", "ngram", "greedy_chain"):
                for k in (2, 4):
                    pred = statistics.mean(expected_run(t, name, k).block_efficiency for t in traces)
                    meas = []
                    for seed in range(16):
                        d = {"draft": lambda: ModelDrafter(near_draft, V), "ngram": PromptLookupDrafter,
                             "greedy_chain": lambda: GreedyChain(near_draft)}[name]()
                        r = speculative_generate(target, d, prompt, 40, k=k, vocab_size=V, sampling=sampling,
                                                 seed=seed)
                        meas.append(len(r.token_ids) / len(r.rounds))
                    ratios.append(pred / statistics.mean(meas))
                    efficiency.setdefault(name, []).append(statistics.mean(meas))
                    if name == "draft":
                        match = statistics.mean(expected_run(_match_rule(t, target, near_draft), name, k)
                                                .block_efficiency for t in traces)
                        match_ratios.append(match / statistics.mean(meas))
    assert all(abs(r - 1) < 0.15 for r in ratios), ratios
    assert abs(statistics.mean(ratios) - 1) < 0.04, statistics.mean(ratios)
    assert max(efficiency["greedy_chain"]) > 1.8, efficiency
    assert statistics.mean(match_ratios) < 0.9, match_ratios


def _match_rule(t: SampledTrace, target, draft) -> SampledTrace:
    """`t` with its overlap replaced by sum_x p(x) q(x) along its output (the negative control)."""
    seq = list(t.prompt_ids) + list(t.target_ids[:-1])
    start = len(t.prompt_ids) - 1
    rows = []
    for m in (target, draft):
        m.reset()
        with torch.no_grad():
            rows.append(warp(m.forward(seq)[start:, :V].float(), t.sampling))
        m.reset()
    match = tuple(float(x) for x in (rows[0] * rows[1]).sum(dim=-1).tolist())
    return SampledTrace(t.prompt_ids, t.target_ids, t.max_new_tokens, t.sampling, overlap=match)


def test_the_sampled_best_k_is_the_analytical_optimum_on_a_constant_overlap():
    """`TraceModel.best_fixed_k` over a long sampled trace of constant overlap alpha picks the K maximising
    E(alpha, K) / (K c + v(K + 1)) (Leviathan et al. 2023) and predicts that speedup; a drafter the trace does
    not record, or one no sampled trace replays, is a one-line error."""
    from specdec.core.costs import CostCurve
    from specdec.core.theory import expected_tokens_per_round
    from specdec.measure.pricing import TraceModel

    curve = CostCurve({1: 0.10, 2: 0.11, 4: 0.12, 8: 0.15, 17: 0.25}, draft_step_s=0.02)
    for alpha in (0.5, 0.8, 0.95):
        t = _const(alpha, 4000)
        rate = {k: expected_tokens_per_round(alpha, k) * curve.forward_s(1)
                / (k * 0.02 + curve.forward_s(k + 1)) for k in range(1, 17)}
        want = max(rate, key=rate.get)
        k, speedup = TraceModel(t, curve).best_fixed_k("draft", range(1, 17))
        assert k == want and speedup == pytest.approx(rate[want], rel=0.01), alpha
    with pytest.raises(ValueError, match="no record of drafter 'ngram'"):
        TraceModel(_const(0.5, 10), curve).best_fixed_k("ngram")
    with pytest.raises(ValueError, match="no sampled replay for drafter 'xtok'"):
        TraceModel(_const(0.5, 10), curve).best_fixed_k("xtok")
    with pytest.raises(ValueError, match="no record of drafter 'mixed': no suffix chain"):
        TraceModel(_const(0.5, 10), curve).best_fixed_k("mixed")


def _varied(n: int, seed: int = 3) -> SampledTrace:
    """A trace whose overlap and chain probabilities vary along the output (a chain of 0-6 tokens per
    position), so a round's fate depends on where it starts."""
    import random

    rng = random.Random(seed)
    overlap = tuple(rng.choice((0.1, 0.5, 0.9, 0.97)) for _ in range(n))
    chain = tuple(tuple(rng.choice((0.2, 0.8, 0.95)) for _ in range(rng.randint(0, 6))) for _ in range(n))
    return SampledTrace((1,), tuple(range(n)), n, HOT, overlap=overlap, chains={"ngram": chain})


@pytest.mark.parametrize("drafter,k", [("draft", 3), ("ngram", 5)])
def test_simulated_runs_of_a_fixed_k_converge_to_the_expectation(drafter, k):
    """`simulate_run` under FixedK, averaged over draws, gives `expected_run`'s rounds, drafted and accepted
    tokens (the same law, sampled): within 2% over 2000 draws."""
    import random

    from specdec.engine.sampled_traces import simulate_run
    from specdec.policies.base import FixedK

    t = _varied(60)
    want = expected_run(t, drafter, k)
    rng = random.Random(0)
    runs = [simulate_run(t, drafter, FixedK(k), rng) for _ in range(2000)]
    assert all(sum(r.num_emitted for r in rounds) == 60 for rounds in runs)
    assert statistics.mean(len(rounds) for rounds in runs) == pytest.approx(want.rounds, rel=0.02)
    assert statistics.mean(sum(r.k for r in rounds) for rounds in runs) == pytest.approx(want.drafted, rel=0.02)
    assert statistics.mean(sum(r.num_accepted for r in rounds) for rounds in runs) == pytest.approx(
        want.accepted, rel=0.02)


def test_the_cost_policy_under_sampling_drafts_where_it_pays_and_stops_where_it_cannot():
    """`TraceModel.expected_policy`: on a constant overlap of 0.9 the cost policy's simulated runs reach the
    best fixed K's predicted speedup within 5%; on an overlap of 0.02 it soon stops drafting (at most 3% below
    target-only); the mean drafted per drafting round and tokens per forward are consistent with that."""
    from specdec.core.costs import CostCurve
    from specdec.measure.pricing import TraceModel

    curve = CostCurve({1: 0.10, 2: 0.11, 4: 0.12, 8: 0.15, 17: 0.25}, draft_step_s=0.02)
    good = TraceModel(_const(0.9, 400), curve)
    bpf, mean_k, speedup = good.expected_policy("draft", "cost", 16)
    assert speedup == pytest.approx(good.best_fixed_k("draft")[1], rel=0.05) and speedup > 1.5
    assert bpf > 3 and mean_k >= 2
    bpf, mean_k, speedup = TraceModel(_const(0.02, 400), curve).expected_policy("draft", "cost", 16)
    assert 0.97 <= speedup <= 1.0 + 1e-9 and bpf < 1.1
    assert TraceModel(_const(0.9, 50), curve).expected_policy("draft", "cost", 16, seed=1) == \
        TraceModel(_const(0.9, 50), curve).expected_policy("draft", "cost", 16, seed=1)  # seeded
    with pytest.raises(ValueError, match="needs measured costs"):
        TraceModel(_const(0.9, 50), None).expected_policy("draft", "cost", 16)
    with pytest.raises(ValueError, match="no record of drafter 'ngram'"):
        TraceModel(_const(0.9, 50), curve).expected_policy("ngram", "cost", 16)


# The mixed drafter under sampling: driven along the output, its model rounds drawn from the overlap, its
# suffix rounds read from the suffix drafter's chain (`simulate_run`'s live drafter).
def _mixed_costs():
    from specdec.core.costs import CostCurve

    return CostCurve({1: 0.10, 2: 0.105, 4: 0.115, 8: 0.13, 17: 0.16}, draft_step_s=0.02)


def _mixed_rounds(t: SampledTrace, k: int, draws: int, seed: int = 0):
    import random

    from specdec.catalogue.drafters import replay_drafter
    from specdec.engine.sampled_traces import simulate_run
    from specdec.policies.base import FixedK

    rng = random.Random(seed)
    return [simulate_run(t, "mixed", FixedK(k), rng, replay_drafter("mixed", costs=_mixed_costs(), trace=t, rng=rng))
            for _ in range(draws)]


def test_the_mixed_drafters_model_rounds_follow_the_overlap_and_teach_its_estimate():
    """On an output with no repeat (the suffix drafter never proposes) the mixed drafter's model rounds are
    drawn from the overlap: their accepted tokens average the overlap's expectation for the round's start and
    length (within 3 standard errors); the draws reach the drafter's estimate, so on an overlap of 0.03 it
    soon stops drafting with the model (fewer than 5 model rounds a run of 80 on average), and on 0.97 it
    drafts every round."""
    n = 80
    out = tuple(500 + i for i in range(n))
    chains = {"suffix": ((),) * n}
    overlap = tuple(0.3 + 0.65 * ((i * 7) % 11) / 10 for i in range(n))
    t = SampledTrace((1, 2, 3), out, n, HOT, overlap=overlap, chains=chains)
    diffs = []
    for rounds in _mixed_rounds(t, 6, 300):
        pos = 0
        assert sum(r.num_emitted for r in rounds) == n
        for r in rounds:
            assert r.by_model or r.k == 0  # a round the model did not draft is a plain one here
            want, survive = 0.0, 1.0
            for p in overlap[pos:pos + r.k]:
                survive *= p
                want += survive
            diffs.append(r.num_accepted - want)
            pos += r.num_emitted
    se = statistics.stdev(diffs) / len(diffs) ** 0.5
    assert abs(statistics.mean(diffs)) < 3 * se, (statistics.mean(diffs), se)
    low = SampledTrace((1, 2, 3), out, n, HOT, overlap=(0.03,) * n, chains=chains)
    assert statistics.mean(sum(1 for r in rounds if r.by_model) for rounds in _mixed_rounds(low, 6, 50)) < 5
    high = SampledTrace((1, 2, 3), out, n, HOT, overlap=(0.97,) * n, chains=chains)
    assert all(all(r.by_model for r in rounds[:-1]) for rounds in _mixed_rounds(high, 6, 50))


def test_the_mixed_drafters_suffix_rounds_read_the_suffix_chain():
    """On a repeating output whose suffix chain accepts every token, the mixed drafter drafts with the suffix
    drafter (rounds not by the model) and commits several tokens a round; the same output with a chain that
    accepts none commits one token per suffix round: the rounds' fates come from the chain."""
    n = 60
    out = tuple([7, 8, 9, 10] * (n // 4))
    prompt = (7, 8, 9, 10, 7, 8, 9, 10)
    for p, most in ((1.0, None), (0.0, 0)):
        chains = {"suffix": tuple((p,) * 16 for _ in range(n))}
        t = SampledTrace(prompt, out, n, HOT, overlap=(0.02,) * n, chains=chains)
        rounds = _mixed_rounds(t, 8, 5)
        suffix = [r for rs in rounds for r in rs if r.by_model is False]
        assert suffix and all(r.k > 0 for r in suffix)
        if most is None:
            assert statistics.mean(r.num_accepted for r in suffix) > 3
        else:
            assert max(r.num_accepted for r in suffix) == 0


@pytest.mark.parametrize("sampling", [HOT, WARM], ids=["t1", "t0.7-top-p"])
def test_the_mixed_drafters_sampled_replay_matches_timed_sampled_runs(tiny_tokenizer, target, near_draft, sampling):
    """The mixed drafter's predicted target forwards per token (`TraceModel.expected`: the mean of simulated
    runs, over 12 seeded target-only runs' traces) against the measured one (48 seeded speculative runs of the
    live drafter, K = 8, their rounds over their tokens): within 8% per prompt and 5% pooled (the measured
    side's standard error is ~2.5% a prompt). The negative control, the overlap replaced by the
    chance that the two models' draws coincide, is off by more than 10%."""
    from specdec.drafters.mixed import MixedDrafter
    from specdec.drafters.suffix import SuffixDrafter
    from specdec.measure.pricing import TraceModel

    costs = _mixed_costs()
    ratios, control = [], []
    for text in TEXTS:
        prompt = tiny_tokenizer(text).input_ids
        traces = _seeded_traces(target, near_draft, prompt, sampling, 12, {"suffix": lambda: SuffixDrafter(costs)})
        pred = statistics.mean(TraceModel(t, costs).expected("mixed", 8)[0].rounds / len(t.target_ids)
                               for t in traces)
        wrong = statistics.mean(
            TraceModel(m, costs).expected("mixed", 8)[0].rounds / len(m.target_ids)
            for m in (SampledTrace(t.prompt_ids, t.target_ids, t.max_new_tokens, t.sampling,
                                   _match_rule(t, target, near_draft).overlap, t.chains) for t in traces))
        rounds = tokens = 0
        for seed in range(48):
            d = MixedDrafter(SuffixDrafter(costs), near_draft, V, costs)
            r = speculative_generate(target, d, prompt, 40, k=8, vocab_size=V, sampling=sampling, seed=seed)
            rounds, tokens = rounds + len(r.rounds), tokens + len(r.token_ids)
            assert "model" in d.stats.choices
        ratios.append(pred / (rounds / tokens))
        control.append(wrong / (rounds / tokens))
    assert all(abs(r - 1) < 0.08 for r in ratios), ratios
    assert abs(statistics.mean(ratios) - 1) < 0.05, ratios
    assert statistics.mean(control) > 1.1, control


def test_the_sampled_grid_prices_only_the_drafters_a_trace_records():
    """The report's K grid of a sampled trace holds a drafter only where the trace records what its replay reads:
    a trace with the draft's overlap and prompt lookup's chain (a sweep without the suffix drafter) gives the
    draft model and prompt lookup, not the mixed drafter, whose suffix rounds read the suffix chain; with that
    chain it gives the suffix and mixed drafters too (and the mixed drafter's fixed K and cost policy)."""
    from specdec.core.costs import CostCurve
    from specdec.report.predicted import PromptModel, _expected_rows

    curve = CostCurve({1: 0.10, 2: 0.11, 4: 0.12, 8: 0.15, 17: 0.25}, draft_step_s=0.02)
    for chains, want in (({"ngram": ((0.5,),) * 20}, {"draft", "ngram"}),
                         ({"ngram": ((0.5,),) * 20, "suffix": ((),) * 20}, {"draft", "ngram", "suffix", "mixed"})):
        t = SampledTrace((1,), tuple(range(20)), 20, HOT, overlap=(0.5,) * 20, chains=chains)
        m = PromptModel(("c", "p", ""), "code", t, curve, 0.0, 0.0, 0.0, (3, 1), None)
        rows = _expected_rows(m, ("cost",), 16)
        assert {r["method"] for r in rows} == want
        assert {r["policy"] for r in rows if r["method"] == "mixed"} <= {"fixed", "cost"}
