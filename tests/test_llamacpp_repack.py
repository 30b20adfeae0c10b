"""llama.cpp weight repacking: the rule that decides it per CPU, what a loaded backend records, and the
per-type weight bytes read from a GGUF header (recorded beside a cost curve, since they decide the kernels)."""

from __future__ import annotations

import pytest

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
