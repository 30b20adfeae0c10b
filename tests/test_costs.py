"""The one cost curve (`specdec.core.costs`): its rule, its readers, and that every caller gets the same answer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from specdec.bench import sweep as S
from specdec.bench.store import Store
from specdec.core import theory
from specdec.core.costs import CostCurve, curve_value
from specdec.policies.cost import CostPolicy

STUDY_DB = Path(__file__).resolve().parents[1] / "results" / "archive" / "study.db"
#: A staircase like the default pair's on 2 CPU cores (n = 1..9, seconds).
STAIRS = {1: 0.27, 2: 0.29, 3: 0.29, 4: 0.54, 5: 0.56, 6: 0.56, 7: 0.77, 8: 0.76, 9: 0.77}


def test_rule_inside_and_beyond_the_measured_range():
    curve = CostCurve(STAIRS, 0.1)
    for n, s in STAIRS.items():
        assert curve.forward_s(n) == s
    sparse = CostCurve({1: 1.0, 4: 2.5})
    assert sparse.forward_s(2) == pytest.approx(1.5) and sparse.forward_s(3) == pytest.approx(2.0)
    # beyond: the last value plus the least-squares slope of ALL points (numpy's fit as the oracle)
    slope = np.polyfit(list(STAIRS), list(STAIRS.values()), 1)[0]
    assert curve.forward_s(17) == pytest.approx(0.77 + 8 * slope)
    # the last segment alone (8 -> 9: +0.01 s) would have said almost nothing; a clamp exactly nothing
    assert curve.forward_s(17) - curve.forward_s(9) > 8 * (STAIRS[9] - STAIRS[8])
    # one point: proportional to n; a falling curve never extrapolates downwards
    assert CostCurve({1: 0.2}).forward_s(5) == pytest.approx(1.0)
    assert CostCurve({1: 1.0, 2: 0.9}).forward_s(7) == pytest.approx(0.9)


def test_derived_figures_and_validation():
    curve = CostCurve({"1": 0.5, "3": 0.75}, 0.1)  # JSON keys
    assert curve.target_step_s == 0.5 and curve.c == pytest.approx(0.2) and curve.max_n == 3
    assert curve.relative() == {1: 1.0, 3: 1.5} and curve.v(2) == pytest.approx(1.25)
    assert curve.round_s(2) == pytest.approx(2 * 0.1 + 0.75) and curve.round_s(2, draft=False) == 0.75
    assert curve.with_draft_step(0.0).round_s(2) == 0.75 and CostCurve({1: 1.0}).c is None
    for bad, match in (({}, "empty"), ({2: 1.0}, "n = 1"), ({1: 0.0}, "> 0"), ({0: 1.0, 1: 1.0}, ">= 1"),
                       ({1: float("nan")}, "> 0"), ({"x": 1.0}, "token counts")):
        with pytest.raises(ValueError, match=match):
            CostCurve(bad)
    with pytest.raises(ValueError, match="draft_step_s"):
        CostCurve({1: 1.0}, -0.1)
    with pytest.raises(ValueError, match="at least one token"):
        curve.forward_s(0)
    with pytest.raises(ValueError, match="specdec costs"):
        CostCurve.from_costs({"draft_step_s": 0.1})


def test_draft_catch_up_is_priced_on_the_draft_curve():
    """A round of K starts with the draft's catch-up forward over its pending tokens: priced on the measured
    draft curve (here the fp32 AMD shape: 2 tokens cost 1.8 steps), one step when no curve was measured."""
    t = {1: 0.3, 2: 0.6, 3: 0.9}
    curve = CostCurve(t, 0.1, {1: 0.1, 2: 0.18, 4: 0.3})
    assert curve.draft_forward(1) == 0.1 and curve.draft_forward(2) == pytest.approx(0.18)
    assert curve.draft_forward(3) == pytest.approx(0.24)  # interpolated
    assert curve.draft_round_s(0, 5) == 0.0  # a plain round feeds the draft nothing
    assert curve.draft_round_s(1) == pytest.approx(0.1) and curve.draft_round_s(2, 2) == pytest.approx(0.28)
    assert curve.round_s(2, pending=2) == pytest.approx(0.28 + 0.9) and curve.round_s(2) == pytest.approx(0.2 + 0.9)
    # no curve, or the step alone: every catch-up costs one step (the old model); prompt lookup drops it
    for flat in (CostCurve(t, 0.1), CostCurve(t, 0.1, {1: 0.1}), curve.with_draft_step(0.1)):
        assert flat.draft_forward_s is None and flat.draft_round_s(2, 9) == pytest.approx(0.2)
    # the step fills in n = 1 (and vice versa); a stored costs dict carries the curve
    assert CostCurve(t, 0.1, {2: 0.18}).draft_forward_s == {1: 0.1, 2: 0.18}
    assert CostCurve(t, None, {1: 0.1, 2: 0.18}).draft_step_s == 0.1
    back = CostCurve.from_costs({"target_forward_s": t, "draft_step_s": 0.1, "draft_forward_s": {"1": 0.1, "2": 0.18}})
    assert back.draft_round_s(1, 2) == pytest.approx(0.18)
    with pytest.raises(ValueError, match="pending"):
        curve.draft_round_s(1, 0)


def test_relative_is_the_one_v_rule():
    """v(n) = t(n) / t(1), sorted by n, v(1) exactly 1: what the analytical model and the report take."""
    out = CostCurve({4: 0.03, 1: 0.02, 2: 0.021}).relative()
    assert list(out) == [1, 2, 4]
    assert out[1] == 1.0 and out[2] == pytest.approx(1.05) and out[4] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="n = 1"):
        CostCurve({2: 0.02}).relative()
    with pytest.raises(ValueError, match="finite and > 0"):
        CostCurve({1: 0.02, 2: 0.0}).relative()


def test_from_calibration_takes_the_median_of_each_role_and_n():
    """Two blocks of one prompt give one curve: per role and n the median; the draft's n = 1 is its step."""
    rows = [{"role": "target", "n_tokens": n, "seconds": s} for n, s in ((1, 0.10), (2, 0.12), (1, 0.30), (2, 0.14))]
    rows += [{"role": "draft", "n_tokens": 1, "seconds": 0.02}, {"role": "draft", "n_tokens": 2, "seconds": 0.03},
             {"role": "other", "n_tokens": 1, "seconds": 9.0}]
    curve = CostCurve.from_calibration(rows)
    assert curve.target_forward_s == {1: pytest.approx(0.20), 2: pytest.approx(0.13)}
    assert curve.draft_step_s == 0.02 and curve.draft_forward_s == {1: 0.02, 2: 0.03}
    step_only = CostCurve.from_calibration([r for r in rows if not (r["role"] == "draft" and r["n_tokens"] == 2)])
    assert step_only.draft_step_s == 0.02 and step_only.draft_forward_s is None  # the step alone: no catch-up curve
    with pytest.raises(ValueError, match="single step"):
        CostCurve.from_calibration([{"role": "target", "n_tokens": 2, "seconds": 0.1}])


