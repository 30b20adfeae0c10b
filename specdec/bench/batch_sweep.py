"""The batch axis of the study: speculative decoding of B prompts at once against target-only decoding of
the same B prompts (``specdec batch-sweep``).

A **cell** is (configuration, group, B, batch): B prompts of one prompt group (`GROUPS`, taken from the
built-in set in a round-robin over the group's types, cycling, batch j starting at prompt j x B) decoded
together by `specdec.engine.decoding.generate_batch`, greedy. Its timed runs are paired as the single-stream sweep
pairs them (B X1 B X2 ... B): a batched target-only run AT THAT B between every two other runs, the others
being, per drafting method (``draft``: the draft model, batched; ``ngram``: prompt lookup per row), the
fixed K that the batch pricing predicts best (policy ``fixed``) and the batch-aware cost policy
(`specdec.policies.batch.BatchCostPolicy`, policy ``cost``), then the A/A run (target-only timed as a method).

Pricing K. Per configuration the batched target forward of B rows x m tokens (B in the batch sizes, m =
1 .. max_k + 1) and the batched draft step of B rows are timed on a warm cache (median of `--calibration-
repeats` passes, m interleaved up and down); `BatchCosts` turns them into ``target_cost(n)`` over n total
tokens and ``draft_cost(B, K)``. The fixed K of a cell is `specdec.policies.batch.best_batch_k` over the rows'
acceptance rates measured by an untimed greedy pre-run (`PRE_TOKENS` new tokens at K = `PRE_K`, batched,
once per prompt and method: a greedy row's tokens, so its acceptance, do not depend on the rows beside it),
raised to 1 when the pricing predicts no K pays (``k_best`` = 0
is stored). The predicted speedup of a run is the priced rate of its K over the priced rate of a plain
batched step (``B / target_cost(B)``).

Exactness. Every run's rows are compared with the cell's first batched target-only run and with
single-sequence target-only decoding of each prompt (`specdec.engine.decoding.autoregressive_generate` on the
configuration's single-sequence target, untimed, once per prompt); mismatching rows are counted and stored,
never fatal: bf16 and llama.cpp batched kernels may flip a near-tie argmax.

Everything goes to the results store (`specdec.bench.store_batch`): one transaction per run, ``--resume``
skips stored runs, the calibration is reused on the same machine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specdec.bench.prompts import PROMPT_TYPES, load_builtin
from specdec.catalogue.drafters import drafter
from specdec.core.theory import expected_tokens_per_round
from specdec.policies.batch import BatchCostPolicy, best_batch_k
from specdec.prompts import Prompt, encode_prompt

__all__ = [
    "GROUPS",
    "MAX_BATCH",
    "BatchCosts",
    "BatchSweepConfig",
    "BatchSweepResult",
    "batch_prompts",
    "calibrate",
    "estimate_s",
    "group_prompts",
    "make_batch_config",
    "plan_cells",
    "run_batch_sweep",
    "run_sequence",
    "summarize_batch",
]

#: Largest batch size a sweep may ask for.
MAX_BATCH = 16
#: The prompt groups: a batch is drawn from one group's built-in prompts (``mixed``: every type).
GROUPS: dict[str, tuple[str, ...]] = {
    "code": ("code", "code_json", "code_python", "technical_ml"),
    "prose": ("natural", "wikipedia_style", "technical", "creative_fiction", "dialogue"),
    "repetitive": ("repetitive", "repetitive_pattern", "list_items"),
    "mixed": PROMPT_TYPES,
}
DRAFT_METHODS = ("draft", "ngram")
#: The untimed greedy pre-run that measures each prompt's acceptance before its first fixed-K run.
PRE_TOKENS = 16
PRE_K = 4
DEFAULT_BATCH_DB = "results/batch.db"


@dataclass(frozen=True)
class BatchSweepConfig:
    """The settings of a batch sweep (validated by `make_batch_config`).

    Attributes:
        target, draft, pair: the models (as ``specdec sweep``); resolved by `specdec.models.resolve_pair`.
        batch_sizes: B values (1 .. `MAX_BATCH`), ascending. configs: runtime configuration labels.
        groups: prompt groups (`GROUPS`). batches: distinct prompt sets per (group, B), the units of the
            intervals. max_new_tokens: new tokens per row. methods: drafting methods (`DRAFT_METHODS`).
        max_k: largest K priced (the calibration times m = 1 .. max_k + 1 tokens per row).
        calibration_repeats: timed passes of the calibration. threads, device: as the sweep.
        single_reference: also decode each prompt alone (untimed) to count rows that differ from it.
    """

    target: str | None = None
    draft: str | None = None
    pair: str | None = None
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    configs: tuple[str, ...] = ("auto",)
    groups: tuple[str, ...] = ("code", "prose", "repetitive")
    batches: int = 3
    max_new_tokens: int = 64
    methods: tuple[str, ...] = DRAFT_METHODS
    max_k: int = 16
    calibration_repeats: int = 3
    threads: int | None = None
    device: str = "cpu"
    single_reference: bool = True
    ngram_max: int = 3
    ngram_min: int = 1

    def meaning(self, target: str, draft: str | None) -> dict[str, Any]:
        """What gives the runs their meaning (the sweep id hashes it): the models and the per-run settings;
        the grid (batch sizes, groups, batches, methods, configurations) is not part of it, so a resume may
        extend it."""
        from specdec.bench.store_schema import model_identity

        return {"kind": "batch-sweep", "target": model_identity(target), "draft": model_identity(draft),
                "max_new_tokens": self.max_new_tokens, "max_k": self.max_k, "pre_tokens": PRE_TOKENS,
                "pre_k": PRE_K, "ngram": [self.ngram_max, self.ngram_min], "device": self.device}


def _csv(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    return [str(p).strip() for p in value if str(p).strip()]


def make_batch_config(**flags: Any) -> BatchSweepConfig:
    """A validated `BatchSweepConfig` from command-line values (None: the default; lists may be
    comma-separated strings).

    Raises:
        ValueError: one line: a batch size < 1 or > `MAX_BATCH` or not an integer, an unknown group, method
            or configuration, a compiled configuration (batched decoding runs the eager backend), or a
            count < 1.
    """
    from specdec.bench.config import default_config
    from specdec.catalogue.runtimes import CONFIG_ALIASES, RUNTIME_CONFIGS

    v = {k: x for k, x in flags.items() if x is not None}
    out: dict[str, Any] = {}
    if "batch_sizes" in v:
        sizes = []
        for p in _csv(v["batch_sizes"]):
            try:
                b = int(p)
            except ValueError:
                raise ValueError(f"--batch-sizes: {p!r} is not an integer") from None
            if not 1 <= b <= MAX_BATCH:
                raise ValueError(f"--batch-sizes: B must be in 1..{MAX_BATCH}, got {b}")
            sizes.append(b)
        if not sizes:
            raise ValueError("--batch-sizes: give at least one batch size, e.g. 1,2,4,8")
        out["batch_sizes"] = tuple(sorted(set(sizes)))
    if "groups" in v:
        groups = [g.lower() for g in _csv(v["groups"])]
        bad = [g for g in groups if g not in GROUPS]
        if bad or not groups:
            raise ValueError(f"--groups: unknown group {', '.join(bad) or '(none given)'}; choose from "
                             f"{', '.join(GROUPS)}")
        out["groups"] = tuple(dict.fromkeys(groups))
    if "methods" in v:
        methods = [m.lower() for m in _csv(v["methods"])]
        bad = [m for m in methods if m not in DRAFT_METHODS]
        if bad or not methods:
            raise ValueError(f"--methods: unknown method {', '.join(bad) or '(none given)'}; choose from "
                             f"{', '.join(DRAFT_METHODS)}")
        out["methods"] = tuple(dict.fromkeys(methods))
    device = str(v.get("device", "cpu"))
    out["device"] = device
    configs = []
    for c in _csv(v.get("configs", "auto")):
        label = default_config(device) if c.lower() == "auto" else CONFIG_ALIASES.get(c.lower(), c)
        if label not in RUNTIME_CONFIGS:
            raise ValueError(f"--configs: unknown config {c!r}; choose from auto, {', '.join(RUNTIME_CONFIGS)}")
        if RUNTIME_CONFIGS[label].compile:
            raise ValueError(f"--configs: {label} is compiled (static cache); batched decoding runs the eager "
                             "backend: choose an uncompiled configuration")
        configs.append(label)
    if not configs:
        raise ValueError("--configs: give at least one runtime configuration")
    out["configs"] = tuple(dict.fromkeys(configs))
    for name, low in (("batches", 1), ("max_new_tokens", 1), ("max_k", 1), ("calibration_repeats", 1),
                      ("threads", 1)):
        if name in v:
            try:
                out[name] = int(v[name])
            except (TypeError, ValueError):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer, got {v[name]!r}") from None
            if out[name] < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {out[name]}")
    for name in ("target", "draft", "pair"):
        if name in v:
            out[name] = str(v[name])
    if "single_reference" in v:
        out["single_reference"] = bool(v["single_reference"])
    return BatchSweepConfig(**out)


# ------------------------------------------------------------------------------------------------- plan


def group_prompts(group: str, prompts: Sequence[Prompt] | None = None) -> list[Prompt]:
    """The group's built-in prompts (or those of `prompts`), in a round-robin over its types (first of each
    type, then the second, ...), so consecutive prompts are of different types.

    Raises:
        ValueError: an unknown group, or a group with no prompt.
    """
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; choose from {', '.join(GROUPS)}")
    pool = list(prompts) if prompts is not None else load_builtin()
    by_type = [[p for p in pool if p.type == t] for t in GROUPS[group]]
    out = []
    for i in range(max((len(x) for x in by_type), default=0)):
        out.extend(x[i] for x in by_type if i < len(x))
    if not out:
        raise ValueError(f"group {group!r} has no prompts")
    return out


def batch_prompts(pool: Sequence[Prompt], batch_size: int, batch_idx: int) -> list[Prompt]:
    """Batch `batch_idx` of `batch_size` prompts: ``pool[(batch_idx * B + i) % len(pool)]`` for i < B."""
    return [pool[(batch_idx * batch_size + i) % len(pool)] for i in range(batch_size)]


@dataclass(frozen=True)
class Cell:
    """One (configuration, group, B, batch): its prompts and its runs in order."""

    config_label: str
    group: str
    batch_size: int
    batch_idx: int
    prompts: tuple[Prompt, ...]
    runs: tuple[tuple[str, str | None], ...]  # (method, policy), seq = index


def run_sequence(methods: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """The bracketed order of a cell's runs: baseline, then for each other run (per drafting method its
    fixed K and its cost policy, then the A/A run) that run and a baseline."""
    others = [(m, p) for m in methods for p in ("fixed", "cost")] + [("aa", None)]
    out: list[tuple[str, str | None]] = [("baseline", None)]
    for x in others:
        out += [x, ("baseline", None)]
    return tuple(out)


def plan_cells(cfg: BatchSweepConfig, prompts: Sequence[Prompt] | None = None) -> list[Cell]:
    """Every cell of the sweep, configuration by configuration, then group, B, batch."""
    seq = run_sequence(cfg.methods)
    cells = []
    for label in cfg.configs:
        for g in cfg.groups:
            pool = group_prompts(g, prompts)
            for b in cfg.batch_sizes:
                for j in range(cfg.batches):
                    cells.append(Cell(label, g, b, j, tuple(batch_prompts(pool, b, j)), seq))
    return cells


# ----------------------------------------------------------------------------------------------- costs


def _interp(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through `points`, linear extrapolation past the ends (never below 10% of the nearest
    point)."""
    xs = sorted(points)
    ys = [points[k] for k in xs]
    if len(xs) == 1:
        return ys[0] * (x / xs[0]) if x > xs[0] else ys[0]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return max(ys[-1] + slope * (x - xs[-1]), 0.1 * ys[-1])
    return float(np.interp(x, xs, ys))


