"""K policies: scripted unit tests (hand-computed K), and greedy exactness of every policy on tiny models."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from specdec.catalogue.policies import POLICIES, make_policy
from specdec.core.costs import CostCurve
from specdec.core.metrics import RoundRecord
from specdec.core.sampling import SamplingParams, warp
from specdec.core.theory import optimal_k
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.policies.base import ConfidenceK, FixedK, HeuristicK, RoundPlan
from specdec.policies.cost import CostPolicy

V = 1000
PROMPTS = [
    "hello world the quick brown fox",
    "abc abc abc abc abc abc abc abc",
    "one two three four five six seven eight nine ten eleven twelve thirteen",
]

# The "expensive draft" pair: draft step 0.45 s, target 0.46 s/step, v(n) ~ 1 + 0.15 (n - 1).
SLOW_DRAFT = {"draft_step_s": 0.45, "target_forward_s": {n: 0.46 * (1 + 0.15 * (n - 1)) for n in range(1, 18)}}
# Same target, a draft 9x cheaper than a target step (c ~ 0.11).
CHEAP_DRAFT = {"draft_step_s": 0.05, "target_forward_s": {n: 0.46 * (1 + 0.15 * (n - 1)) for n in range(1, 18)}}


def rec(k: int, accepted: int, *, k_requested: int | None = None) -> RoundRecord:
    """A round that proposed k tokens and accepted the first `accepted` of them."""
    flags = (True,) * accepted + ((False,) if accepted < k else ())
    kind = "bonus" if accepted == k else "recovered"
    return RoundRecord(k, accepted, flags, kind, accepted + 1, k_requested=k_requested)


def full(k: int) -> RoundRecord:
    return rec(k, k)


# ---------------------------------------------------------------------------------------------------
# fixed / heuristic / confidence
# ---------------------------------------------------------------------------------------------------


def test_fixed_is_constant():
    p = FixedK(3)
    p.start()
    for r in (full(3), rec(3, 0), rec(3, 1)):
        assert p.next_k() == 3 and p.alpha_estimate() is None
        p.observe(r)
    with pytest.raises(ValueError):
        FixedK(0)


def test_heuristic_schedule_hand_computed():
    p = HeuristicK(3)
    p.start()
    ks = []
    script = [full(3), full(5), rec(7, 2), rec(6, 0), rec(5, 4), rec(4, 0), rec(3, 0), rec(2, 1), rec(1, 0),
              rec(0, 0), full(1)]
    for r in script:
        k = p.next_k()
        ks.append(k)
        p.observe(r)
    # +2, +2, -1, -1, -1, -1, -1, -1, floor 1, no evidence (K=0 round) -> unchanged, +2
    assert ks == [3, 5, 7, 6, 5, 4, 3, 2, 1, 1, 1]
    assert p.next_k() == 3
    assert p.alpha_estimate() is None


def test_heuristic_resets_between_calls_and_respects_max():
    p = HeuristicK(2, max_k=5)
    p.start()
    seen = []
    for _ in range(4):
        k = p.next_k()
        seen.append(k)
        p.observe(full(k))
    assert seen == [2, 4, 5, 5]  # capped at max_k
    p.start()  # a new generation: back to the initial K ("heuristic_transient")
    assert p.next_k() == 2
    p.observe(rec(2, 0))
    assert p.next_k() == 1
    p.start()
    assert p.next_k() == 2
    with pytest.raises(ValueError):
        HeuristicK(4, max_k=3)
    with pytest.raises(ValueError):
        HeuristicK(0)


def test_heuristic_counts_clamped_full_round_as_full():
    """The engine may clamp K (budget); a round whose proposed tokens were all accepted is 'full'."""
    p = HeuristicK(6)
    p.start()
    p.observe(rec(2, 2, k_requested=6))
    assert p.next_k() == 8


def test_policies_return_the_confidence_stop_with_k():
    """The stop is part of each round's plan (passed to propose), never state left in a drafter."""
    p = ConfidenceK(5, 0.3)
    assert p.next_round() == RoundPlan(5, 0.3) and p.alpha_estimate() is None
    for other in (FixedK(2), HeuristicK(2), CostPolicy.from_costs(CHEAP_DRAFT)):
        other.start()
        plan = other.next_round()
        assert plan.min_confidence is None and plan.k >= 0, other.name
    assert FixedK(3).next_round() == RoundPlan(3)
    with pytest.raises(ValueError):
        ConfidenceK(4, -0.1)
    with pytest.raises(ValueError):
        ConfidenceK(0)


