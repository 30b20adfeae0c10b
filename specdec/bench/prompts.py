"""Benchmark prompts: the built-in typed prompt set and loaders for user prompt files.

The built-in set (`prompts.jsonl`, shipped in this package) holds at least five original completion
prompts for each of the twelve `PROMPT_TYPES`; the first of each type (id ``<type>-01``) is the primary
prompt that full sweeps run on. `load_prompt_file` reads a user's file in one of three formats, detected
from the content:

1. JSON Lines, one object per line with ``"prompt"`` and ``"type"`` (or ``"category"``), optional ``"id"``;
2. Spec-Bench's ``question.jsonl`` (``question_id``, ``category``, ``turns``; the first turn is used);
3. plain text, one prompt per blank-line-separated block (type ``"custom"``).

Every problem with a file is a `PromptFileError` whose message is one line naming the file (and the line,
where there is one). The loaders only read files; they never touch a model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "PROMPT_TYPES",
    "Prompt",
    "PromptFileError",
    "encode_prompt",
    "load_builtin",
    "load_prompt_file",
    "parse_types",
]

PROMPT_TYPES: tuple[str, ...] = (
    "repetitive",
    "repetitive_pattern",
    "dialogue",
    "wikipedia_style",
    "natural",
    "technical",
    "technical_ml",
    "code",
    "code_python",
    "code_json",
    "creative_fiction",
    "list_items",
)

CUSTOM_TYPE = "custom"
_BUILTIN_FILE = "prompts.jsonl"
_JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: a unique `id`, its `type` (category) and the completion `text`."""

    id: str
    type: str
    text: str


class PromptFileError(ValueError):
    """A prompt file is missing, unreadable, empty, malformed or inconsistent (one-line message)."""


# --------------------------------------------------------------------------------------------- helpers


def _short(value: Any, limit: int = 40) -> str:
    """A one-line, length-limited repr for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _valid_types_msg() -> str:
    return "valid types: " + ", ".join(PROMPT_TYPES)


class _Builder:
    """Collects prompts from one source, generating missing ids and rejecting duplicate ones."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.prompts: list[Prompt] = []
        self._id_origin: dict[str, str] = {}  # id -> where it was first seen ("line 3", "block 2")
        self._per_type: dict[str, int] = {}

    def add(self, text: str, ptype: str, pid: str | None, where: str) -> None:
        n = self._per_type.get(ptype, 0) + 1
        self._per_type[ptype] = n
        if pid is None:
            pid = f"{ptype}-{n:02d}"
        if pid in self._id_origin:
            raise PromptFileError(
                f"{self.source}: {where}: duplicate id {pid!r} (first used on {self._id_origin[pid]})"
            )
        self._id_origin[pid] = where
        self.prompts.append(Prompt(id=pid, type=ptype, text=text))


def _record_to_prompt(rec: Any, where: str, source: str) -> tuple[str, str, str | None]:
    """(text, type, id or None) from one JSON record, either prompt-style or Spec-Bench-style."""
    err = f"{source}: {where}"
    if not isinstance(rec, dict):
        raise PromptFileError(f"{err}: expected a JSON object, got {type(rec).__name__}")

    if "prompt" in rec:
        text = rec["prompt"]
        if not isinstance(text, str):
            raise PromptFileError(f"{err}: 'prompt' must be a string, got {type(text).__name__}")
        raw_type = rec.get("type", rec.get("category", CUSTOM_TYPE))
        raw_id = rec.get("id")
    elif "turns" in rec:  # Spec-Bench question.jsonl
        turns = rec["turns"]
        if not isinstance(turns, list) or not turns:
            raise PromptFileError(f"{err}: 'turns' must be a non-empty list of strings")
        text = turns[0]
        if not isinstance(text, str):
            raise PromptFileError(f"{err}: the first of 'turns' must be a string, got {type(text).__name__}")
        raw_type = rec.get("category", rec.get("type", CUSTOM_TYPE))
        raw_id = rec.get("question_id", rec.get("id"))
    else:
        keys = ", ".join(sorted(map(str, rec))) or "none"
        raise PromptFileError(
            f"{err}: unknown record format: expected a 'prompt' field (with 'type' or 'category') "
            f"or Spec-Bench 'turns'; got keys: {keys}"
        )

    if not text.strip():
        raise PromptFileError(f"{err}: empty prompt")
    if not isinstance(raw_type, str) or not raw_type.strip():
        raise PromptFileError(f"{err}: type/category must be a non-empty string, got {_short(raw_type)}")

    pid: str | None
    if raw_id is None:
        pid = None
    elif isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise PromptFileError(f"{err}: id must be a string or an integer, got {_short(raw_id)}")
    else:
        pid = str(raw_id).strip()
        if not pid:
            raise PromptFileError(f"{err}: empty id")
    return text, raw_type.strip(), pid


