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
from typing import TYPE_CHECKING

from specdec.bench.methods import METHODS
from specdec.bench.values import BEST_K, policy_name
from specdec.prompts import Prompt

if TYPE_CHECKING:
    from specdec.bench.config import SweepConfig

__all__ = [
    "GROUPS",
    "batch_cost_ns",
    "batch_k",
    "batch_policies",
    "batch_units",
    "group_of",
    "idle_policies",
    "method_ks",
    "policies_for",
    "policy_k",
    "sweep_policy_ks",
    "type_ks_entries",
    "type_ks_for",
]  # fmt: skip

#: The prompt groups a batch is drawn from, by prompt type (a type outside them is a group of its own).
GROUPS: dict[str, tuple[str, ...]] = {
    "code": ("code", "code_json", "code_python", "technical_ml"),
    "prose": ("natural", "wikipedia_style", "technical", "creative_fiction", "dialogue"),
    "repetitive": ("repetitive", "repetitive_pattern", "list_items"),
}


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


def policies_for(cfg: SweepConfig, method: str, *, primary: bool = True) -> tuple[str, ...]:
    """The policies timed for drafting `method` on a primary (or a non-primary) prompt: the entries without a
    method and those of the form ``method:policy``; never `BEST_K` for a cross-tokenizer method (no trace of
    it is recorded to choose K from: it runs at `method_ks` instead)."""
    entries = cfg.policies if primary else cfg.secondary_policies
    out = dict.fromkeys(policy_name(e) for e in entries if ":" not in e or e.split(":", 1)[0] == method)
    if method in METHODS and METHODS[method].cross_tokenizer:
        out.pop(BEST_K, None)
    return tuple(out)


#: The largest K of ``best`` (the fixed K the prompt's trace predicts fastest) without ``--policy-k``: the
#: largest K of the original study's grid.
BEST_K_MAX = 16


def policy_k(cfg: SweepConfig, policy: str) -> int:
    """The K a policy runs at in the sweep (the heuristic's start, the largest K of the others, ``best``'s
    range): ``--policy-k`` when given, else the policy's own default (`specdec.catalogue.policies`, as
    ``generate`` gives it; `BEST_K_MAX` for ``best``)."""
    if policy == BEST_K:
        return BEST_K_MAX if cfg.policy_k is None else int(cfg.policy_k)
    from specdec.catalogue.policies import resolve_policy

    return resolve_policy(policy, cfg.policy_k)[1]


def sweep_policy_ks(cfg: SweepConfig) -> list[int]:
    """`policy_k` of every policy the sweep names (primary and secondary)."""
    return [policy_k(cfg, policy_name(e)) for e in (*cfg.policies, *cfg.secondary_policies)]


def idle_policies(cfg: SweepConfig) -> str | None:
    """A line naming the ``method:policy`` entries of the policies that plan nothing because `method` is not
    among the sweep's methods (``--policies mixed:cost --methods baseline,draft``; under sampling the default
    methods are those a sampled trace replays); None when every entry plans runs."""
    idle = dict.fromkeys(e for e in (*cfg.policies, *cfg.secondary_policies)
                         if ":" in e and e.split(":", 1)[0] not in cfg.methods)
    if not idle:
        return None
    why = "" if cfg.greedy else " (under sampling the default methods are those a sampled trace replays)"
    return f"nothing planned for policy {', '.join(idle)}: not among the methods {','.join(cfg.methods)}{why}"


def method_ks(cfg: SweepConfig, method: str) -> tuple[int, ...]:
    """The fixed K a method gets on every prompt besides the K grids: `SweepConfig.xtok_ks` for a
    cross-tokenizer method (`Method.cross_tokenizer`), none for the others."""
    return cfg.xtok_ks if method in METHODS and METHODS[method].cross_tokenizer else ()


# ------------------------------------------------------------------------------------------ the batch axis


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
    the largest `policy_k` of the sweep's policies, capped as ``generate`` caps a batch's K
    (`specdec.policies.batch.batch_k_max`: at most 16, and B x (K + 1) <= 128 tokens)."""
    from specdec.policies.batch import batch_k_max

    return min(max(sweep_policy_ks(cfg), default=BEST_K_MAX), batch_k_max(batch_size))


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
