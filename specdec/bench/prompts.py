"""The study's prompt set: at least five original completion prompts for each of the twelve `PROMPT_TYPES`
(`prompts.jsonl`, shipped in this package); the first of each type (id ``<type>-01``) is the primary prompt
that full sweeps run on. A user's own prompt file is read by `specdec.prompts.read_prompts`."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from importlib import resources

from specdec.prompts import Prompt, parse_prompts

__all__ = ["PROMPT_TYPES", "load_builtin", "parse_types"]

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

_BUILTIN_FILE = "prompts.jsonl"


def _valid_types_msg() -> str:
    return "valid types: " + ", ".join(PROMPT_TYPES)



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
    prompts = parse_prompts(text, f"<builtin {_BUILTIN_FILE}>", ".jsonl")
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
