"""``specdec models``: one row per preset, saying where its weights come from and whether they are here.

Cheap by design: no network, no assembly, no conversion.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from specdec.models.chunks import assembled_path, installed_chunk_files
from specdec.models.convert import conversions
from specdec.models.files import cache_dir
from specdec.models.hub import has_safetensors, hub_cache
from specdec.models.presets import DEFAULT_PAIR, PARAM_COUNTS, PRESETS
from specdec.models.spec import resolve

__all__ = ["list_presets"]


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
    r = resolve(spec)
    if r.kind == "chunked":
        cs = r.chunks
        final = assembled_path(cs)
        converted = conversions(r)  # every finished conversion (float32, bfloat16, ...)
        paths = [final, *converted] if final.exists() else list(converted)
        source = f"PyPI chunks {cs.package_prefix}1..{cs.count}"
        installed, chunk_paths = installed_chunk_files(cs)
        paths.extend(p for p in chunk_paths if p.is_file())
        available = (
            installed
            or (final.is_file() and final.stat().st_size == cs.size)
            or bool(converted)
        )
        return available, paths, source
    if r.kind in ("gguf", "dir"):
        return r.path.exists(), [r.path] if r.path.exists() else [], str(r.path)
    spec = r.source
    local = None
    with contextlib.suppress(Exception):
        from huggingface_hub import try_to_load_from_cache

        cfg = try_to_load_from_cache(spec, "config.json", cache_dir=hub_cache())
        if isinstance(cfg, str) and has_safetensors(Path(cfg).parent):
            local = Path(cfg).parent
    return local is not None, [local] if local is not None else [], f"Hugging Face hub {spec!r}"


def list_presets() -> list[dict]:
    """One dict per preset, for ``specdec models``. Cheap: no network, no assembly, no conversion.

    Keys: ``name``, ``description``, ``draft``, ``target`` (specs), ``draft_params``, ``target_params``
    (parameter counts, known numbers, or None), ``default`` (bool), ``offline`` (ships without the hub),
    ``weights`` (where the weights come from and are kept), ``available_offline_now`` (both members can be
    loaded without network right now), ``other_tokenizer`` (the draft has another tokenizer: it drafts text,
    `specdec.drafters.xtok`), ``disk_bytes`` (bytes on disk of what is there: chunks, assembled
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
            weights += f"; cache: {hub_cache()}"
        rows.append(
            {
                "name": p.name,
                "description": p.description,
                "draft": p.draft,
                "target": p.target,
                "draft_params": PARAM_COUNTS.get(p.draft),
                "target_params": PARAM_COUNTS.get(p.target),
                "default": p.name == DEFAULT_PAIR,
                "offline": p.offline,
                "weights": weights,
                "available_offline_now": ok_d and ok_t,
                "other_tokenizer": p.other_tokenizer,
                "disk_bytes": sum(_tree_bytes(x) for x in paths),
                "paths": [str(x) for x in paths],
            }
        )
    return rows
