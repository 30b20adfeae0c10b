"""The sweep's batched runs (B > 1): their backends and pricing, their K, their rows and their exactness.

A configuration with batched runs gets, once (`prepare`): the forwards that price a batch's K, measured by
the one measurement (`specdec.measure.timing.measure_forwards` of `specdec.bench.grid.batch_cost_ns`:
target forwards of B x (K + 1) tokens, the draft's forward over B rows) and stored beside the configuration's
cost curve (``costs`` roles ``batch_target`` / ``batch_draft``; reused on resume on the same machine), and the
target's batched backend for the sweep's largest B (`specdec.runtimes.batched_loading.batched_backend`).

A batched run is one `specdec.engine.decoding.generate_batch` call through its method's batched form
(`specdec.bench.methods.Method.batch`), timed by the engine: the batch's wall time is its last row's end,
its aggregate tokens/s every row's new tokens over that. Policy ``best`` runs at the K that
`specdec.policies.batch.best_batch_k` prices best on those costs for the rows' acceptance, which an untimed
greedy pre-run measures once per prompt and method (`PRE_TOKENS` new tokens, at most the budget, at K =
`PRE_K`: a greedy row's tokens, so its acceptance, do not depend on the rows beside it); K = 0 priced best
is timed at K = 1 and noted. The
predicted speedup of a drafting run is the priced rate of its K (the cost policy: of the best K) over a plain
batched step's, ``B / t(B)``.

Exactness, per row and greedy only, stored and never fatal (batched bf16 and llama.cpp kernels may flip a
near tie): ``matches_baseline`` against the same row of the batch's first batched target-only run,
``matches_single`` against single-sequence target-only decoding of the row's prompt (the sweep's stored
B = 1 baseline, else decoded here untimed, once per prompt).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec.bench.console import one_line
from specdec.bench.grid import batch_cost_ns, batch_k
from specdec.bench.methods import METHODS
from specdec.bench.plan import PlannedRun
from specdec.bench.requests import BatchRequest, BatchRuntime
from specdec.bench.values import BEST_K
from specdec.core.costs import CostCurve
from specdec.core.theory import expected_tokens_per_round
from specdec.engine.traces import first_divergence

if TYPE_CHECKING:
    from specdec.bench.loaded import LoadedConfig
    from specdec.bench.state import SweepState

__all__ = ["PRE_K", "PRE_TOKENS", "BatchState", "aggregate", "close", "execute", "prepare", "resolve", "warm_up"]

#: The untimed greedy pre-run that measures a prompt's acceptance before its first batched drafting run.
PRE_TOKENS = 16
PRE_K = 4


@dataclass
class BatchState:
    """What one loaded configuration's batched runs share.

    Attributes:
        target: the target's batched backend, for `max_rows` rows of at most `row_tokens` tokens.
        costs: the batch pricing's curve (`prepare`). runtimes: the `BatchRuntime` of each B.
        alphas: (method, prompt id) -> the pre-run's acceptance. priced: (batch id, method) -> (alphas, best K).
        singles: prompt id -> its single-sequence target-only tokens. refs: batch id -> its first batched
            target-only run's rows.
    """

    target: Any
    max_rows: int
    row_tokens: int
    costs: CostCurve | None
    runtimes: dict[int, BatchRuntime] = field(default_factory=dict)
    alphas: dict[tuple[str, str], float] = field(default_factory=dict)
    priced: dict[tuple[str, str], tuple[list[float], int]] = field(default_factory=dict)
    singles: dict[str, list[int]] = field(default_factory=dict)
    refs: dict[str, list[list[int]]] = field(default_factory=dict)


def prepare(loaded: LoadedConfig, cells: list[PlannedRun], s: SweepState) -> None:
    """Measure (or reuse the stored) batch pricing of the configuration and build its batched target backend
    (``loaded.batch``), when `cells` hold a batched run.

    Raises:
        What the measurement or the backend raises (the models' context too short for the widest forward, a
        runtime without a batched backend).
    """
    from specdec.measure.timing import measure_forwards
    from specdec.runtimes.batched_loading import batched_backend

    batched = [c for c in cells if c.batch_id is not None]
    if not batched:
        return
    cfg, label, sid = loaded.cfg, loaded.label, s.sweep_id
    t_ns, d_ns = batch_cost_ns(cfg)
    costs = s.store.load_costs(sid, label, batch=True)
    if costs is None or not set(t_ns) <= set(costs["target_forward_s"]):
        t0 = time.perf_counter()
        s.store.save_costs(sid, label, measure_forwards(loaded.pair, t_ns, d_ns, repeats=cfg.cost_repeats,
                                                        context_tokens=cfg.cost_context_tokens), batch=True)
        costs = s.store.load_costs(sid, label, batch=True)
        s.log(f"[{label}] batch costs measured in {time.perf_counter() - t0:.1f} s (target forwards of "
              f"{','.join(map(str, t_ns))} tokens)")
    rows = max(c.batch_size for c in batched)
    longest = max(len(loaded.prompt_ids(p)) for c in batched for p in c.rows)
    row_tokens = longest + cfg.max_new_tokens + max(batch_k(cfg, c.batch_size) for c in batched) + 1
    loaded.batch = BatchState(batched_backend(loaded.pair.target, rows, row_tokens=row_tokens), rows, row_tokens,
                              CostCurve.from_costs(costs))


def close(loaded: LoadedConfig) -> None:
    """Close the configuration's batched backends (llama.cpp frees their contexts)."""
    bs, loaded.batch = loaded.batch, None
    if bs is None:
        return
    backends = [bs.target] + [getattr(d, "backend", None) for rt in bs.runtimes.values() for d in rt.drafters.values()]
    for b in backends:
        with contextlib.suppress(Exception):
            if callable(getattr(b, "close", None)):
                b.close()


