"""Published architectures with random weights (timing only), their cost curves, and the original pairs'
predicted speedups (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec import archs, original_study, theory

TINY = archs.Arch("tiny-gpt2", {**archs.ARCHS["gpt2"].config, "n_embd": 64, "n_layer": 2, "n_head": 2,
                                "vocab_size": 1000, "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0},
                  0)


@pytest.mark.parametrize("name", list(archs.ARCHS))
def test_configs_build_the_published_parameter_counts(name):
    """Built on the meta device (no memory): the parameter count of the configuration equals the count the
    published checkpoint has (GPT-2: 124,439,808 / 354,823,168 / 774,030,080)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = archs.ARCHS[name]
    fields = dict(arch.config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))
    assert sum(p.numel() for p in model.parameters()) == arch.params
    if name.startswith("gpt2"):
        assert arch.params == {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080}[name]


def test_random_model_is_seeded_and_typed():
    a = archs.build_random_model(TINY, seed=3)
    b = archs.build_random_model(TINY, seed=3)
    c = archs.build_random_model(TINY, seed=4, dtype="bfloat16")
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
    assert a(ids).logits.shape == (1, 3, 1000)
    assert c.dtype == torch.bfloat16


def test_resolve_archs_errors_are_one_line():
    assert [a.name for a in archs.resolve_archs("gpt2, gpt2-large,gpt2")] == ["gpt2", "gpt2-large"]
    with pytest.raises(ValueError, match="unknown architecture 'gpt3'; known: gpt2"):
        archs.resolve_archs("gpt2,gpt3")
    with pytest.raises(ValueError, match="no architecture"):
        archs.resolve_archs(" , ")


def test_measure_arch_costs_derives_c_and_v_from_the_curves():
    other = archs.Arch("tiny-wide", {**TINY.config, "n_embd": 128}, 0)
    out = archs.measure_arch_costs([TINY, other], max_n=4, repeats=1, context_tokens=8,
                                   pairs=(("tiny-gpt2", "tiny-wide"), ("tiny-gpt2", "absent")))
    assert out["weights"] == archs.RANDOM_WEIGHTS_LABEL
    a, b = out["archs"]["tiny-gpt2"], out["archs"]["tiny-wide"]
    assert sorted(a["forward_s"]) == [1, 2, 3, 4] and a["verify_steps"][1] == 1.0
    assert a["verify_steps"][3] == pytest.approx(a["forward_s"][3] / a["forward_s"][1])
    (pair,) = out["pairs"]  # the pair with an untimed member is left out
    assert pair["c"] == pytest.approx(a["step_s"] / b["step_s"])
    assert pair["verify_steps"] is b["verify_steps"]
    with pytest.raises(ValueError, match="exceed its context"):
        archs.measure_arch_costs([TINY], max_n=4, repeats=1, context_tokens=126)


def _costs(c: float, v17: float) -> dict:
    v = {n: 1.0 + (v17 - 1.0) * (n - 1) / 16 for n in range(1, 18)}
    return {"weights": archs.RANDOM_WEIGHTS_LABEL, "dtype": "float32", "device": "cpu",
            "archs": {"gpt2": {"params": 1, "step_s": c, "verify_steps": v},
                      "gpt2-large": {"params": 1, "step_s": 1.0, "verify_steps": v}},
            "pairs": [{"draft": "gpt2", "target": "gpt2-large", "c": c, "verify_steps": v},
                      {"draft": "qwen2.5-coder-0.5b", "target": "qwen2.5-coder-1.5b", "c": c,
                       "verify_steps": v}]}


