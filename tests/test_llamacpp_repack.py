"""llama.cpp weight repacking: the rule that decides it per CPU, what a loaded backend records, and the
per-type weight bytes read from a GGUF header (recorded beside a cost curve, since they decide the kernels)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import specdec
from specdec.runtimes.gguf import gguf_weight_types
from specdec.runtimes.llamacpp import AMX_FLAGS, GGUFNotFoundError, repack_default

ZEN4 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "fma"}


def test_repack_is_on_without_amx():
    on, note = repack_default(ZEN4)
    assert on is True
    assert "on" in note


@pytest.mark.parametrize("amx", sorted(AMX_FLAGS))
def test_repack_is_off_where_the_cpu_reports_amx(amx):
    on, note = repack_default(ZEN4 | {amx})
    assert on is False
    assert amx in note and "\n" not in note


def test_weight_types_of_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(GGUFNotFoundError, match="not found"):
        gguf_weight_types(tmp_path / "absent.gguf")


def test_weight_types_of_a_damaged_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ValueError, match="bad.gguf: not a readable GGUF"):
        gguf_weight_types(bad)


def test_weight_types_sum_to_the_tensor_data(smollm2_gguf):
    types = gguf_weight_types(smollm2_gguf)
    assert next(iter(types)) == "Q4_1"  # the file's bulk type comes first (largest share)
    size = smollm2_gguf.stat().st_size
    assert 0.8 * size < sum(types.values()) <= size


@pytest.mark.slow
def test_a_loaded_backend_records_whether_it_repacked(smollm2_gguf):
    pytest.importorskip("llama_cpp")
    from specdec.runtimes.llamacpp import load_llamacpp

    expected, _ = repack_default()
    with load_llamacpp(smollm2_gguf, n_ctx=128, n_threads=1) as be:
        assert be.extra_buffers is expected
        assert be.extra_buffers_note == repack_default()[1]
    with load_llamacpp(smollm2_gguf, n_ctx=128, n_threads=1, extra_buffers=False) as be:
        assert be.extra_buffers is False and "asked for" in be.extra_buffers_note


# ggml's AMX buffer type: `use_extra_bufts` puts quantized weights there where ggml offers it, and its matmul
# over 2+ tokens dies in ldtilecfg (an invalid tile configuration; specdec.runtimes.llamacpp's docstring). The
# children below run the decode in their own process, so a regression fails one test instead of killing the run.

_PYTHONPATH = os.pathsep.join([str(Path(specdec.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])

_DECODE = """
import sys
import specdec.runtimes.llamacpp as L
if sys.argv[2] == "bypass":  # what the backend did before the guard: honour the request whatever ggml offers
    L.amx_buffer_type_active = lambda flags=None: False