def test_make_policy():
    assert isinstance(make_policy("fixed", 4), FixedK) and make_policy("fixed", 4).next_k() == 4
    h = make_policy("heuristic", 3, max_k=9)
    assert isinstance(h, HeuristicK) and h.initial_k == 3 and h.max_k == 9
    c = make_policy("confidence", 6, confidence_threshold=0.5)
    assert isinstance(c, ConfidenceK) and c.max_k == 6 and c.confidence_threshold == 0.5
    assert make_policy("confidence", 6).confidence_threshold == 0.4
    json_costs = {"draft_step_s": 0.05, "target_forward_s": {str(n): s for n, s in
                                                             CHEAP_DRAFT["target_forward_s"].items()},
                  "machine": "ignored"}
    cp = make_policy("cost", 7, costs=json_costs)
    assert isinstance(cp, CostPolicy) and cp.max_k == 7
    assert cp.target_forward_s == CHEAP_DRAFT["target_forward_s"]
    assert {p.name for p in (make_policy(n, 2, costs=CHEAP_DRAFT) for n in POLICIES)} == set(POLICIES)
    with pytest.raises(ValueError, match="fixed, heuristic, confidence, cost"):
        make_policy("adaptive", 4)
    with pytest.raises(ValueError, match="specdec costs"):
        make_policy("cost", 4)
    with pytest.raises(ValueError):
        make_policy("heuristic", 0)


# ---------------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------------


def test_cost_alpha_estimate_hand_computed():
    p = CostPolicy(0.1, {1: 1.0, 5: 1.4}, max_k=4)  # prior 0.6 weight 2, decay 0.8
    assert p.alpha_estimate() == pytest.approx(0.6)
    p.next_k()
    assert p.alpha_estimate() == pytest.approx(0.6)
    # the prior is old data: its weight decays with the counts (w = 2 * 0.8 ** rounds observed)
    p.observe(rec(4, 2))  # S = 2, F = 1, w = 1.6 -> (0.96 + 2) / (1.6 + 3)
    assert p.current_alpha() == pytest.approx(2.96 / 4.6)
    p.observe(full(4))  # S = 0.8*2 + 4 = 5.6, F = 0.8, w = 1.28 -> (0.768 + 5.6) / (1.28 + 6.4)
    assert p.current_alpha() == pytest.approx(6.368 / 7.68)
    p.observe(rec(0, 0))  # a plain round observes nothing: no drift
    assert p.current_alpha() == pytest.approx(6.368 / 7.68)
    p.next_k()
    assert p.alpha_estimate() == pytest.approx(6.368 / 7.68)
    p.start()
    assert p.current_alpha() == pytest.approx(0.6)
    kept = CostPolicy(0.1, {1: 1.0, 5: 1.4}, max_k=4, forget_prior=False)
    kept.observe(rec(4, 2))  # the prior keeps its weight: (1.2 + 2) / (2 + 3)
    assert kept.current_alpha() == pytest.approx(3.2 / 5)


# The default pair's measured costs on this CPU (results/archive/study.db): c = 0.36 and the MKL staircase, where
# scoring 3 tokens costs what 2 do and 17 cost less than 13.
STUDY_COSTS = {"draft_step_s": 0.0994, "target_forward_s": {
    1: 0.2748, 2: 0.2882, 3: 0.2858, 4: 0.5378, 5: 0.5576, 6: 0.5634, 7: 0.7652, 8: 0.7621, 9: 0.7643,
    10: 0.9167, 11: 0.9138, 12: 0.9075, 13: 1.0635, 14: 1.0771, 15: 1.0724, 16: 0.7681, 17: 0.7822}}


def test_cost_forgetting_the_prior_lets_a_long_easy_stretch_reach_a_large_k():
    # On the staircase, K = 16 beats K = 2 only for alpha >= ~0.98. A prior that keeps its weight caps the
    # estimate at K = 2 with full acceptance: (1.2 + 10) / (2 + 10) = 0.93, and the policy never leaves
    # K = 2 on text where K = 16 is 1.14x faster (repetitive, replayed from its traces). Forgotten, it does.
    assert CostPolicy.from_costs(STUDY_COSTS).best_k(0.93) == 2
    for forget, k_end in ((True, 16), (False, 2)):
        p = CostPolicy.from_costs(STUDY_COSTS, forget_prior=forget)
        ks = []
        for _ in range(30):
            ks.append(p.next_k())
            p.observe(full(ks[-1]))
        assert ks[0] == 1  # the prior (0.6): K = 1 edges K = 2 (1.136 vs 1.113 tokens per step)
        assert ks[-1] == k_end, (forget, ks)


