"""Output paths that never destroy a results store (`check_output`).

A results store is often a user's only copy of hours of runs, and every command that writes a file or a
directory (``specdec export --out``, ``costs --out``, ``merge --out``, ``report --out``, ``study --out``)
checks its output here first: the output is never one of the command's inputs, never an existing SQLite
store, and an existing file is overwritten only when the user says so (``--force``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["check_output", "is_sqlite_file", "same_file", "write_text_replacing"]

_SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite_file(path: str | Path) -> bool:
    """Whether `path` is an existing file that starts with SQLite's magic string (a store, damaged or not)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC
    except OSError:
        return False


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether `a` and `b` name the same file (``os.path.samefile`` when both exist: links, ``./``,
    relative and absolute spellings; else the resolved paths)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_output(path: str | Path, *, inputs: Iterable[str | Path] = (), force: bool = False,
                 directory: bool = False, flag: str = "--out", create_parent: bool = False) -> Path:
    """Check the output path of a command before anything is read or written; return it as a `Path`.

    Args:
        path: the output file (or directory, with `directory`).
        inputs: the files the command reads (results stores, ...): the output may not be one of them.
        force: overwrite an existing file that is not a SQLite store (``--force``).
        directory: `path` is a directory the command writes into (``report --out``): an existing directory
            is fine, an existing file (a store or anything else) is refused.
        flag: the option's name in messages.
        create_parent: make a missing parent folder of a file now (so a long run's output has somewhere to go),
            or refuse in one line when it cannot be made.

    Raises:
        ValueError: one line (``specdec: error: ...`` at the CLI) naming the file: empty path; the output is
            an input; an existing SQLite store (never overwritten, even with `force`); a directory where a
            file is written or a file where a directory is; an existing file without `force`.
    """
    text = str(path)
    if not text.strip():
        raise ValueError(f"{flag} is empty: name an output {'directory' if directory else 'file'}")
    out = Path(path)
    for src in inputs:
        if same_file(out, src):
            raise ValueError(f"{flag} {out} is also the input {src}: writing it would destroy it; "
                             f"name another output")
    if directory:
        if out.exists() and not out.is_dir():
            kind = "a results store" if is_sqlite_file(out) else "an existing file"
            raise ValueError(f"{flag} {out} is {kind}, not a directory: name a directory for the output")
        return out
    if out.is_dir():
        raise ValueError(f"{flag} {out} is a directory: name an output file")
    if is_sqlite_file(out):
        raise ValueError(f"{flag} {out} is a results store (SQLite): it is never overwritten; name another "
                         f"output file")
    if out.exists() and not force:
        raise ValueError(f"{flag} {out} already exists: pass --force to overwrite it, or name another file")
    if create_parent and not out.parent.is_dir():
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{flag} {out}: cannot make its folder {out.parent} ({exc.strerror or exc})") from None
    if not out.parent.is_dir():
        raise ValueError(f"{flag} {out}: its folder {out.parent} does not exist")
    return out


def write_text_replacing(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary sibling moved into place (``os.replace``): a crash or a full
    disk leaves the old file (or none), never half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
