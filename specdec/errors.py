"""The one rule for turning an error into one line of text (CLI errors, a failed run's ``runs.error``, logs).

Every user-facing error of the project is one line (``specdec: error: ...``); an exception's message may span
several (a traceback-like library message, a listing), so its first line is kept. This module imports nothing
heavy: the CLI, the bench and the backends all use it.
"""

from __future__ import annotations

__all__ = ["one_line"]


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