def _looks_like_json_object_line(line: str) -> bool:
    s = line.strip()
    return s.startswith("{") and s.endswith("}")


def _parse_jsonl(text: str, source: str) -> list[Prompt]:
    builder = _Builder(source)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(
                f"{source}: {where}: invalid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        ptext, ptype, pid = _record_to_prompt(rec, where, source)
        builder.add(ptext, ptype, pid, where)
    return builder.prompts


def _parse_json_array(doc: list[Any], source: str) -> list[Prompt]:
    builder = _Builder(source)
    for i, rec in enumerate(doc, start=1):
        where = f"item {i}"
        ptext, ptype, pid = _record_to_prompt(rec, where, source)
        builder.add(ptext, ptype, pid, where)
    if not builder.prompts:
        raise PromptFileError(f"{source}: the JSON array holds no prompts")
    return builder.prompts


def _parse_plain(text: str, source: str) -> list[Prompt]:
    builder = _Builder(source)
    block: list[str] = []
    start = 0
    n_block = 0

    def flush() -> None:
        nonlocal n_block
        if block:
            n_block += 1
            builder.add("\n".join(block), CUSTOM_TYPE, None, f"block {n_block} (line {start})")
            block.clear()

    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not block:
                start = lineno
            block.append(line)
        else:
            flush()
    flush()
    return builder.prompts


def _parse_text(text: str, source: str, suffix: str = "") -> list[Prompt]:
    """Detect the format of `text` (a file's content) and parse it."""
    if not text.strip():
        raise PromptFileError(f"{source}: file is empty")
    first = next(line for line in text.splitlines() if line.strip())

    if suffix in _JSONL_SUFFIXES or _looks_like_json_object_line(first):
        return _parse_jsonl(text, source)

    stripped = text.strip()
    if stripped[0] in "[{" or suffix == ".json":
        # A single (possibly pretty-printed) JSON document rather than JSON Lines.
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as exc:
            if suffix == ".json":
                skipped = text[: len(text) - len(text.lstrip())].count("\n")  # leading blank lines
                raise PromptFileError(
                    f"{source}: line {exc.lineno + skipped}: invalid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            doc = None  # not JSON after all: plain text that happens to start with a bracket
        if isinstance(doc, list):
            return _parse_json_array(doc, source)
        if isinstance(doc, dict):
            raise PromptFileError(
                f"{source}: a single multi-line JSON object; expected JSON Lines (one object per line)"
            )
        if suffix == ".json":
            raise PromptFileError(
                f"{source}: unknown format: a JSON {type(doc).__name__}, expected JSON Lines or an array"
            )
    return _parse_plain(text, source)


# ------------------------------------------------------------------------------------------------ API


def parse_types(arg: str) -> list[str]:
    """Parse a ``--types`` argument: ``"all"`` or a comma-separated list of `PROMPT_TYPES` names.

    Whitespace around names is ignored, as are empty items and repeats (first occurrence wins).
    Raises ValueError for an empty argument or an unknown type (the message lists the valid types).
    """
    if not isinstance(arg, str):
        raise TypeError(f"types must be a string, got {type(arg).__name__}")
    if arg.strip().lower() == "all":
        return list(PROMPT_TYPES)
    names = [part.strip() for part in arg.split(",") if part.strip()]
    if not names:
        raise ValueError(f"no prompt types given (use 'all' or a comma-separated list); {_valid_types_msg()}")
    return _validate_types(names)


def _validate_types(names: Sequence[str]) -> list[str]:
    unknown = [n for n in names if n not in PROMPT_TYPES]
    if unknown:
        raise ValueError(f"unknown prompt type(s): {', '.join(map(str, unknown))}; {_valid_types_msg()}")
    return list(dict.fromkeys(names))


@lru_cache(maxsize=1)
def _builtin_all() -> tuple[Prompt, ...]:
    text = resources.files(__package__).joinpath(_BUILTIN_FILE).read_text(encoding="utf-8")
    prompts = _parse_jsonl(text, f"<builtin {_BUILTIN_FILE}>")
    bad = sorted({p.type for p in prompts} - set(PROMPT_TYPES))
    if bad:  # a packaging bug, not a user error
        raise RuntimeError(f"built-in prompt set has unknown types: {', '.join(bad)}")
    return tuple(prompts)


def load_builtin(types: Sequence[str] | None = None, *, per_type: int | None = None) -> list[Prompt]:
    """The built-in prompts, grouped by type in the order of `types` (default: all of `PROMPT_TYPES`).

    Within a type, prompts keep their file order, so ``per_type=1`` gives each type's primary prompt
    (``<type>-01``) and ``per_type=N`` the first N. `types` may also be a string, parsed by `parse_types`.
    Raises ValueError for an unknown type (listing the valid ones), an empty `types`, or ``per_type < 1``.
    """
    if types is None:
        wanted = list(PROMPT_TYPES)
    elif isinstance(types, str):
        wanted = parse_types(types)
    else:
        wanted = _validate_types(list(types))
        if not wanted:
            raise ValueError(f"no prompt types given; {_valid_types_msg()}")
    if per_type is not None and (isinstance(per_type, bool) or not isinstance(per_type, int) or per_type < 1):
        raise ValueError(f"per_type must be a positive integer or None, got {per_type!r}")

    everything = _builtin_all()
    out: list[Prompt] = []
    for t in wanted:
        of_type = [p for p in everything if p.type == t]
        out.extend(of_type if per_type is None else of_type[:per_type])
    return out


def load_prompt_file(path: str | Path) -> list[Prompt]:
    """Read prompts from a user file, detecting its format from the content (see the module docstring).

    JSON Lines is chosen when the first non-blank line is a one-line JSON object (or the file ends in
    ``.jsonl``/``.ndjson``); a JSON array of such objects (any file, or one ending in ``.json``) is
    accepted too; anything else is plain text, one prompt per blank-line-separated block, type
    ``"custom"`` (so a plain-text prompt cannot contain a blank line: use JSON Lines for those).
    Types may be any non-empty string.
    Missing ids become ``<type>-<NN>`` (numbered per type, from 01). Prompt text is kept verbatim.

    Raises PromptFileError (a ValueError; one-line message naming the file, and the line where there is
    one) for: a missing or unreadable path, a binary or non-UTF-8 file, an empty file, invalid JSON on a
    line, a record with neither ``prompt`` nor ``turns`` (unknown format), an empty prompt, an empty
    type, a non-object record, a lone pretty-printed JSON object, or a duplicate id. Only reads the file.
    """
    p = Path(path)
    source = str(p)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise PromptFileError(f"{source}: no such prompt file") from None
    except IsADirectoryError:
        raise PromptFileError(f"{source}: is a directory, not a prompt file") from None
    except OSError as exc:
        raise PromptFileError(f"{source}: cannot read prompt file ({exc.strerror or exc})") from None

    if b"\x00" in data:
        raise PromptFileError(f"{source}: unknown format: binary data (NUL bytes), expected a text file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PromptFileError(
            f"{source}: unknown format: not UTF-8 text (bad byte at offset {exc.start})"
        ) from None
    return _parse_text(text, source, p.suffix.lower())


def encode_prompt(tokenizer, text: str, *, chat_template: bool = False) -> list[int]:
    """Token ids of a prompt: the tokenizer's default encoding (its special tokens, e.g. a BOS), or with
    `chat_template` the chat template around one user turn plus the generation prompt.

    Raises:
        ValueError: `chat_template` but the tokenizer has none; the prompt encodes to no tokens.
    """
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("--chat-template: this tokenizer has no chat template")
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(out, Mapping) or hasattr(out, "keys"):
            out = out["input_ids"]
        if out and isinstance(out[0], (list, tuple)):
            out = out[0]
        ids = [int(t) for t in out]
    else:
        ids = [int(t) for t in tokenizer(text)["input_ids"]]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids
