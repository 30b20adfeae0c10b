"""Split a sweep's plan into N shards by prompt, so N machines can run one sweep (``specdec sweep --shard I/N``).

The rule (deterministic, the same in every process and on every machine):

1. within each prompt type, the prompts are ranked by id (rank 0 = the lowest id, ``<type>-01`` in the
   built-in set: the primary prompt, which `specdec.bench.sweep.primary_ids` picks as the first of its
   type);
2. the prompts are listed rank by rank (every type's rank 0, types sorted by name, then every rank 1, ...);
3. prompt number j (0-based) of that list goes to shard ``j mod N + 1`` (round-robin).

Why round-robin over a sorted list rather than a hash of the prompt id: with a dozen prompts a hash leaves
shards very unequal (12 prompts over 4 shards by hash is often 6/2/2/2, so the study takes 1/2 instead of
1/4 of the time), while round-robin gives every shard ``ceil(P/N)`` or ``floor(P/N)`` prompts; dealing the
primaries first also spreads them (they carry the full K grid, the policies and the peers, ~10x the runs of
another prompt) evenly. The assignment depends only on the set of prompt ids and types, not on their order in a
prompt file, and the prompt set is part of the sweep identity
(`specdec.bench.sweep.meaning`), never on the grid (Ks, methods, repeats): resuming a shard with a larger
grid keeps every prompt on the shard that already holds its baseline.

Everything of one prompt (its baseline, speculative runs, policies, peers, all repeats and all runtime
configurations) lands in one shard, so every speedup is taken between runs of one machine. The shard is
NOT part of the sweep identity: all shards of a sweep share its ``sweep_id``; the shard is recorded per
store as metadata (``shards`` table, `specdec.bench.machines`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.store_info import missing_shards  # re-exported: the bench's shard API

__all__ = ["Shard", "assign_prompts", "missing_shards", "parse_shard", "shard_plan", "split_plan"]

_SHARD_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (1-based: ``1/4`` ... ``4/4``), as ``--shard I/N`` and SLURM's
    ``--array=1-N`` number them."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise ValueError(f"--shard {self.index}/{self.count}: need 1 <= I <= N (e.g. 1/4 ... 4/4)")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def tag(self) -> str:
        """``"shard-I-of-N"``: for file names."""
        return f"shard-{self.index}-of-{self.count}"


def parse_shard(text: str | Shard | None) -> Shard | None:
    """``"I/N"`` -> `Shard` (None and ``"1/1"`` stay as given: None means no sharding).

    Raises:
        ValueError: not of the form I/N with integers 1 <= I <= N (one line, e.g. for ``3/2``, ``0/0``, ``x``).
    """
    if text is None or isinstance(text, Shard):
        return text
    m = _SHARD_RE.match(str(text))
    if m is None:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 1/4 (shard I of N, 1 <= I <= N)")
    return Shard(int(m.group(1)), int(m.group(2)))


def _prompt_order(prompts: Sequence[Any]) -> list[Any]:
    """The prompts dealt round-robin: rank 0 of every type (the lowest id of the type), types sorted, then
    rank 1 of every type, ... (ranks by sorted id within a type; duplicates of an id count once)."""
    by_type: dict[str, list[Any]] = {}
    for p in {p.id: p for p in prompts}.values():
        by_type.setdefault(str(p.type), []).append(p)
    ranked = sorted(
        ((rank, t, p.id), p)
        for t, ps in by_type.items()
        for rank, p in enumerate(sorted(ps, key=lambda q: q.id))
    )
    return [p for _, p in ranked]


def assign_prompts(prompts: Sequence[Any], count: int) -> dict[str, int]:
    """prompt id -> shard index (1-based) for `count` shards (see the module docstring for the rule).

    Args:
        prompts: the sweep's prompts (objects with ``id`` and ``type``, e.g. `specdec.bench.prompts.Prompt`).
        count: N >= 1.

    Raises:
        ValueError: count < 1.
    """
    if count < 1:
        raise ValueError(f"shard count must be >= 1, got {count}")
    return {p.id: j % count + 1 for j, p in enumerate(_prompt_order(prompts))}


def shard_plan(plan: Sequence[Any], prompts: Sequence[Any], shard: Shard | str | None) -> list[Any]:
    """The runs of `plan` (`specdec.bench.plan.PlannedRun` s, in their order) whose prompt belongs to `shard`.

    Args:
        plan: the full plan (`build_plan`).
        prompts: the sweep's prompts (the assignment depends on them only, not on the grid).
        shard: a `Shard`, ``"I/N"`` or None (None: the whole plan).

    Raises:
        ValueError: bad `shard` text, or the shard holds no prompt (N larger than the number of prompts).
    """
    shard = parse_shard(shard)
    if shard is None:
        return list(plan)
    owner = assign_prompts(prompts, shard.count)
    mine = {pid for pid, i in owner.items() if i == shard.index}
    if not mine:
        raise ValueError(f"--shard {shard}: the sweep has only {len(owner)} prompts, so shard {shard.index} "
                         f"would be empty; use N <= {len(owner)}")
    return [c for c in plan if c.prompt.id in mine]


def split_plan(plan: Sequence[Any], prompts: Sequence[Any], count: int) -> list[list[Any]]:
    """The plan split into `count` shards: element i is `shard_plan` of shard i + 1 (empty shards kept).

    The shards partition the plan: disjoint, their union is the plan, each prompt in exactly one.
    """
    owner = assign_prompts(prompts, count)
    out: list[list[Any]] = [[] for _ in range(count)]
    for c in plan:
        out[owner[c.prompt.id] - 1].append(c)
    return out