def test_cost_k_hand_computed():
    # c = 0.1, v(n) = 1 + 0.1 (n - 1); at alpha = 0.6 tokens/s: K0 1, K1 1.6/1.2, K2 1.96/1.4 = 1.4,
    # K3 2.176/1.6 = 1.36, K4 2.3056/1.8 = 1.2809  ->  K = 2.
    p = CostPolicy(0.1, {1: 1.0, 5: 1.4}, max_k=4)
    assert p.next_k() == 2
    assert p.predicted_tokens() == pytest.approx(1.96)
    assert p.predicted_tokens_per_s() == pytest.approx(1.4)
    assert p.tokens_per_s(0.6) == pytest.approx([1.0, 1.6 / 1.2, 1.4, 2.176 / 1.6, 2.3056 / 1.8])


@pytest.mark.parametrize("costs", [CHEAP_DRAFT, SLOW_DRAFT,
                                   {"draft_step_s": 0.002, "target_forward_s": {1: 0.02, 4: 0.021, 17: 0.03}}])
def test_cost_k_matches_theory_optimal_k(costs):
    p = CostPolicy.from_costs(costs)
    t1 = costs["target_forward_s"][1]
    v = CostCurve(costs["target_forward_s"]).relative()
    for alpha in (0.0, 0.05, 0.2, 0.35, 0.5, 0.7, 0.85, 0.95, 0.99, 1.0):
        k_theory, speedup = optimal_k(alpha, costs["draft_step_s"] / t1, v, ks=range(17))
        assert p.best_k(alpha) == k_theory, alpha
        assert p.tokens_per_s(alpha)[k_theory] * t1 == pytest.approx(speedup)


def test_cost_picks_plain_decoding_when_draft_is_expensive():
    p = CostPolicy.from_costs(SLOW_DRAFT)
    assert not p.speculation_can_win  # even alpha = 1 cannot pay for a draft step this slow
    p.start()
    for _ in range(3):
        p.observe(rec(2, 0))
    ks = []
    for _ in range(60):
        ks.append(p.next_k())
        p.observe(rec(ks[-1], 0))
    assert ks == [0] * 60  # and never probes: no alpha could make it pay
    assert p.predicted_tokens() == 1.0


def test_cost_picks_large_k_when_alpha_near_one_and_draft_cheap():
    p = CostPolicy(0.001, {1: 0.02, 17: 0.024})  # c = 0.05, v(17) = 1.2
    p.start()
    k = p.next_k()
    assert k >= 3
    for _ in range(15):
        p.observe(full(k))
        k = p.next_k()
    assert p.alpha_estimate() > 0.97
    assert k == 16


def test_cost_probes_after_a_loss_bounded_backoff():
    # CHEAP_DRAFT: t1 = 0.46 s, c = 0.05 / 0.46, v(n) = 1 + 0.15 (n - 1). The back-off schedule alone
    # (no loss ledger: tests/test_never_lose.py covers the ledger)
    p = CostPolicy.from_costs(CHEAP_DRAFT, probe_budget=math.inf)
    p.start()
    assert p.next_k() > 0  # the prior (0.6) says speculate
    for _ in range(20):  # a hard stretch: every first draft token rejected
        p.observe(rec(2, 0))
    alpha_low = p.current_alpha()
    assert p.best_k(alpha_low) == 0

    def run_plain_until_probe(limit=200):
        n = 0
        while True:
            k = p.next_k()
            assert p.alpha_estimate() == pytest.approx(alpha_low)  # no drift while plain
            if k > 0:
                return n, k
            p.observe(rec(0, 0))
            n += 1
            assert n < limit

    # The probe is planned at the data-only alpha, 0 here: K = 1 costs R = c + v(2) = 0.1087 + 1.15 plain
    # steps for E = 1 token, so N = ceil((R - E) / 0.03 - E) = ceil(8.623 - 1) = 8 plain rounds per probe.
    expected_n = math.ceil((0.05 / 0.46 + 1.15 - 1.0) / 0.03 - 1.0)
    assert expected_n == 8
    for _ in range(4):  # failed probes: the same bounded back-off each time
        assert run_plain_until_probe() == (expected_n, 1)
        p.observe(rec(1, 0))
        alpha_low = p.current_alpha()
    # a probe that succeeds (an easy stretch began): the estimate moves to S / (S + F) = 1 / (1 + 0.8 F)
    # = 0.2 (the prior is forgotten), still under K = 1's break-even 0.2587. It rests on about 5 decayed
    # trials, so one standard deviation above it, 0.2 + sqrt(0.2 * 0.8 / 6) = 0.363, is above break-even:
    # the policy drafts again at once (explore_z = 1). Without that, the next probe is nearly free
    # (E = 1.2, N = ceil(0.0587 / 0.03 - 1.2) = 1) and comes after one plain round.
    assert run_plain_until_probe() == (expected_n, 1)
    p.observe(full(1))
    alpha_low = p.current_alpha()
    assert 0.19 < alpha_low < 0.21
    assert 4.5 < p.trials() < 5.5  # "about 5 decayed trials"
    assert p.upper_alpha() == pytest.approx(alpha_low + math.sqrt(alpha_low * (1 - alpha_low) / (p.trials() + 1)))
    assert 0.35 < p.upper_alpha() < 0.37
    assert p.best_k(alpha_low) == 0 and p.best_k(p.upper_alpha()) == 1
    assert p.next_k() == 1  # explores: no plain round
    p.explore_z = 0.0
    assert run_plain_until_probe() == (1, 1)
    p.observe(full(1))
    assert p.next_k() > 0