def _runtime(loaded: LoadedConfig, rows: int) -> BatchRuntime:
    bs = loaded.batch
    if rows not in bs.runtimes:
        bs.runtimes[rows] = BatchRuntime(bs.target, loaded.runtime(), rows, bs.row_tokens, bs.costs)
    return bs.runtimes[rows]


def _priced(loaded: LoadedConfig, cell: PlannedRun) -> tuple[list[float], int]:
    """The rows' pre-run acceptance (measured now for prompts not yet measured) and the K in 0..``cell.k``
    that the batch costs price best for them (`specdec.policies.batch.best_batch_k`)."""
    from specdec.engine.decoding import generate_batch
    from specdec.policies.batch import best_batch_k

    bs, key = loaded.batch, (cell.batch_id, cell.method)
    if key not in bs.priced:
        rt = _runtime(loaded, cell.batch_size)
        todo = list({p.id: p for p in cell.rows if (cell.method, p.id) not in bs.alphas}.values())
        if todo:
            pair = loaded.pair
            res = generate_batch(bs.target, [loaded.prompt_ids(p) for p in todo], min(PRE_TOKENS, loaded.cfg.max_new_tokens),
                                 drafter=rt.drafter(cell.method), k=PRE_K, eos_ids=pair.eos_ids,
                                 vocab_size=pair.vocab_size)
            for p, r in zip(todo, res, strict=True):
                bs.alphas[cell.method, p.id] = r.num_accepted / r.num_drafted if r.num_drafted else 0.0
        alphas = [bs.alphas[cell.method, p.id] for p in cell.rows]
        model = METHODS[cell.method].drafts_with_model
        k = best_batch_k(alphas, bs.costs.forward_s, max_k=int(cell.k), draft_cost=rt.draft_cost if model else None)
        bs.priced[key] = (alphas, k)
    return bs.priced[key]


def _predicted(loaded: LoadedConfig, cell: PlannedRun, alphas: list[float], k: int) -> float:
    """Priced committed tokens per second of a round of K over a plain batched step's (``B / t(B)``)."""
    if k <= 0:
        return 1.0
    rt, b = _runtime(loaded, cell.batch_size), cell.batch_size
    draft = rt.draft_cost(b, k) if METHODS[cell.method].drafts_with_model else 0.0
    rate = sum(expected_tokens_per_round(min(max(a, 0.0), 1.0), k) for a in alphas) / (rt.costs.forward_s(b * (k + 1))
                                                                                        + draft)
    return rate / (b / rt.costs.forward_s(b))


def resolve(loaded: LoadedConfig, cell: PlannedRun, s: SweepState) -> PlannedRun:
    """What runs for a batched `cell`: itself, or for policy ``best`` the fixed K its batch's costs price best
    (at least 1); its ``cell_key`` stays the planned one."""
    if cell.policy != BEST_K:
        return cell
    alphas, k = _priced(loaded, cell)
    if cell.repeat == 0:
        s.log(f"[{loaded.label}] batch {cell.batch_id}: {cell.method} at K = {max(1, k)}, the batch pricing's best"
              + (" (K = 0: no K pays)" if k == 0 else "") + f" at acceptance {sum(alphas) / len(alphas):.2f}")
    return dataclasses.replace(cell, k=max(1, k), policy="fixed")


def _request(loaded: LoadedConfig, cell: PlannedRun, n: int) -> BatchRequest:
    ids = [loaded.prompt_ids(p) for p in cell.rows]
    return BatchRequest(ids, n, cell.k, cell.policy, loaded.cfg.seed + cell.repeat)


def warm_up(loaded: LoadedConfig, cell: PlannedRun, log) -> None:
    """One untimed, unstored batched generation of `cell`'s group on its own rows (`warmup_tokens` new tokens)."""
    try:
        n = min(loaded.cfg.warmup_tokens, loaded.cfg.max_new_tokens)
        METHODS[cell.method].batch(_runtime(loaded, cell.batch_size), _request(loaded, cell, n))
    except Exception as exc:  # noqa: BLE001 - the timed run will fail the same way and be recorded
        log(f"{cell.describe()}: warm-up failed: {one_line(exc)}")


