"""The one cost measurement and its cache (`specdec.measure.timing`, `specdec.measure.cost_cache`): which
shapes each plan times, that a setup is measured once and reused while it covers what is asked, and what
keys a measurement."""

from __future__ import annotations

import pytest

from specdec.core.costs import CostCurve
from specdec.measure.cost_cache import cached_costs, model_fingerprint
from specdec.measure.timing import QUICK_DRAFT_NS, batch_ns, measure_forwards, quick_ns, sweep_ns


@pytest.fixture(scope="module")
def fp32_pair(tiny_pair, near_draft_dir):
    from specdec.runtimes.loading import load_pair

    return load_pair(str(tiny_pair.target_dir), str(near_draft_dir), dtype="float32", threads=1)


def test_the_plans_shapes():
    assert quick_ns(17) == ([1, 2, 3, 5, 9, 16, 17], list(QUICK_DRAFT_NS))
    # the cost policy's default K (64): both ends of each step of the kernels' staircase past 17
    assert quick_ns(65)[0] == [1, 2, 3, 5, 9, 16, 17, 32, 33, 48, 49, 64, 65]
    assert quick_ns(6)[0] == [1, 2, 3, 5, 6] and quick_ns(1)[0] == [1]
    with pytest.raises(ValueError):
        quick_ns(0)
    t, d = sweep_ns(17)
    assert t == list(range(1, 18)) and d[:16] == list(range(1, 17)) and d[-1] == 64
    assert batch_ns(3, 51) == ([1, 3, 6, 9, 15, 27, 51], [1, 3])


def test_one_measurement_times_the_plans_shapes(fp32_pair):
    ticks = iter(range(10**6))
    costs = measure_forwards(fp32_pair, *quick_ns(9), repeats=2, context_tokens=32,
                             clock=lambda: next(ticks) * 0.001)
    assert sorted(costs["target_forward_s"]) == [1, 2, 3, 5, 9] and costs["ns"] == [1, 2, 3, 5, 9]
    assert costs["draft_step_s"] > 0 and costs["repeats"] == 2 and costs["draft_repeats"] == 6
    # the draft's forwards up to a prefill's size, which the cost policy prices the deferred prefill on
    assert sorted(costs["draft_forward_s"]) == list(QUICK_DRAFT_NS)
    assert costs["draft_forward_s"][1] == costs["draft_step_s"]
    assert CostCurve.from_costs(costs).draft_forward_s is not None  # what the cost policy reads
    with pytest.raises(ValueError, match="too short"):
        measure_forwards(fp32_pair, [10**6])


def test_a_setup_is_measured_once_per_plan_and_reused_while_it_covers_the_ask(fp32_pair, tmp_path):
    measured = []

    def measure(pair, target_ns, draft_ns):
        measured.append(max(target_ns))
        return {"draft_step_s": 0.1, "target_step_s": 0.3, "target_forward_s": {n: 0.3 * n for n in target_ns}}

    key = {"target": model_fingerprint(str(fp32_pair.target.spec)), "draft": None, "dtype": "float32", "threads": 1}
    costs, note = cached_costs(fp32_pair, key, max_n=5, cache=tmp_path, measure=measure)
    assert note.startswith("costs measured in") and measured == [5] and costs["plan"] == "quick"
    costs, note = cached_costs(fp32_pair, key, max_n=5, cache=tmp_path, measure=measure)
    assert note.startswith("costs from") and "--remeasure-costs" in note and measured == [5]
    assert costs["target_forward_s"]["5"] == pytest.approx(1.5)  # JSON round trip: string keys
    cached_costs(fp32_pair, key, max_n=3, cache=tmp_path, measure=measure)  # covered by the stored n <= 5
    cached_costs(fp32_pair, key, max_n=9, cache=tmp_path, measure=measure)  # more than stored
    cached_costs(fp32_pair, key, max_n=5, cache=tmp_path, measure=measure, refresh=True)
    cached_costs(fp32_pair, {**key, "dtype": "bfloat16"}, max_n=5, cache=tmp_path, measure=measure)
    cached_costs(fp32_pair, key, plan="batch", rows=2, max_n=6, cache=tmp_path, measure=measure)
    cached_costs(fp32_pair, key, plan="batch", rows=3, max_n=6, cache=tmp_path, measure=measure)
    assert measured == [5, 9, 5, 5, 6, 6]
    assert len(list((tmp_path / "costs").glob("quick-*.json"))) == 2
    assert len(list((tmp_path / "costs").glob("batch-*.json"))) == 2
    for f in (tmp_path / "costs").glob("*.json"):
        f.write_text("{not json")
    cached_costs(fp32_pair, key, max_n=3, cache=tmp_path, measure=measure)  # unreadable: measured again
    assert len(measured) == 7
    with pytest.raises(ValueError, match="unknown cost plan"):
        cached_costs(fp32_pair, key, plan="guess", max_n=3, cache=tmp_path, measure=measure)


