"""Every K policy, named once: what it is called, its default K, whether it needs measured costs, and how it
is built for one sequence and for a batch of rows.

A K policy chooses how many tokens to draft each round (`specdec.policies.base.KPolicy`; for a batch, one K
for every row, `specdec.policies.batch.BatchKPolicy`). The command line (``--policy``), the Python API
(``policy=``), the sweep's methods and the trace replay build policies here only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdec.policies.base import KPolicy
    from specdec.policies.batch import BatchKPolicy

__all__ = ["ADAPTIVE_POLICIES", "POLICIES", "PolicyEntry", "batch_policy", "make_policy", "policy", "policy_names", "resolve_policy"]


@dataclass(frozen=True)
class PolicyEntry:
    """One K policy.

    Attributes:
        name: its one name (``--policy``, ``policy=``, ``runs.policy``). help: one line for ``--help``.
        default_k: the K it gets when none is given (fixed and the heuristic's start: 4; the largest K of the
            confidence stop: 16; of the cost policy: 64, since it prices every K on the measured curve and a
            repeat drafted whole pays where verification rises in steps, `specdec.core.costs.TILE_STEP`).
        needs_costs: it prices K on a measured cost curve (the cost policy).
        build: ``build(k, costs, pad_verify, **options)`` -> the policy of one sequence; `costs` a
            `specdec.core.costs.CostCurve` (or its dict) with the drafter's step (0 for a model-free one);
            `options` the policy's own (``confidence_threshold``, the heuristic's ``max_k``).
        build_batch: ``build_batch(k, curve, draft_cost)`` -> its form for a batch (one K per round for every
            row; `curve` prices a forward of n tokens in all, `draft_cost(rows, K)` a batch's drafting, None
            when drafting is free); None: no batch form.
    """

    name: str
    help: str
    default_k: int
    build: Callable[..., KPolicy]
    needs_costs: bool = False
    build_batch: Callable[[int, Any, Any], BatchKPolicy] | None = None


def _fixed(k, costs, pad_verify, **options):
    from specdec.policies.base import FixedK

    return FixedK(k, **options)


def _fixed_batch(k, curve, draft_cost):
    from specdec.policies.batch import FixedBatchK

    return FixedBatchK(k)


def _heuristic(k, costs, pad_verify, **options):
    from specdec.policies.base import HeuristicK

    return HeuristicK(k, **options)


def _confidence(k, costs, pad_verify, **options):
    from specdec.policies.base import ConfidenceK

    return ConfidenceK(k, **{"confidence_threshold": 0.4, **options})


def _cost(k, costs, pad_verify, **options):
    from specdec.policies.cost import CostPolicy

    return CostPolicy.from_costs(costs, max_k=k, pad_verify=pad_verify, **options)


def _cost_batch(k, curve, draft_cost):
    from specdec.policies.batch_cost import BatchCostPolicy

    return BatchCostPolicy(curve.forward_s, max_k=k, draft_cost=draft_cost)


#: Every K policy by name, in the order the command line lists them.
POLICIES: dict[str, PolicyEntry] = {p.name: p for p in (
    PolicyEntry("fixed", "always K (Leviathan et al. 2023)", 4, _fixed, build_batch=_fixed_batch),
    PolicyEntry("heuristic", "K += 2 after a fully accepted round, K -= 1 otherwise (transformers' schedule)", 4,
                _heuristic),
    PolicyEntry("confidence", "K every round; the draft model stops below a top probability of 0.4", 16,
                _confidence),
    PolicyEntry("cost", "K per round from the measured costs and the running acceptance, never losing more "
                "than about a step and 1% to target-only", 64, _cost, needs_costs=True, build_batch=_cost_batch),
)}


#: The policies that choose K per round (every one but ``fixed``).
ADAPTIVE_POLICIES = tuple(n for n in POLICIES if n != "fixed")


def policy_names(batch: bool = False) -> tuple[str, ...]:
    """The policies' names (with `batch`: those with a batch form)."""
    return tuple(n for n, p in POLICIES.items() if not batch or p.build_batch is not None)


def policy(name: str) -> PolicyEntry:
    """The entry of a policy name (case-insensitive).

    Raises:
        ValueError: an unknown name (the message lists the names).
    """
    key = str(name).strip().lower()
    if key not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    return POLICIES[key]


def resolve_policy(name: str | None, k: int | None, *, batch: bool = False) -> tuple[PolicyEntry, int]:
    """``(policy, K)`` from what a user gave: `k` alone is a fixed K; neither gives the cost policy at its
    default K; a policy alone gets its default K.

    Raises:
        ValueError: an unknown policy, one without a batch form when `batch`, or K < 1.
    """
    entry = policy(name if name is not None else ("fixed" if k is not None else "cost"))
    if batch and entry.build_batch is None:
        raise ValueError(f"a batch runs one K per round for every row: policy {entry.name!r} is not available; "
                         f"choose {' or '.join(policy_names(batch=True))}")
    if k is not None and (isinstance(k, bool) or int(k) != k or int(k) < 1):
        raise ValueError(f"K must be an integer >= 1, got {k!r}")
    return entry, int(k) if k is not None else entry.default_k


def make_policy(name: str, k: int, *, costs: Any = None, pad_verify: bool = False, free_drafts: bool = False,
                **options: Any) -> KPolicy:
    """The policy `name` of one sequence at K = `k` (the fixed K, the heuristic's start, or the largest K).

    Args:
        costs: for a policy that `needs_costs`: a `specdec.core.costs.CostCurve` or its dict
            (``{"draft_step_s": s, "target_forward_s": {n: s}, ...}``).
        pad_verify: price verification at the padded shape (`specdec.policies.cost.CostPolicy`).
        free_drafts: the drafter needs no model step: its drafted tokens are priced at 0 s.
        options: the policy's own settings (``confidence_threshold`` for ``confidence``, default 0.4; ``max_k``
            for ``heuristic``, a cap on its K; `specdec.policies.cost.CostPolicy`'s keywords for ``cost``).

    Raises:
        ValueError: an unknown name, K < 1, or a policy that needs costs without them.
        TypeError: an option the policy does not take.
    """
    entry = policy(name)
    if entry.needs_costs:
        if costs is None:
            raise ValueError(f"the {entry.name} policy needs measured costs (draft_step_s, target_forward_s): "
                             "measure them with `specdec costs` or pass stored ones")
        if free_drafts:
            from specdec.core.costs import CostCurve

            costs = (costs if isinstance(costs, CostCurve) else CostCurve.from_costs(costs)).with_draft_step(0.0)
    return entry.build(int(k), costs, pad_verify, **options)


def batch_policy(name: str, k: int, *, curve: Any = None, draft_cost: Any = None) -> BatchKPolicy:
    """The batch form of policy `name` at K = `k` (the fixed K or the largest K).

    Args:
        curve: for a policy that `needs_costs`: the batch's cost curve (``forward_s(n)`` over n tokens in all).
        draft_cost: ``draft_cost(rows, K)`` seconds of drafting (None: model-free drafting).

    Raises:
        ValueError: an unknown name, no batch form, or costs missing.
    """
    entry, k = resolve_policy(name, k, batch=True)
    if entry.needs_costs and curve is None:
        raise ValueError(f"the batch {entry.name} policy needs measured costs")
    return entry.build_batch(k, curve, draft_cost)