def test_cost_probe_near_break_even_comes_after_one_plain_round():
    # data-only estimate (no prior, no decay): S = 1, F = 3 -> alpha = 0.25, just below K = 1's break-even
    # (1 + a = c + v(2) = 1.2587 at a = 0.2587). E = 1.25, R - E = 0.0087: N = ceil(0.29 - 1.25) -> 1.
    p = CostPolicy.from_costs(CHEAP_DRAFT, prior_weight=0.0, decay=1.0, explore_z=0.0)
    for accepted in (1, 0, 0, 0):
        p.observe(rec(1, accepted))
    assert p.current_alpha() == pytest.approx(0.25)
    assert p.best_k(0.25) == 0
    assert p.probe_plan(0.25) == (1, 1)
    assert [p.next_k(), p.next_k()] == [0, 1]


def test_cost_one_early_rejection_does_not_make_the_drafter_look_hopeless():
    # The default pair's measured costs (c = 0.36, v(2) = 1.05). A first round K = 1 rejected: the estimate
    # is (0.96 + 0) / (1.6 + 1) = 0.369, under K = 1's break-even (1 + a = c + v(2) -> a = 0.411), so the
    # policy decodes plainly; the data alone (0 of 1) would say alpha = 0 and wait 13 rounds, but one trial
    # is not evidence: the probe is planned at 0.369 (E = 1.369, R = 1.411, N = ceil(0.014) = 1).
    # (With explore_z = 1, the default, the policy does not even pause: 0.369 rests on 2.6 trials, and one
    # standard deviation above it, 0.369 + sqrt(0.369 * 0.631 / 3.6) = 0.623, is above break-even.)
    t = {1: 0.2748, 2: 0.2882, 3: 0.2858, 4: 0.5378, 5: 0.5576}
    explorer = CostPolicy(0.0994, t, max_k=4)
    explorer.observe(rec(1, 0))
    assert explorer.upper_alpha() == pytest.approx(0.96 / 2.6 + math.sqrt(0.96 / 2.6 * (1 - 0.96 / 2.6) / 3.6))
    assert [explorer.next_k(), explorer.next_k()] == [1, 1]
    p = CostPolicy(0.0994, t, max_k=4, explore_z=0.0)
    p.start()
    assert p.next_k() == 1
    p.observe(rec(1, 0))
    assert p.current_alpha() == pytest.approx(0.96 / 2.6)
    assert [p.next_k(), p.next_k()] == [0, 1]
    # with evidence (decayed S + F >= 3: five rejections, F = (1 - 0.8^5) / 0.2 = 3.36) the data-only
    # estimate rules: R = (0.0994 + 0.2882) / 0.2748 = 1.4105, N = ceil(0.4105 / 0.03 - 1) = 13
    for _ in range(4):
        p.observe(rec(1, 0))
    assert p.backoff == 13


