"""The one rule for turning an error into one line of text (CLI errors, a failed run's ``runs.error``, logs).

Every user-facing error of the project is one line (``specdec: error: ...``); an exception's message may span
several (a traceback-like library message, a listing), so its first line is kept. This module imports nothing
heavy: the CLI, the bench and the backends all use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["cli_errors", "one_line", "user_errors"]


def one_line(error: BaseException | str, *, with_type: bool = False, limit: int | None = None) -> str:
    """The first line of `error`'s message, stripped.

    Args:
        error: an exception or a message.
        with_type: prefix the exception's class name (``"ValueError: bad K"``), as a failed run records it.
        limit: keep at most this many characters (None: all).

    Returns:
        The line; for an empty message, the exception's class name (``"error"`` for an empty string).
    """
    lines = str(error).strip().splitlines()
    first = lines[0].strip() if lines else ""
    name = type(error).__name__ if isinstance(error, BaseException) else "error"
    if with_type and isinstance(error, BaseException):
        text = f"{name}: {first}" if first else name
    else:
        text = first or name
    return text if limit is None else text[:limit]


class SetupError(RuntimeError):
    """A setup that cannot run: a model that is not available or whose files are damaged, a backend that
    cannot load or run a model. The base of those errors (`specdec.models.ModelNotAvailableError`,
    `specdec.models.ChunkAssemblyError`, `specdec.runtimes.base.BackendError`)."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The exception types a command reports as bad input or an unusable setup (one line, exit status 2)
    rather than as a crash: ValueError (and its subclasses: store, prompt-file, output-path errors) and
    `SetupError`."""
    return (ValueError, SetupError)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn `user_errors` into one stderr line (``specdec: error: ...``) and exit status 2, in the format of
    `specdec.entrypoints.cli.fail`, so the commands behave the same when mounted on another Typer app (tests)."""
    import typer

    try:
        yield
    except user_errors() as exc:
        typer.echo(f"specdec: error: {one_line(exc)}", err=True)
        raise typer.Exit(2) from None