be = L.load_llamacpp(sys.argv[1], n_ctx=256, n_threads=1, extra_buffers=True)
print("repack", be.extra_buffers, "|", be.extra_buffers_note, flush=True)
ids = be.tokenize("def fibonacci(n):\\n")
be.forward(ids[:1])
print("1-token decode ok", flush=True)
out = be.forward(ids[1:])  # one llama_decode of len(ids) - 1 >= 2 tokens: the AMX tile path
print("batch decode ok", tuple(out.shape), flush=True)
"""


def _decode_in_child(gguf, mode):
    env = dict(os.environ, PYTHONPATH=_PYTHONPATH, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", _DECODE, str(gguf), mode], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_ggml_names_its_extra_buffer_types():
    pytest.importorskip("llama_cpp")
    from specdec.runtimes.llamacpp import amx_buffer_type_active, ggml_extra_buffer_types
    from specdec.runtimes.precision import cpu_flags

    types = ggml_extra_buffer_types()
    assert isinstance(types, tuple) and all(isinstance(t, str) and t for t in types)
    assert amx_buffer_type_active() is ("AMX" in types)
    if "AMX" in types:
        assert "amx_int8" in cpu_flags()  # ggml offers it only on a CPU with AMX


def test_amx_flags_decide_where_ggml_cannot_be_asked(monkeypatch):
    import specdec.runtimes.llamacpp as L

    monkeypatch.setattr(L, "ggml_extra_buffer_types", lambda: None)
    assert L.amx_buffer_type_active(ZEN4 | {"amx_int8"}) is True
    assert L.amx_buffer_type_active(ZEN4) is False
    monkeypatch.setattr(L, "ggml_extra_buffer_types", lambda: ("CPU_REPACK",))
    assert L.amx_buffer_type_active(ZEN4 | {"amx_int8"}) is False  # a build without AMX kernels: repack is safe


@pytest.mark.slow
def test_repacking_asked_for_stays_off_where_ggml_offers_the_amx_buffer_type(smollm2_gguf, monkeypatch):
    pytest.importorskip("llama_cpp")
    import specdec.runtimes.llamacpp as L

    monkeypatch.setattr(L, "ggml_extra_buffer_types", lambda: ("AMX", "CPU_REPACK"))
    with L.load_llamacpp(smollm2_gguf, n_ctx=128, n_threads=1, extra_buffers=True) as be:
        assert be.extra_buffers is False and be.extra_buffers_note == L.AMX_BUFFER_NOTE
        ids = be.tokenize("The capital of France")
        assert len(ids) >= 2 and be.forward(ids).shape == (len(ids), be.vocab_size)


@pytest.mark.slow
def test_a_batch_decode_with_repacking_asked_for_runs_on_this_machine(smollm2_gguf):
    """The condition that crashed (repacking asked for, a decode of several tokens), in a child process."""
    pytest.importorskip("llama_cpp")
    from specdec.runtimes.llamacpp import AMX_BUFFER_NOTE, amx_buffer_type_active

    p = _decode_in_child(smollm2_gguf, "guarded")
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr[-2000:])
    assert "batch decode ok" in p.stdout
    amx = amx_buffer_type_active()
    assert f"repack {not amx} |" in p.stdout
    assert (AMX_BUFFER_NOTE in p.stdout) is amx


@pytest.mark.slow
def test_the_amx_buffer_type_still_crashes_on_a_batch_decode(smollm2_gguf):
    """Why the guard exists, checked where ggml offers the AMX buffer type: with the guard bypassed, a 1-token
    decode works and the first decode of several tokens kills the process. If this starts failing, the
    llama.cpp in use no longer crashes there and `LlamaCppBackend` may let repacking run again."""
    pytest.importorskip("llama_cpp")
    from specdec.runtimes.llamacpp import amx_buffer_type_active

    if not amx_buffer_type_active():
        pytest.skip("ggml offers no AMX buffer type here (no AMX, or a llama.cpp built without AMX kernels)")
    p = _decode_in_child(smollm2_gguf, "bypass")
    assert "repack True" in p.stdout and "1-token decode ok" in p.stdout, (p.stdout, p.stderr[-2000:])
    assert p.returncode < 0 and "batch decode ok" not in p.stdout, (
        f"llama.cpp's AMX batched matmul no longer crashes (rc {p.returncode}): the guard may be lifted")


def _write_gguf(path, tensors):
    """A GGUF file holding `tensors` (name -> float32 array) and no metadata beyond the architecture."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_matmul_flops_count_the_embedding_only_when_it_is_the_output_layer(tmp_path):
    from specdec.runtimes.gguf import gguf_matmul_flops

    layer = {"blk.0.ffn_up.weight": (8, 4), "blk.0.attn_norm.weight": (4,)}  # 32 elements; a norm is no product
    tied = _write_gguf(tmp_path / "tied.gguf", {"token_embd.weight": (10, 4), **layer})
    untied = _write_gguf(tmp_path / "untied.gguf", {"token_embd.weight": (10, 4), "output.weight": (10, 4),
                                                   **layer})
    assert gguf_matmul_flops(tied) == 2 * (40 + 32)  # the table multiplies the last hidden state
    assert gguf_matmul_flops(untied) == 2 * (40 + 32)  # the output layer once; the lookup table not at all
    only_norms = _write_gguf(tmp_path / "norms.gguf", {"blk.0.attn_norm.weight": (4,)})
    with pytest.raises(ValueError, match="no 2-d weight tensor"):
        gguf_matmul_flops(only_norms)


def test_matmul_flops_of_smollm2_match_its_published_shapes(smollm2_gguf):
    from specdec.runtimes.gguf import gguf_matmul_flops

    # SmolLM2-135M: hidden 576, 30 layers, 9 query and 3 key/value heads of 64, MLP 1536, vocab 49152, tied
    h, layers, kv, mlp, vocab = 576, 30, 3 * 64, 1536, 49152
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * mlp
    assert gguf_matmul_flops(smollm2_gguf) == 2 * (layers * per_layer + vocab * h)
