"""The model cache directory and the atomic-file helpers every writer under it uses.

Writers build a file (or directory) under a temporary ``.<name>.*.partial`` sibling and ``os.replace`` it
into place, under an inter-process lock, so a crash never leaves a complete-looking file; a verified
file's sha256 is remembered in a ``<file>.verified`` sidecar keyed by its size and mtime.

Files specdec derives itself (a requantized GGUF, a converted checkpoint directory) have no published
checksum to check against, so one is recorded when they are made (`record_digests`) and checked when
they are used (`check_digests`): a disk error, a truncation or bytes written into the weights would
otherwise load and decode garbage, or fail on every later run.
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
    "DIGEST_RECORD",
    "cache_dir",
    "cached_ok",
    "check_digests",
    "copy_into",
    "file_lock",
    "fsync_dir",
    "marker_path",
    "note",
    "progress",
    "record_digests",
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


def note(message: str) -> None:
    """One line on stderr, ``specdec: note: <message>``, for something the user should know even with
    ``SPECDEC_QUIET=1`` (a damaged cache file made again)."""
    print(f"specdec: note: {message}", file=sys.stderr, flush=True)


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


# ------------------------------------------------------------------------- digests of derived files

#: The digest record of a derived directory, inside it (a file's is ``<file>.sha256.json`` beside it).
DIGEST_RECORD = "specdec-sha256.json"
_DIGEST_FORMAT = 1
#: What a record keeps of each file's ``stat`` besides its size: a file whose values still match is taken
#: as recorded without reading it (see `check_digests`).
_STAT_KEYS = ("mtime_ns", "ctime_ns", "ino")
#: This process's answers for a record and the stats of its files (a failed check is not hashed twice).
_checked: dict[tuple, str | None] = {}


def _record_path(target: Path) -> Path:
    return target / DIGEST_RECORD if target.is_dir() else target.with_name(target.name + ".sha256.json")


def _members(target: Path) -> dict[str, Path]:
    """The files a record covers: `target` itself, or every non-hidden file of the directory (but the record)."""
    if not target.is_dir():
        return {target.name: target}
    return {p.name: p for p in sorted(target.iterdir())
            if p.is_file() and not p.name.startswith(".") and p.name != DIGEST_RECORD}


def _entry(path: Path, sha256: str) -> dict:
    st = path.stat()
    return {"size": st.st_size, "sha256": sha256, **{k: getattr(st, f"st_{k}") for k in _STAT_KEYS}}


def _write_record(target: Path, entries: dict[str, dict]) -> None:
    record = _record_path(target)
    tmp = record.with_name(f".{record.name}.{os.getpid()}.partial")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"format": _DIGEST_FORMAT, "algorithm": "sha256", "files": entries}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, record)


def record_digests(target: Path) -> None:
    """Hash `target` (a file, or every file of a directory) and record the sha256, size and stat of each in
    its digest record, written atomically (a temporary sibling renamed into place): ``<file>.sha256.json``
    beside a file, `DIGEST_RECORD` inside a directory (written before the directory is renamed into place,
    it is then as atomic as the directory). Call it when the derived file is complete."""
    _write_record(target, {name: _entry(p, sha256_file(p)) for name, p in _members(target).items()})


def _well_formed(rec) -> bool:
    """Whether `rec` (parsed JSON) is a digest record of this format: a sha256 per file."""
    if not isinstance(rec, dict) or (rec.get("format"), rec.get("algorithm")) != (_DIGEST_FORMAT, "sha256"):
        return False
    entries = rec.get("files")
    return isinstance(entries, dict) and bool(entries) and all(
        isinstance(e, dict) and isinstance(e.get("sha256"), str) for e in entries.values())


def check_digests(target: Path) -> str | None:
    """None when `target` matches the digest record made with it; else why not, in a few words (no record,
    an unreadable or foreign record, a file missing, added, resized or with another sha256).

    sha256 over whole files (hashlib, about 1-2 GB/s: seconds for a multi-GB checkpoint) is paid when a file
    is made and only when its stat changed since: a file whose size, mtime, ctime and inode are the recorded
    ones is not read, so loading an intact cache costs a few ``stat`` calls. The trade-off: bytes rewritten
    in place with all four restored (or within the filesystem's timestamp tick of the recording) are not
    seen; every ordinary write, truncation, copy or restore changes them and is hashed. A file whose stat
    changed but whose sha256 matches gets its stat recorded again (when the record can be written), and a
    failed check is remembered for this process, so neither is hashed twice.
    """
    try:
        rec = json.loads(_record_path(target).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "it has no checksum record"
    except (OSError, ValueError):
        return "its checksum record cannot be read"
    if not _well_formed(rec):
        return "its checksum record is not one specdec writes"
    entries = rec["files"]
    now = _members(target)
    if set(now) != set(entries):
        missing, extra = sorted(set(entries) - set(now)), sorted(set(now) - set(entries))
        return f"its files differ from the checksum record (missing: {', '.join(missing) or '-'}; not recorded: " \
               f"{', '.join(extra) or '-'})"
    stats = {name: p.stat() for name, p in now.items()}
    for name, st in stats.items():
        if st.st_size != entries[name].get("size"):
            return f"{name} is {st.st_size} bytes, {entries[name].get('size')} when it was made"
    changed = [n for n, st in stats.items() if any(getattr(st, f"st_{k}") != entries[n].get(k) for k in _STAT_KEYS)]
    if not changed:
        return None
    key = (str(target.resolve()), tuple((n, stats[n].st_size, stats[n].st_mtime_ns, stats[n].st_ctime_ns)
                                        for n in changed))
    if key not in _checked:
        bad = next((n for n in changed if sha256_file(now[n]) != entries[n]["sha256"]), None)
        _checked[key] = None if bad is None else f"{bad}'s sha256 differs from the one recorded when it was made"
        if bad is None:
            with contextlib.suppress(OSError):  # a read-only cache: hashed again by the next process
                _write_record(target, {**entries, **{n: _entry(now[n], entries[n]["sha256"]) for n in changed}})
    return _checked[key]
