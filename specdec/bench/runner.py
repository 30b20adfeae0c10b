"""The sweep's runner: load each runtime configuration once, measure its costs, warm up, time every planned
run through its `Method`, and store each run the moment it finishes.

Method (MEASUREMENT.md): each runtime configuration loads its models once (the previous one is freed first),
measures its costs (`specdec.bench.costs.measure_costs`, stored once per config_label), then runs one
untimed warm-up generation per (config_label, method, K, policy) on the first prompt before the first timed
run of that group. Under greedy decoding every run records whether its token ids equal our baseline's for the
same config_label and prompt. Every run is committed with its rounds in one transaction
(`specdec.bench.store.Store.record_run`), so a killed sweep loses at most the run in flight; ``resume=True``
skips finished runs and retries failed ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.bench.config import DEFAULT_DB, RuntimeConfig, SweepConfig
from specdec.bench.console import summary_line
from specdec.bench.costs import calibration_block, measure_costs
from specdec.bench.environment import git_commit, machine_changes, machine_info
from specdec.bench.estimate import estimate_plan_s, format_duration
from specdec.bench.machines import record_shard
from specdec.bench.methods import METHODS, RunRecord, RunRequest, Runtime, reference_method
from specdec.bench.plan import PlannedRun, Prepared, cost_max_n, prepare
from specdec.bench.prompts import Prompt, encode_prompt
from specdec.bench.shard import shard_plan
from specdec.bench.store import Store, writer_lock
from specdec.costs import CostCurve
from specdec.errors import one_line
from specdec.traces import first_divergence, record_trace, target_margins

__all__ = ["LoadedConfig", "SweepResult", "execute", "measure_here", "run_sweep"]

_ERR_LEN = 300  # characters kept of an error message


class PlanDoesNotFitError(ValueError):
    """Prompts whose tokens plus the new-token budget exceed a model's context (case C20): refused before any
    run, in one line naming them, unless the sweep skips them (``--skip-long-prompts``)."""


@dataclass
class SweepResult:
    """What `run_sweep` did.

    Attributes:
        sweep_id, db: the sweep and its database.
        planned: runs in the plan; already_done: of those, finished before this call (resume).
        ran: runs executed now (successful + failed); failed: of those, recorded with an error;
        skipped: recorded as skipped (error starting with ``skipped:``).
        status: ``done`` (every planned run attempted) or ``interrupted``.
        failed_configs: config_label -> one-line load error, for configurations that could not be loaded.
    """

    sweep_id: str
    db: str
    planned: int
    already_done: int
    ran: int = 0
    failed: int = 0
    skipped: int = 0
    status: str = "running"
    failed_configs: dict[str, str] = field(default_factory=dict)


@dataclass
class LoadedConfig:
    """One runtime configuration, loaded: its models, its measured costs and the prompts' token ids.

    Attributes:
        cfg: the sweep's settings. rc: the runtime configuration. pair: the loaded models
            (`specdec.loading.LoadedPair`; anything with a ``tokenizer`` for a skipped method).
        costs: the stored costs dict (`Store.load_costs`), None before they are measured.
        threads: intra-op threads the runs use (recorded per run).
    """

    cfg: SweepConfig
    rc: RuntimeConfig
    pair: Any
    costs: dict | None = None
    threads: int = 1
    prompt_costs: dict[str, CostCurve] = field(default_factory=dict)
    _ids: dict[str, list[int]] = field(default_factory=dict, repr=False)

    def runtime(self, prompt_id: str | None = None) -> Runtime:
        """What the methods run on: the pair, the sampling settings, the measured costs (the prompt's own
        calibration block once it has one, else the configuration's), n-gram sizes."""
        costs = self.prompt_costs.get(prompt_id) if prompt_id is not None else None
        if costs is None:
            costs = CostCurve.from_costs(self.costs) if self.costs else None
        return Runtime(self.pair, self.cfg.sampling, costs, self.cfg.ngram_max, self.cfg.ngram_min,
                       ignore_eos=not self.cfg.sampling.greedy, pad_verify=self.rc.pad_verify)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """`prompt`'s token ids on this configuration's tokenizer (encoded once)."""
        if prompt.id not in self._ids:
            self._ids[prompt.id] = encode_prompt(self.pair.tokenizer, prompt.text,
                                                 chat_template=self.cfg.chat_template)
        return self._ids[prompt.id]


@dataclass
class _Session:
    """What every configuration of one `run_sweep` call shares."""

    prepared: Prepared
    store: Store
    result: SweepResult
    log: Callable[[str], None]
    bar: Any
    max_runs: int | None
    on_run: Callable[[dict], None] | None
    baseline_tps: dict[tuple[str, str], list[float]]


def _one_line(exc: BaseException) -> str:
    return one_line(exc, with_type=True, limit=_ERR_LEN)


def _row(loaded: LoadedConfig, cell: PlannedRun, prepared: Prepared) -> dict[str, Any]:
    """The settings columns of `cell`'s ``runs`` row (the measured ones come from its `RunRecord`)."""
    cfg, rc, sid = loaded.cfg, loaded.rc, prepared.sweep_id
    return {
        "sweep_id": sid, "cell_key": cell.key(sid), "config_label": cell.config_label,
        "pair": prepared.pair_name, "target": prepared.target, "draft": prepared.draft,
        "target_backend": rc.target_backend, "draft_backend": rc.draft_backend, "compiled": int(rc.compile),
        "device": cfg.device, "dtype": rc.target_precision(cfg.dtype), "threads": loaded.threads,
        "prompt_id": cell.prompt.id, "prompt_type": cell.prompt.type, "chat_template": int(cfg.chat_template),
        "prompt_tokens": None, "method": cell.method, "policy": cell.policy, "k": cell.k,
        "repeat": cell.repeat, "seed": cfg.seed + cell.repeat, "temperature": cfg.temperature,
        "top_k": cfg.top_k, "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens,
    }  # fmt: skip


def _run(loaded: LoadedConfig, cell: PlannedRun, ids: list[int], n: int) -> RunRecord:
    """Run `cell`'s method on prompt `ids` for `n` new tokens (raises what the method raises)."""
    request = RunRequest(ids, n, cell.k, cell.policy, loaded.cfg.seed + cell.repeat)
    return METHODS[cell.method].run(loaded.runtime(cell.prompt.id), request)


def execute(loaded: LoadedConfig, cell: PlannedRun, prepared: Prepared) -> tuple[dict, list[dict]]:
    """Run one timed generation of `cell`; return its ``runs`` row and ``rounds`` rows.

    A failure is recorded in the row (``error``, one line), never raised (KeyboardInterrupt excepted); a
    method with `Method.skip` is recorded as skipped without running.
    """
    row = _row(loaded, cell, prepared)
    skip = METHODS[cell.method].skip
    try:
        ids = loaded.prompt_ids(cell.prompt)
        row["prompt_tokens"] = len(ids)
        if skip:
            row["error"] = skip[:_ERR_LEN]
            return row, []
        record = _run(loaded, cell, ids, loaded.cfg.max_new_tokens)
    except Exception as exc:  # noqa: BLE001 - a failed run is recorded (error set) and the sweep goes on
        row["error"] = _one_line(exc)
        return row, []
    row.update(record.columns())
    return row, record.rounds


def _warm_up(loaded: LoadedConfig, cell: PlannedRun, prompt: Prompt, log: Callable[[str], None]) -> None:
    """One untimed, unstored generation of `cell`'s group on `prompt` (`warmup_tokens` new tokens)."""
    if METHODS[cell.method].skip:
        return
    try:
        n = min(loaded.cfg.warmup_tokens, loaded.cfg.max_new_tokens)
        _run(loaded, cell, loaded.prompt_ids(prompt), n)
    except Exception as exc:  # noqa: BLE001 - the timed run will fail the same way and be recorded
        log(f"{cell.describe()}: warm-up failed: {_one_line(exc)}")


def _free(pair) -> None:
    """Drop a loaded pair's models (and llama.cpp contexts) so the next configuration fits in memory."""
    if pair is None:
        return
    for m in (pair.target, pair.draft):
        if m is None:
            continue
        close = getattr(m.backend, "close", None)  # llama.cpp frees its context; transformers has none
        if callable(close):
            with contextlib.suppress(Exception):
                close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _baseline_tps(store: Store, sid: str) -> dict[tuple[str, str], list[float]]:
    """Tokens/s of the sweep's stored target-only runs per (config_label, prompt_id), for the console's
    "x vs baseline": only those timed on this machine (`store.machine_id`), since a sweep resumed on another
    machine would otherwise print a ratio of two machines' timings."""
    out: dict[tuple[str, str], list[float]] = {}
    here = store.machine_id or ""
    for r in store.runs(sid, method=reference_method().name):
        if r["error"] is None and r["tokens_per_s"] and (r.get("machine_id") or "") == here:
            out.setdefault((r["config_label"], r["prompt_id"]), []).append(r["tokens_per_s"])
    return out


def _load_pair(cfg: SweepConfig, rc: RuntimeConfig, p: Prepared, loader):
    """The configuration's models, loaded as every timed run sees them (a self-draft loads the target twice)."""
    draft = p.target if rc.self_draft_quant is not None else p.draft
    return loader(p.target, draft, backend=rc.target_backend, draft_backend=rc.draft_backend,
                  device=cfg.device, threads=cfg.threads, compile=rc.compile, **rc.load_kwargs(cfg.dtype))


def _sweep_costs(cfg: SweepConfig, pair) -> dict[str, Any]:
    """`measure_costs` with the sweep's settings (target forwards of 1 .. `cost_max_n` tokens, seconds)."""
    return measure_costs(pair, max_n=cost_max_n(cfg), repeats=cfg.cost_repeats,
                         context_tokens=cfg.cost_context_tokens)


def _load(cfg: SweepConfig, rc: RuntimeConfig, loader, s: _Session) -> LoadedConfig:
    """Load a configuration's models once."""
    p = s.prepared
    s.log(f"[{rc.label}] loading target {p.target} ({rc.target_backend}) and draft "
          f"{p.target + ' quantized ' + rc.self_draft_quant if rc.self_draft_quant else p.draft} "
          f"({rc.draft_backend}){' compiled' if rc.compile else ''} ...")
    t0 = time.perf_counter()
    pair = _load_pair(cfg, rc, p, loader)
    loaded = LoadedConfig(cfg, rc, pair, threads=int(cfg.threads or torch.get_num_threads()))
    compile_s = sum(m.compile_s for m in (pair.target, pair.draft) if m is not None)
    s.log(f"[{rc.label}] loaded in {time.perf_counter() - t0:.1f} s"
          + (f" (of which {compile_s:.1f} s compiling, before any timing)" if rc.compile else ""))
    return loaded


def _measure(loaded: LoadedConfig, s: _Session) -> None:
    """Measure (or reuse) the configuration's costs: c and the target's forward-time curve."""
    cfg, rc, pair, p = loaded.cfg, loaded.rc, loaded.pair, s.prepared
    costs = s.store.load_costs(p.sweep_id, rc.label)
    max_n = cost_max_n(cfg)
    if costs is None or max(costs["target_forward_s"]) < max_n:
        t0 = time.perf_counter()
        measured = _sweep_costs(cfg, pair)
        s.store.save_costs(p.sweep_id, rc.label, measured)
        costs = s.store.load_costs(p.sweep_id, rc.label)
        s.log(f"[{rc.label}] costs measured in {time.perf_counter() - t0:.1f} s")
    loaded.costs = costs
    _roofline(loaded, s)
    curve = CostCurve.from_costs(costs)
    c_txt = f"{curve.c:.3f}" if curve.c is not None else "n/a"
    d_txt = f"{curve.draft_step_s * 1e3:.1f} ms" if curve.draft_step_s is not None else "n/a"
    s.log(f"[{rc.label}] target step {curve.target_step_s * 1e3:.1f} ms, draft step {d_txt}, c = {c_txt}, "
          f"v({max_n}) = {curve.v(max_n):.2f} target steps")


def measure_here(cfg: SweepConfig, rc: RuntimeConfig, prepared: Prepared, *, loader=None,
                 echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Load one configuration's models as the sweep would, time its costs on this machine with the sweep's
    own settings (`measure_costs`: target forwards of 1 .. `cost_max_n` tokens, the draft step; seconds),
    free the models and return the costs (nothing is stored). Used by ``specdec sweep --dry-run
    --measure-costs`` to price a plan on the machine that will run it.

    Args:
        cfg: the sweep. rc: one of its runtime configurations. prepared: `specdec.bench.sweep.prepare` of
            `cfg` (model specs). loader: `specdec.loading.load_pair`-compatible (tests). echo: progress lines.

    Raises:
        Whatever loading raises for an unknown or unavailable model (one line at the CLI).
    """
    if loader is None:
        from specdec.loading import load_pair as loader
    echo(f"[{rc.label}] loading {prepared.target} and its draft to time this machine's costs ...")
    t0 = time.perf_counter()
    pair = _load_pair(cfg, rc, prepared, loader)
    try:
        costs = _sweep_costs(cfg, pair)
    finally:
        _free(pair)
    d = costs["draft_step_s"]
    echo(f"[{rc.label}] target step {costs['target_step_s'] * 1e3:.1f} ms"
         + (f", draft step {d * 1e3:.1f} ms" if d is not None else "")
         + f" (load and measure {time.perf_counter() - t0:.0f} s)")
    return costs


def _roofline(loaded: LoadedConfig, s: _Session) -> None:
    """Store the configuration's weight bytes per step and (once per machine and store) the machine's
    memory bandwidth by a streaming copy; a failure is logged, never raised."""
    from specdec.roofline import measure_bandwidth, weight_bytes

    pair, label = loaded.pair, loaded.rc.label
    try:
        tb = weight_bytes(pair.target)
        db = weight_bytes(pair.draft) if pair.draft is not None else None
        known = s.store.bandwidth_gbps()
        bw = measure_bandwidth(threads=loaded.cfg.threads) if known is None else {"gbps": known,
                                                                               "method": "measured earlier"}
        s.store.save_roofline(s.prepared.sweep_id, label, tb, db, bw)
        s.log(f"[{label}] weights read per target step {tb / 1e9:.2f} GB; machine bandwidth "
              f"{bw['gbps']:.1f} GB/s (streaming copy)")
    except Exception as exc:  # noqa: BLE001 - a roofline is context, not a result
        s.log(f"[{label}] roofline inputs not measured: {_one_line(exc)}")


def _announce(loaded: LoadedConfig, cells: list[PlannedRun], log: Callable[[str], None]) -> None:
    """The configuration's rough duration (from its measured costs and an assumed acceptance)."""
    counts = {}
    for c in cells:
        with contextlib.suppress(Exception):
            counts[c.prompt.id] = len(loaded.prompt_ids(c.prompt))
    cfg, label = loaded.cfg, loaded.rc.label
    timed, warm = estimate_plan_s(cells, {label: CostCurve.from_costs(loaded.costs)},
                                  max_new_tokens=cfg.max_new_tokens, warmup_tokens=cfg.warmup_tokens,
                                  prompt_tokens=counts)
    log(f"[{label}] {len(cells)} generations + {len({c.group for c in cells})} warm-ups: rough estimate "
        f"{format_duration(timed + warm)} (from the measured step times and an ASSUMED acceptance "
        f"alpha = 0.5; not a measurement)")


def _fitting(loaded: LoadedConfig, cells: list[PlannedRun], s: _Session) -> list[PlannedRun]:
    """The cells whose prompt + `max_new_tokens` fits the target's and (for drafting methods) the draft's
    context; the others are skipped with one line when the sweep says so, else refused.

    Raises:
        PlanDoesNotFitError: a prompt does not fit and ``skip_long_prompts`` is off.
    """
    budget = loaded.cfg.max_new_tokens
    limits = {"target": loaded.pair.target.backend.max_length}
    if loaded.pair.draft is not None:
        limits["draft"] = loaded.pair.draft.backend.max_length
    too_long: dict[str, str] = {}
    for prompt in {c.prompt.id: c.prompt for c in cells}.values():
        n = len(loaded.prompt_ids(prompt))
        over = [f"the {role}'s context of {ctx}" for role, ctx in limits.items() if n + budget > ctx]
        if over:
            too_long[prompt.id] = f"{prompt.id} ({n} tokens; over {' and '.join(over)})"
    if not too_long:
        return cells
    names = ", ".join(too_long.values())
    if not loaded.cfg.skip_long_prompts:
        raise PlanDoesNotFitError(
            f"[{loaded.rc.label}] {len(too_long)} prompt(s) + {budget} new tokens do not fit: {names}; "
            "skip them with --skip-long-prompts, or lower --max-new-tokens")
    kept = [c for c in cells if c.prompt.id not in too_long]
    s.log(f"[{loaded.rc.label}] skipping {len(cells) - len(kept)} runs of {len(too_long)} prompt(s) that do "
          f"not fit with {budget} new tokens: {names}")
    s.result.skipped += len(cells) - len(kept)
    s.bar.update(len(cells) - len(kept))
    return kept


def _check_equal(loaded: LoadedConfig, cell: PlannedRun, row: dict, s: _Session, refs: dict) -> None:
    """Under greedy decoding, set ``matches_baseline``: the run's ids equal our baseline's for its prompt."""
    if not loaded.cfg.greedy or row.get("token_ids") is None:
        return
    pid = cell.prompt.id
    if refs.get(pid) is None:
        refs[pid] = s.store.baseline_tokens(s.prepared.sweep_id, loaded.rc.label, pid)
    ref = refs[pid]
    if METHODS[cell.method].reference and ref is None:
        ref = row["token_ids"]
    row["matches_baseline"] = None if ref is None else int(row["token_ids"] == ref)
    row["first_divergence"] = None if ref is None else first_divergence(row["token_ids"], ref)


def _trace_and_calibrate(loaded: LoadedConfig, cell: PlannedRun, row: dict, run_id: int, s: _Session) -> None:
    """After a prompt's first successful target-only run: store its acceptance trace (greedy sweeps) and time
    a calibration block at its context. Untimed for the runs; a failure is logged, never raised."""
    cfg, pair, sid, label = loaded.cfg, loaded.pair, s.prepared.sweep_id, loaded.rc.label
    pid = cell.prompt.id
    prompt, out = loaded.prompt_ids(cell.prompt), list(row["token_ids"] or [])
    if cfg.traces and cfg.greedy and not s.store.has_trace(sid, label, pid):
        try:
            draft = pair.draft.backend if pair.draft is not None else None
            trace = record_trace(prompt, out, cfg.max_new_tokens, draft, vocab_size=pair.vocab_size)
            margins, tf_ids = target_margins(pair.target.backend, prompt, out, vocab_size=pair.vocab_size)
            s.store.save_trace(sid, label, pid, run_id, trace, target_margin=margins, target_tf_ids=tf_ids,
                               draft_context=draft.max_length if draft is not None else None)
        except Exception as exc:  # noqa: BLE001 - the timed runs do not depend on it
            s.log(f"[{label}] {pid}: acceptance trace not recorded: {_one_line(exc)}")
    if cfg.calibration_repeats > 0:
        try:
            block = calibration_block(pair, prompt + out[: len(out) // 2], max_n=cost_max_n(cfg),
                                      repeats=cfg.calibration_repeats)
            s.store.save_calibration(sid, label, pid, run_id, block)
            # the cost policy of this prompt's runs decides with the costs measured at its own context
            loaded.prompt_costs[pid] = CostCurve.from_costs(block)
        except Exception as exc:  # noqa: BLE001
            s.log(f"[{label}] {pid}: calibration block not timed: {_one_line(exc)}")


def _stored_prompt_costs(loaded: LoadedConfig, s: _Session) -> None:
    """On --resume: the calibration blocks this machine stored earlier for this configuration, so that the
    cost policy of a resumed prompt decides with the same costs as its earlier runs (and as its replay)."""
    blocks: dict[str, list[dict]] = {}
    for c in s.store.calibration(s.prepared.sweep_id):
        if c["config_label"] == loaded.rc.label and c["machine_id"] == (s.store.machine_id or ""):
            blocks.setdefault(c["prompt_id"], []).append(c)
    for pid, rows in blocks.items():
        if any(r["role"] == "target" and int(r["n_tokens"]) == 1 for r in rows):
            loaded.prompt_costs.setdefault(pid, CostCurve.from_calibration(rows))


def _record(cell: PlannedRun, row: dict, rounds: list[dict], label: str, s: _Session) -> int:
    run_id = s.store.record_run(row, rounds)
    s.result.ran += 1
    if row.get("error"):
        if str(row["error"]).startswith("skipped:"):
            s.result.skipped += 1
        else:
            s.result.failed += 1
    if METHODS[cell.method].reference and not row.get("error") and row.get("tokens_per_s"):
        s.baseline_tps.setdefault((label, cell.prompt.id), []).append(row["tokens_per_s"])
    if s.on_run is not None:
        s.on_run(row)
    s.bar.update(1)
    return run_id


def _run_config(loaded: LoadedConfig, cells: list[PlannedRun], s: _Session) -> bool:
    """Warm up and run one configuration's remaining cells; True when `max_runs` stopped the sweep."""
    label = loaded.rc.label
    _announce(loaded, cells, s.log)
    _stored_prompt_costs(loaded, s)
    warmed: set[tuple] = set()
    remaining: dict[tuple, int] = {}  # runs left per cell: its summary line comes after its last repeat
    for c in cells:
        remaining[c.cell] = remaining.get(c.cell, 0) + 1
    finished: dict[tuple, list[dict]] = {}
    refs: dict[str, list[int] | None] = {}
    for cell in cells:
        if s.max_runs is not None and s.result.ran >= s.max_runs:
            return True
        if cell.group not in warmed:
            warmed.add(cell.group)
            _warm_up(loaded, cell, cells[0].prompt, s.log)
        row, rounds = execute(loaded, cell, s.prepared)
        _check_equal(loaded, cell, row, s, refs)
        run_id = _record(cell, row, rounds, label, s)
        if METHODS[cell.method].reference and cell.repeat == 0 and not row.get("error"):
            _trace_and_calibrate(loaded, cell, row, run_id, s)
        finished.setdefault(cell.cell, []).append(row)
        remaining[cell.cell] -= 1
        if remaining[cell.cell] == 0:
            s.log(summary_line(cell, finished.pop(cell.cell), s.baseline_tps.get((label, cell.prompt.id))))
    return False


def _begin(cfg: SweepConfig, prepared: Prepared, store: Store, resume: bool, log) -> list[PlannedRun]:
    """Open (or resume) the sweep in the store, warn about a busy or changed machine; the runs left to do."""
    sid, plan = prepared.sweep_id, prepared.plan
    machine = machine_info(cfg.device, cfg.threads)
    row = store.begin_sweep(sid, prepared.meaning, resume=resume, name=cfg.name, machine=machine,
                            git_commit=git_commit())
    load = machine.get("loadavg_1m")
    if load is not None and load > 0.5:
        log(f"warning: the 1-minute load average is {load:.2f} before any model runs; other work on this "
            f"machine distorts every timing (each thread needs an idle core)")
    changed = machine_changes(row.get("machine_json"), machine)
    if changed:
        log(f"warning: this sweep was started with another {', '.join(changed)}; the runs added now are "
            f"timed on this machine, so compare them with care")
    done = store.done_cells(sid)
    todo = [c for c in plan if c.key(sid) not in done]
    return rebracket(todo) if cfg.pairing == "bracket" else todo


def rebracket(todo: Sequence[PlannedRun]) -> list[PlannedRun]:
    """The runs left to do, with no two non-baseline runs of a prompt back to back where baselines are left
    to go between them (MEASUREMENT.md, "Pair what you compare").

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
        The same runs, reordered within each (configuration, prompt) block of consecutive runs.
    """
    out: list[PlannedRun] = []
    for _, group in itertools.groupby(todo, key=lambda c: (c.config_label, c.prompt.id)):
        block = list(group)
        ref = [METHODS[c.method].reference for c in block]
        if not any(ref) or not any(not a and not b for a, b in itertools.pairwise(ref)):  # already alternates
            out.extend(block)
            continue
        bases = [c for c, r in zip(block, ref, strict=True) if r]
        others = [c for c, r in zip(block, ref, strict=True) if not r]
        out.extend(c for pair in itertools.zip_longest(bases, others) for c in pair if c is not None)
    return out


def _run_configs(cfg: SweepConfig, todo: list[PlannedRun], loader, s: _Session) -> bool:
    """Load and run each configuration in turn (a configuration that fails to load is reported and left for
    --resume); True when `max_runs` stopped the sweep."""
    for rc in cfg.runtime_configs():
        cells = [c for c in todo if c.config_label == rc.label]
        if not cells:
            continue
        try:
            loaded = _load(cfg, rc, loader, s)
            cells = _fitting(loaded, cells, s)  # before any forward runs, cost measurement included
            if cells:
                _measure(loaded, s)
        except PlanDoesNotFitError:
            raise
        except Exception as exc:  # noqa: BLE001 - a config that cannot load is reported, the rest run
            s.result.failed_configs[rc.label] = _one_line(exc)
            s.log(f"[{rc.label}] could not be loaded, its {len(cells)} runs are left for --resume: "
                  f"{_one_line(exc)}")
            s.bar.update(len(cells))
            continue
        try:
            if cells and _run_config(loaded, cells, s):
                return True
        finally:
            pair, loaded = loaded.pair, None
            _free(pair)
            del pair
    return False


def run_sweep(
    cfg: SweepConfig,
    *,
    db: str | Path = DEFAULT_DB,
    resume: bool = False,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    max_runs: int | None = None,
    on_run: Callable[[dict], None] | None = None,
    loader: Callable[..., Any] | None = None,
    lock_wait_s: float = 10.0,
    shard: str | None = None,
) -> SweepResult:
    """Run (or resume) a sweep and store every run in `db`.

    Args:
        cfg: the sweep (`specdec.bench.config.make_config`).
        db: the SQLite results file (created if missing).
        resume: continue the sweep with this configuration: finished runs are skipped, failed ones retried.
        progress: show a progress bar with ETA (tqdm, on stderr).
        echo: where plan/summary lines go (default: print to stdout, or above the progress bar).
        max_runs: stop after this many runs (for tests and partial runs); the sweep is left ``interrupted``.
        on_run: called with each stored run row (after its commit).
        loader: `specdec.loading.load_pair`-compatible (injectable for tests).
        lock_wait_s: how long to wait for another process's sweep on the same `db` to finish.
        shard: ``"I/N"`` (or a `specdec.bench.shard.Shard`): run only this shard's prompts
            (`specdec.bench.shard.shard_plan`); the sweep id is unchanged, the shard is recorded in ``shards``.

    Returns:
        A `SweepResult`.

    Raises:
        ValueError (PromptFileError, StoreError ...): bad settings or prompts (before any model loads),
            ``SweepExistsError`` / ``SweepNotFoundError`` (see `Store.begin_sweep`), ``StoreBusyError``
            (another sweep holds the store for longer than `lock_wait_s`), or every configuration failed to
            load (the first load error).
        KeyboardInterrupt: re-raised after marking the sweep ``interrupted`` (finished runs are kept); a
            SIGTERM received while the sweep runs (in the main thread) is raised as one.
    """
    if loader is None:
        from specdec.loading import load_pair as loader
    prepared = prepare(cfg)
    if shard is not None:  # only this shard's prompts; the identity (and so the sweep id) is unchanged
        prepared = dataclasses.replace(prepared, plan=shard_plan(prepared.plan, prepared.prompts, shard))
    with writer_lock(db, wait_s=lock_wait_s), _sigterm_as_interrupt():  # one sweep per store (case C23)
        return _run_locked(cfg, prepared, db, resume, progress, echo, max_runs, on_run, loader, shard)


SIGTERM_REASON = "SIGTERM"  # the KeyboardInterrupt's argument when a SIGTERM raised it (exit status 143)


def interrupt_exit_status(exc: KeyboardInterrupt) -> int:
    """The shell's exit status for a sweep stopped by `exc`: 143 (128 + 15) when SIGTERM raised it (see
    `_sigterm_as_interrupt`), 130 (128 + 2) for Ctrl-C."""
    return 128 + signal.SIGTERM if exc.args == (SIGTERM_REASON,) else 128 + signal.SIGINT


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While a sweep runs in the main thread, SIGTERM raises KeyboardInterrupt, so a sweep stopped by
    `kill`, a SLURM time limit or a job scheduler is marked ``interrupted`` like one stopped by Ctrl-C
    (finished runs are kept either way; a background job of a non-interactive shell ignores SIGINT, so
    SIGTERM is how it is stopped). The previous handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(_signum, _frame):
        raise KeyboardInterrupt(SIGTERM_REASON)

    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _run_locked(cfg, prepared: Prepared, db, resume, progress, echo, max_runs, on_run, loader,
                shard) -> SweepResult:
    """`run_sweep`'s body, under the store's writer lock."""
    from tqdm.auto import tqdm

    sid, plan = prepared.sweep_id, prepared.plan
    store = Store(db)
    bar = None

    def log(msg: str) -> None:
        if bar is not None and echo is None:
            bar.write(msg)
        else:
            (echo or print)(msg)

    try:
        todo = _begin(cfg, prepared, store, resume, log)
        record_shard(store, sid, shard)  # which shard this store holds, on which machine
        result = SweepResult(sid, str(db), len(plan), len(plan) - len(todo))
        n_prompts = len({c.prompt.id for c in plan})  # a shard's own prompts
        log(f"sweep {sid}: {len(plan)} timed generations ({n_prompts} prompts x {len(cfg.configs)} "
            f"config(s), {cfg.max_new_tokens} new tokens, {cfg.repeats} repeat(s)); {result.already_done} "
            f"already done, {len(todo)} to run; results in {db}")
        bar = tqdm(total=len(todo), unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True,
                   desc="sweep")
        session = _Session(prepared, store, result, log, bar, max_runs, on_run, _baseline_tps(store, sid))
        stopped = _run_configs(cfg, todo, loader, session)
        if result.failed_configs and result.ran == 0 and set(result.failed_configs) == {
            c.config_label for c in todo
        }:
            store.set_status(sid, "interrupted")
            result.status = "interrupted"
            raise ValueError(f"no configuration could be loaded: {next(iter(result.failed_configs.values()))}")
        result.status = "interrupted" if (stopped or result.failed_configs) else "done"
        store.set_status(sid, result.status)
        done = store.done_cells(sid)  # of the whole sweep: a shard's plan is part of it
        stored = sum(c.key(sid) in done for c in plan)
        log(f"sweep {sid} {result.status}: {result.ran} runs now ({result.failed} failed, {result.skipped} "
            f"skipped), {stored}/{len(plan)} planned runs stored successfully")
        return result
    except PlanDoesNotFitError:
        with contextlib.suppress(Exception):  # refused before anything ran: leave no trace of a new sweep
            if resume or not store.forget_empty_sweep(sid):
                store.set_status(sid, "interrupted")
        raise
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            store.set_status(sid, "interrupted")
        raise
    finally:
        if bar is not None:
            bar.close()
        store.close()
