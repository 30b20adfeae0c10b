"""The model cache directory and the atomic-file helpers every writer under it uses.

Writers build a file (or directory) under a temporary ``.<name>.*.partial`` sibling and ``os.replace`` it
into place, under an inter-process lock, so a crash never leaves a complete-looking file; a verified
file's sha256 is remembered in a ``<file>.verified`` sidecar keyed by its size and mtime.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "cache_dir",
    "cached_ok",
    "copy_into",
    "file_lock",
    "fsync_dir",
    "marker_path",
    "progress",
    "remove_stale_partials",
    "sha256_digest",
    "sha256_file",
    "write_marker",
]

_BUF = 16 * 1024 * 1024


def cache_dir() -> Path:
    """Where specdec keeps assembled GGUFs and converted checkpoints (not created here).

    ``$SPECDEC_CACHE_DIR`` if set; else ``$XDG_CACHE_HOME/specdec``; else the platform's user cache:
    ``~/Library/Caches/specdec`` (macOS), ``%LOCALAPPDATA%\\specdec\\Cache`` (Windows),
    ``~/.cache/specdec`` (elsewhere).
    """
    env = os.environ.get("SPECDEC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "specdec"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "specdec"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "specdec" / "Cache"
    return Path.home() / ".cache" / "specdec"


def progress(message: str) -> None:
    """One progress line on stderr, ``specdec: <message>``, for a step that takes seconds to minutes
    (assembling a GGUF, converting it, loading models, measuring costs); stdout stays clean for output
    such as ``--json``. ``SPECDEC_QUIET=1`` silences them."""
    if os.environ.get("SPECDEC_QUIET", "").strip() not in ("", "0"):
        return
    print(f"specdec: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive inter-process lock on `path` (created if needed); a no-op where fcntl is missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def fsync_dir(path: Path) -> None:
    """Flush the directory entry of `path` to disk (after a rename); errors are ignored."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_partials(directory: Path, stem: str, max_age_s: float = 6 * 3600) -> None:
    """Delete ``.{stem}.*.partial`` leftovers of crashed runs older than `max_age_s` seconds."""
    now = time.time()
    for leftover in directory.glob(f".{stem}.*.partial"):
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > max_age_s:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink()


def copy_into(dst, src: Path, digest) -> int:
    """Append `src` to the open binary file `dst`, feeding the hashlib object `digest`; return the bytes
    copied."""
    copied = 0
    with open(src, "rb") as fh:
        while block := fh.read(_BUF):
            dst.write(block)
            digest.update(block)
            copied += len(block)
    return copied


def sha256_digest(path: Path) -> bytes:
    """Raw sha256 digest (32 bytes) of the file at `path`, read in 16 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BUF):
            digest.update(block)
    return digest.digest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at `path`."""
    return sha256_digest(path).hex()


def marker_path(path: Path) -> Path:
    """The ``.verified`` sidecar of `path`."""
    return path.with_name(path.name + ".verified")


def write_marker(path: Path, sha256: str) -> None:
    """Record that `path` (as it is now: size, mtime) was verified to have `sha256`; atomic."""
    st = path.stat()
    data = json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    marker = marker_path(path)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.partial")
    tmp.write_text(data)
    os.replace(tmp, marker)


def cached_ok(path: Path, size: int, sha256: str) -> bool:
    """True if `path` is a complete, verified copy: size checked always, sha256 read from the sidecar
    marker when it matches the file's size and mtime, otherwise computed once and recorded."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != size:
        return False
    with contextlib.suppress(OSError, ValueError, TypeError):
        marker = json.loads(marker_path(path).read_text())
        if (
            marker.get("sha256") == sha256
            and marker.get("size") == st.st_size
            and marker.get("mtime_ns") == st.st_mtime_ns
        ):
            return True
    if sha256_file(path) != sha256:
        return False
    write_marker(path, sha256)
    return True
