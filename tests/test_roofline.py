"""Issue 19, part B: the roofline per run (`specdec.measure.roofline`, `specdec costs`, benchmarks/roofline.py).

Weight bytes are checked against an independent count: the tensor byte ranges in the safetensors file on
disk (its JSON header), for fp32 and bf16 tiny checkpoints; int8 against the bytes torchao's layout must
hold. Bandwidth figures are only checked for being positive and finite (they are the machine's)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_model, load_backend, load_benchmark

from specdec.measure.roofline import achieved_gbps, bandwidth_share, measure_bandwidth, roofline, weight_bytes


def file_tensor_bytes(checkpoint: Path) -> int:
    """Sum of every tensor's byte range in ``model.safetensors`` (read from the file's JSON header)."""
    with open(checkpoint / "model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(end - start for key, v in header.items() if key != "__metadata__" for start, end in [v["data_offsets"]])


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    path = tmp_path_factory.mktemp("bf16") / "target"
    build_tiny_model(0).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tied") / "target"
    GPT2LMHeadModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


def load(path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True).eval()


def test_weight_bytes_equal_the_checkpoint_file_fp32_bf16_and_tied(tiny_pair, bf16_dir, tied_dir):
    from specdec.runtimes.loading import load_pair

    fp32 = file_tensor_bytes(tiny_pair.target_dir)
    assert weight_bytes(load_backend(tiny_pair.target_dir)) == fp32  # a backend
    assert weight_bytes(load(tiny_pair.target_dir, torch.float32)) == fp32  # a module
    assert weight_bytes(load_pair(str(tiny_pair.target_dir), None).target) == fp32  # a LoadedModel
    bf16 = file_tensor_bytes(bf16_dir)
    assert bf16 * 2 == fp32
    assert weight_bytes(load(bf16_dir, torch.bfloat16)) == bf16
    # the fp32 checkpoint loaded as bf16: the stored dtype in memory counts, not the file's
    assert weight_bytes(load(tiny_pair.target_dir, torch.bfloat16)) == bf16
    # tied input/output embeddings are one tensor, counted once (the file holds it once too)
    tied = load(tied_dir, torch.float32)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert weight_bytes(tied) == file_tensor_bytes(tied_dir)


def test_weight_bytes_of_int8_weights_count_the_int8_data_scales_and_zero_points(tiny_pair):
    pytest.importorskip("torchao")
    from specdec.runtimes.precision import apply_quant

    model = apply_quant(load(tiny_pair.target_dir, torch.float32), "int8")
    expected = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            out_f, in_f = module.weight.shape
            expected += out_f * in_f * 1 + out_f * 4 + out_f * 1  # int8 data, fp32 scale, int8 zero point
            expected += 0 if module.bias is None else module.bias.numel() * 4
    expected += sum(p.numel() * 4 for name, p in model.named_parameters()
                    if not any(name.startswith(n + ".") for n, m in model.named_modules()
                               if isinstance(m, torch.nn.Linear) and n))
    assert weight_bytes(model) == expected
    assert weight_bytes(model) < file_tensor_bytes(tiny_pair.target_dir) / 2


def test_weight_bytes_of_prepacked_linears_and_gguf_files(tiny_pair, tmp_path):
    from specdec.runtimes.compiled import CompiledHFBackend

    fp32 = file_tensor_bytes(tiny_pair.target_dir)
    if torch.backends.mkldnn.is_available():
        for mode in ("onednn", "hybrid"):  # packed at construction (no compilation needed here)
            backend = CompiledHFBackend(load(tiny_pair.target_dir, torch.float32), mode=mode, buckets=(1,))
            assert weight_bytes(backend) == fp32, mode
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(1234))
    assert weight_bytes(gguf) == weight_bytes(str(gguf)) == 1238

    class FakeLlama:
        model_path = str(gguf)

    assert weight_bytes(FakeLlama()) == 1238
    with pytest.raises(TypeError, match=".gguf path"):
        weight_bytes(tmp_path / "model.safetensors")
    with pytest.raises(TypeError, match="cannot tell the weight bytes"):
        weight_bytes(object())


def test_measure_bandwidth_is_positive_and_restores_threads():
    before = torch.get_num_threads()
    bw = measure_bandwidth(size_mib=2, repeats=3, threads=1)
    assert torch.get_num_threads() == before and bw["threads"] == 1
    assert bw["bytes_per_copy"] == 2 * 2 * 2**20  # read + write
    assert math.isfinite(bw["gbps"]) and bw["gbps"] > 0 and bw["gbps"] >= bw["median_gbps"] > 0
    assert bw["gbps"] == pytest.approx(bw["bytes_per_copy"] / bw["best_s"] / 1e9)
    for bad in ({"size_mib": 0}, {"size_mib": float("nan")}, {"repeats": 0}, {"threads": 0}):
        with pytest.raises(ValueError):
            measure_bandwidth(**{"size_mib": 1, **bad})


def test_achieved_share_and_roofline_arithmetic():
    assert achieved_gbps(6_000_000_000, 0.3) == pytest.approx(20.0)
    assert bandwidth_share(20.0, 40.0) == pytest.approx(0.5)
    r = roofline(3_000_000_000, 0.12, {"gbps": 30.0})
    assert r["achieved_gbps"] == pytest.approx(25.0) and r["bandwidth_share"] == pytest.approx(25 / 30)
    assert r["bound_step_s"] == pytest.approx(0.1) and roofline(3e9, 0.12, 30.0) == r
    for args in ((-1, 0.1), (1, 0.0), (1, float("inf"))):
        with pytest.raises(ValueError):
            achieved_gbps(*args)
    with pytest.raises(ValueError):
        bandwidth_share(1.0, 0.0)


def test_costs_command_reports_the_roofline(tiny_pair, near_draft_dir):
    from test_cli import run

    p = run("costs", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--dtype", "float32", "--max-n", "2",
            "--repeats", "1", "--bandwidth-mib", "4", "--threads", "1", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    roof = out["roofline"]
    assert roof["weight_bytes"] == file_tensor_bytes(tiny_pair.target_dir)
    assert roof["step_s"] == out["target_step_s"]
    assert roof["achieved_gbps"] == pytest.approx(roof["weight_bytes"] / out["target_step_s"] / 1e9)
    assert roof["bandwidth_gbps"] == out["bandwidth"]["gbps"] > 0
    assert roof["bandwidth_share"] == pytest.approx(roof["achieved_gbps"] / roof["bandwidth_gbps"])
    p = run("costs", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--dtype", "float32", "--max-n", "2",
            "--repeats", "1", "--bandwidth-mib", "4", "--threads", "1")
    assert p.returncode == 0, p.stderr
    assert "roofline: target weights 0.9 MB read per step" in p.stdout


def test_benchmark_script_prints_consistent_figures(tiny_pair, bf16_dir, capsys):
    bench = load_benchmark("roofline")
    from specdec.runtimes.precision import cpu_flags, missing_bf16_support

    dtypes = "float32" if missing_bf16_support(cpu_flags()) else "float32,bfloat16"
    rows = bench.main(["--models", f"{tiny_pair.target_dir},{bf16_dir}", "--dtypes", dtypes, "--threads", "1",
                       "--repeats", "2", "--bandwidth-mib", "4", "--json"])
    printed = capsys.readouterr().out
    n_dtypes = len(dtypes.split(","))
    assert len(rows) == 2 * n_dtypes
    fp32 = file_tensor_bytes(tiny_pair.target_dir)
    for row in rows:
        assert row["weight_bytes"] == (fp32 if row["dtype"] == "float32" else fp32 // 2)
        assert row["achieved_gbps"] == pytest.approx(row["weight_bytes"] / row["step_s"] / 1e9)
    # the printed table: GB/s = (MB/step * 1e6) / (ms/step / 1e3) / 1e9, to the printed precision
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model"))
    table = lines[header + 1 : header + 1 + len(rows)]
    machine = float(lines[0].split("machine bandwidth ")[1].split()[0])
    for line, row in zip(table, rows, strict=True):
        mb, ms, gbps, bw, share = (float(x) for x in line.split()[-5:])
        assert mb == pytest.approx(row["weight_bytes"] / 1e6, abs=0.05)
        assert gbps == pytest.approx(row["weight_bytes"] / (row["step_s"]) / 1e9, abs=0.005)
        assert gbps == pytest.approx(mb * 1e6 / (ms / 1e3) / 1e9, rel=0.15, abs=0.01)  # rounding of 0.x MB
        assert bw == pytest.approx(machine, abs=0.01) and share == pytest.approx(gbps / bw, abs=0.006)
    assert json.loads(lines[-1])["rows"] == json.loads(json.dumps(rows))


def test_shape_roofline_finds_the_peak_and_the_attainable_curve():
    from specdec.measure.roofline import format_shape_roofline, shape_roofline

    flops = 3e9  # per token
    # 30 ms a step up to the knee; n = 8 at 120 ms is the best throughput (8 x 3e9 / 0.12 s = 200 GOP/s)
    step = {1: 0.030, 2: 0.060, 4: 0.110, 8: 0.120, 16: 0.300}
    r = shape_roofline(step, flops, weight_bytes=1_000_000_000, bandwidth_gbps=50.0)
    assert r["peak_n"] == 8 and r["peak_gops"] == pytest.approx(200.0)
    assert r["n_knee"] == pytest.approx(200e9 * 0.030 / 3e9)  # = 2 tokens for one step's time
    by_n = {row["n"]: row for row in r["rows"]}
    assert [row["n"] for row in r["rows"]] == [1, 2, 4, 8, 16]
    assert by_n[2]["v"] == pytest.approx(2.0) and by_n[2]["gops"] == pytest.approx(100.0)
    assert by_n[1]["v_roof"] == 1.0 and by_n[2]["v_roof"] == pytest.approx(1.0)
    assert by_n[16]["v_roof"] == pytest.approx(16 * 3e9 / (200e9 * 0.030))  # 8.0: compute-bound
    assert by_n[8]["v_roof"] == pytest.approx(by_n[8]["v"])  # the peak width sits on its own roof
    assert all(row["v"] >= row["v_roof"] - 1e-12 for row in r["rows"])  # nothing beats the best kernel
    assert by_n[1]["gbps"] == pytest.approx(1e9 / 0.030 / 1e9) and r["bound_step_s"] == pytest.approx(0.02)
    text = format_shape_roofline("q4", r)
    assert "peak 200 GOP/s at n = 8" in text and len(text.splitlines()) == 2 + len(step)


@pytest.mark.parametrize("step, flops, match", [
    ({2: 0.1}, 1e9, "n = 1"),
    ({1: 0.1, 0: 0.1}, 1e9, "integers >= 1"),
    ({1: 0.1, 2: float("nan")}, 1e9, "finite time"),
    ({1: 0.1}, 0, "positive number"),
])
def test_shape_roofline_refuses_bad_input(step, flops, match):
    from specdec.measure.roofline import shape_roofline

    with pytest.raises(ValueError, match=match):
        shape_roofline(step, flops)