@dataclass
class BatchCosts:
    """A configuration's batched cost curve from its calibration.

    Attributes:
        target: ``{(B, m): seconds}`` of one batched target forward of B rows x m tokens (warm cache).
        draft: ``{B: seconds}`` of one batched draft step (one token per row); empty without a draft model.
    """

    target: dict[tuple[int, int], float]
    draft: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("a batch cost curve needs at least one target point")
        by_n: dict[int, list[float]] = {}
        for (b, m), s in self.target.items():
            by_n.setdefault(b * m, []).append(s)
        self._by_n = {n: statistics.median(v) for n, v in by_n.items()}

    def target_cost(self, n: int) -> float:
        """Seconds of one target forward over n tokens in total (rows x tokens per row): the median of the
        points with B x m = n, else interpolated over n."""
        return self._by_n.get(int(n)) or _interp(self._by_n, n)

    def draft_step(self, b: int) -> float:
        """Seconds of one batched draft step of `b` rows (interpolated over B); 0 without draft points."""
        return _interp(self.draft, b) if self.draft else 0.0

    def draft_cost(self, b: int, k: int) -> float:
        """Seconds of drafting K tokens for b rows: K batched draft steps (the first one's catch-up of one or
        two tokens per row is priced as a step)."""
        return k * self.draft_step(b)

    def best_k(self, alphas: Sequence[float], max_k: int, *, drafting_model: bool) -> int:
        """`best_batch_k` over these costs (``drafting_model``: price draft steps; else free drafting)."""
        return best_batch_k(list(alphas), self.target_cost, max_k=max_k,
                            draft_cost=self.draft_cost if drafting_model else None)

    def predicted_speedup(self, alphas: Sequence[float], k: int, *, drafting_model: bool) -> float:
        """Priced committed tokens per second at K over a plain batched step's ``B / target_cost(B)``."""
        b = len(alphas)
        base = b / self.target_cost(b)
        if k <= 0:
            return 1.0
        t = self.target_cost(b * (k + 1)) + (self.draft_cost(b, k) if drafting_model else 0.0)
        return sum(expected_tokens_per_round(min(max(a, 0.0), 1.0), k) for a in alphas) / t / base


