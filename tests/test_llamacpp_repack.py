"""llama.cpp weight repacking: the rule that decides it per CPU, what a loaded backend records, and the
per-type weight bytes read from a GGUF header (recorded beside a cost curve, since they decide the kernels)."""

from __future__ import annotations

import pytest

from specdec.backends.llamacpp import AMX_FLAGS, GGUFNotFoundError, gguf_weight_types, repack_default

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
    from specdec.backends.llamacpp import load_llamacpp

    expected, _ = repack_default()
    with load_llamacpp(smollm2_gguf, n_ctx=128, n_threads=1) as be:
        assert be.extra_buffers is expected
        assert be.extra_buffers_note == repack_default()[1]
    with load_llamacpp(smollm2_gguf, n_ctx=128, n_threads=1, extra_buffers=False) as be:
        assert be.extra_buffers is False and "asked for" in be.extra_buffers_note
