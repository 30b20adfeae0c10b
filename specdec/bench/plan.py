"""The plan of a sweep: its prompts, its cells in execution order, and its identity (`prepare`).

Vocabulary: a **cell** is (config_label, prompt, method, K, policy); a **run** is one timed generation of a
cell, and a `PlannedRun` is one run to do (cell x repeat; `PlannedRun.cell` is its cell). A batched run
decodes the B prompts of one batch together (`specdec.bench.grid`); its cell is (config_label, batch, method,
K, policy), and it is stored as B rows.
Everything in this module is checked without loading a model.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdec.bench.config import RUNTIME_CONFIGS, SweepConfig, check_available
from specdec.bench.grid import (
    batch_k,
    batch_policies,
    batch_units,
    method_ks,
    policies_for,
    policy_k,
    sweep_policy_ks,
    type_ks_entries,
    type_ks_for,
)
from specdec.bench.methods import METHODS, our_methods, peer_methods, reference_method
from specdec.bench.prompts import load_builtin
from specdec.bench.store import cell_key, model_identity, sweep_id_for
from specdec.prompts import Prompt, read_prompts

__all__ = [
    "PlannedRun",
    "Prepared",
    "build_plan",
    "calibration_passes",
    "cost_max_n",
    "meaning",
    "plan_summary",
    "prepare",
    "primary_ids",
    "rebracket",
    "select_prompts",
]


def select_prompts(cfg: SweepConfig) -> list[Prompt]:
    """The prompts of the sweep: the built-in set (`prompts_per_type` per type) or the prompt file, filtered
    by `prompt_types`. Reads files only; no model is touched.

    Raises:
        PromptFileError (ValueError): the file is unusable. ValueError: unknown types / nothing selected.
    """
    if cfg.prompts is None:
        prompts = load_builtin(cfg.prompt_types, per_type=cfg.prompts_per_type)
    else:
        prompts = read_prompts(cfg.prompts)
        if cfg.prompt_types.lower() != "all":
            wanted = [t.strip() for t in cfg.prompt_types.split(",") if t.strip()]
            prompts = [p for p in prompts if p.type in wanted]
            if not prompts:
                raise ValueError(f"{cfg.prompts}: no prompt of type(s) {', '.join(wanted)}")
    if not prompts:
        raise ValueError("no prompts selected")
    return prompts


def primary_ids(prompts: Sequence[Prompt]) -> set[str]:
    """Ids of the primary prompts: the first prompt of each type (``<type>-01`` in the built-in set)."""
    seen: dict[str, str] = {}
    for p in prompts:
        seen.setdefault(p.type, p.id)
    return set(seen.values())


@dataclass(frozen=True)
class PlannedRun:
    """One run to do: a cell x repeat. ``k`` is None for ``baseline``/``hf_generate``; ``policy`` is
    ``"fixed"`` or an adaptive policy for ``draft``/``ngram`` and None for baseline and peers.

    A batched run (B > 1) has its batch's prompts in `rows` and its id in `batch_id`
    (`specdec.bench.store.batch_id_for`); `prompt` is its first row's (the shard that runs the batch)."""

    config_label: str
    prompt: Prompt
    method: str
    k: int | None
    policy: str | None
    repeat: int
    primary: bool = True
    rows: tuple[Prompt, ...] = ()
    batch_id: str | None = None

    @property
    def batch_size(self) -> int:
        return len(self.rows) or 1

    @property
    def unit(self) -> str:
        """What the run is paired within (its bracket's target-only runs): the prompt's id, or the batch's."""
        return self.batch_id or self.prompt.id

    def key(self, sweep_id: str) -> str:
        """The run's ``cell_key`` (a batched run's first row's: its rows are stored together)."""
        return self.row_key(sweep_id, 0)

    def is_done(self, sweep_id: str, done: set[str]) -> bool:
        """Whether the run is stored successfully: its key (every row's, for a batched run) in `done`."""
        return all(self.row_key(sweep_id, i) in done for i in range(self.batch_size))

    def row_key(self, sweep_id: str, row: int) -> str:
        """The ``cell_key`` of row `row` of a batched run (of the run itself for a single sequence)."""
        pid = self.rows[row].id if self.rows else self.prompt.id
        return cell_key(sweep_id, self.config_label, pid, self.method, self.k, self.policy, self.repeat,
                        self.batch_id, row if self.batch_id is not None else None)

    @property
    def group(self) -> tuple:
        """(config_label, method, k, policy, B): what one warm-up covers."""
        return (self.config_label, self.method, self.k, self.policy, self.batch_size)

    @property
    def cell(self) -> tuple:
        """(config_label, prompt or batch id, method, k, policy): the cell, all repeats."""
        return (self.config_label, self.unit, self.method, self.k, self.policy)

    def describe(self) -> str:
        what = self.method
        if self.k is not None:
            what += f" K={self.k}"
        if self.policy not in (None, "fixed"):
            what += f" {self.policy}"
        where = f"batch {self.batch_id} (B={self.batch_size})" if self.batch_id else self.prompt.id
        return f"[{self.config_label}] {where} {what}"


