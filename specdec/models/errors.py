"""The two errors of :mod:`specdec.models` meant for a user: one-line messages the CLI prints as is."""

from __future__ import annotations

from specdec.errors import SetupError

__all__ = ["ChunkAssemblyError", "ModelNotAvailableError"]


class ModelNotAvailableError(SetupError):
    """The weights for a model spec are not on this machine and cannot be fetched (one-line message that
    names the model and says how to provide it)."""


class ChunkAssemblyError(SetupError):
    """A preset's GGUF cannot be assembled from its chunk packages: one is missing, incomplete or corrupt.
    The one-line message names the package(s) to (re)install."""
