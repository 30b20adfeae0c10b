"""GGUF -> safetensors: dequantize a GGUF once with transformers and keep it as a checkpoint directory in
``cache_dir()/"converted"``, which then loads in seconds.

Also the dtype names the loaders accept (`torch_dtype`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from specdec.models import files
from specdec.models.chunks import assemble_gguf
from specdec.models.hub import has_safetensors
from specdec.models.spec import ResolvedSpec

__all__ = [
    "conversion_complete",
    "convert_gguf",
    "converted_dir",
    "converted_dir_for",
    "load_from_gguf",
    "preset_checkpoint",
    "torch_dtype",
]

_CONVERSION_FORMAT = 1  # bump when the converted-checkpoint layout changes; old ones are then rebuilt
_CONVERSION_MARKER = "specdec-conversion.json"


def converted_dir_for(gguf: Path, *, known_sha256: str | None = None) -> Path:
    """Cache location of the safetensors conversion of `gguf` (keyed by sha256 if known, else by the
    resolved path, size and mtime: `gguf` must then exist)."""
    if known_sha256:
        key = known_sha256[:16]
    else:
        st = gguf.stat()
        ident = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    stem = gguf.name[: -len(".gguf")] if gguf.name.lower().endswith(".gguf") else gguf.name
    return files.cache_dir() / "converted" / f"{stem}-{key}-v{_CONVERSION_FORMAT}"


def converted_dir(r: ResolvedSpec) -> Path:
    """Where the conversion of a ``"chunked"`` or (existing) ``"gguf"`` spec lives (it may not exist yet)."""
    if r.kind == "chunked":
        return converted_dir_for(Path(r.chunks.filename), known_sha256=r.chunks.sha256)
    if r.kind == "gguf":
        return converted_dir_for(r.path)
    raise ValueError(f"{r.spec!r} is not a GGUF spec (kind {r.kind!r})")


def conversion_complete(directory: Path) -> bool:
    """`directory` is a finished conversion (its marker and its weights are there)."""
    return (directory / _CONVERSION_MARKER).is_file() and has_safetensors(directory)


def torch_dtype(dtype: Any):
    """``torch.dtype`` (or ``"auto"``) for a dtype name such as ``"float32"``/``"bf16"``; ValueError if unknown."""
    import torch

    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    known = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    }  # fmt: skip
    try:
        return known[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None


def load_from_gguf(gguf: Path, dtype: Any = "float32"):
    """(model, tokenizer) dequantized straight from a GGUF file with transformers (slow: ~1 min/model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=str(gguf), dtype=torch_dtype(dtype), local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=str(gguf), local_files_only=True)
    model.eval()
    return model, tokenizer


def convert_gguf(gguf: Path, out_dir: Path, *, source_sha256: str | None = None) -> Path:
    """Dequantize `gguf` once (float32, about a minute per model) and save it as the safetensors
    checkpoint directory `out_dir`; return `out_dir` (immediately if already converted)."""
    if conversion_complete(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with files.file_lock(out_dir.with_name(f".{out_dir.name}.lock")):
        if conversion_complete(out_dir):
            return out_dir
        started = time.perf_counter()
        model, tokenizer = load_from_gguf(gguf, "float32")
        _write_checkpoint(model, tokenizer, out_dir, gguf, source_sha256, started)
    return out_dir


def _write_checkpoint(
    model, tokenizer, out_dir: Path, gguf: Path, source_sha256: str | None, started: float
) -> None:
    """Save a GGUF-loaded (dequantized) model as a safetensors checkpoint at `out_dir`, atomically.

    Built in a temporary sibling directory and renamed into place, so `out_dir` exists only complete.
    Embeddings keep the tying the GGUF implies (``tie_word_embeddings`` is True only when the file has no
    ``output.weight``); a tied head is saved once and re-tied on load.
    """
    files.remove_stale_partials(out_dir.parent, out_dir.name)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".partial"))
    try:
        # A GGUF-loaded model carries its quantizer (`hf_quantizer`, and `config.quantization_config`):
        # `save_pretrained` refuses to save it ("not serializable"), and a saved quantization_config would
        # send the next load back through the GGUF path. With `dequantize` the weights are plain tensors,
        # so both can go.
        if getattr(model, "hf_quantizer", None) is not None:
            del model.hf_quantizer
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = str(out_dir)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        from transformers import __version__ as tf_version

        (tmp / _CONVERSION_MARKER).write_text(
            json.dumps(
                {
                    "source": str(gguf),
                    "source_size": gguf.stat().st_size,
                    "source_sha256": source_sha256,
                    "dtype": "float32",
                    "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
                    "transformers": tf_version,
                    "format": _CONVERSION_FORMAT,
                    "seconds": round(time.perf_counter() - started, 1),
                },
                indent=1,
            )
        )
        if out_dir.exists():  # a leftover without the completion marker
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files.fsync_dir(out_dir.parent)


def preset_checkpoint(r: ResolvedSpec) -> Path:
    """Converted safetensors dir of a ``"chunked"`` spec (assembling and converting on first use)."""
    out = converted_dir(r)
    if conversion_complete(out):
        return out
    gguf = assemble_gguf(r.role, r.preset.name)  # type: ignore[arg-type]
    return convert_gguf(gguf, out, source_sha256=r.chunks.sha256)