def _median_iqr(xs: list[float]) -> tuple[float, float]:
    q1, q3 = np.percentile(xs, [25, 75])
    return float(statistics.median(xs)), float(q3 - q1)


def calibrate(target, drafter_backend, context: Sequence[int], batch_sizes: Sequence[int], *, max_m: int,
              repeats: int, clock: Callable[[], float] = time.perf_counter) -> list[dict[str, Any]]:
    """Time the batched target forward of B rows x m tokens (m = 1 .. `max_m`) and the batched draft step of
    B rows, each row's cache holding `context` (warm), for every B.

    Each pass times every m once, up and down on alternate passes (interleaved, so a drifting machine hits
    every m alike), after one untimed forward; each forward is rolled back before the next. Returns the
    calibration rows (``role`` ``target``/``draft``, ``batch_size``, ``n_tokens`` = m, ``context_tokens``,
    ``seconds`` = median, ``spread_s`` = IQR, ``repeats``).

    Args:
        target: a `specdec.runtimes.base.BatchedBackend`. drafter_backend: the draft's batched backend, or None.
        context: >= 1 token ids (the cache content of every row).
    """
    ctx = list(context)
    rows: list[dict[str, Any]] = []
    feed = [ctx[i % len(ctx)] for i in range(max_m)]

    def timed(backend, b: int, m: int) -> float:
        backend.synchronize()
        t0 = clock()
        backend.forward([feed[:m]] * b, last=None if backend is target else 1)
        backend.synchronize()
        dt = clock() - t0
        backend.truncate([len(ctx)] * b)
        return dt

    for b in batch_sizes:
        target.prefill([ctx] * b)
        timed(target, b, 1)
        samples: dict[int, list[float]] = {m: [] for m in range(1, max_m + 1)}
        for r in range(repeats):
            order = range(1, max_m + 1) if r % 2 == 0 else range(max_m, 0, -1)
            for m in order:
                samples[m].append(timed(target, b, m))
        for m, xs in samples.items():
            s, spread = _median_iqr(xs)
            rows.append({"role": "target", "batch_size": b, "n_tokens": m, "context_tokens": len(ctx),
                         "seconds": s, "spread_s": spread, "repeats": repeats})
        if drafter_backend is not None:
            drafter_backend.prefill([ctx] * b)
            timed(drafter_backend, b, 1)
            xs = [timed(drafter_backend, b, 1) for _ in range(max(3, repeats))]
            s, spread = _median_iqr(xs)
            rows.append({"role": "draft", "batch_size": b, "n_tokens": 1, "context_tokens": len(ctx),
                         "seconds": s, "spread_s": spread, "repeats": len(xs)})
    return rows


