"""GGUF -> safetensors: dequantize a GGUF once with transformers and keep it as a checkpoint directory in
``cache_dir()/"converted"``, which then loads in seconds.

A conversion is stored in the dtype that will run (`conversion_dtype`): float32, or bfloat16 / float16,
which halve the disk written (the default pair: ~9 GB in float32, ~4.5 GB in bfloat16) and the time it
takes. Conversions of one GGUF in several dtypes coexist (the directory name carries the dtype). A half-
precision run reuses an existing float32 conversion instead of converting again: transformers dequantizes
a GGUF to float32 and casts, so casting the float32 checkpoint at load gives the same weights.

A conversion is verified: the sha256 of each of its files is recorded inside it (`files.DIGEST_RECORD`,
written before the directory is renamed into place, so it is as atomic as the directory) and checked
whenever the conversion is used (`specdec.models.files.check_digests`: a few ``stat`` calls, a hash only of
a file whose size, mtime, ctime or inode changed). A conversion that does not match its record, or has no
record, is not used: it is converted again from its GGUF, with a one-line note on stderr; where the GGUF
cannot be had (a preset whose chunk packages are gone), loading fails in one line naming the packages.

Also the dtype names the loaders accept (`torch_dtype`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specdec.models import files
from specdec.models.chunks import assemble_gguf
from specdec.models.errors import ChunkAssemblyError
from specdec.models.hub import has_safetensors
from specdec.models.spec import ResolvedSpec

__all__ = [
    "conversion_complete",
    "conversion_dtype",
    "conversions",
    "convert_gguf",
    "converted_dir",
    "converted_dir_for",
    "find_conversion",
    "load_from_gguf",
    "preset_checkpoint",
    "torch_dtype",
]

_CONVERSION_FORMAT = 1  # bump when the converted-checkpoint layout changes; old ones are then rebuilt
_CONVERSION_MARKER = "specdec-conversion.json"


#: Conversion dtypes and the tag their directory names carry (float32's directories carry none, so the
#: conversions made before half-precision conversions existed keep their names and are reused).
_DTYPE_TAGS = {"float32": "", "bfloat16": "-bf16", "float16": "-fp16"}


def conversion_dtype(dtype: Any = "float32") -> str:
    """The dtype a GGUF is converted to for a run in `dtype`: ``"bfloat16"`` or ``"float16"`` for those
    (any spelling `torch_dtype` knows), ``"float32"`` for everything else (float32, ``"auto"``)."""
    import torch

    dt = torch_dtype(dtype)
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dt, "float32")


def converted_dir_for(gguf: Path, *, known_sha256: str | None = None, dtype: Any = "float32") -> Path:
    """Cache location of the safetensors conversion of `gguf` in `dtype` (`conversion_dtype` of it), keyed
    by sha256 if known, else by the resolved path, size and mtime (`gguf` must then exist)."""
    if known_sha256:
        key = known_sha256[:16]
    else:
        st = gguf.stat()
        ident = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    stem = gguf.name[: -len(".gguf")] if gguf.name.lower().endswith(".gguf") else gguf.name
    tag = _DTYPE_TAGS[conversion_dtype(dtype)]
    return files.cache_dir() / "converted" / f"{stem}-{key}{tag}-v{_CONVERSION_FORMAT}"


def converted_dir(r: ResolvedSpec, dtype: Any = "float32") -> Path:
    """Where the conversion in `dtype` of a ``"chunked"`` or (existing) ``"gguf"`` spec lives (it may not
    exist yet)."""
    if r.kind == "chunked":
        return converted_dir_for(Path(r.chunks.filename), known_sha256=r.chunks.sha256, dtype=dtype)
    if r.kind == "gguf":
        return converted_dir_for(r.path, dtype=dtype)
    raise ValueError(f"{r.spec!r} is not a GGUF spec (kind {r.kind!r})")


def find_conversion(r: ResolvedSpec, dtype: Any = "float32") -> Path | None:
    """A finished, verified conversion of a GGUF spec that loads as `dtype`: the one in `dtype`'s conversion
    dtype, else (for bfloat16 / float16) the float32 one, whose cast at load gives the same weights; None when
    neither exists or matches its digest record (a float32 run never loads a half-precision conversion: it
    lost bits). A damaged one is left for `convert_gguf`, which says so and converts it again."""
    want = conversion_dtype(dtype)
    for d in dict.fromkeys((want, "float32")):
        directory = converted_dir(r, d)
        if conversion_complete(directory) and files.check_digests(directory) is None:
            return directory
    return None


def conversions(r: ResolvedSpec) -> list[Path]:
    """Every finished conversion of a GGUF spec, float32 first (for listings and the tokenizer)."""
    return [d for d in (converted_dir(r, t) for t in _DTYPE_TAGS) if conversion_complete(d)]


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


@contextlib.contextmanager
def _one_metadata_parse() -> Iterator[None]:
    """Parse each GGUF's metadata once while loading it, instead of three times.

    transformers' GGUF loader builds a `gguf.GGUFReader` (which parses every metadata field in Python,
    the 151k-entry vocabulary and merges included) for the config, again for the weights, and again for the
    tokenizer's config; on the default pair each parse takes seconds to tens of seconds on a small CPU.
    Inside this context the readers and the metadata-only results of
    ``transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`` are memoized per path (a deep copy
    is handed out, so a caller that edits its config changes nothing shared). The values are the ones
    transformers computes; only the repetition goes. If transformers' internals are not where this expects
    them, nothing is patched and loading is just slower.
    """
    try:
        import gguf
        import transformers.modeling_gguf_pytorch_utils as mg

        real_reader, real_load = gguf.GGUFReader, mg.load_gguf_checkpoint
    except (ImportError, AttributeError):
        yield
        return
    readers: dict[tuple, Any] = {}
    metadata: dict[str, Any] = {}

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    def load(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return real_load(path, return_tensors=return_tensors, **kwargs)
        if str(path) not in metadata:
            metadata[str(path)] = real_load(path, return_tensors=False)
        return copy.deepcopy(metadata[str(path)])

    gguf.GGUFReader, mg.load_gguf_checkpoint = reader, load
    try:
        yield
    finally:
        gguf.GGUFReader, mg.load_gguf_checkpoint = real_reader, real_load


@contextlib.contextmanager
def _quiet_gguf_load() -> Iterator[None]:
    """Silence transformers' per-tensor progress bar and its advice to keep GGUF weights packed in float32
    (it does not apply: a conversion dequantizes every weight) while a GGUF loads, so that the conversion's
    own progress lines (`files.progress`) are what stderr shows."""
    import logging

    logger = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        import transformers.modeling_gguf_pytorch_utils as mg

        bar = mg.tqdm
    except (ImportError, AttributeError):
        mg, bar = None, None
    if mg is not None:
        mg.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        logger.setLevel(level)
        if mg is not None:
            mg.tqdm = bar


def load_from_gguf(gguf: Path, dtype: Any = "float32"):
    """(model, tokenizer) dequantized straight from a GGUF file with transformers, the weights in `dtype`
    (slow: ~1 min/model; the file's metadata is parsed once, `_one_metadata_parse`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _one_metadata_parse(), _quiet_gguf_load():
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=str(gguf), dtype=torch_dtype(dtype), local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=str(gguf), local_files_only=True)
    model.eval()
    return model, tokenizer


