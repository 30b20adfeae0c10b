"""Reduced precision: the default dtype (bf16 where the CPU has native bf16 kernels), bf16 refused where it
has none, int8 weight-only models, and a quantized copy of the target drafting for it, exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import one_row

from specdec.drafters.model import ModelDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.runtimes import precision
from specdec.runtimes.loading import load_pair

V = 1000
AMD = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
OLD = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\n"


def test_cpu_flags_and_bf16_support():
    assert "avx512_bf16" in precision.cpu_flags(AMD)
    assert precision.missing_bf16_support(precision.cpu_flags(AMD), "x86_64") is None
    assert precision.missing_bf16_support({"amx_bf16", "amx_tile"}, "x86_64") is None  # Intel AMX
    assert precision.missing_bf16_support(precision.cpu_flags(OLD), "x86_64") == "avx512_bf16 and amx_bf16"
    assert precision.missing_bf16_support(precision.cpu_flags(ARM), "aarch64") is None
    assert "bf16" in precision.missing_bf16_support({"asimd"}, "aarch64")


def test_bf16_is_refused_in_one_line_on_a_cpu_without_bf16():
    with pytest.raises(ValueError, match="lacks avx512_bf16 and amx_bf16; use --dtype float32"):
        precision.check_dtype_supported("bfloat16", "cpu", flags=precision.cpu_flags(OLD), machine="x86_64")
    precision.check_dtype_supported("bfloat16", "cpu", flags=precision.cpu_flags(AMD), machine="x86_64")
    precision.check_dtype_supported("float32", "cpu", flags=set(), machine="x86_64")
    precision.check_dtype_supported("bfloat16", "cuda", flags=set(), machine="x86_64")


def test_default_dtype_is_bf16_only_where_the_cpu_has_native_bf16_kernels():
    dd = precision.default_dtype
    assert dd("cpu", flags=precision.cpu_flags(AMD), machine="x86_64") == "bfloat16"
    assert dd("cpu", flags={"amx_bf16"}, machine="AMD64") == "bfloat16"
    assert dd("cpu", flags=precision.cpu_flags(OLD), machine="x86_64") == "float32"
    assert dd("cpu", flags=precision.cpu_flags(ARM), machine="aarch64") == "bfloat16"
    assert dd("cpu", flags={"asimd"}, machine="arm64") == "float32"
    assert dd("cpu", flags={"bf16", "avx512_bf16"}, machine="riscv64") == "float32"  # unknown: no claim
    assert dd("cuda", flags=precision.cpu_flags(AMD), machine="x86_64") == "float32"  # CUDA unchanged
    assert dd("cuda:1", flags=set(), machine="x86_64") == "float32"
    kw = {"flags": precision.cpu_flags(AMD), "machine": "x86_64"}
    assert precision.resolve_dtype("auto", "cpu", **kw) == "bfloat16" == precision.resolve_dtype(None, **kw)
    assert precision.resolve_dtype("AUTO", "cuda", **kw) == "float32"
    assert precision.resolve_dtype("float32", "cpu", **kw) == "float32"  # asked for: kept
    # this machine: the one rule, and what load_pair resolves "auto" to
    expected = "bfloat16" if precision.missing_bf16_support(precision.cpu_flags()) is None else "float32"
    assert dd("cpu") in (expected, "float32") and precision.resolve_dtype("auto") == dd("cpu")


def test_load_pair_resolves_auto_and_records_the_dtype(tiny_pair):
    pair = load_pair(str(tiny_pair.target_dir), str(tiny_pair.draft_dir), dtype="auto")
    want = precision.default_dtype("cpu")
    assert pair.target.dtype == pair.draft.dtype == want
    assert str(next(pair.target.hf_model.parameters()).dtype) == f"torch.{want}"
    mixed = load_pair(str(tiny_pair.target_dir), str(tiny_pair.draft_dir), dtype="float32", draft_dtype="auto")
    assert (mixed.target.dtype, mixed.draft.dtype) == ("float32", want)
    with pytest.raises(ValueError, match="choose one of auto, float32"):
        load_pair(str(tiny_pair.target_dir), None, dtype="float8")


def test_int8_weight_only_quantizes_every_linear(tiny_pair):
    pytest.importorskip("torchao")
    pair = load_pair(str(tiny_pair.target_dir), None, quant="int8")
    model = pair.target.hf_model
    from transformers.pytorch_utils import Conv1D

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # GPT-2's Conv1D projections became linears too: 4 per block (2 blocks) + the output head
    assert not any(isinstance(m, Conv1D) for m in model.modules()) and len(linears) == 4 * 2 + 1
    assert {type(m.weight).__name__ for m in linears} == {"Int8Tensor"}
    full = load_pair(str(tiny_pair.target_dir), None)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        a, b = model(ids).logits, full.target.hf_model(ids).logits
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=0.05 * float(b.abs().max()))
    with pytest.raises(ValueError, match="unknown quantization 'int4'"):
        load_pair(str(tiny_pair.target_dir), None, quant="int4")
    with pytest.raises(ValueError, match="eager transformers backend only"):
        load_pair(str(tiny_pair.target_dir), None, quant="int8", compile=True)


def test_quantized_copy_of_the_target_drafts_for_it_exactly(tiny_pair, tiny_tokenizer):
    """The int8 copy of the target as its own draft: output equals full-precision target-only greedy, the
    draft is really quantized (its logits differ from the target's), and it agrees often (high acceptance)."""
    pytest.importorskip("torchao")
    spec = str(tiny_pair.target_dir)
    pair = load_pair(spec, spec, draft_quant="int8")
    assert pair.target.hf_model is not pair.draft.hf_model
    prompt = tiny_tokenizer("hello world the quick brown fox jumps over").input_ids
    with torch.no_grad():
        t = pair.target.hf_model(torch.tensor([prompt])).logits
        d = pair.draft.hf_model(torch.tensor([prompt])).logits
    assert not torch.equal(t, d) and (t - d).abs().max() < 0.5 * t.abs().max()
    ref = autoregressive_generate(pair.target.backend, prompt, 32, vocab_size=V).token_ids
    for k in (1, 4, 8):
        out = speculative_generate(pair.target.backend, ModelDrafter(pair.draft.backend, V), prompt, 32, k=k,
                                   vocab_size=V)
        assert out.token_ids == ref
        assert out.acceptance_rate > 0.5, out.acceptance_rate


def test_cli_generate_with_a_quantized_draft(tiny_pair):
    pytest.importorskip("torchao")
    spec = str(tiny_pair.target_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "specdec", "generate", "--target", spec, "--draft", spec,
                        "--draft-quant", "int8", "--prompt", "hello world", "--k", "4", "--max-new-tokens", "12",
                        "--baseline", "--json", "--threads", "1"], capture_output=True, text=True, env=env,
                       timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout.strip().splitlines()[-1]))
    assert out["identical_to_baseline"] and out["num_drafted"] > 0
    p = subprocess.run([sys.executable, "-m", "specdec", "generate", "--target", spec, "--draft", spec,
                        "--quant", "int8", "--compile", "--prompt", "x"], capture_output=True, text=True,
                       env=env, timeout=300, check=False)
    assert p.returncode == 2 and "eager transformers backend only" in p.stderr and "Traceback" not in p.stderr