def costs_from_rows(rows: Sequence[dict[str, Any]]) -> BatchCosts:
    """`BatchCosts` from stored or fresh calibration rows."""
    target = {(int(r["batch_size"]), int(r["n_tokens"])): float(r["seconds"]) for r in rows if r["role"] == "target"}
    draft = {int(r["batch_size"]): float(r["seconds"]) for r in rows if r["role"] == "draft"}
    return BatchCosts(target, draft)


# ------------------------------------------------------------------------------------------------- runs


def summarize_batch(results: Sequence[Any]) -> dict[str, Any]:
    """The ``batch_runs`` measurements of one `generate_batch` call (its per-row `GenerationResult`s).

    Aggregate tokens/s = every row's new tokens / the batch's end-to-end seconds (start to the last row's
    end, prefill included); per-row tokens/s = a row's new tokens / its own end-to-end seconds (p50, p95).
    Round times are the batch's rounds (shared by their rows, so taken once per round): draft, the target
    forward, and bookkeeping (verification outside the forward, commit, rollback).
    """
    new = sum(len(r.token_ids) for r in results)
    total = max((r.total_s for r in results), default=0.0)
    row_tps = [len(r.token_ids) / r.total_s for r in results if r.total_s > 0]
    n_rounds = max((len(r.rounds) for r in results), default=0)
    draft_s = forward_s = other_s = 0.0
    for i in range(n_rounds):
        rec = next(r.rounds[i] for r in results if len(r.rounds) > i)
        draft_s += rec.draft_s
        forward_s += rec.forward_s
        other_s += (rec.verify_s - rec.forward_s) + rec.other_s
    p50, p95 = (np.percentile(row_tps, [50, 95]) if row_tps else (math.nan, math.nan))
    return {
        "new_tokens": new, "total_s": total, "prefill_s": results[0].prefill_s if results else None,
        "tokens_per_s": new / total if total > 0 else None, "row_tps_p50": float(p50), "row_tps_p95": float(p95),
        "num_rounds": n_rounds, "row_rounds": sum(len(r.rounds) for r in results),
        "num_drafted": sum(r.num_drafted for r in results), "num_accepted": sum(r.num_accepted for r in results),
        "draft_s": draft_s, "forward_s": forward_s, "other_s": other_s,
    }  # fmt: skip


