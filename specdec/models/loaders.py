"""Loading what a spec names: a transformers model and tokenizer (`load_hf`, `hf_tokenizer`) or a GGUF
file for llama.cpp (`gguf_file`). Each asks :func:`specdec.models.spec.resolve` what the spec is.

Safety: weights are only ever read from safetensors or GGUF files (``use_safetensors=True``), and
``trust_remote_code`` is False unless a caller passes True.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.models.chunks import assemble_gguf
from specdec.models.convert import (
    conversions,
    convert_gguf,
    converted_dir,
    find_conversion,
    preset_checkpoint,
    torch_dtype,
)
from specdec.models.errors import ModelNotAvailableError
from specdec.models.hub import has_safetensors, hub_snapshot
from specdec.models.presets import DEFAULT_PAIR
from specdec.models.spec import ResolvedSpec, resolve

__all__ = ["checkpoint_dir", "gguf_file", "hf_tokenizer", "load_hf"]


def _existing_gguf(r: ResolvedSpec) -> Path:
    """The file of a ``"gguf"`` spec; ModelNotAvailableError when it does not exist."""
    if not r.path.is_file():
        raise ModelNotAvailableError(f"GGUF file {r.source} does not exist")
    return r.path


def checkpoint_dir(spec: str, *, tokenizer_only: bool = False, code: bool = False, dtype: Any = "float32") -> Path:
    """Local checkpoint directory (config, tokenizer, safetensors) for any spec; converts GGUFs on first use.

    Args:
        spec: a model spec (:mod:`specdec.models.spec`).
        tokenizer_only: a directory without weights will do (hub: fetch only config and tokenizer files).
        code: the caller trusts the repo's code (hub: fetch ``*.py`` too).
        dtype: the dtype the weights will be loaded in; a GGUF spec gives a conversion that loads as it
            (`specdec.models.convert.find_conversion`), converting in that dtype on first use.

    Raises:
        ModelNotAvailableError: the weights are not available (one line naming the model and how to
            provide them).
        ChunkAssemblyError: a chunk package is missing or corrupt.
    """
    r = resolve(spec)
    if r.kind == "chunked":
        return preset_checkpoint(r, dtype)
    if r.kind == "gguf":
        path = _existing_gguf(r)
        return find_conversion(r, dtype) or convert_gguf(path, converted_dir(r, dtype), dtype=dtype)
    if r.kind == "dir":
        if not (r.path / "config.json").is_file():
            raise ModelNotAvailableError(f"{r.source} is not a checkpoint directory (no config.json)")
        if not tokenizer_only and not has_safetensors(r.path):
            raise ModelNotAvailableError(
                f"{r.source} has no *.safetensors weights (pickled .bin weights are refused for safety); "
                f"convert it to safetensors first"
            )
        return r.path
    if r.kind == "missing":
        raise ModelNotAvailableError(f"model path {r.source} does not exist (nor is it a hub id)")
    return hub_snapshot(r.source, tokenizer_only=tokenizer_only, code=code)


def load_hf(spec: str, *, device: str = "cpu", dtype: Any = "float32", trust_remote_code: bool = False):
    """Load a causal LM and its tokenizer for the transformers runtime.

    Args:
        spec: ``"<preset>:draft|target"`` (GGUF presets load their converted safetensors checkpoint,
            converting on first use in `dtype`: about a minute per model and ~9 GB of disk for the default
            pair in float32, half that in bfloat16), a hub id, a local checkpoint directory, or a ``.gguf``
            file (converted once into the cache, keyed by its path, size and mtime, and the dtype).
        device: torch device string, e.g. ``"cpu"`` or ``"cuda:0"``.
        dtype: ``"float32"`` (default), ``"bfloat16"``, ``"float16"``, ``"auto"`` or a ``torch.dtype``.
        trust_remote_code: passed to transformers; keep False unless the checkpoint is trusted.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, on `device`, in `dtype`.

    Raises:
        ModelNotAvailableError: the weights are not available (one line naming the model and how to
            provide them), or a *.safetensors or tokenizer file cannot be read (truncated, damaged).
        ChunkAssemblyError: a default-preset chunk package is missing or corrupt.
        ValueError: unknown dtype.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    dt = torch_dtype(dtype)
    directory = checkpoint_dir(spec, code=trust_remote_code, dtype=dt)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory),
            dtype=dt,
            use_safetensors=True,
            trust_remote_code=trust_remote_code,
            local_files_only=True,
        )
    except SafetensorError as exc:  # a truncated or damaged *.safetensors file
        from specdec.errors import one_line

        raise ModelNotAvailableError(
            f"{spec}: its safetensors weights{_where(spec, directory)} cannot be read (damaged or incomplete: {one_line(exc)})"
        ) from None
    tokenizer = _dir_tokenizer(spec, directory, trust_remote_code)
    if str(device) != "cpu":
        model.to(device)
    model.eval()
    return model, tokenizer