def test_cost_policy_overhead_on_a_hopeless_drafter_stays_within_bound():
    # Every draft token rejected for 2000 rounds: the time spent beyond plain decoding of the same tokens,
    # on the policy's own cost model, stays within its 3% probe overhead (after the prior is forgotten),
    # also for a free drafter such as prompt lookup (a prior that kept its weight would hold the estimate at
    # 1.2 / 7 = 0.17, above K = 1's break-even of 0.15 there, and keep drafting for nothing).
    for draft_s in (0.05, 0.3, 0.0):
        costs = {"draft_step_s": draft_s, "target_forward_s": CHEAP_DRAFT["target_forward_s"]}
        p = CostPolicy.from_costs(costs)
        assert p.speculation_can_win
        p.start()
        seconds = tokens = 0.0
        for i in range(2000):
            k = p.next_k()
            p.observe(rec(k, 0))
            if i >= 50:
                seconds += p.round_cost_s[k]
                tokens += 1
        overhead = seconds / (tokens * p.round_cost_s[0]) - 1.0
        # (the 1950-round window cuts one probe cycle: at most ~0.1% on top of the 3% bound)
        assert 0.0 < overhead <= 0.031


def test_cost_alpha_follows_a_change_in_acceptance():
    p = CostPolicy.from_costs(CHEAP_DRAFT)
    p.start()
    for _ in range(30):
        p.observe(full(4))  # easy text: alpha-hat -> 1
    high = p.current_alpha()
    assert high > 0.95
    low_steady = 0.0  # nothing accepted and the prior forgotten
    trace = []
    for _ in range(10):
        p.observe(rec(4, 0))  # hard text: every first draft token rejected
        trace.append(p.current_alpha())
    assert all(b < a for a, b in itertools.pairwise(trace))
    mid = (high + low_steady) / 2
    assert trace[7] < mid  # past halfway within 8 rounds (of 1 token each)
    assert p.best_k(trace[-1]) < p.best_k(high)
    for i in range(3):
        p.observe(full(4))  # easy again: rises past halfway within 2 rounds
        trace.append(p.current_alpha())
    assert trace[-2] > (trace[9] + high) / 2


def test_cost_validation():
    with pytest.raises(ValueError, match="n = 1"):
        CostPolicy(0.1, {2: 1.0})
    with pytest.raises(ValueError, match="specdec costs"):
        CostPolicy.from_costs({"target_forward_s": {1: 1.0}})
    with pytest.raises(ValueError, match="draft_step_s"):
        CostPolicy.from_costs({"draft_step_s": None, "target_forward_s": {1: 1.0}})
    assert CostPolicy.from_costs({"draft_step_s": 0.0, "target_forward_s": {"1": 1.0, "3": 1.2}}).best_k(0.5) > 0
    with pytest.raises(ValueError):
        CostPolicy(-1.0, {1: 1.0})
    with pytest.raises(ValueError):
        CostPolicy(0.1, {1: 0.0})
    with pytest.raises(ValueError):
        CostPolicy(0.1, {1: 1.0}, decay=0.0)
    with pytest.raises(ValueError, match="probe_overhead"):
        CostPolicy(0.1, {1: 1.0}, probe_overhead=0.0)
    with pytest.raises(ValueError):
        CostPolicy(0.1, {1: 1.0}, max_k=0)


def test_cost_extrapolates_verification_cost_conservatively():
    """Past the largest measured n, T(n) grows along the last measured slope (never clamped flat)."""
    p = CostPolicy(0.0, {1: 1.0, 3: 1.2}, max_k=6)
    assert p.round_cost_s == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6])


# The cheap draft of CHEAP_DRAFT with a measured forward curve: a 500-token prefill costs ~4 target steps.
LONG_PREFILL = {**CHEAP_DRAFT, "draft_forward_s": {1: 0.05, 16: 0.10, 64: 0.30}}