def _generate(target, prompts, max_new_tokens, **kw):
    """`specdec.engine.decoding.generate_batch` (one seam for tests)."""
    from specdec.engine.decoding import generate_batch

    return generate_batch(target, prompts, max_new_tokens, **kw)


def single_reference(backend, prompt_ids: Sequence[int], max_new_tokens: int, *, eos_ids, vocab_size) -> list[int]:
    """Greedy single-sequence target-only tokens of one prompt (the oracle rows are compared with)."""
    from specdec.engine.decoding import autoregressive_generate

    return autoregressive_generate(backend, list(prompt_ids), max_new_tokens, eos_ids=eos_ids,
                                   vocab_size=vocab_size).token_ids


def _mismatches(rows: Sequence[Sequence[int]], ref: Sequence[Sequence[int] | None]) -> int | None:
    if any(r is None for r in ref):
        return None
    return sum(1 for a, b in zip(rows, ref, strict=True) if list(a) != list(b))


# ------------------------------------------------------------------------------------------- estimate


def estimate_s(cfg: BatchSweepConfig, *, alpha: float = 0.5, k: int = 3) -> dict[str, float]:
    """A rough duration per configuration (seconds) from the reference cost curves of the default pair
    (`specdec.bench.estimate.reference_costs`; a forward of B rows x m tokens priced as one of B x m
    tokens), an ASSUMED acceptance `alpha` and K: timed runs, pre-runs, calibration, single-sequence
    references. Model loading excluded. Not a measurement."""
    from specdec.bench.estimate import reference_costs
    from specdec.catalogue.runtimes import RUNTIME_CONFIGS

    out = {}
    t_tok = cfg.max_new_tokens
    e = expected_tokens_per_round(alpha, k)
    for label in cfg.configs:
        rc = RUNTIME_CONFIGS[label]
        curve, _ = reference_costs(rc.target_backend, rc.draft_backend, rc.dtype or "float32")
        d = curve.draft_step_s or 0.0

        def base(b: int, tokens: int, curve=curve) -> float:
            return tokens * curve.forward_s(b)

        def spec(b: int, tokens: int, method: str, curve=curve, d=d) -> float:
            draft = k * d * max(1.0, b / 2) if drafter(method).needs_model else 0.0
            return tokens / e * (curve.forward_s(b * (k + 1)) + draft)

        total = 0.0
        n_runs = len(run_sequence(cfg.methods))
        for b in cfg.batch_sizes:
            per_cell = (n_runs - 2 * len(cfg.methods)) * base(b, t_tok)
            per_cell += sum(2 * spec(b, t_tok, m) for m in cfg.methods)
            total += per_cell * cfg.batches * len(cfg.groups)
        n_prompts = len({p.id for c in plan_cells(cfg) if c.config_label == label for p in c.prompts})
        b_max = max(cfg.batch_sizes)
        total += math.ceil(n_prompts / b_max) * sum(spec(b_max, PRE_TOKENS, m) for m in cfg.methods)
        total += cfg.calibration_repeats * sum(curve.forward_s(b * m) for b in cfg.batch_sizes
                                               for m in range(1, cfg.max_k + 2))
        if cfg.single_reference:
            total += n_prompts * base(1, t_tok)
        out[label] = total
    return out


