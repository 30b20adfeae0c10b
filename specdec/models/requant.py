"""Requantized GGUF targets: a GGUF rewritten to another ggml weight type once, kept in the model cache.

llama.cpp's CPU kernels decide how a verification forward of n tokens scales: weight types with a repacked
GEMM kernel (Q4_0, IQ4_NL, Q8_0 on x86) read each weight row once for several tokens, while the shipped
Q4_K_M mix keeps per-row dot products for its Q6_K tensors. `requantized_gguf` makes a pure copy of a GGUF
in one of those types with llama.cpp's own quantizer (`specdec.runtimes.gguf.requantize_gguf`), once:

* where: ``cache_dir()/gguf/requantized/<stem>.<TYPE>.gguf`` for a GGUF that lives in the cache's ``gguf``
  folder (the presets' assembled files), ``<stem>-<key>.<TYPE>.gguf`` for any other file, `key` being a
  hash of its resolved path, size and mtime (two files of one name are never confused);
* how: under an inter-process lock (`specdec.models.files.file_lock`, as the converted checkpoints), the
  quantizer writes a ``.<name>.<pid>.partial`` sibling that is renamed into place only when complete, so a
  killed run never leaves a file that a later call would use; leftovers of killed runs are removed;
* verified: its sha256 is recorded beside it (``<name>.sha256.json``, written atomically:
  `specdec.models.files.record_digests`) once it is in place, and checked on every use
  (`specdec.models.files.check_digests`: a stat per call, a hash only when the file's size, mtime, ctime or
  inode changed). A file that does not match its record, or has no readable record (a run killed between
  the rename and the record), is requantized again from its source, with a one-line note on stderr.

A requantized file is a different model (two roundings stacked): its greedy output is compared with the
shipped file's and with the fp32 reference by ``benchmarks/llamacpp_candidates.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

from specdec.models import files

__all__ = ["check_gguf_type", "requantized_gguf", "requantized_path"]


def check_gguf_type(weight_type: str) -> str:
    """The canonical name of a requantization weight type (``"q4_0"`` -> ``"Q4_0"``).

    Raises:
        ValueError: not a type `specdec.runtimes.gguf.requantize_gguf` knows (one line, the known ones).
    """
    from specdec.runtimes.gguf import REQUANT_TYPES

    name = str(weight_type).strip().upper()
    if name not in REQUANT_TYPES:
        raise ValueError(f"unknown GGUF weight type {weight_type!r}; choose one of {', '.join(REQUANT_TYPES)}")
    return name


def requantized_path(src: str | os.PathLike, weight_type: str) -> Path:
    """Where the `weight_type` copy of the GGUF `src` is kept (it may not exist yet; see the module).

    Raises:
        ValueError: unknown `weight_type`. FileNotFoundError: `src` does not exist (its mtime is the key).
    """
    name = check_gguf_type(weight_type)
    source = Path(src).resolve()
    stem = source.name[: -len(".gguf")] if source.name.lower().endswith(".gguf") else source.name
    folder = files.cache_dir() / "gguf"
    if source.parent != folder.resolve():
        st = source.stat()
        key = hashlib.sha256(f"{source}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
        stem = f"{stem}-{key}"
    return folder / "requantized" / f"{stem}.{name}.gguf"


def requantized_gguf(src: str | os.PathLike, weight_type: str, *, threads: int | None = None) -> Path:
    """The GGUF `src` requantized (pure) to `weight_type`, made on first use and reused afterwards.

    Args:
        src: a GGUF file (e.g. `specdec.models.gguf_file` of a preset member).
        weight_type: a `specdec.runtimes.gguf.REQUANT_TYPES` name, any case (``q4_0``, ``IQ4_NL``).
        threads: quantizer threads (default: the CPUs this process may use).

    Returns:
        The path of the requantized file (`requantized_path`), checked against its recorded sha256 (made again
        when it does not match: see the module); a progress line goes to stderr when it is made (seconds for a
        135M model, about a minute for 1.5B).

    Raises:
        ValueError: unknown `weight_type` (one line). specdec.runtimes.llamacpp.GGUFNotFoundError: `src`
            missing. specdec.runtimes.base.BackendError: llama.cpp's quantizer failed (nothing is left).
    """
    from specdec.runtimes.gguf import requantize_gguf
    from specdec.runtimes.llamacpp import require_file

    name = check_gguf_type(weight_type)
    source = require_file(src)
    dst = requantized_path(source, name)
    if dst.is_file() and files.check_digests(dst) is None:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    with files.file_lock(dst.with_name(f".{dst.name}.lock")):
        if dst.is_file():
            why = files.check_digests(dst)
            if why is None:  # another process made it (or recorded it) while this one waited
                return dst
            files.note(f"{dst}: {why}; requantizing it again from {source.name}")
        for leftover in dst.parent.glob(f".{dst.name}.*.partial*"):  # a killed run's; under the lock none is live
            with contextlib.suppress(OSError):
                leftover.unlink()
        part = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
        started = time.perf_counter()
        files.progress(f"requantizing {source.name} to {name} in {dst.parent} (once) ...")
        try:
            requantize_gguf(source, part, name, threads=threads)
            os.replace(part, dst)
            files.record_digests(dst)  # after the rename, so the recorded stat is the file's in place
        finally:
            with contextlib.suppress(OSError):
                part.unlink()
            with contextlib.suppress(OSError):
                part.with_name(part.name + ".part").unlink()
        files.fsync_dir(dst.parent)
        files.progress(f"requantized {source.name} to {name} in {time.perf_counter() - started:.1f} s "
                       f"({dst.stat().st_size / 1e9:.2f} GB)")
    return dst