def test_cost_pays_the_draft_prefill_only_where_it_pays_back():
    p = CostPolicy.from_costs(LONG_PREFILL, max_k=8)
    k0 = p.best_k(p.prior_alpha)
    assert k0 > 0
    # 16 new tokens after a 500-token prompt: what K saves cannot pay back the draft's prefill twice over
    p.start(prefill_tokens=500, budget=16)
    price = p.catch_up_steps()
    assert 3.0 < price < 6.0
    assert not p.invest_pays(k0, p.prior_alpha)
    for _ in range(16):
        assert p.next_k() == 0  # no probe either: a probe would pay the prefill on optimism alone
        p.observe(rec(0, 0))
    assert p.invested == 0.0 and p.declined == 16 and "draft prefill declined" in p.note()
    # 256 new tokens: it pays the prefill in the first round
    p.start(prefill_tokens=500, budget=256)
    assert p.catch_up_steps() == pytest.approx(price)
    k = p.next_k()
    assert k == k0
    p.observe(rec(k, 0))  # ... whose drafts are all rejected
    assert p.invested == pytest.approx(price) and p.catch_up_steps() == 0.0
    # the prefill is sunk: the ledger's allowance holds it, so one unlucky first round does not end speculation
    # (without it, that round's priced loss of ~price + 1 steps would exceed the 1-step allowance)
    assert p.ledger.priced_loss_s / p.round_cost_s[0] > p.probe_allowance + 1.0
    later = []
    for _ in range(10):
        later.append(p.next_k())
        p.observe(full(later[-1]) if later[-1] else rec(0, 0))
    assert all(k > 0 for k in later), later
    assert "draft prefill paid" in p.note()
    # no prefill to pay (a drafter that prefilled eagerly, or prompt lookup): the same first K at any budget
    p.start(budget=16)
    assert p.next_k() == k0 and p.invested == 0.0


def test_cost_measured_ledger_counts_the_prefill_at_its_price():
    import dataclasses

    p = CostPolicy.from_costs(LONG_PREFILL, max_k=8)
    t1, step = 0.46, 0.05
    p.start(prefill_tokens=500, budget=256)
    k = p.next_k()
    price = p.catch_up_steps()
    # the prefill ran 3x slower than priced; the round's verification as priced
    verify = p.curve.forward_s(k + 1)
    p.observe(dataclasses.replace(full(k), draft_s=3 * price * t1 + k * step, verify_s=verify))
    for _ in range(p.ledger.MEASURED_PLAIN_ROUNDS):
        p.observe(dataclasses.replace(rec(0, 0), verify_s=t1))
    # the measured ledger counts the prefill at its price, not at its measured seconds
    expected = price + p.round_steps(k) - (k + 1)
    assert p.net_loss() == pytest.approx(expected, abs=1e-9)
    assert p.net_loss() < 3 * price + p.round_steps(k) - (k + 1) - 1.0


def test_the_engine_tells_the_policy_about_the_draft_prefill(tiny_tokenizer, target, near_draft):
    seen = []

    class Spy(FixedK):
        def start(self, prefill_tokens=None, budget=None):
            seen.append((prefill_tokens, budget))

    prompt = tiny_tokenizer(PROMPTS[2]).input_ids
    speculative_generate(target, ModelDrafter(near_draft, V), prompt, 6, policy=Spy(2), vocab_size=V)
    speculative_generate(target, PromptLookupDrafter(), prompt, 6, policy=Spy(2), vocab_size=V)
    assert seen == [(len(prompt), 6), (None, 6)]


def test_cost_start_and_investment_validation():
    p = CostPolicy.from_costs(LONG_PREFILL)
    with pytest.raises(ValueError, match="prefill_tokens"):
        p.start(prefill_tokens=-1)
    with pytest.raises(ValueError, match="budget"):
        p.start(budget=-1)
    with pytest.raises(ValueError, match="invest_margin"):
        CostPolicy.from_costs(LONG_PREFILL, invest_margin=-1.0)
    with pytest.raises(ValueError, match="default_budget"):
        CostPolicy.from_costs(LONG_PREFILL, default_budget=0)


# ---------------------------------------------------------------------------------------------------
# on tiny real models: exactness for every policy, confidence stop, sampling rule
# ---------------------------------------------------------------------------------------------------





def _policies():
    return [
        make_policy("fixed", 4),
        make_policy("heuristic", 2, max_k=8),
        make_policy("confidence", 5, confidence_threshold=0.4),
        make_policy("confidence", 5, confidence_threshold=0.0),
        make_policy("cost", 8, costs=CHEAP_DRAFT),
        make_policy("cost", 8, costs=SLOW_DRAFT),
    ]


def test_every_policy_is_exact_under_greedy(tiny_tokenizer, target, near_draft):
    for text in PROMPTS[:2]:
        prompt = tiny_tokenizer(text).input_ids
        ref = autoregressive_generate(target, prompt, 32, vocab_size=V).token_ids
        for policy in _policies():
            for drafter in (ModelDrafter(near_draft, V), PromptLookupDrafter()):
                out = speculative_generate(target, drafter, prompt, 32, policy=policy, vocab_size=V)
                assert out.token_ids == ref, (policy.name, drafter.name, text)
                assert out.rounds and all(r.k_requested is not None for r in out.rounds)
                assert all(r.k <= r.k_requested for r in out.rounds)
                if policy.name == "cost":
                    assert all(r.alpha_estimate is not None and 0 <= r.alpha_estimate <= 1 for r in out.rounds)
                else:
                    assert all(r.alpha_estimate is None for r in out.rounds)


