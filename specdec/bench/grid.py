"""What the sweep times each prompt and each batch at: the fixed-K grids (per prompt type and drafting method),
the K policies of each drafting method, and the batch axis (which prompts make a batch of B, what a batch
runs, the largest K a batch prices, the forwards that price it). Pure functions of the settings; nothing here
loads a model.

The batch axis: a batch of B > 1 prompts is drawn from one prompt **group** of the sweep's selection
(`GROUPS`: code, prose, repetitive; a type outside them is a group of its own), the group's prompts taken
round-robin over its types (the first of each type, then the second, ...), so consecutive rows are of
different types. A group of n prompts gives ceil(n / B) batches at B, batch j holding prompts
``(j B + i) mod n`` (i < B): every prompt of the group is in a batch at every B, and the last batch of a group
smaller than a multiple of B starts over from its first prompt. A batch runs, besides batched target-only
decoding (its reference), the A/A run and every drafting method with a batched form
(`specdec.bench.methods.Method.batch`) under the sweep's policies that have a batch form: ``best`` as the
fixed K the batch's costs price best for its rows (`specdec.bench.batch_runs.resolve`), ``cost`` as the batch
cost policy; the fixed-K grids, the other policies and the peers are single-sequence only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specdec.bench.methods import METHODS, our_methods
from specdec.prompts import Prompt

if TYPE_CHECKING:
    from specdec.bench.config import SweepConfig

__all__ = [
    "BEST_K", "GROUPS", "MAX_BATCH", "batch_cost_ns", "batch_k", "batch_policies", "batch_units", "group_of",
    "method_ks", "parse_batch_sizes", "parse_type_ks", "policies_for", "policy_name", "type_ks_entries",
    "type_ks_for",
]  # fmt: skip

#: A fixed K chosen per prompt: the K in 1..--policy-k that the prompt's acceptance trace, priced with its
#: calibration block, predicts fastest (`specdec.measure.pricing.TraceModel.best_fixed_k`; greedy sweeps with
#: traces); in a batch, the K the batch's costs price best for its rows.
BEST_K = "best"
#: Largest batch size a sweep may ask for.
MAX_BATCH = 16
#: The prompt groups a batch is drawn from, by prompt type (a type outside them is a group of its own).
GROUPS: dict[str, tuple[str, ...]] = {
    "code": ("code", "code_json", "code_python", "technical_ml"),
    "prose": ("natural", "wikipedia_style", "technical", "creative_fiction", "dialogue"),
    "repetitive": ("repetitive", "repetitive_pattern", "list_items"),
}


def _as_list(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ValueError(f"{what} must be a comma-separated string or a list, got {value!r}")


def _int_list(value: Any, what: str, *, allow_empty: bool) -> tuple[int, ...]:
    items = _as_list(value, what)
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
    for item in _as_list(value, "type_ks"):
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


def type_ks_entries(cfg: SweepConfig) -> list[tuple[str, str, int]]:
    """`cfg.type_ks` (normalized by `parse_type_ks`) as ``(method, prompt_type, K)`` triples, in order."""
    out = []
    for e in cfg.type_ks:
        head, _, k = e.rpartition("=")
        method, _, ptype = head.partition(":")
        out.append((method, ptype, int(k)))
    return out


def type_ks_for(cfg: SweepConfig, method: str, prompt_type: str) -> tuple[int, ...]:
    """The extra fixed K of `cfg.type_ks` for one drafting method and prompt type (tokens, in order)."""
    return tuple(k for m, t, k in type_ks_entries(cfg) if (m, t) == (method, prompt_type))


def policy_name(entry: str) -> str:
    """The policy of a `SweepConfig.policies` entry: ``"cost"`` for ``"cost"`` and for ``"draft:cost"``."""
    return entry.split(":", 1)[1] if ":" in entry else entry


def policies_for(cfg: SweepConfig, method: str, *, primary: bool = True) -> tuple[str, ...]:
    """The policies timed for drafting `method` on a primary (or a non-primary) prompt: the entries without a
    method and those of the form ``method:policy``; never `BEST_K` for a cross-tokenizer method (no trace of
    it is recorded to choose K from: it runs at `method_ks` instead)."""
    entries = cfg.policies if primary else cfg.secondary_policies
    out = dict.fromkeys(policy_name(e) for e in entries if ":" not in e or e.split(":", 1)[0] == method)
    if method in METHODS and METHODS[method].cross_tokenizer:
        out.pop(BEST_K, None)
    return tuple(out)


def method_ks(cfg: SweepConfig, method: str) -> tuple[int, ...]:
    """The fixed K a method gets on every prompt besides the K grids: `SweepConfig.xtok_ks` for a
    cross-tokenizer method (`Method.cross_tokenizer`), none for the others."""
    return cfg.xtok_ks if method in METHODS and METHODS[method].cross_tokenizer else ()


# ------------------------------------------------------------------------------------------ the batch axis


def parse_batch_sizes(value: Any) -> tuple[int, ...]:
    """Batch sizes from a comma-separated string or a list: integers in 1..`MAX_BATCH`, ascending, no repeats.

    Raises:
        ValueError: one line: a value that is not an integer or out of range, or none given.
    """
    out = []
    for item in _as_list(value, "batch_sizes"):
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


def group_of(prompt_type: str) -> str:
    """The prompt group of a prompt type (`GROUPS`; the type itself outside them)."""
    return next((g for g, types in GROUPS.items() if prompt_type in types), prompt_type)


def batch_units(prompts: Sequence[Prompt], batch_size: int) -> list[tuple[str, tuple[Prompt, ...]]]:
    """``(batch_id, rows)`` of every batch of `batch_size` prompts (see the module docstring), group by group
    in the order the groups first appear in `prompts`; ``batch_id`` is `specdec.bench.store.batch_id_for`."""
    from specdec.bench.store_schema import batch_id_for

    groups: dict[str, dict[str, list[Prompt]]] = {}
    for p in prompts:
        groups.setdefault(group_of(p.type), {}).setdefault(p.type, []).append(p)
    out = []
    for group, by_type in groups.items():
        order = [t for t in GROUPS.get(group, ()) if t in by_type] + [t for t in by_type if t not in GROUPS.get(group, ())]
        pool = [by_type[t][i] for i in range(max(len(v) for v in by_type.values())) for t in order
                if i < len(by_type[t])]
        for j in range(-(-len(pool) // batch_size)):
            rows = tuple(pool[(j * batch_size + i) % len(pool)] for i in range(batch_size))
            out.append((batch_id_for(group, batch_size, j), rows))
    return out


def batch_policies(cfg: SweepConfig, method: str) -> tuple[str, ...]:
    """The policies drafting `method` runs at B > 1: those of `policies_for` (primary prompts) that have a batch
    form (`specdec.catalogue.policies.policy_names(batch=True)`), `BEST_K` among them (a fixed K)."""
    from specdec.catalogue.policies import policy_names

    return tuple(p for p in policies_for(cfg, method) if p == BEST_K or p in policy_names(batch=True))


def batch_k(cfg: SweepConfig, batch_size: int) -> int:
    """The largest K a batch of `batch_size` rows prices (policy ``best``'s range, the cost policy's largest K):
    ``--policy-k``, capped as ``generate`` caps a batch's K (`specdec.policies.batch.batch_k_max`:
    B x (K + 1) <= 128 tokens)."""
    from specdec.policies.batch import batch_k_max

    return min(cfg.policy_k, batch_k_max(batch_size))


def batch_cost_ns(cfg: SweepConfig) -> tuple[list[int], list[int]]:
    """``(target ns, draft ns)`` that price every batch size of the sweep: `specdec.measure.timing.batch_ns` of
    each B > 1 up to B x (`batch_k` + 1) tokens (empty without one)."""
    from specdec.measure.timing import batch_ns

    target: set[int] = set()
    draft: set[int] = set()
    for b in cfg.batch_sizes:
        if b > 1:
            t, d = batch_ns(b, b * (batch_k(cfg, b) + 1))
            target.update(t)
            draft.update(d)
    return sorted(target), sorted(draft)