def test_theory_policy_and_estimate_agree_past_the_measured_range():
    """The report's model, the policy's K choice and the sweep's estimate read ONE curve: beyond the measured
    n (here 9) they used to clamp, extend the last slope and fit a line respectively."""
    curve = CostCurve(STAIRS, 0.1)
    rel = curve.relative()
    policy = CostPolicy(0.1, STAIRS, max_k=16)
    for k in range(17):
        assert theory.cost_at(rel, k + 1) == pytest.approx(curve.v(k + 1))
        assert policy.round_cost_s[k] == pytest.approx(curve.round_s(k))
        assert S.estimate_generation_s("draft", k or 1, "fixed", curve, 10, prompt_tokens=1, alpha=0.0) == \
            pytest.approx(curve.target_step_s * (1 + curve.c) + 10 * curve.round_s(k or 1))
    # the policy's predicted speedup over plain decoding at K is the model's refined speedup
    for k in (1, 12, 16):
        rates = policy.tokens_per_s(0.7)
        assert rates[k] / rates[0] == pytest.approx(theory.refined_speedup(0.7, k, curve.c, rel))


@pytest.mark.skipif(not STUDY_DB.is_file(), reason="the published study store is not in this checkout")
def test_published_store_and_json_cache_read_back(tmp_path):
    db = tmp_path / "study.db"
    shutil.copy(STUDY_DB, db)  # Store opens in WAL mode: never touch the published file
    with Store(db) as st:
        sid = st.sweeps()[0]["sweep_id"]
        costs = st.load_costs(sid, "transformers-eager")
    curve = CostCurve.from_costs(costs)
    assert curve.max_n == 17 and curve.draft_step_s == costs["draft_step_s"]
    assert curve.c == pytest.approx(costs["c"])
    assert curve.forward_s(5) == costs["target_forward_s"][5]
    # JSON round trip (the cost cache) gives the same curve
    again = CostCurve.from_costs(json.loads(json.dumps(costs)))
    assert again == curve and again.forward_s(20) == curve.forward_s(20)
    # The development machine's reference curve is the published one, rounded to 0.1 ms
    for n in range(1, 18):
        assert S.REFERENCE_COSTS.forward_s(n) == pytest.approx(curve.forward_s(n), abs=6e-5)
    assert curve_value(curve.relative(), 17) == pytest.approx(curve.v(17))