# ---------------------------------------------------------------------------------------------- the sweep


@dataclass
class BatchSweepResult:
    """What a batch sweep did: its id, runs timed now, runs skipped (stored), failed runs, status."""

    sweep_id: str
    ran: int = 0
    skipped: int = 0
    failed: int = 0
    status: str = "done"


def _resolve_models(cfg: BatchSweepConfig) -> tuple[str, str | None]:
    from specdec import models

    return models.resolve_pair(cfg.pair, cfg.target, cfg.draft)


def sweep_id_of(cfg: BatchSweepConfig) -> str:
    """The batch sweep's id: ``sha256[:16]`` of `BatchSweepConfig.meaning` (the store's `sweep_id_for`)."""
    from specdec.bench.store_schema import sweep_id_for

    target, draft = _resolve_models(cfg)
    return sweep_id_for(cfg.meaning(target, draft))


def run_batch_sweep(cfg: BatchSweepConfig, db: str | Path, *, resume: bool = False,
                    echo: Callable[[str], None] = print, loader=None, lock_wait_s: float = 10.0,
                    prompts: Sequence[Prompt] | None = None) -> BatchSweepResult:
    """Run the batch sweep into the store `db`: per configuration load the pair once, build its batched
    backends for max(B) rows, calibrate (or reuse this machine's stored calibration), then every cell's runs
    in their bracketed order, each stored in one transaction as it finishes.

    Args:
        cfg: the settings (`make_batch_config`). db: the results store (created when missing).
        resume: continue the batch sweep with these settings (stored runs skipped, failed ones retried);
            without it a sweep that already has runs is refused.
        echo: progress lines. loader: `specdec.runtimes.loading.load_pair`-compatible (tests).
        lock_wait_s: how long to wait for another writer of `db`. prompts: the prompt pool (default: the
            built-in set).

    Returns:
        `BatchSweepResult`.

    Raises:
        StoreError (one line): the store cannot be written, or the sweep exists without `resume`; what
        loading raises; KeyboardInterrupt (the sweep is marked interrupted; finished runs are kept).
    """
    import torch

    from specdec.bench.control import sweep_guard
    from specdec.bench.store import Store
    from specdec.bench.store_batch import BatchTables, batch_cell_key
    from specdec.catalogue.runtimes import RUNTIME_CONFIGS, check_available
    from specdec.measure.environment import git_commit, machine_info

    if loader is None:
        from specdec.runtimes.loading import load_pair as loader
    target_spec, draft_spec = _resolve_models(cfg)
    for label in cfg.configs:
        check_available(RUNTIME_CONFIGS[label])
    if "draft" in cfg.methods and draft_spec is None:
        raise ValueError("method draft needs a draft model (--draft or --pair), or use --methods ngram")
    sid = sweep_id_of(cfg)
    cells = plan_cells(cfg, prompts)
    result = BatchSweepResult(sid)
    db = Path(db)
    with sweep_guard(db, lock_wait_s), Store(db) as store:
        bt = BatchTables(store)
        bt.begin(sid, {**cfg.meaning(target_spec, draft_spec), "settings": asdict(cfg)}, resume=resume,
                 machine=machine_info(cfg.device, cfg.threads), git_commit=git_commit())
        done = bt.done_cells(sid)
        try:
            for label in cfg.configs:
                mine = [c for c in cells if c.config_label == label]
                keys = {batch_cell_key(sid, label, c.group, c.batch_size, c.batch_idx, s, m, p)
                        for c in mine for s, (m, p) in enumerate(c.runs)}
                if keys <= done:
                    echo(f"[{label}] every run stored; skipped")
                    result.skipped += len(keys)
                    continue
                _run_config(cfg, label, mine, bt, sid, done, result, echo, loader, target_spec, draft_spec, torch)
        except BaseException:  # stopped (Ctrl-C, SIGTERM) or a configuration that cannot load: resumable
            bt.set_status(sid, "interrupted")
            result.status = "interrupted"
            raise
        bt.set_status(sid, "done")
    return result


