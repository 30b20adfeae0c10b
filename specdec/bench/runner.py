"""The sweep's runner: plan -> run -> record.

- plan: `prepare` the sweep (no model loaded), keep this process's shard (`specdec.bench.control.for_shard`),
  open or resume it in the store and keep the runs left to do (`_begin`; resumed runs re-bracketed).
- run: per runtime configuration, load its models once (the previous configuration's are freed first),
  drop the prompts that do not fit (`specdec.bench.loaded.fitting`), measure its costs (stored once per
  config_label), then time each planned run through its `Method`, after one untimed warm-up generation per
  (config_label, method, K, policy) on the first prompt. What a configuration started beside its models (the
  batched backends, the native peers' ``llama-server`` processes) is closed with it.
- record: each run is committed with its rounds in one transaction (`specdec.bench.store.Store.record_run`),
  so a killed sweep loses at most the run in flight; ``resume=True`` skips finished runs and retries failed
  ones. The sweep's status is set at the end (``done`` or ``interrupted``).

Around the timed runs, the probes of `specdec.bench.probes` (roofline, equality with our baseline under
greedy decoding, acceptance trace, calibration block) are walked at their moments; the state shared by the
whole call is one `specdec.bench.state.SweepState`. A batched run (B > 1) is timed, checked and turned into
its B rows by `specdec.bench.batch_runs`, and its rows are committed together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specdec.bench import batch_runs, native_peers, probes
from specdec.bench.config import BEST_K, DEFAULT_DB, SweepConfig
from specdec.bench.console import ERR_LEN, one_line, summary_line
from specdec.bench.control import LOCK_WAIT_S, SIGTERM_REASON, for_shard, interrupt_exit_status, sweep_guard
from specdec.bench.grid import idle_policies
from specdec.bench.loaded import (
    LoadedConfig,
    PlanDoesNotFitError,
    announce,
    fitting,
    free,
    free_models,
    load_config,
    measure_config_costs,
    measure_here,
)
from specdec.bench.machines import record_shard
from specdec.bench.methods import METHODS, reference_method
from specdec.bench.plan import PlannedRun, Prepared, prepare, rebracket
from specdec.bench.requests import RunRecord, RunRequest
from specdec.bench.state import SweepResult, SweepState
from specdec.bench.store import Store
from specdec.measure.environment import git_commit, machine_changes, machine_info
from specdec.prompts import Prompt

__all__ = [
    "SIGTERM_REASON",
    "LoadedConfig",
    "PlanDoesNotFitError",
    "SweepResult",
    "SweepState",
    "execute",
    "interrupt_exit_status",
    "measure_here",
    "run_sweep",
]


def _row(loaded: LoadedConfig, cell: PlannedRun, prepared: Prepared) -> dict[str, Any]:
    """The settings columns of `cell`'s ``runs`` row (the measured ones come from its `RunRecord`)."""
    cfg, rc, sid = loaded.cfg, loaded.rc, prepared.sweep_id
    return {
        "sweep_id": sid, "cell_key": cell.key(sid), "config_label": cell.config_label,
        "pair": prepared.pair_name, "target": prepared.target,
        "draft": cfg.xtok_draft if METHODS[cell.method].cross_tokenizer else prepared.draft,
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
    return METHODS[cell.method].run(loaded.runtime(cell.prompt.id, cell.method), request)


def _resolve(loaded: LoadedConfig, cell: PlannedRun, s: SweepState) -> tuple[PlannedRun, str | None]:
    """What runs for `cell`: itself, or for policy ``best`` the same drafter at the fixed K its prompt's trace
    predicts fastest (`probes.best_k`; the row then reads as that fixed-K cell, its ``cell_key`` stays the
    planned one; a batched run's K is its batch's, `specdec.bench.batch_runs.resolve`). Second: a skip reason
    when that K cannot be chosen."""
    if cell.policy != BEST_K:
        return cell, None
    if cell.batch_id is not None:
        try:
            return batch_runs.resolve(loaded, cell, s), None
        except Exception as exc:  # noqa: BLE001 - recorded as skipped; the pre-run fails as the run would
            return cell, f"skipped: {one_line(exc)}"
    try:
        k = probes.best_k(loaded, s, cell)
    except ValueError as exc:
        # a resumed prompt may have its first baseline stored but not its trace or block: take them now
        if not probes.measure_missed(loaded, s, cell.prompt):
            return cell, f"skipped: {one_line(exc)}"
        try:
            k = probes.best_k(loaded, s, cell)
        except ValueError as again:
            return cell, f"skipped: {one_line(again)}"
    return dataclasses.replace(cell, k=k, policy="fixed"), None


def execute(loaded: LoadedConfig, cell: PlannedRun, prepared: Prepared, *,
            skip: str | None = None) -> tuple[dict, list[dict]]:
    """Run one timed generation of `cell`; return its ``runs`` row and ``rounds`` rows.

    A failure is recorded in the row (``error``, one line), never raised (KeyboardInterrupt excepted); a
    method with `Method.skip`, or a given `skip` reason, is recorded as skipped without running.
    """
    row = _row(loaded, cell, prepared)
    skip = skip or METHODS[cell.method].skip_reason(loaded.cfg)
    try:
        ids = loaded.prompt_ids(cell.prompt)
        row["prompt_tokens"] = len(ids)
        if skip:
            row["error"] = skip[:ERR_LEN]
            return row, []
        record = _run(loaded, cell, ids, loaded.cfg.max_new_tokens)
    except Exception as exc:  # noqa: BLE001 - a failed run is recorded (error set) and the sweep goes on
        row["error"] = one_line(exc)
        return row, []
    row.update(record.columns())
    return row, record.rounds


def _warm_up(loaded: LoadedConfig, cell: PlannedRun, prompt: Prompt, log: Callable[[str], None]) -> None:
    """One untimed, unstored generation of `cell`'s group on `prompt` (`warmup_tokens` new tokens)."""
    if METHODS[cell.method].skip_reason(loaded.cfg):
        return
    try:
        n = min(loaded.cfg.warmup_tokens, loaded.cfg.max_new_tokens)
        _run(loaded, cell, loaded.prompt_ids(prompt), n)
    except Exception as exc:  # noqa: BLE001 - the timed run will fail the same way and be recorded
        log(f"{cell.describe()}: warm-up failed: {one_line(exc)}")


def _baseline_tps(store: Store, sid: str) -> dict[tuple[str, str], list[float]]:
    """Tokens/s of the sweep's stored target-only runs per (config_label, prompt or batch id; a batch's
    aggregate tokens/s), for the console's "x vs baseline": only those timed on this machine (`store.machine_id`), since a sweep resumed on another
    machine would otherwise print a ratio of two machines' timings."""
    out: dict[tuple[str, str], list[float]] = {}
    here = store.machine_id or ""
    for r in store.runs(sid, method=reference_method().name):
        tps = r["tokens_per_s"] if r["batch_id"] is None else r["batch_tokens_per_s"] if r["row"] == 0 else None
        if r["error"] is None and tps and (r.get("machine_id") or "") == here:
            out.setdefault((r["config_label"], r["batch_id"] or r["prompt_id"]), []).append(tps)
    return out


def _record(cell: PlannedRun, rows: list[dict], rounds: list[list[dict]], s: SweepState) -> list[int]:
    """Store one run (a batched run's rows) with its rounds (one transaction) and count it; return the run
    ids."""
    run_ids = s.store.record_runs(list(zip(rows, rounds, strict=True)))
    s.result.ran += 1
    row = rows[0] if cell.batch_id is None else batch_runs.aggregate(rows)
    if row.get("error"):
        if str(row["error"]).startswith("skipped:"):
            s.result.skipped += 1
        else:
            s.result.failed += 1
    if METHODS[cell.method].reference and not row.get("error") and row.get("tokens_per_s"):
        s.baseline_tps.setdefault((cell.config_label, cell.unit), []).append(row["tokens_per_s"])
    if s.on_run is not None:
        for r in rows:
            s.on_run(r)
    s.advance()
    return run_ids


def _first_baseline(cell: PlannedRun, row: dict) -> bool:
    """Whether `row` is its prompt's first successful single-sequence target-only run (the one the probes
    measure after)."""
    return METHODS[cell.method].reference and cell.repeat == 0 and not row.get("error") and cell.batch_id is None


def _execute(loaded: LoadedConfig, cell: PlannedRun, run: PlannedRun, skip: str | None,
             s: SweepState) -> tuple[list[dict], list[list[dict]]]:
    """Time `run` (`cell` resolved) and return its rows and rounds, keyed by the planned `cell`, the `RUN`
    probes walked."""
    if cell.batch_id is not None:
        return batch_runs.execute(loaded, cell, run, _row(loaded, run, s.prepared), s, skip)
    row, rounds = execute(loaded, run, s.prepared, skip=skip)
    row["cell_key"] = cell.key(s.sweep_id)  # the planned cell: what --resume finds done
    probes.walk(probes.RUN, s, probes.At(loaded, cell, row))
    return [row], [rounds]


def _run_config(loaded: LoadedConfig, cells: list[PlannedRun], s: SweepState) -> bool:
    """Warm up and run one configuration's remaining cells; True when `max_runs` stopped the sweep."""
    announce(loaded, cells, s.log)
    probes.stored_prompt_costs(loaded, s)
    probes.stored_outputs(loaded, s)
    warmed: set[tuple] = set()
    remaining: dict[tuple, int] = {}  # runs left per cell: its summary line comes after its last repeat
    for c in cells:
        remaining[c.cell] = remaining.get(c.cell, 0) + 1
    finished: dict[tuple, list[dict]] = {}
    for cell in cells:
        if s.stop_now():
            return True
        run, skip = _resolve(loaded, cell, s)
        if run.group not in warmed and skip is None:
            warmed.add(run.group)
            if run.batch_id is None:
                _warm_up(loaded, run, cells[0].prompt, s.log)
            else:
                batch_runs.warm_up(loaded, run, s.log)
        rows, rounds = _execute(loaded, cell, run, skip, s)
        run_ids = _record(cell, rows, rounds, s)
        if _first_baseline(cell, rows[0]):
            probes.walk(probes.FIRST_BASELINE, s, probes.At(loaded, cell, rows[0], run_ids[0]))
        finished.setdefault(cell.cell, []).append(rows[0] if cell.batch_id is None else batch_runs.aggregate(rows))
        remaining[cell.cell] -= 1
        if remaining[cell.cell] == 0:
            # the line names what ran (policy best: the fixed K its trace chose)
            s.log(summary_line(run, finished.pop(cell.cell), s.baseline_tps.get((loaded.label, cell.unit))))
    return False


def _run_configs(todo: list[PlannedRun], s: SweepState) -> bool:
    """Load and run each configuration in turn (a configuration that fails to load is reported and left for
    --resume); True when `max_runs` stopped the sweep."""
    for rc in s.cfg.runtime_configs():
        cells = [c for c in todo if c.config_label == rc.label]
        if not cells:
            continue
        try:
            loaded = load_config(rc, s)
            cells = fitting(loaded, cells, s)  # before any forward runs, cost measurement included
            if cells:
                measure_config_costs(loaded, s)
                batch_runs.prepare(loaded, cells, s)  # the batch pricing and backends, when it has batched runs
                probes.walk(probes.CONFIGURATION, s, probes.At(loaded))
        except PlanDoesNotFitError:
            raise
        except Exception as exc:  # noqa: BLE001 - a config that cannot load is reported, the rest run
            s.result.failed_configs[rc.label] = one_line(exc)
            s.log(f"[{rc.label}] could not be loaded, its {len(cells)} runs are left for --resume: "
                  f"{one_line(exc)}")
            s.advance(len(cells))
            continue
        try:
            if cells and _run_config(loaded, cells, s):
                return True
        finally:
            batch_runs.close(loaded)
            native_peers.close_servers()  # the configuration's llama-server processes (its native peers)
            pair, xtok, loaded = loaded.pair, loaded.xtok, None
            free(pair)
            free_models(xtok.draft if xtok is not None else None)
            del pair, xtok
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
    todo = [c for c in plan if not c.is_done(sid, done)]
    return rebracket(todo) if cfg.pairing == "bracket" else todo


def _finish(todo: list[PlannedRun], stopped: bool, s: SweepState) -> SweepResult:
    """Set and log the sweep's status: ``done`` when every run left was attempted, else ``interrupted``.

    Raises:
        ValueError: no configuration could be loaded (the first load error).
    """
    result, store, sid, plan = s.result, s.store, s.sweep_id, s.prepared.plan
    if result.failed_configs and result.ran == 0 and set(result.failed_configs) == {
        c.config_label for c in todo
    }:
        store.set_status(sid, "interrupted")
        result.status = "interrupted"
        raise ValueError(f"no configuration could be loaded: {next(iter(result.failed_configs.values()))}")
    result.status = "interrupted" if (stopped or result.failed_configs) else "done"
    store.set_status(sid, result.status)
    done = store.done_cells(sid)  # of the whole sweep: a shard's plan is part of it
    stored = sum(c.is_done(sid, done) for c in plan)
    s.log(f"sweep {sid} {result.status}: {result.ran} runs now ({result.failed} failed, {result.skipped} "
          f"skipped), {stored}/{len(plan)} planned runs stored successfully")
    return result


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
    lock_wait_s: float = LOCK_WAIT_S,
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
        loader: `specdec.runtimes.loading.load_pair`-compatible (injectable for tests).
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
        from specdec.runtimes.loading import load_pair as loader
    prepared = for_shard(prepare(cfg), shard)  # a shard's prompts only; the sweep id is unchanged
    with sweep_guard(db, lock_wait_s):  # one sweep per store; SIGTERM stops it like Ctrl-C
        from tqdm.auto import tqdm

        sid, plan = prepared.sweep_id, prepared.plan
        s = SweepState(cfg, prepared, Store(db), loader, SweepResult(sid, str(db), len(plan), 0), echo=echo,
                       max_runs=max_runs, on_run=on_run)
        try:
            todo = _begin(cfg, prepared, s.store, resume, s.log)  # plan
            record_shard(s.store, sid, shard)  # which shard this store holds, on which machine
            s.result.already_done = len(plan) - len(todo)
            s.baseline_tps = _baseline_tps(s.store, sid)
            n_prompts = len({c.prompt.id for c in plan})  # a shard's own prompts
            s.log(f"sweep {sid}: {len(plan)} timed generations ({n_prompts} prompts x {len(cfg.configs)} "
                  f"config(s), {cfg.max_new_tokens} new tokens, {cfg.repeats} repeat(s)); "
                  f"{s.result.already_done} already done, {len(todo)} to run; results in {db}")
            if (idle := idle_policies(cfg)) is not None:
                s.log(idle)
            s.bar = tqdm(total=len(todo), unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True,
                         desc="sweep")
            stopped = _run_configs(todo, s)  # run (each run recorded as it finishes)
            return _finish(todo, stopped, s)  # record the sweep's status
        except PlanDoesNotFitError:
            with contextlib.suppress(Exception):  # refused before anything ran: leave no trace of a new sweep
                if resume or not s.store.forget_empty_sweep(sid):
                    s.store.set_status(sid, "interrupted")
            raise
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                s.store.set_status(sid, "interrupted")
            raise
        finally:
            if s.bar is not None:
                s.bar.close()
            s.store.close()
