"""Opening a results store safely: its errors, its one-writer lock (`writer_lock`), and the checks made
before anything is written to a store (`check_writable`, `connect`).

A user's store is often their only copy of hours of runs, so every failure to open one is ONE line naming
the file and what to do (`StoreError`), and a store that is damaged, unwritable or missing its
write-ahead log is never written to:

- `check_writable`: the file (or, for a new store, its directory) can be written, checked before a sweep
  loads any model;
- `connect`: ``PRAGMA quick_check`` before the first write (a damaged store is named with the
  ``sqlite3 FILE ".recover"`` command that salvages its rows), an existing SQLite database that is not a
  results store (another program's tables) is never opened for writing, and a store without tables and
  without a ``-wal`` file beside it (a WAL store's header, or an empty file read as a store) is named as a
  copy that may have lost its ``-wal`` file (a WAL store's runs stay there until a checkpoint) instead of
  being taken for an empty store.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "StoreBusyError", "StoreError", "SweepExistsError", "SweepNotFoundError", "check_writable", "connect",
    "damaged_error", "writer_lock",
]  # fmt: skip


class StoreError(ValueError):
    """A results-store problem meant for the user (one-line message)."""


class SweepExistsError(StoreError):
    """The sweep already has runs in this database and ``--resume`` was not given."""


class SweepNotFoundError(StoreError):
    """``--resume`` was given but this database holds no sweep with this configuration."""


class StoreBusyError(StoreError):
    """Another process kept this results store locked for longer than we were willing to wait."""

    def __init__(self, path: Path | str, waited_s: float, holder: str = "") -> None:
        who = f" ({holder})" if holder else ""
        super().__init__(f"{path}: another process{who} is writing this results store (waited {waited_s:.0f} s); "
                         "wait for it to finish, or use another --db")


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _storage_failure(exc: sqlite3.Error) -> bool:
    """Whether `exc` is the file failing (read-only, damaged, disk full), not a locked store or a bug."""
    text = str(exc).lower()
    return type(exc) in (sqlite3.DatabaseError, sqlite3.OperationalError) and any(
        w in text for w in ("readonly", "read-only", "malformed", "disk i/o", "not a database", "disk is full",
                            "corrupt", "unable to open"))


@contextmanager
def writer_lock(db: str | Path, *, wait_s: float = 10.0, poll_s: float = 0.2) -> Iterator[None]:
    """Hold the one-writer lock of a results store: an OS advisory lock (``flock``) on ``<db>.lock``, which
    also records the holder's pid. A sweep holds it from start to end, so a second sweep on the same store
    waits up to `wait_s` seconds and then stops with `StoreBusyError` instead of interleaving its runs
    (readers such as ``specdec report`` never take it). Released when the process ends, even if killed.

    Raises:
        StoreBusyError: the lock was held for all of `wait_s`.
        StoreError: the store or its directory cannot be written (`check_writable`).
    """
    import fcntl  # POSIX; the store's users run on Linux and macOS

    check_writable(db)  # a read-only store or directory: one line, before the lock file is created
    path = Path(f"{db}.lock")
    with open(path, "a+") as f:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 >= wait_s:
                    f.seek(0)
                    holder = f.read().strip()
                    raise StoreBusyError(db, time.monotonic() - t0, holder) from None
                time.sleep(poll_s)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)



def check_writable(db: str | Path) -> None:
    """Make sure the results store `db` can be written: the file when it exists, and its directory (SQLite
    writes a rollback journal beside the store on every commit). A missing directory is created.

    Raises:
        StoreError: one line naming the file or directory that cannot be written, and why.
    """
    path = Path(db)
    if path.is_dir():
        raise StoreError(f"{path}: is a directory, not a results store; name a file (e.g. {path}/sweep.db)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"{path}: cannot create its directory {path.parent} ({exc.strerror or exc})") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise StoreError(f"{path}: the results store is read-only (no write permission on the file); make "
                         f"it writable (chmod u+w {path}) or write to another --db")
    parent = path.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"{path}: its directory {parent} is read-only (SQLite writes a journal beside the store "
                         f"on every commit); make it writable or write to another --db")


def damaged_error(path: str | Path, detail: object) -> StoreError:
    """The one-line error for a store SQLite finds damaged: the file, SQLite's words, and the command that
    salvages its rows into a new store (nothing is written to the damaged one)."""
    text = str(detail).strip().splitlines()[0] if str(detail).strip() else "damaged"
    return StoreError(f"{path}: the results store is damaged ({text}); nothing was written to it. Salvage its "
                      f"rows into a new file with: sqlite3 {path} \".recover\" | sqlite3 recovered.db")


def _sqlite_magic(path: Path) -> bool:
    """Whether `path` starts with SQLite's magic string (a SQLite file, damaged or not)."""
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def _wal_header(path: Path) -> bool:
    """Whether the SQLite header of `path` says WAL mode (file format bytes 18-19 are 2)."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[:16] == b"SQLite format 3\x00" and head[18] == 2


def connect(path: str | Path, *, readonly: bool, timeout_s: float) -> sqlite3.Connection:
    """Open `path` (``isolation_level=None``, `sqlite3.Row` rows) and check it before anything is written:
    ``PRAGMA quick_check`` on an existing store, and a WAL store that lost its ``-wal`` file.

    Args:
        readonly: open with ``mode=ro`` (the file must exist; nothing, not even a journal, is written); a
            WAL store on a read-only directory without its ``-shm`` file is opened ``immutable``.
        timeout_s: SQLite's busy timeout on each statement.

    Raises:
        sqlite3.OperationalError: the store is locked by another process (the caller retries).
        StoreError: no such file (`readonly`), not a SQLite database, damaged (`damaged_error`), a WAL
            store without tables whose ``-wal`` file is missing, or (not `readonly`) a database whose tables
            are not a results store's (`check_results_tables`).
    """
    path = Path(path)
    if readonly and not path.is_file():
        raise StoreError(f"{path}: no such results database")
    existing = path.is_file() and path.stat().st_size > 0
    wal = Path(f"{path}-wal")
    # before connecting (opening a WAL store creates an empty -wal file); an empty one holds no runs
    had_wal = wal.is_file() and wal.stat().st_size > 0
    if readonly and not existing and not had_wal:
        # an empty file: a new WAL store's runs live in its -wal file until a checkpoint (the .db stays 0 bytes)
        raise StoreError(f"{path}: is empty (no tables) and {wal.name} is missing: a store in WAL mode keeps "
                         f"its committed runs in {wal.name} until a checkpoint; if this is a copy of one, copy "
                         f"{wal.name} next to it, else it is not a results store")
    uri = f"file:{path.resolve().as_posix()}?mode=ro" if readonly else None
    conn = _open(path, uri, timeout_s)
    try:
        if not existing:
            return conn
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if not (readonly and _wal_header(path) and ("unable to open" in text or "readonly" in text)):
                raise
            # a WAL store in a read-only directory: SQLite cannot create its -shm file to read it
            if had_wal:
                raise StoreError(f"{path}: a WAL-mode store whose {wal.name} lies in a read-only directory: "
                                 f"SQLite must write {path.name}-shm to read it; make {path.parent} writable, "
                                 f"or copy the store with its {wal.name} elsewhere") from None
            conn.close()  # no -wal: the .db is the whole store; read it as it is on disk
            conn = _open(path, f"file:{path.resolve().as_posix()}?mode=ro&immutable=1", timeout_s)
            check = conn.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            raise damaged_error(path, check[0] if check else "quick_check gave nothing")
        has_tables = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1").fetchone()
        if not has_tables and _wal_header(path) and not had_wal:
            raise StoreError(f"{path}: holds no tables and its write-ahead log {wal.name} is missing: a store in "
                             f"WAL mode keeps its committed runs in {wal.name} until a checkpoint, so this looks "
                             f"like a copy of the .db alone; copy {wal.name} next to it (same name + -wal) and "
                             f"open it again")
        if not readonly:  # never another program's database: refused before anything is written to it
            check_results_tables(conn, path)
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if _is_busy(exc):
            raise
        if "readonly" in str(exc).lower() or "unable to open" in str(exc).lower():
            raise StoreError(f"{path}: cannot be opened ({exc}); check the permissions of the file and of "
                             f"{path.parent}") from None
        raise damaged_error(path, exc) from None
    except sqlite3.DatabaseError as exc:
        conn.close()
        if not _sqlite_magic(path):
            raise StoreError(f"{path}: not a specdec results database (SQLite: {exc})") from None
        raise damaged_error(path, exc) from None
    except BaseException:
        conn.close()
        raise


def _open(path: Path, uri: str | None, timeout_s: float) -> sqlite3.Connection:
    if uri is not None:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=timeout_s)
    else:
        conn = sqlite3.connect(str(path), isolation_level=None, timeout=timeout_s)
    conn.row_factory = sqlite3.Row
    return conn


def check_results_tables(conn: sqlite3.Connection, path: str | Path) -> None:
    """Refuse to write into an existing SQLite database that holds tables but not ``runs`` and ``sweeps``:
    another program's data, which must not get the store's tables (nor a sweep) added to it. An empty
    database (a new store) and any results store pass.

    Raises:
        StoreError: one line naming the file and some of its tables.
    """
    have = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    if have and not {"runs", "sweeps"} <= set(have):
        shown = ", ".join(have[:4]) + (f" (+{len(have) - 4} more)" if len(have) > 4 else "")
        raise StoreError(f"{path}: not a specdec results database (its tables: {shown}); nothing was written "
                         f"to it: name another --db")