Group = tuple[str, int | None, str | None]  # (method, K, policy) of one run of a pass


def build_plan(cfg: SweepConfig, prompts: Sequence[Prompt]) -> list[PlannedRun]:
    """Every run of the sweep, in execution order, per config: the prompts' runs (B = 1, when
    ``batch_sizes`` holds 1), then each larger B's batches (`specdec.bench.grid.batch_units`).

    A prompt's (or batch's) other runs (the A/A run ``aa``, draft and ngram over K, their policies, the peers)
    form one pass; with ``repeats`` > 1 the pass runs once per repeat (repeat 0 of every run, then repeat 1
    ...), so a machine that slows down inside a prompt's window hits every method in every pass.

    - ``pairing="bracket"`` (default): a target-only baseline run before each run of the pass and one after
      the last (B X1 B X2 ... Xn B); each X is then timed between two baselines adjacent in time, and its
      speedup is the ratio to those two (a drift of the machine's speed cancels out of the ratio). In a
      batch, the baselines are batched target-only runs of the same prompts at the same B.
    - ``pairing="none"``: baseline first, the pass, then ``baseline_repeats - repeats`` extra baselines.

    Primary prompts (first of each type) get `ks`, the policies and the peers; the others get
    `secondary_ks`, `secondary_policies` and, with `secondary_peers`, the peers only; every prompt also gets
    its type's `type_ks` (after its grid, a K already in the grid not repeated) and its method's `method_ks`
    (a cross-tokenizer draft's fixed K).
    A batch gets the methods with a batched form under the policies with one (`specdec.bench.grid`).
    Baseline runs of a prompt (a batch) are numbered 0, 1, ... in plan order (their ``repeat``).
    """
    prim = primary_ids(prompts)
    types = {p.type for p in prompts}
    unknown = sorted({t for _, t, _ in type_ks_entries(cfg)} - types)
    if unknown:
        raise ValueError(f"type_ks names prompt type(s) not in this sweep: {', '.join(unknown)} "
                         f"(its types: {', '.join(sorted(types))})")
    turn = {pid: i for i, pid in enumerate(p.id for p in prompts if p.id in prim)}
    plan: list[PlannedRun] = []
    for label in cfg.configs:
        if 1 in cfg.batch_sizes:
            for prompt in prompts:
                groups = _prompt_groups(cfg, label, prompt, turn.get(prompt.id))
                priced = prompt.id not in prim and not groups and cfg.checks_per_prompt > 0
                plan += _pass(cfg, groups, lambda m, k, p, r, prompt=prompt, label=label: PlannedRun(
                    label, prompt, m, k, p, r, prompt.id in prim), priced=priced)
        for b in cfg.batch_sizes:
            if b == 1:
                continue
            groups = _batch_groups(cfg, b)
            for batch_id, rows in batch_units(prompts, b):
                plan += _pass(cfg, groups, lambda m, k, p, r, rows=rows, batch_id=batch_id, label=label: PlannedRun(
                    label, rows[0], m, k, p, r, True, rows, batch_id))
    return plan


def calibration_passes(cfg: SweepConfig, plan: Sequence[PlannedRun], label: str, prompt_id: str) -> int:
    """Passes of the calibration block for one prompt: ``calibration_repeats`` where the prompt has timed runs
    besides target-only in `plan` (the cost policy and policy ``best`` decide with its block), at most one
    for a prompt that is priced only (its block prices its trace's replay); ``calibration_repeats`` everywhere
    with ``checks_per_prompt`` 0."""
    if cfg.checks_per_prompt == 0:  # nothing is priced only: every prompt's block as before dealing
        return cfg.calibration_repeats
    base = reference_method().name
    timed = any(c.config_label == label and c.prompt.id == prompt_id and c.method != base and c.batch_id is None
                for c in plan)
    return cfg.calibration_repeats if timed else min(cfg.calibration_repeats, 1)