def test_cost_policy_on_a_bad_draft_goes_plain_probes_and_stays_exact(tiny_tokenizer, target, far_draft):
    prompt = tiny_tokenizer(PROMPTS[0]).input_ids
    ref = autoregressive_generate(target, prompt, 80, vocab_size=V).token_ids
    policy = make_policy("cost", 8, costs=CHEAP_DRAFT)
    # a clock that stands still: the rounds carry no measured time, so the ledger prices them on CHEAP_DRAFT
    # (the tiny models' real times are not that curve)
    out = speculative_generate(target, ModelDrafter(far_draft, V), prompt, 80, policy=policy, vocab_size=V,
                               clock=lambda: 0.0)
    assert out.token_ids == ref
    ks = [r.k_requested for r in out.rounds]
    assert ks[0] > 0 and 0 in ks
    first_plain = ks.index(0)
    assert any(k > 0 for k in ks[first_plain:])  # a probe after the back-off
    plain_run = list(itertools.takewhile(lambda r: r.k_requested == 0, out.rounds[first_plain:]))
    assert len({r.alpha_estimate for r in plain_run}) == 1  # no drift while decoding plainly


def test_confidence_threshold_controls_draft_length_greedy(tiny_tokenizer, target, near_draft):
    prompt = tiny_tokenizer(PROMPTS[2]).input_ids
    n = 30
    ref = autoregressive_generate(target, prompt, n, vocab_size=V).token_ids
    drafter = ModelDrafter(near_draft, V)
    never = make_policy("confidence", 4, confidence_threshold=1.01)
    out = speculative_generate(target, drafter, prompt, n, policy=never, vocab_size=V)
    assert out.token_ids == ref
    assert all(r.k == 1 and r.k_requested == 4 for r in out.rounds[:-1])
    # the same drafter object afterwards: nothing of the stop stays in it
    for policy in (make_policy("confidence", 4, confidence_threshold=0.0), make_policy("fixed", 4)):
        out = speculative_generate(target, drafter, prompt, n, policy=policy, vocab_size=V)
        assert out.token_ids == ref
        produced = 0
        for r in out.rounds:
            assert r.k == min(4, n - produced - 1), policy.name  # K, clamped only by the budget
            produced += r.num_emitted


