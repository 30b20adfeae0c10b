"""Published architectures with random weights (timing only) and their cost curves (`specdec.measure.archs`,
``specdec costs --arch``), and the GPU script that times them (`benchmarks/gpu_costs.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.measure import archs

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
    # study.replay_curve reads the same file as a cost curve for the traces
    from study import replay_curve as replay

    curve = replay.curve_from_costs(tmp_path / "gpu_costs.json", "float32", "gpt2", "gpt2")
    assert curve.target_step_s > 0 and curve.draft_step_s > 0 and curve.v(3) > 0
    # a dtype the file lacks, or a missing store: one line, exit 2
    assert replay.main(["--db", str(tmp_path / "none.db"), "--costs", str(tmp_path / "gpu_costs.json")]) == 2
    assert replay.main(["--db", str(tmp_path / "none.db"), "--target-ms", "1:10"]) == 2