def _prompt_groups(cfg: SweepConfig, label: str, prompt: Prompt, turn: int | None) -> list[Group]:
    """The runs of one prompt's pass, baselines aside (see `build_plan`); `turn` is the prompt's place among
    the primaries (None: not a primary).

    The checks (the plain methods such as the A/A run, and the policies) of a primary are dealt out in turn
    when ``checks_per_prompt`` > 0: the j-th primary gets checks ``j*n .. j*n + n - 1`` (mod their number) of
    the list, so every check is timed on about the same number of primaries. With ``checks_per_prompt`` > 0 a
    non-primary prompt without K grid or policy cells is priced only (its one target-only run, trace and
    calibration block: no plain method); with 0 every prompt gets the plain methods, as before dealing."""
    is_primary = turn is not None
    rc = RUNTIME_CONFIGS[label]
    peers = [m for m in peer_methods() if (cfg.peers or m.name in cfg.methods) and m.applies(rc)]
    plain = [m.name for m in our_methods() if not m.takes_k and not m.reference and m.name in cfg.methods]
    drafting = [m.name for m in our_methods() if m.takes_k and m.name in cfg.methods]
    ks = cfg.ks if is_primary else cfg.secondary_ks
    grid: list[Group] = []
    for m in drafting:
        extra = type_ks_for(cfg, m, prompt.type)
        grid.extend((m, k, "fixed") for k in ks)
        grid.extend((m, k, "fixed") for k in extra if k not in ks)
        grid.extend((m, k, "fixed") for k in method_ks(cfg, m) if k not in ks and k not in extra)
    policies: list[Group] = [(m, policy_k(cfg, p), p) for m in drafting
                             for p in policies_for(cfg, m, primary=is_primary)]
    timed_peers = is_primary or cfg.secondary_peers
    if not is_primary and not grid and not policies and not (timed_peers and peers) and cfg.checks_per_prompt > 0:
        return []
    checks: list[Group] = [(m, None, None) for m in plain] + policies
    n = cfg.checks_per_prompt
    if is_primary and 0 < n < len(checks):
        dealt = {(turn * n + j) % len(checks) for j in range(n)}
        checks = [c for i, c in enumerate(checks) if i in dealt]
    groups = [c for c in checks if c[1] is None] + grid + [c for c in checks if c[1] is not None]
    if timed_peers:
        for pm in peers:
            groups.extend((pm.name, k, None) for k in (cfg.peer_ks if pm.takes_k else (None,)))
    return groups


def _batch_groups(cfg: SweepConfig, batch_size: int) -> list[Group]:
    """The runs of one batch's pass at B = `batch_size`, baselines aside (see `build_plan`)."""
    ours = [m for m in our_methods() if m.batch is not None and not m.reference and m.name in cfg.methods]
    groups: list[Group] = [(m.name, None, None) for m in ours if not m.takes_k]
    for m in ours:
        if m.takes_k:
            groups.extend((m.name, batch_k(cfg, batch_size), p) for p in batch_policies(cfg, m.name))
    return groups