def test_calibration_block_times_the_drafts_catch_up(tiny_pair, near_draft_dir):
    """The calibration block times the draft's forwards of DRAFT_CALIBRATION_NS tokens scoring the last row only
    (what ModelDrafter's catch-up runs), the target's of 1..max_n scoring every row (verification), and the
    store keeps one draft row per n; a costs dict with them prices the catch-up."""
    from specdec.core.costs import DRAFT_CALIBRATION_NS
    from specdec.measure.timing import calibration_block
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(tiny_pair.target_dir), str(near_draft_dir), threads=1)
    calls = {"target": [], "draft": []}
    for role in ("target", "draft"):
        backend = getattr(pair, role).backend
        inner = backend.forward

        def spy(tokens, *, logits=True, last=None, _inner=inner, _log=calls[role]):
            _log.append((len(tokens), last))
            return _inner(tokens, logits=logits, last=last)

        backend.forward = spy
    block = calibration_block(pair, list(range(5, 25)), max_n=5, repeats=1)
    assert set(block["draft_forward_s"]) == set(DRAFT_CALIBRATION_NS)
    assert block["draft_step_s"] == block["draft_forward_s"][1]
    timed_draft = [c for c in calls["draft"] if c[0] <= max(DRAFT_CALIBRATION_NS) and c[0] != 20]
    assert {n for n, _ in timed_draft} == set(DRAFT_CALIBRATION_NS) and all(last == 1 for _, last in timed_draft)
    assert {(n, last) for n, last in calls["target"] if n <= 5} == {(n, None) for n in range(1, 6)}
    curve = CostCurve(block["target_forward_s"], block["draft_step_s"], block["draft_forward_s"])
    assert curve.draft_round_s(1, 2) == pytest.approx(block["draft_forward_s"][2])
    with Store(":memory:") as st:
        st.save_calibration("s", "c", "p", 1, block)
        rows = [r for r in st.calibration() if r["role"] == "draft"]
    assert sorted(r["n_tokens"] for r in rows) == sorted(DRAFT_CALIBRATION_NS)


def test_a_resumed_prompt_decides_with_the_median_of_its_stored_blocks():
    """On --resume the runner rebuilds each prompt's costs from its stored calibration blocks of this machine and
    configuration with the replay's rule (`CostCurve.from_calibration`, median per role and n), so the cost
    policy of a resumed prompt prices K as its replay does; other machines' and configurations' rows count not."""
    from types import SimpleNamespace

    from specdec.bench.probes import stored_prompt_costs

    def row(label, pid, mid, after, role, n, s):
        return {"config_label": label, "prompt_id": pid, "machine_id": mid, "after_run_id": after, "role": role,
                "n_tokens": n, "seconds": s}

    rows = [row("c", "p", "m", 1, "target", 1, 0.1), row("c", "p", "m", 1, "target", 2, 0.2),
            row("c", "p", "m", 9, "target", 1, 0.3), row("c", "p", "m", 9, "target", 2, 0.4),
            row("c", "p", "m", 1, "draft", 1, 0.05),
            row("c", "p", "other", 1, "target", 1, 9.0), row("x", "p", "m", 1, "target", 1, 9.0),
            row("c", "q", "m", 1, "draft", 1, 0.05)]  # q: no target step, no curve
    store = SimpleNamespace(machine_id="m", calibration=lambda sweep_id: rows)
    loaded = SimpleNamespace(label="c", prompt_costs={})
    stored_prompt_costs(loaded, SimpleNamespace(store=store, sweep_id="s"))
    assert set(loaded.prompt_costs) == {"p"}
    curve = loaded.prompt_costs["p"]
    assert curve.target_forward_s == {1: pytest.approx(0.2), 2: pytest.approx(0.3)} and curve.draft_step_s == 0.05