def convert_gguf(gguf: Path, out_dir: Path, *, source_sha256: str | None = None, dtype: Any = "float32") -> Path:
    """Dequantize `gguf` once and save it in `dtype` (`conversion_dtype` of it) as the safetensors checkpoint
    directory `out_dir` (about a minute per model); return `out_dir` (immediately if already converted and
    matching its digest record; converted again, with a one-line note on stderr, when it does not).
    A progress line goes to stderr before and after a conversion."""
    if conversion_complete(out_dir) and files.check_digests(out_dir) is None:
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    dtype = conversion_dtype(dtype)
    with files.file_lock(out_dir.with_name(f".{out_dir.name}.lock")):
        if conversion_complete(out_dir):
            why = files.check_digests(out_dir)
            if why is None:  # another process converted it while this one waited
                return out_dir
            files.note(f"{out_dir}: {why}; converting {gguf.name} again")
        started = time.perf_counter()
        files.progress(f"converting {gguf.name} to a {dtype} safetensors checkpoint in {out_dir.parent} "
                       "(once; about a minute per model) ...")
        model, tokenizer = load_from_gguf(gguf, dtype)
        _write_checkpoint(model, tokenizer, out_dir, gguf, source_sha256, started, dtype)
        files.progress(f"converted {gguf.name} in {time.perf_counter() - started:.0f} s "
                       f"({sum(p.stat().st_size for p in out_dir.glob('*.safetensors')) / 1e9:.1f} GB)")
    return out_dir


def _write_checkpoint(
    model, tokenizer, out_dir: Path, gguf: Path, source_sha256: str | None, started: float,
    dtype: str = "float32",
) -> None:
    """Save a GGUF-loaded (dequantized) model as a safetensors checkpoint at `out_dir`, atomically.

    Built in a temporary sibling directory and renamed into place, so `out_dir` exists only complete, with
    the sha256 of each of its files recorded inside it (`files.record_digests`).
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
                    "dtype": dtype,
                    "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
                    "transformers": tf_version,
                    "format": _CONVERSION_FORMAT,
                    "seconds": round(time.perf_counter() - started, 1),
                },
                indent=1,
            )
        )
        files.record_digests(tmp)  # inside the directory, renamed into place with it
        if out_dir.exists():  # a leftover without the completion marker, or a damaged conversion
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files.fsync_dir(out_dir.parent)


def preset_checkpoint(r: ResolvedSpec, dtype: Any = "float32") -> Path:
    """Converted safetensors dir of a ``"chunked"`` spec that loads as `dtype` (`find_conversion`;
    assembling and converting in `dtype` on first use, or when the conversion does not match its record).

    Raises:
        ChunkAssemblyError: the GGUF cannot be assembled (one line naming the package(s) to reinstall; it
            also names a damaged conversion that could not be made again for want of it).
    """
    found = find_conversion(r, dtype)
    if found is not None:
        return found
    try:
        gguf = assemble_gguf(r.role, r.preset.name)  # type: ignore[arg-type]
    except ChunkAssemblyError as exc:
        target = converted_dir(r, dtype)
        why = files.check_digests(target) if conversion_complete(target) else None
        if why is None:
            raise
        raise ChunkAssemblyError(f"{target} cannot be used ({why}) nor converted again: {exc}") from None
    return convert_gguf(gguf, converted_dir(r, dtype), source_sha256=r.chunks.sha256, dtype=dtype)
