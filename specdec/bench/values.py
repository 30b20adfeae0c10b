"""The sweep's setting values as the command line and TOML files give them, parsed and checked: lists, batch
sizes, per-type K (``method:type=K``) and policy entries (``best``, ``cost``, ``METHOD:POLICY``). Pure
functions; `specdec.bench.config` and `specdec.bench.grid` read them."""

from __future__ import annotations

from typing import Any

from specdec.bench.methods import our_methods

__all__ = ["BEST_K", "MAX_BATCH", "as_list", "float_list", "int_list", "parse_batch_sizes", "parse_type_ks", "policy_name"]

#: A fixed K chosen per prompt: the K in 1..--policy-k that the prompt's acceptance trace, priced with its
#: calibration block, predicts fastest (`specdec.measure.pricing.TraceModel.best_fixed_k`; greedy sweeps with
#: traces); in a batch, the K the batch's costs price best for its rows.
BEST_K = "best"
#: Largest batch size a sweep may ask for.
MAX_BATCH = 16


def as_list(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"{what} must be a comma-separated string or a list, got {value!r}")


def int_list(value: Any, what: str, *, allow_empty: bool) -> tuple[int, ...]:
    items = as_list(value, what)
    out = []
    for item in items:
        try:
            k = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: {item!r} is not an integer") from None
        if isinstance(item, float) and item != k:
            raise ValueError(f"{what}: {item!r} is not an integer")
        if k < 1:
            raise ValueError(f"{what}: K must be >= 1, got {k}")
        out.append(k)
    if not out and not allow_empty:
        raise ValueError(f"{what}: give at least one value")
    return tuple(dict.fromkeys(out))


def float_list(value: Any, what: str) -> tuple[float, ...]:
    """Numbers as floats, in the given order, without repeats (ValueError: one that is not a number)."""
    out = []
    for item in as_list(value, what):
        try:
            out.append(float(item))
        except (TypeError, ValueError):
            raise ValueError(f"{what}: {item!r} is not a number") from None
    return tuple(dict.fromkeys(out))


def parse_type_ks(value: Any, methods: tuple[str, ...]) -> tuple[str, ...]:
    """Validate ``type_ks`` entries ``"method:type=K"`` (a comma-separated string or a list; ``type=K`` alone
    means every drafting method of the sweep) and return them normalized, one (method, type, K) per entry,
    in the order given without repeats.

    Raises:
        ValueError: an entry not of that form, a method that takes no K or is not in the sweep's methods,
            or K < 1 (one line naming the entry).
    """
    drafting = [m.name for m in our_methods() if m.takes_k and m.name in methods]
    out: list[str] = []
    for item in as_list(value, "type_ks"):
        entry = str(item).strip()
        head, eq, k_txt = entry.partition("=")
        method, colon, ptype = head.partition(":")
        if not colon:
            method, ptype = "", head
        method, ptype = method.strip().lower(), ptype.strip()
        try:
            k = int(k_txt)
        except ValueError:
            k = 0
        if not eq or not ptype or k < 1:
            raise ValueError(f"type_ks: {entry!r} is not method:type=K with K >= 1 (e.g. draft:code=3)")
        if method and method not in drafting:
            raise ValueError(f"type_ks: {entry!r}: {method!r} is not a drafting method of this sweep "
                             f"({', '.join(drafting) or 'none'})")
        for m in [method] if method else drafting:
            out.append(f"{m}:{ptype}={k}")
    return tuple(dict.fromkeys(out))


def policy_name(entry: str) -> str:
    """The policy of a `SweepConfig.policies` entry: ``"cost"`` for ``"cost"`` and for ``"draft:cost"``."""
    return entry.split(":", 1)[1] if ":" in entry else entry


def parse_batch_sizes(value: Any) -> tuple[int, ...]:
    """Batch sizes from a comma-separated string or a list: integers in 1..`MAX_BATCH`, ascending, no repeats.

    Raises:
        ValueError: one line: a value that is not an integer or out of range, or none given.
    """
    out = []
    for item in as_list(value, "batch_sizes"):
        try:
            b = int(item)
        except (TypeError, ValueError):
            raise ValueError(f"batch_sizes: {item!r} is not an integer") from None
        if not 1 <= b <= MAX_BATCH or (isinstance(item, float) and item != b):
            raise ValueError(f"batch_sizes: B must be an integer in 1..{MAX_BATCH}, got {item}")
        out.append(b)
    if not out:
        raise ValueError("batch_sizes: give at least one batch size, e.g. 1,2,4,8")
    return tuple(sorted(set(out)))