def test_interleaved_forward_times_alternate_backends_and_roll_back():
    """Each backend is prefilled once, warmed with single-token forwards, then timed width by width with the
    backends alternating inside each width, every timed forward rolled back to the prefilled length."""
    from specdec.measure.timing import interleaved_forward_times

    log: list[tuple] = []

    class Fake:
        def __init__(self, name):
            self.name, self.cache_length = name, 0

        def reset(self):
            self.cache_length = 0
            log.append((self.name, "reset"))

        def forward(self, tokens, *, logits=True):
            self.cache_length += len(tokens)
            log.append((self.name, "forward", len(tokens)))

        def truncate(self, length):
            assert length <= self.cache_length
            self.cache_length = length

    ticks = iter(range(1000))
    a, b = Fake("a"), Fake("b")
    times = interleaved_forward_times({"a": (a, list(range(6))), "b": (b, list(range(5)))}, [1, 3], repeats=2,
                                      warm_forwards=1, clock=lambda: float(next(ticks)))
    assert log[:6] == [("a", "reset"), ("a", "forward", 6), ("a", "forward", 1),
                       ("b", "reset"), ("b", "forward", 5), ("b", "forward", 1)]
    timed = [(name, n) for name, _, n in log[6:]]
    assert timed == [("a", 1), ("b", 1), ("a", 3), ("b", 3)] * 2
    assert (a.cache_length, b.cache_length) == (6, 5)
    assert times == {"a": {1: [1.0, 1.0], 3: [1.0, 1.0]}, "b": {1: [1.0, 1.0], 3: [1.0, 1.0]}}
    with pytest.raises(ValueError, match="needs at least 4 context ids"):
        interleaved_forward_times({"a": (a, [1, 2, 3])}, [4], repeats=1)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved_forward_times({"a": (a, [1, 2, 3])}, [1], repeats=0)


#: llama.cpp's target (Q4_K_M, 2 threads, repacking off) on a 2-vCPU Xeon, in target steps at every n up to 65:
#: its forward time rises in steps of 16 tokens.
XEON_LLAMACPP_V = {1: 1.0, 2: 1.42, 3: 1.8, 4: 2.16, 5: 2.5, 6: 2.76, 7: 3.09, 8: 3.22, 9: 3.32, 10: 3.31,
                   11: 3.34, 12: 3.43, 13: 3.33, 14: 3.34, 15: 3.39, 16: 3.35, 17: 4.54, 18: 4.6, 19: 4.61,
                   20: 4.69, 21: 4.76, 22: 4.72, 23: 4.68, 24: 4.77, 25: 4.82, 26: 4.81, 27: 4.78, 28: 4.73,
                   29: 4.82, 30: 4.95, 31: 4.97, 32: 4.89, 33: 6.02, 34: 6.02, 35: 6.13, 36: 6.23, 37: 6.27,
                   38: 6.12, 39: 6.19, 40: 6.19, 41: 6.23, 42: 6.28, 43: 6.34, 44: 6.27, 45: 6.35, 46: 6.43,
                   47: 6.4, 48: 6.36, 49: 7.34, 50: 7.41, 51: 7.55, 52: 7.72, 53: 7.75, 54: 7.65, 55: 7.5,
                   56: 7.99, 57: 7.96, 58: 8.02, 59: 8.13, 60: 8.19, 61: 8.17, 62: 8.28, 63: 8.22, 64: 7.97,
                   65: 9.24}


def test_a_staircase_timed_at_both_ends_of_its_steps_lets_the_cost_policy_draft_a_repeat_whole():
    from specdec.core.costs import measured_ns
    from specdec.measure.timing import quick_ns

    assert measured_ns(17) == list(range(1, 18)) and measured_ns(5) == [1, 2, 3, 4, 5]
    assert measured_ns(65) == [*range(1, 18), 24, 25, 32, 33, 40, 41, 48, 49, 56, 57, 64, 65]
    assert measured_ns(30)[-3:] == [24, 25, 30]
    with pytest.raises(ValueError):
        measured_ns(0)
    # the sparse curve (the sweep's, and generate's quick one) follows the dense one within 6% at every n
    for ns in (measured_ns(65), quick_ns(65)[0]):
        sampled = {n: XEON_LLAMACPP_V[n] for n in ns}
        assert max(abs(curve_value(sampled, n) / v - 1) for n, v in XEON_LLAMACPP_V.items()) < 0.06
    # a free drafter whose drafts are nearly always right: 48 tokens in one round (6.4 steps) beat three rounds
    # of 16 (3 x 3.35); measured to 17 only, the curve's slope prices 49 tokens at 9.5 steps and K stays 15
    wide = CostPolicy(0.0, {n: XEON_LLAMACPP_V[n] for n in measured_ns(65)}, max_k=64)
    narrow = CostPolicy(0.0, {n: XEON_LLAMACPP_V[n] for n in measured_ns(17)}, max_k=64)
    assert wide.best_k(0.98) == 47 and narrow.best_k(0.98) == 15
    assert wide.best_k(0.9) == narrow.best_k(0.9) == 15  # at 0.9 a long draft is not expected to survive
