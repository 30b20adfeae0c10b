"""Prompts for every command: the one reader of prompt files and the one encoding of a prompt's text.

`read_prompts` reads a user's file in one of four formats, detected from the content (never from the suffix
alone), so ``specdec generate --prompts-file F``, ``specdec sweep --prompts F`` and the Python API read the
same prompts from the same file:

1. JSON Lines, one object per line with ``"prompt"`` and optionally ``"type"`` (or ``"category"``), ``"id"``
   and ``"max_new_tokens"`` (that prompt's own budget);
2. Spec-Bench's ``question.jsonl`` (``question_id``, ``category``, ``turns``; the first turn is used);
3. a JSON array of such objects;
4. plain text, one prompt per blank-line-separated block (type ``"custom"``): a prompt spans lines, and a
   blank line ends it.

A UTF-8 byte-order mark is dropped. A plain-text file with a line that is a one-line JSON object is refused
(it would otherwise be decoded with its literal JSON as a prompt). Every problem with a file is a
`PromptFileError` whose message is one line naming the file (and the line, where there is one). The reader
only reads files; it never touches a model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CUSTOM_TYPE", "Prompt", "PromptFileError", "encode_prompt", "parse_prompts", "read_prompts"]

CUSTOM_TYPE = "custom"
_JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson"})


@dataclass(frozen=True)
class Prompt:
    """One prompt: a unique `id`, its `type` (category), the completion `text`, its own new-token budget
    (None: the command's) and where it was read (``"line 3"``, ``"block 2 (line 5)"``, ``"item 4"``)."""

    id: str
    type: str
    text: str
    max_new_tokens: int | None = None
    where: str = field(default="", compare=False)


class PromptFileError(ValueError):
    """A prompt file is missing, unreadable, empty, malformed or inconsistent (one-line message)."""


# --------------------------------------------------------------------------------------------- helpers


def _short(value: Any, limit: int = 40) -> str:
    """A one-line, length-limited repr for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."



class _Builder:
    """Collects prompts from one source, generating missing ids and rejecting duplicate ones."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.prompts: list[Prompt] = []
        self._id_origin: dict[str, str] = {}  # id -> where it was first seen ("line 3", "block 2")
        self._per_type: dict[str, int] = {}

    def add(self, text: str, ptype: str, pid: str | None, where: str, budget: int | None = None) -> None:
        n = self._per_type.get(ptype, 0) + 1
        self._per_type[ptype] = n
        if pid is None:
            pid = f"{ptype}-{n:02d}"
        if pid in self._id_origin:
            raise PromptFileError(
                f"{self.source}: {where}: duplicate id {pid!r} (first used on {self._id_origin[pid]})"
            )
        self._id_origin[pid] = where
        self.prompts.append(Prompt(id=pid, type=ptype, text=text, max_new_tokens=budget, where=where))


def _record_to_prompt(rec: Any, where: str, source: str) -> tuple[str, str, str | None, int | None]:
    """(text, type, id or None, max_new_tokens or None) from one JSON record, prompt-style or Spec-Bench-style."""
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
    budget = rec.get("max_new_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise PromptFileError(f"{err}: 'max_new_tokens' must be an integer >= 0, got {_short(budget)}")
    return text, raw_type.strip(), pid, budget


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
        ptext, ptype, pid, budget = _record_to_prompt(rec, where, source)
        builder.add(ptext, ptype, pid, where, budget)
    return builder.prompts


def _parse_json_array(doc: list[Any], source: str) -> list[Prompt]:
    builder = _Builder(source)
    for i, rec in enumerate(doc, start=1):
        where = f"item {i}"
        ptext, ptype, pid, budget = _record_to_prompt(rec, where, source)
        builder.add(ptext, ptype, pid, where, budget)
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
        if _looks_like_json_object_line(line):
            raise PromptFileError(f"{source}: line {lineno} is a JSON object, but the file is read as plain text "
                                  "(its first line is not one): make every non-blank line a JSON object")
        if line.strip():
            if not block:
                start = lineno
            block.append(line)
        else:
            flush()
    flush()
    return builder.prompts


def parse_prompts(text: str, source: str, suffix: str = "") -> list[Prompt]:
    """The prompts of `text` (a file's content; `source` names it in messages, `suffix` is its file suffix,
    lower case), its format detected as `read_prompts` does.

    Raises:
        PromptFileError: as `read_prompts`.
    """
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


def read_prompts(path: str | Path) -> list[Prompt]:
    """Read prompts from a user file, detecting its format from the content (see the module docstring).

    JSON Lines is chosen when the first non-blank line is a one-line JSON object (or the file ends in
    ``.jsonl``/``.ndjson``); a JSON array of such objects (any file, or one ending in ``.json``) is
    accepted too; anything else is plain text, one prompt per blank-line-separated block, type
    ``"custom"`` (so a plain-text prompt cannot contain a blank line: use JSON Lines for those).
    Types may be any non-empty string; ``"max_new_tokens"`` an integer >= 0.
    Missing ids become ``<type>-<NN>`` (numbered per type, from 01). Prompt text is kept verbatim.

    Raises PromptFileError (a ValueError; one-line message naming the file, and the line where there is
    one) for: a missing or unreadable path, a binary or non-UTF-8 file, an empty file, invalid JSON on a
    line, a record with neither ``prompt`` nor ``turns`` (unknown format), an empty prompt, an empty
    type, a bad ``max_new_tokens``, a non-object record, a lone pretty-printed JSON object, a JSON object
    line inside a plain-text file, or a duplicate id. Only reads the file.
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
    return parse_prompts(text, source, p.suffix.lower())


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