def test_original_pairs_prediction_by_hand():
    """alpha = 1 (repetitive), K = 16, c = 0.1, v(17) = 2: 17 tokens per round for 1.6 + 2 steps = 4.72x;
    natural (alpha 0.714) at K = 1: (1 + 0.714) / (0.1 + v(2) = 1.0625) = 1.474x."""
    rows = original_study.predict(_costs(0.1, 2.0))
    assert {r["pair"] for r in rows} == {"gpt2 -> gpt2-large"}  # the default pair is not an original pair
    rep16 = next(r for r in rows if r["prompt_type"] == "repetitive" and r["k"] == 16)
    assert rep16["predicted"] == pytest.approx(17 / 3.6) and rep16["best_k"] == 16
    assert rep16["original_best_k"] == 16 and rep16["original_speedup"] is None
    nat1 = next(r for r in rows if r["prompt_type"] == "natural" and r["k"] == 1)
    assert nat1["predicted"] == pytest.approx(1.714 / (0.1 + 1.0625))
    assert nat1["original_speedup"] == 0.950
    assert nat1["ideal"] == pytest.approx(float(theory.ideal_speedup(0.714, 1, 0.1)))
    with pytest.raises(ValueError, match="need 17"):
        original_study.predict({"pairs": [{"draft": "gpt2", "target": "gpt2-large", "c": 0.1,
                                           "verify_steps": {1: 1.0, 2: 1.1}}]})


def test_original_pairs_section_labels_what_is_measured_and_what_is_predicted():
    from specdec.report.document import Bullets, Table
    from specdec.report.original import original_pairs_section

    sec = original_pairs_section(_costs(0.5, 6.0))
    intro = sec.blocks[0]
    assert "random weights: timing only" in intro and "PREDICTS" in intro and "MEASURED" in intro
    tables = [b for b in sec.blocks if isinstance(b, Table)]
    pred = tables[-1]
    row = next(r for r in pred.rows if r[:2] == ["gpt2 -> gpt2-large", "natural"])
    assert row[2] == "0.714" and row[-1] == "0.950x"  # the original's published acceptance and speedup
    (bullets,) = [b for b in sec.blocks if isinstance(b, Bullets)]
    text = "\n".join(bullets.items)
    assert "the original reports 1.846x" in text
    # c = 0.5, v(n) rising linearly to v(17) = 6 (a CPU-like curve): natural's best is K = 1 at
    # 1.714 / (0.5 + 1.3125) = 0.946x, no win, as the original measured on its GPU
    assert "natural: the original measured 0.950x (no win); predicted best here 0.95x at K = 1 (below 1 here too)" in text
    assert "repetitive: best K 16 on the GPU, 16 predicted here" in text  # alpha = 1: the longest draft pays


def test_report_with_arch_costs_has_the_section(tmp_path):
    """`specdec report --arch-costs FILE` puts the section in both the HTML and the Markdown report."""
    from specdec.bench.store import Store
    from specdec.report.render import write_report

    db = tmp_path / "empty.db"
    Store(db).close()
    costs = tmp_path / "arch.json"
    costs.write_text(json.dumps(_costs(0.3, 3.0)))
    res = write_report(db, tmp_path / "rep", arch_costs=costs)
    for path in (res.html, res.markdown):
        text = path.read_text()
        assert "The original pairs (predicted from measured costs)" in text
        assert "gpt2 -&gt; gpt2-large" in text or "gpt2 -> gpt2-large" in text


@pytest.mark.slow
def test_gpu_script_runs_on_cpu(tmp_path):
    """The prepared GPU script, on CPU with one small architecture: exactness checks pass, costs written."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_costs.py"
    p = subprocess.run([sys.executable, str(script), "--device", "cpu", "--archs", "gpt2", "--max-n", "3",
                        "--repeats", "1", "--context-tokens", "8", "--e2e-target", "gpt2", "--e2e-draft", "gpt2",
                        "--e2e-tokens", "8", "--e2e-ks", "1,2", "--e2e-passes", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads((tmp_path / "gpu_costs.json").read_text())
    assert out["greedy_exactness"]["passed"] and out["sampling_exactness"]["passed"]
    assert out["sampling_exactness"]["tv_negative_control"] > 0.1
    assert out["costs"]["float32"]["archs"]["gpt2"]["verify_steps"]["3"] > 0
    assert "PASS" in p.stdout and "FAIL" not in p.stdout
    runs = {r["name"]: r for r in out["end_to_end"]["runs"]}
    assert set(runs) == {"target-only", "draft K=1", "draft K=2", "twin K=4", "ngram K=4"}
    # fp32: an identical copy of the target drafts what the target picks, and every output is the target's
    assert runs["twin K=4"]["accepted"] == runs["twin K=4"]["drafted"] > 0
    assert all(r["identical_to_target_only"] for r in out["end_to_end"]["runs"])
    assert all(r["predicted_decode_s"] > 0 and r["speedup"] > 0 for r in out["end_to_end"]["runs"])
    assert "A/A" in p.stdout
    # benchmarks/replay_curve.py reads the same file as a cost curve for the traces
    from conftest import load_benchmark

    replay = load_benchmark("replay_curve")
    curve = replay.curve_from_costs(tmp_path / "gpu_costs.json", "float32", "gpt2", "gpt2")
    assert curve.target_step_s > 0 and curve.draft_step_s > 0 and curve.v(3) > 0
    # a dtype the file lacks, or a missing store: one line, exit 2
    assert replay.main(["--db", str(tmp_path / "none.db"), "--costs", str(tmp_path / "gpu_costs.json")]) == 2
    assert replay.main(["--db", str(tmp_path / "none.db"), "--target-ms", "1:10"]) == 2


def test_replay_curve_prices_traces_with_another_machines_curve(tmp_path):
    """benchmarks/replay_curve.py: the same acceptance traces, priced with a curve where a draft step costs a
    target step (the H200's launch-bound regime), predict a loss for the draft model at every K even when it
    always agrees, while prompt lookup still pays on text it can copy; the overheads are zeroed, not the
    traces changed."""
    from conftest import load_benchmark

    from specdec.costs import CostCurve
    from specdec.report.predicted import PromptModel, trace_best_k, trace_grid
    from specdec.traces import AcceptanceTrace

    mod = load_benchmark("replay_curve")
    assert mod.parse_ms("1:20,17:24") == {1: 0.020, 17: 0.024}
    with pytest.raises(ValueError, match="n:ms"):
        mod.parse_ms("1:20,17")
    out = tuple([5, 6, 7, 8] * 8)  # 32 tokens the prompt already holds: prompt lookup copies them
    trace = AcceptanceTrace(tuple([5, 6, 7, 8] * 3), out, out, None, 32)  # the draft agrees everywhere
    cpu = CostCurve({1: 1.0, 2: 1.1, 17: 1.3}, 0.1)  # c = 0.1: the draft model pays
    m = PromptModel(("c", "p", ""), "repetitive", trace, cpu, 0.05, 0.05, 0.02, (3, 1), None)
    gpu = CostCurve({1: 0.020, 2: 0.021, 17: 0.024}, 0.021)  # c = 1.05
    (g,) = mod.repriced([m], gpu)
    assert (g.curve, g.o_base, g.o_spec, g.ngram_draft_s) == (gpu, 0.0, 0.0, 0.0) and g.trace is m.trace
    assert m.curve is cpu and m.o_spec == 0.05  # the original is untouched
    own, other = trace_grid([m]), trace_grid([g])
    draft = other[(other["method"] == "draft") & (other["policy"] == "fixed")]
    assert (draft["predicted"] < 1).all() and len(draft) > 3
    assert (own[(own["method"] == "draft") & (own["k"] == 4)]["predicted"] > 1.5).all()
    best = trace_best_k(other).set_index("method")
    assert best.loc["ngram", "predicted"] > 3 and best.loc["draft", "predicted"] < 1
    table = mod.best_k_table([g], "gpu")
    assert set(table["method"]) == {"draft", "ngram"} and (table["curve"] == "gpu").all()