class MemoBackend:
    """A `Backend` that returns a real model's logits memoised by prefix (the model runs once per distinct
    prefix), so a sampling test can run the real engine and drafter many times cheaply."""

    name = "memo"

    def __init__(self, inner):
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.max_length = inner.max_length
        self.device = inner.device
        self.seq: list[int] = []
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def cache_length(self) -> int:
        return len(self.seq)

    def _row(self, prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in self.memo:
            self.inner.reset()
            rows = self.inner.forward(list(prefix))
            for j in range(len(prefix)):
                self.memo.setdefault(prefix[: j + 1], rows[j].clone())
        return self.memo[prefix]

    def forward(self, tokens, *, logits=True, last=None):
        start = len(self.seq)
        self.seq.extend(tokens)
        if not logits:
            return None
        if not tokens:
            return torch.empty(0, self.vocab_size)
        if last is not None:
            start = max(start, len(self.seq) - last)
        return torch.stack([self._row(tuple(self.seq[: j + 1])) for j in range(start, len(self.seq))])

    def truncate(self, length: int) -> None:
        del self.seq[length:]

    def reset(self) -> None:
        self.seq = []

    def synchronize(self) -> None:
        pass


def test_confidence_stop_keeps_sampling_exact(tiny_tokenizer, target, near_draft):
    """Joint law of the first two sampled tokens with a confidence stop that fires after some first draft
    tokens and not others: chi-square against the target's own (warped) distribution."""
    sampling = SamplingParams(temperature=1.0, top_k=3)
    prompt = tiny_tokenizer(PROMPTS[0]).input_ids
    tgt, dft = MemoBackend(target), MemoBackend(near_draft)

    def dist(backend, ids):
        backend.reset()
        return warp(backend.forward(ids)[-1, :V], sampling)

    p1 = dist(tgt, prompt)
    joint = {}
    for t1 in torch.nonzero(p1).flatten().tolist():
        p2 = dist(tgt, prompt + [t1])
        for t2 in torch.nonzero(p2).flatten().tolist():
            joint[(t1, t2)] = float(p1[t1] * p2[t2])
    # a threshold between the draft's top probabilities after its possible first tokens
    q1 = dist(dft, prompt)
    tops = sorted(float(dist(dft, prompt + [d]).max()) for d in torch.nonzero(q1).flatten().tolist())
    assert tops[0] < tops[-1]
    drafter = ModelDrafter(dft, V)
    policy = ConfidenceK(2, (tops[0] + tops[-1]) / 2)

    n_runs = 1000
    counts: dict[tuple[int, int], int] = {}
    first_round_k = set()
    for seed in range(n_runs):
        out = speculative_generate(tgt, drafter, prompt, 3, policy=policy, sampling=sampling, vocab_size=V,
                                   seed=seed)
        assert out.rounds[0].k_requested == 2
        first_round_k.add(out.rounds[0].k)
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    assert first_round_k == {1, 2}  # the stop fired in some rounds and not in others
    assert set(counts) <= set(joint)
    chi2 = sum((counts.get(c, 0) - n_runs * p) ** 2 / (n_runs * p) for c, p in joint.items())
    assert len(joint) - 1 == 8
    assert chi2 < 26.12, chi2  # chi-square with 8 degrees of freedom at p = 0.001


def test_cost_explores_while_the_evidence_is_thin_and_stops_when_it_is_not():
    # CHEAP_DRAFT: K = 1 breaks even at alpha = 0.2587. Data-only counts (no prior, no decay) at alpha = 0.2:
    # on 5 trials one standard deviation above is 0.2 + sqrt(0.16 / 6) = 0.363 -> draft (K = 1);
    # on 100 trials it is 0.2 + sqrt(0.16 / 101) = 0.240 -> decode plainly (and probe after the back-off).
    p = CostPolicy.from_costs(CHEAP_DRAFT, prior_weight=0.0, decay=1.0)
    for accepted in (1, 0, 0, 0, 0):
        p.observe(rec(1, accepted))
    assert p.current_alpha() == pytest.approx(0.2)
    assert p.upper_alpha() == pytest.approx(0.2 + math.sqrt(0.16 / 6))
    assert p.best_k(0.2) == 0 and p.next_k() == 1
    for i in range(95):
        p.observe(rec(1, 1 if i % 5 == 0 else 0))
    assert p.current_alpha() == pytest.approx(0.2)
    assert p.upper_alpha() == pytest.approx(0.2 + math.sqrt(0.16 / 101))
    assert p.next_k() == 0
    assert p.alpha_estimate() == pytest.approx(0.2)
    with pytest.raises(ValueError):
        CostPolicy.from_costs(CHEAP_DRAFT, explore_z=-1.0)


def _iid_speedup(policy: CostPolicy, alpha: float, n_tokens: int, seed: int) -> float:
    """Plain-decoding time over the policy's time for `n_tokens` of i.i.d. acceptance at `alpha`, both on
    the policy's own cost model (each draft position accepted with probability alpha, independently)."""
    rng = random.Random(seed)
    policy.start()
    seconds, done = 0.0, 0
    while done < n_tokens:
        k = policy.next_k()
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        policy.observe(rec(k, accepted) if k else rec(0, 0))
        seconds += policy.round_cost_s[k]
        done += accepted + 1
    return done * policy.round_cost_s[0] / seconds


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5])
def test_cost_exploring_costs_little_below_break_even(alpha):
    # The default window is short (decay 0.8), so the exploration bound never closes: the policy drafts
    # K = 1 down to an estimate of ~0.24 where K = 1 breaks even at 0.411 (the study's costs). On i.i.d.
    # acceptance that must stay within 5% of plain decoding everywhere below break-even, and within 2% of
    # the same policy without exploring.
    explore = CostPolicy.from_costs(STUDY_COSTS)
    plain_minded = CostPolicy.from_costs(STUDY_COSTS, explore_z=0.0)
    assert explore.best_k(0.40) == 0 and explore.best_k(0.42) > 0  # K = 1's break-even is ~0.41
    with_z = sum(_iid_speedup(explore, alpha, 4000, s) for s in range(3)) / 3
    without = sum(_iid_speedup(plain_minded, alpha, 4000, s) for s in range(3)) / 3
    assert with_z >= 0.95, with_z
    assert with_z >= without - 0.02, (with_z, without)