def _pass(cfg: SweepConfig, groups: list[Group], make, *, priced: bool = False) -> list[PlannedRun]:
    """One prompt's (batch's) runs in order: `groups` once per repeat, placed among its target-only runs as
    ``pairing`` says; ``make(method, k, policy, repeat)`` builds each `PlannedRun`. A prompt `priced` only
    gets one target-only run per repeat (its trace and calibration block follow the first)."""
    base = reference_method().name
    out: list[PlannedRun] = []
    with_base = base in cfg.methods
    if with_base and priced:
        return [make(base, None, None, r) for r in range(cfg.repeats)]
    if cfg.pairing == "bracket" and with_base and groups:
        out.append(make(base, None, None, 0))
        for r in range(cfg.repeats):  # repeats outermost: each pass runs every group once
            for method, k, policy in groups:
                out.append(make(method, k, policy, r))
                out.append(make(base, None, None, len(out) // 2))  # closes this pair and opens the next one
        return out
    for r in range(cfg.repeats):
        if with_base:
            out.append(make(base, None, None, r))
        out.extend(make(method, k, policy, r) for method, k, policy in groups)
    if with_base:
        out.extend(make(base, None, None, r) for r in range(cfg.repeats, cfg.baseline_repeats))
    return out


def meaning(cfg: SweepConfig, prompts: Sequence[Prompt], target: str, draft: str | None) -> dict[str, Any]:
    """The configuration that gives a run its meaning; `sweep_id_for` of this is the sweep's id.

    In: models (`model_identity`: a preset member or hub id as named, a local directory or GGUF by its
    content, so one model typed as ``dir``, ``dir/`` or an absolute path is one sweep), prompts (id, type, text digest), max_new_tokens, sampling and base seed, device, dtype,
    threads, chat template, n-gram sizes, and for sampled sweeps ``ignore_eos`` (every run uses its whole
    budget; greedy sweeps stop at EOS, their identity unchanged). Not in: the grid (Ks, methods, policies, peers, repeats,
    configs), so ``--resume`` with a larger grid adds cells to the same sweep.
    """
    return {
        "schema": 1,
        "target": model_identity(target),
        "draft": model_identity(draft),
        "prompts": sorted(
            [p.id, p.type, hashlib.sha256(p.text.encode()).hexdigest()[:16]] for p in prompts
        ),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "seed": cfg.seed,
        "device": cfg.device,
        "dtype": cfg.dtype,
        "threads": cfg.threads,
        "chat_template": cfg.chat_template,
        "ngram": [cfg.ngram_max, cfg.ngram_min],
        **({"ignore_eos": True} if cfg.temperature > 0 else {}),
    }


def cost_max_n(cfg: SweepConfig) -> int:
    """Largest forward the cost curve covers: n = 1..17 always (K up to 16), more when a cell or a policy uses
    K > 16 (its verification forward scores K + 1 tokens; the cost policy's default largest K is 64)."""
    ks = list(cfg.ks) + list(cfg.secondary_ks) + list(cfg.peer_ks) + [k for _, _, k in type_ks_entries(cfg)]
    ks += [k for m in cfg.methods for k in method_ks(cfg, m)]
    ks += sweep_policy_ks(cfg)
    return max([17] + [k + 1 for k in ks])


def plan_summary(plan: Sequence[PlannedRun]) -> dict[str, int]:
    """Runs per method label (``draft K=4``, ``ngram cost``, ``hf_generate`` ..., ``B=4 draft best`` for a
    batched run), for ``--dry-run``."""
    out: dict[str, int] = {}
    for c in plan:
        key = (f"B={c.batch_size} " if c.batch_id else "") + c.method
        if c.policy not in (None, "fixed"):
            key += f" {c.policy} (K<={c.k})"
        elif c.k is not None:
            key += f" K={c.k}"
        out[key] = out.get(key, 0) + 1
    return out


def rebracket(todo: Sequence[PlannedRun]) -> list[PlannedRun]:
    """The runs left to do, with no two non-baseline runs of a prompt back to back where baselines are left
    to go between them, so that every run is timed next to a target-only run of its prompt on this machine
    (its speedup is paired with those neighbours).

    A fresh plan (B X1 B X2 ... Xn B) and a plan resumed after an interruption (X2 B2 X3 B3) already
    alternate and come back unchanged. `--resume` with a larger grid does not: the new cells keep their plan
    positions and the new baselines are numbered after the stored ones, so the new cells would run back to
    back with the baselines after them (draft K = 1, K = 4, B, B: K = 1 with no target-only run beside it on
    this machine). Such a prompt's runs are put in bracket order again: a target-only run, then alternately
    another run and a target-only run, the rest after (B K = 1 B K = 4). Prompts keep their order; within a
    prompt, baselines and other runs each keep theirs.

    Args:
        todo: planned runs (`build_plan` order, finished ones removed).

    Returns:
        The same runs, reordered within each (configuration, prompt or batch) block of consecutive runs.
    """
    out: list[PlannedRun] = []
    for _, group in itertools.groupby(todo, key=lambda c: (c.config_label, c.unit)):
        block = list(group)
        ref = [METHODS[c.method].reference for c in block]
        if not any(ref) or not any(not a and not b for a, b in itertools.pairwise(ref)):  # already alternates
            out.extend(block)
            continue
        bases = [c for c, r in zip(block, ref, strict=True) if r]
        others = [c for c, r in zip(block, ref, strict=True) if not r]
        out.extend(c for pair in itertools.zip_longest(bases, others) for c in pair if c is not None)
    return out


@dataclass(frozen=True)
class Prepared:
    """A sweep checked and planned before any model loads (`prepare`).

    Attributes:
        prompts: the selected prompts. target, draft: the resolved model specs; pair_name: the preset or None.
        meaning: what gives the sweep's rows their meaning (`meaning`); sweep_id: its hash.
        plan: every run, in execution order (`build_plan`).
    """

    prompts: list[Prompt]
    target: str
    draft: str | None
    pair_name: str | None
    meaning: dict[str, Any]
    sweep_id: str
    plan: list[PlannedRun]


def prepare(cfg: SweepConfig) -> Prepared:
    """Everything that can be checked without loading a model: prompts, models, configurations, the plan.

    Raises:
        ValueError (incl. PromptFileError): bad prompts, unknown preset, unavailable configuration.
    """
    from specdec import models

    prompts = select_prompts(cfg)
    target, draft = models.resolve_pair(cfg.pair, cfg.target, cfg.draft)
    pair_name = cfg.pair or (models.DEFAULT_PAIR if cfg.target is None and cfg.draft is None else None)
    for rc in cfg.runtime_configs():
        check_available(rc)
    m = meaning(cfg, prompts, target, draft)
    return Prepared(prompts, target, draft, pair_name, m, sweep_id_for(m), build_plan(cfg, prompts))