def _run_config(cfg, label, cells, bt, sid, done, result, echo, loader, target_spec, draft_spec, torch) -> None:
    """Load one configuration, calibrate it and run its cells (see `run_batch_sweep`)."""
    from specdec.bench.loaded import free
    from specdec.bench.store_batch import batch_cell_key
    from specdec.catalogue.drafters import DraftSource, batched_drafter
    from specdec.catalogue.runtimes import RUNTIME_CONFIGS
    from specdec.runtimes.batched_loading import batched_backend

    rc = RUNTIME_CONFIGS[label]
    dtype = rc.dtype or "float32"
    echo(f"[{label}] loading target {target_spec} and draft {draft_spec} ...")
    t0 = time.perf_counter()
    draft_needed = "draft" in cfg.methods
    pair = loader(target_spec, draft_spec if draft_needed else None, backend=rc.target_backend,
                  draft_backend=rc.draft_backend, device=cfg.device, threads=cfg.threads, compile=False,
                  **rc.load_kwargs(dtype))
    try:
        threads = int(cfg.threads or torch.get_num_threads())
        max_rows = max(cfg.batch_sizes)
        target_b = batched_backend(pair.target, max_rows)
        source = DraftSource(pair, ngram=(cfg.ngram_max, cfg.ngram_min), rows=max_rows)
        drafters = {m: batched_drafter(m, source) for m in cfg.methods}
        model_drafter = next((d for d in drafters.values() if hasattr(d, "backend")), None)
        echo(f"[{label}] loaded in {time.perf_counter() - t0:.1f} s; batched backends for {max_rows} rows")
        tok = pair.tokenizer
        ids: dict[str, list[int]] = {}

        def prompt_ids(p: Prompt) -> list[int]:
            if p.id not in ids:
                ids[p.id] = encode_prompt(tok, p.text)
            return ids[p.id]

        ctx_len = max(1, min(64, target_b.max_length - cfg.max_k - 2))
        context = (prompt_ids(cells[0].prompts[0]) * ctx_len)[:ctx_len]
        stored = bt.calibration(sid, label)
        have = {int(r["batch_size"]) for r in stored if r["role"] == "target"
                and int(r["n_tokens"]) == cfg.max_k + 1}
        missing = [b for b in cfg.batch_sizes if b not in have]
        if missing:
            t1 = time.perf_counter()
            rows = calibrate(target_b, model_drafter.backend if model_drafter is not None else None, context,
                             missing, max_m=cfg.max_k + 1, repeats=cfg.calibration_repeats)
            bt.save_calibration(sid, label, rows)
            stored = bt.calibration(sid, label)
            echo(f"[{label}] calibrated B = {','.join(map(str, missing))} in {time.perf_counter() - t1:.1f} s")
        costs = costs_from_rows(stored)
        eos, vocab = frozenset(pair.eos_ids), pair.vocab_size
        singles: dict[str, list[int]] = {}
        acceptance: dict[tuple[str, str], float] = {}  # (method, prompt id) -> the pre-run's acceptance rate

        def drafter_of(method: str):
            return drafters[method]

        for cell in cells:
            keys = [batch_cell_key(sid, label, cell.group, cell.batch_size, cell.batch_idx, s, m, p)
                    for s, (m, p) in enumerate(cell.runs)]
            if all(k in done for k in keys):
                result.skipped += len(keys)
                continue
            pids = [prompt_ids(p) for p in cell.prompts]
            too_long = [p.id for p, x in zip(cell.prompts, pids, strict=True)
                        if len(x) + cfg.max_new_tokens > target_b.max_length]
            if too_long:
                raise ValueError(f"[{label}] prompt(s) {', '.join(too_long)} + {cfg.max_new_tokens} new tokens "
                                 f"exceed the target's context of {target_b.max_length}; lower --max-new-tokens")
            if cfg.single_reference:
                for p, x in zip(cell.prompts, pids, strict=True):
                    if p.id not in singles:
                        singles[p.id] = single_reference(pair.target.backend, x, cfg.max_new_tokens,
                                                         eos_ids=eos, vocab_size=vocab)
            single_ref = [singles.get(p.id) for p in cell.prompts]
            stored_base = bt.runs(sid, cell_key=keys[0])
            batched_ref: list[list[int]] | None = stored_base[0]["token_ids"] if stored_base else None
            pre: dict[str, tuple[list[float], int]] = {}
            common = {"config_label": label, "target": target_spec, "draft": draft_spec, "dtype": rc.target_precision(dtype),
                      "threads": threads, "group_name": cell.group, "batch_size": cell.batch_size,
                      "batch_idx": cell.batch_idx, "prompt_ids": [p.id for p in cell.prompts],
                      "max_new_tokens": cfg.max_new_tokens, "sweep_id": sid}
            for seq, (method, policy) in enumerate(cell.runs):
                key = keys[seq]
                if key in done:
                    result.skipped += 1
                    continue
                row: dict[str, Any] = {**common, "cell_key": key, "seq": seq, "method": method, "policy": policy}
                try:
                    kw: dict[str, Any] = {"eos_ids": eos, "vocab_size": vocab}
                    if method in DRAFT_METHODS:
                        if method not in pre:
                            todo = list(dict.fromkeys(p.id for p in cell.prompts if (method, p.id) not in acceptance))
                            if todo:  # a greedy row's acceptance does not depend on its batch: once per prompt
                                by_id = {p.id: x for p, x in zip(cell.prompts, pids, strict=True)}
                                pre_res = _generate(target_b, [by_id[i] for i in todo], PRE_TOKENS,
                                                    drafter=drafter_of(method), k=PRE_K, **kw)
                                for i, r in zip(todo, pre_res, strict=True):
                                    acceptance[method, i] = r.num_accepted / r.num_drafted if r.num_drafted else 0.0
                            alphas = [acceptance[method, p.id] for p in cell.prompts]
                            pre[method] = (alphas, costs.best_k(alphas, cfg.max_k, drafting_model=drafter(method).needs_model))
                        alphas, k_best = pre[method]
                        model = drafter(method).needs_model
                        row.update(alpha_pre=sum(alphas) / len(alphas), k_best=k_best)
                        if policy == "fixed":
                            k = max(1, k_best)
                            kw.update(drafter=drafter_of(method), k=k)
                            row.update(k=k, predicted_speedup=costs.predicted_speedup(alphas, k, drafting_model=model))
                        else:
                            kw.update(drafter=drafter_of(method), policy=BatchCostPolicy(
                                costs.target_cost, cfg.max_k, draft_cost=costs.draft_cost if model else None))
                            row.update(k=cfg.max_k, predicted_speedup=costs.predicted_speedup(
                                alphas, k_best, drafting_model=model))
                    else:
                        row.update(predicted_speedup=1.0)
                    res = _generate(target_b, pids, cfg.max_new_tokens, **kw)
                    tokens = [list(r.token_ids) for r in res]
                    if seq == 0:
                        batched_ref = tokens
                    row.update(summarize_batch(res), token_ids=tokens,
                               rows_mismatch_batched=_mismatches(tokens, batched_ref) if batched_ref else None,
                               rows_mismatch_single=_mismatches(tokens, single_ref) if cfg.single_reference else None)
                except KeyboardInterrupt:
                    raise
                except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on; --resume retries it
                    row = {k: row[k] for k in (*common, "cell_key", "seq", "method", "policy")}
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    result.failed += 1
                    echo(f"[{label}] {cell.group} B={cell.batch_size} batch {cell.batch_idx} {method}"
                         f"{'/' + policy if policy else ''} failed: {row['error']}")
                bt.record_run(row)
                result.ran += 1
            echo(_cell_line(bt, sid, label, cell))
    finally:
        free(pair)


def _cell_line(bt, sid: str, label: str, cell: Cell) -> str:
    """One progress line per cell: each drafting run's aggregate tokens/s over its bracketing baselines."""
    runs = sorted(bt.runs(sid, config_label=label, group_name=cell.group, batch_size=cell.batch_size,
                          batch_idx=cell.batch_idx), key=lambda r: r["seq"])
    by_seq = {r["seq"]: r for r in runs if r["error"] is None}
    parts = []
    for s, r in by_seq.items():
        if r["method"] == "baseline":
            continue
        nb = [by_seq[j]["tokens_per_s"] for j in (s - 1, s + 1) if j in by_seq and by_seq[j]["method"] == "baseline"]
        if nb and r["tokens_per_s"]:
            ratio = r["tokens_per_s"] / math.exp(sum(math.log(x) for x in nb) / len(nb))
            parts.append(f"{r['method']}{'/' + r['policy'] if r['policy'] else ''}"
                         f"{'@K=' + str(r['k']) if r['policy'] == 'fixed' else ''} {ratio:.2f}x")
    return f"[{label}] {cell.group} B={cell.batch_size} batch {cell.batch_idx}: " + (", ".join(parts) or "no ratio")