def test_a_model_file_that_changes_is_another_setup(fp32_pair):
    fp = model_fingerprint(str(fp32_pair.target.spec))
    assert fp and all(len(entry) == 3 for entry in fp) and model_fingerprint(None) is None
    from specdec.models import resolve

    sha = resolve("qwen2.5-coder:target").chunks.sha256
    assert model_fingerprint("qwen2.5-coder:target") == {"sha256": sha}  # the GGUF's content, not its path


@pytest.mark.parametrize("damage", [
    {"c": float("nan")}, {"target_step_s": -1.0}, {"target_forward_s": "x"},
    {"target_forward_s": {"1": "x", "2": "x", "3": "x"}}, {"verify_steps": {"1": None}},
])
def test_a_cached_measurement_with_damaged_figures_is_measured_again(fp32_pair, tmp_path, damage):
    """A cache file whose numbers were damaged (NaN, negative, strings) is never used: measured again and
    rewritten, instead of steering the cost policy or failing with a message that names no file."""
    import json

    measured = []

    def measure(pair, target_ns, draft_ns):
        measured.append(max(target_ns))
        return {"draft_step_s": 0.1, "target_step_s": 0.3, "c": 1 / 3,
                "target_forward_s": {n: 0.3 * n for n in target_ns}, "verify_steps": {n: n for n in target_ns}}

    key = {"target": model_fingerprint(str(fp32_pair.target.spec)), "draft": None, "dtype": "float32", "threads": 1}
    cached_costs(fp32_pair, key, max_n=3, cache=tmp_path, measure=measure)
    (path,) = (tmp_path / "costs").glob("*.json")
    stored = json.loads(path.read_text())
    stored["costs"].update(damage)
    path.write_text(json.dumps(stored))
    costs, note = cached_costs(fp32_pair, key, max_n=3, cache=tmp_path, measure=measure)
    assert note.startswith("costs measured in") and measured == [3, 3]
    assert costs["target_step_s"] == 0.3
    assert json.loads(path.read_text())["costs"]["target_step_s"] == 0.3  # the damaged file was replaced
    _, note = cached_costs(fp32_pair, key, max_n=3, cache=tmp_path, measure=measure)
    assert note.startswith("costs from") and measured == [3, 3]


def test_a_measurement_too_noisy_to_trust_is_used_once_and_never_cached(fp32_pair, tmp_path):
    """A busy machine's curve (t(1) 1.66 s with a spread of 1.48 s, beside t(5) 0.41 s, as seen when a test run
    shared the cores) prices this run only; the next run measures again, and a quiet measurement is cached."""
    quiet = {1: (0.10, 0.004), 5: (0.30, 0.01)}
    busy = {1: (1.66, 1.48), 5: (0.41, 0.02)}
    curves = [busy, quiet]

    def measure(pair, target_ns, draft_ns):
        c = curves.pop(0)
        return {"draft_step_s": 0.05, "target_step_s": c[1][0], "target_forward_s": {n: c[n][0] for n in (1, 5)},
                "target_forward_spread_s": {n: c[n][1] for n in (1, 5)}}

    key = {"target": model_fingerprint(str(fp32_pair.target.spec)), "draft": None, "dtype": "float32", "threads": 1}
    costs, note = cached_costs(fp32_pair, key, max_n=5, cache=tmp_path, measure=measure)
    assert costs["target_forward_s"][1] == 1.66 and "not cached" in note and "machine is busy" in note
    assert not list((tmp_path / "costs").glob("*.json"))
    costs, note = cached_costs(fp32_pair, key, max_n=5, cache=tmp_path, measure=measure)  # measured again
    assert costs["target_forward_s"][1] == 0.10 and "cached in" in note and not curves
    assert cached_costs(fp32_pair, key, max_n=5, cache=tmp_path, measure=measure)[1].startswith("costs from")