def hf_tokenizer(spec: str, *, trust_remote_code: bool = False):
    """The tokenizer of `spec` only (no weights are loaded).

    For a GGUF spec (a chunked preset member or a ``.gguf`` file) whose converted checkpoint does not
    exist yet, the tokenizer is read from the GGUF itself (assembling a preset's if needed, no
    conversion). For a hub id only the tokenizer/config files are fetched.

    Raises:
        ModelNotAvailableError, ChunkAssemblyError: as :func:`load_hf`.
    """
    from transformers import AutoTokenizer

    r = resolve(spec)
    if r.kind in ("chunked", "gguf"):
        gguf = _existing_gguf(r) if r.kind == "gguf" else None
        done = conversions(r)  # any dtype's conversion holds the same tokenizer
        if not done:
            gguf = gguf or assemble_gguf(r.role, r.preset.name)  # type: ignore[arg-type]
            return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=str(gguf), local_files_only=True)
        directory = done[0]
    else:
        directory = checkpoint_dir(spec, tokenizer_only=True, code=trust_remote_code)
    return _dir_tokenizer(spec, directory, trust_remote_code)


def _where(spec: str, directory: Path) -> str:
    """`` in DIR`` when the files of `spec` live in another directory (a converted checkpoint), else ``""``."""
    return "" if Path(spec).resolve() == Path(directory).resolve() else f" in {directory}"


def _dir_tokenizer(spec: str, directory: Path, trust_remote_code: bool):
    """The tokenizer of a checkpoint directory; a damaged JSON file in it (a truncated tokenizer.json) is a
    ModelNotAvailableError naming the checkpoint, not the JSON decoder's bare message."""
    import json

    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=trust_remote_code,
                                             local_files_only=True)
    except json.JSONDecodeError as exc:
        raise ModelNotAvailableError(f"{spec}: its tokenizer files{_where(spec, directory)} are not valid JSON (damaged or "
                                     f"incomplete: {exc})") from None


def gguf_file(spec: str) -> Path:
    """GGUF path of `spec`, for the llama.cpp runtime.

    A GGUF preset member is assembled on first use; a ``.gguf`` path is returned as is (resolved).

    Raises:
        ModelNotAvailableError: `spec` has no GGUF (hub ids, checkpoint dirs, GPT-2 presets) or the file
            does not exist.
        ChunkAssemblyError: a chunk package is missing or corrupt.
    """
    r = resolve(spec)
    if r.kind == "chunked":
        return assemble_gguf(r.role, r.preset.name)  # type: ignore[arg-type]
    if r.kind == "gguf":
        return _existing_gguf(r).resolve()
    raise ModelNotAvailableError(
        f"{r.source!r} has no GGUF file for the llama.cpp runtime: pass a .gguf path, use the "
        f"{DEFAULT_PAIR} preset, or use the transformers runtime"
    )