def execute(loaded: LoadedConfig, planned: PlannedRun, run: PlannedRun, base: dict, s: SweepState,
            skip: str | None = None) -> tuple[list[dict], list[list[dict]]]:
    """Run one batched generation of `run` (`planned` resolved: `resolve`); return its B ``runs`` rows (`base`:
    the settings columns; keyed by `planned`'s rows) and each row's ``rounds``. A failure, or a `skip` reason,
    is recorded in every row (``error``), never raised."""
    rows = [{**base, "cell_key": planned.row_key(s.sweep_id, i), "prompt_id": p.id, "prompt_type": p.type,
             "batch_size": run.batch_size, "batch_id": run.batch_id, "row": i} for i, p in enumerate(run.rows)]
    try:
        req = _request(loaded, run, loaded.cfg.max_new_tokens)
        for row, ids in zip(rows, req.prompt_ids, strict=True):
            row["prompt_tokens"] = len(ids)
        if skip:
            raise RuntimeError(skip)
        extra: dict[str, Any] = {}
        if METHODS[run.method].takes_k:
            alphas, k_best = _priced(loaded, run)
            extra["predicted_speedup"] = _predicted(loaded, run, alphas, run.k if run.policy == "fixed" else k_best)
            if planned.policy == BEST_K and k_best == 0:
                extra["policy_note"] = "the batch pricing finds no K that pays (K = 0); timed at K = 1"
        records = METHODS[run.method].batch(_runtime(loaded, run.batch_size), req)
    except Exception as exc:  # noqa: BLE001 - a failed run is recorded (error set) and the sweep goes on
        error = skip or one_line(exc)
        return [{**r, "error": error} for r in rows], [[] for _ in rows]
    total = max(r.total_s for r in records)
    new = sum(len(r.token_ids) for r in records)
    for row, rec in zip(rows, records, strict=True):
        row.update(rec.columns(), batch_total_s=total, batch_tokens_per_s=new / total if total > 0 else None, **extra)
    _check_rows(loaded, run, rows, s)
    return rows, [rec.rounds for rec in records]


def _single(loaded: LoadedConfig, s: SweepState, prompt) -> list[int]:
    """Single-sequence greedy target-only tokens of `prompt`: the sweep's stored B = 1 baseline, else decoded
    now (untimed), once per prompt."""
    bs = loaded.batch
    if prompt.id not in bs.singles:
        ids = s.store.baseline_tokens(s.sweep_id, loaded.label, prompt.id)
        if ids is None:
            from specdec.engine.decoding import autoregressive_generate

            rt = loaded.runtime()
            ids = autoregressive_generate(loaded.pair.target.backend, loaded.prompt_ids(prompt), loaded.cfg.max_new_tokens,
                                          eos_ids=rt.stop_ids, vocab_size=loaded.pair.vocab_size).token_ids
        bs.singles[prompt.id] = list(ids)
    return bs.singles[prompt.id]


def _batch_ref(loaded: LoadedConfig, cell: PlannedRun, s: SweepState, rows: list[dict]) -> list[list[int]] | None:
    """The rows of the batch's first batched target-only run (stored, or `rows` when they are it)."""
    bs = loaded.batch
    if cell.batch_id not in bs.refs:
        stored = [r for r in s.store.runs(s.sweep_id, config_label=loaded.label, batch_id=cell.batch_id,
                                          method="baseline") if r["error"] is None and r["token_ids"] is not None]
        first = min((r["repeat"] for r in stored), default=None)
        by_row = {r["row"]: json.loads(r["token_ids"]) for r in stored if r["repeat"] == first}
        if len(by_row) == cell.batch_size:
            bs.refs[cell.batch_id] = [by_row[i] for i in range(cell.batch_size)]
        elif METHODS[cell.method].reference:
            bs.refs[cell.batch_id] = [list(r["token_ids"]) for r in rows]
    return bs.refs.get(cell.batch_id)


def _check_rows(loaded: LoadedConfig, cell: PlannedRun, rows: list[dict], s: SweepState) -> None:
    """Greedy sweeps: each row's ``matches_baseline`` / ``first_divergence`` (against the batch's first batched
    target-only run) and ``matches_single`` (against single-sequence target-only decoding)."""
    if not loaded.cfg.greedy:
        return
    ref = _batch_ref(loaded, cell, s, rows)
    for i, (row, prompt) in enumerate(zip(rows, cell.rows, strict=True)):
        row["matches_single"] = int(row["token_ids"] == _single(loaded, s, prompt))
        if ref is not None:
            row["matches_baseline"] = int(row["token_ids"] == ref[i])
            row["first_divergence"] = first_divergence(row["token_ids"], ref[i])


def aggregate(rows: list[dict]) -> dict:
    """One batched run's rows as one row for the console (`specdec.bench.console.summary_line`): the batch's
    aggregate tokens/s, the rows' summed counts, equal to the batched baseline when every row is."""
    if rows[0].get("error"):
        return {"error": rows[0]["error"]}
    matches = [r.get("matches_baseline") for r in rows]
    return {"tokens_per_s": rows[0]["batch_tokens_per_s"], "error": None,
            **{c: sum(r.get(c) or 0 for r in rows) for c in ("num_drafted", "num_accepted", "num_rejections")},
            "matches_baseline": None if None in matches else int(all(matches))}
