"""Hugging Face hub access: the hub cache, offline mode, and a local snapshot of a model's safe files.

``HF_HOME``, ``HF_HUB_CACHE`` and ``HF_HUB_OFFLINE`` are read at call time (huggingface_hub reads them once
at import). Only configs, tokenizer files and safetensors weights are fetched: never pickled weights
(``*.bin``, ``*.pt``, ``*.ckpt``), and code only when the caller trusts the repo's code.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from specdec.models.errors import ModelNotAvailableError

__all__ = ["has_safetensors", "hub_cache", "hub_offline", "hub_snapshot", "looks_like_hub_id"]

_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
_HUB_TOKENIZER_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
_HUB_ID_RE = re.compile(r"[A-Za-z0-9_][\w.-]*(/[A-Za-z0-9_][\w.-]*)?")


def looks_like_hub_id(spec: str) -> bool:
    """`spec` has the shape of a hub id: ``name`` or ``org/name``."""
    return bool(_HUB_ID_RE.fullmatch(spec))


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them once at import)."""
    if _is_true(os.environ.get("HF_HUB_OFFLINE")) or _is_true(os.environ.get("TRANSFORMERS_OFFLINE")):
        return True
    with contextlib.suppress(Exception):
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    return False


def hub_cache() -> Path:
    """The hub cache dir per HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME, read now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def has_safetensors(directory: Path) -> bool:
    """`directory` holds safetensors weights (a single file or a sharded index)."""
    return any(directory.glob("*.safetensors")) or (directory / "model.safetensors.index.json").is_file()


def hub_snapshot(
    repo_id: str, *, tokenizer_only: bool = False, download: bool = True, code: bool = False
) -> Path:
    """Local snapshot directory of a hub model with config, tokenizer and safetensors weights.

    Looks in the hub cache first (no network). Downloads only when `download` and not offline, with a
    10 s connection timeout.

    Raises:
        ModelNotAvailableError: not cached and offline / not downloadable (one line, names the model).
    """
    from huggingface_hub import snapshot_download

    cache = hub_cache()
    patterns = _HUB_TOKENIZER_PATTERNS if tokenizer_only else _HUB_PATTERNS
    if code:  # trust_remote_code=True: the repo's modeling/tokenization code is needed too
        patterns = [*patterns, "*.py"]

    def complete(path: Path) -> bool:
        return (path / "config.json").is_file() and (tokenizer_only or has_safetensors(path))

    with contextlib.suppress(Exception):
        local = Path(
            snapshot_download(repo_id, cache_dir=cache, local_files_only=True, allow_patterns=patterns)
        )
        if complete(local):
            return local
    offline = hub_offline()
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
