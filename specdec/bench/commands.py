"""CLI commands of the benchmark layer: ``specdec sweep``, ``specdec costs``, ``specdec export``.

`register(app)` adds them to the main Typer app (``specdec/entrypoints/cli.py``). Every user error (bad flag value,
bad prompt file, missing model, sweep already in the database, ...) is printed as ONE line on stderr and
exits with status 2; an interrupted sweep exits with 130 (143 when stopped by SIGTERM) and says how to
resume. ``specdec sweep``'s options are built from one declaration per setting (`sweep_settings`); the pair
and runtime options of every command are `specdec.entrypoints.cli`'s shared declarations.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from specdec.bench.cluster_commands import check_executor, merge, sweep_on_ray  # [shards]
from specdec.bench.control import LOCK_WAIT_S, axis_resume
from specdec.bench.grid import batch_cost_ns, idle_policies
from specdec.bench.methods import chain_drafter_names
from specdec.bench.plan import calibration_passes
from specdec.bench.settings import PANEL_PLAN, PANEL_STORE, Setting, field_settings, typer_command
from specdec.bench.shard import shard_plan  # [shards]
from specdec.errors import cli_errors
from specdec.options import (
    BackendOpt,
    CompileOpt,
    DeviceOpt,
    DraftBackendOpt,
    DraftDtypeOpt,
    DraftOpt,
    DraftQuantOpt,
    DtypeOpt,
    GGUFTypeOpt,
    PairOpt,
    QuantOpt,
    TargetOpt,
    ThreadsOpt,
)

__all__ = ["RUN_SETTINGS", "costs", "export", "register", "sweep", "sweep_settings"]


def _echo(msg: str) -> None:
    typer.echo(msg)


# ------------------------------------------------------------------------------------------------ sweep


#: ``specdec sweep``'s options beyond the `SweepConfig` fields and the ``--config`` file's `FILE_SETTINGS`:
#: how this process runs the sweep (not part of it; a TOML file cannot set them).
RUN_SETTINGS = (
    Setting("config", None, "TOML file with any of the settings (flags override it).", PANEL_PLAN, Path),
    Setting("quick", False, "Primaries only, K=4, 32 new tokens, no peers or policies (~15 min on a 2-core "
            "CPU).", PANEL_PLAN, bool, ("--quick",)),
    Setting("dry_run", False, "Print the plan and a rough duration; load no model.", PANEL_PLAN, bool,
            ("--dry-run",)),
    Setting("measure_costs", False, "With --dry-run: load each configuration and time its target forwards and "
            "draft step on this machine first (about a minute each), and price the plan with them instead of "
            "reference costs of another machine.", PANEL_PLAN, bool, ("--measure-costs",)),
    Setting("max_runs", None, "Stop after this many runs (resume later).", PANEL_PLAN, int),
    Setting("wait_for_store", LOCK_WAIT_S, "Seconds to wait while another sweep writes the same --db before stopping "
            "with a message.", PANEL_STORE, float),
    Setting("resume", False, "Continue the sweep with these settings: skip finished runs, retry failed ones (in "
            "a store with no sweep yet, start it).", PANEL_STORE, bool, ("--resume",)),
    Setting("progress", True, "Progress bar with ETA on stderr.", PANEL_STORE, bool),
    Setting("shard", None, "Run shard I of N (I/N, 1-based) of the plan, split by prompt; merge the shard "
            "stores with specdec merge.", PANEL_STORE),  # [shards] specdec/bench/shard.py
    Setting("executor", "local", "local, or ray: one shard per Ray node, merged into --db.",
            PANEL_STORE),  # [shards] specdec/bench/ray_executor.py
    Setting("address", None, "Ray cluster address (with --executor ray).", PANEL_STORE),
)


def sweep_settings() -> list[Setting]:
    """Every option of ``specdec sweep``: the `SweepConfig` fields, the file settings (``--db``) and
    `RUN_SETTINGS`, each declared once."""
    from specdec.bench.config import FILE_SETTINGS, SweepConfig

    return [*field_settings(SweepConfig), *FILE_SETTINGS, *RUN_SETTINGS]


def _sweep(**opts) -> None:
    """``specdec sweep``'s body: `opts` holds one value per option of `sweep_settings` (None: not given)."""
    from specdec.bench import sweep as S

    with cli_errors():
        file_values = S.load_config_file(opts["config"]) if opts["config"] is not None else {}
        flags = {f.name: opts[f.name] for f in dataclasses.fields(S.SweepConfig) if f.name in opts}
        cfg = S.make_config(flags, file=file_values, quick=opts["quick"])
        shard = opts["shard"]
        executor = check_executor(opts["executor"], shard, opts["address"])  # [shards] one-line errors
        db_path = Path(opts["db"] or file_values.get("db") or S.DEFAULT_DB)
        if opts["measure_costs"] and not opts["dry_run"]:
            raise ValueError("--measure-costs prices a --dry-run; add --dry-run (a sweep measures its own costs)")
        axis = S.axis_configs(cfg)  # one sweep per temperature of --temperatures, all validated first
        resumes = axis_resume(axis, db_path, opts["resume"])
        if opts["dry_run"]:
            for one, resume in zip(axis, resumes, strict=True):
                _dry_run(one, db_path, shard, measure=opts["measure_costs"], resume=resume)
            return
        for one, resume in zip(axis, resumes, strict=True):
            try:
                if executor == "ray":
                    sweep_on_ray(one, db_path, resume=resume, address=opts["address"], progress=opts["progress"],
                                 max_runs=opts["max_runs"])
                    continue
                result = S.run_sweep(one, db=db_path, resume=resume, progress=opts["progress"],
                                     max_runs=opts["max_runs"], lock_wait_s=opts["wait_for_store"],
                                     shard=shard)  # shard=None: the whole plan
            except KeyboardInterrupt as exc:
                typer.echo(f"\ninterrupted: finished runs are saved in {db_path}; rerun the same command with "
                           f"--resume to continue", err=True)
                raise typer.Exit(S.interrupt_exit_status(exc)) from None
            if not _report_result(result, db_path):
                return  # interrupted: the axis's later sweeps wait for --resume


def _report_result(result, db_path: Path) -> bool:
    """Print how sweep `result` ended; False when it was interrupted (resume later).

    Raises:
        ValueError: every run attempted failed (a broken setup, not a result: exit non-zero).
    """
    if result.status == "interrupted":  # stopped by --max-runs, or a configuration could not load
        typer.echo(f"sweep {result.sweep_id}: interrupted; rerun the same command with --resume to continue")
    else:
        typer.echo(f"sweep {result.sweep_id}: {result.status}; export with: specdec export --db {db_path} "
                   f"--format csv --out runs.csv")
    if result.failed and result.failed >= result.ran - result.skipped:
        raise ValueError(f"all {result.failed} runs attempted failed; their errors are stored in {db_path} "
                         f"(specdec report names them)")
    return result.status != "interrupted"


sweep = typer_command(_sweep, sweep_settings(), "Run the study on this machine: per prompt a target-only run "
                      "(its acceptance trace and calibration block predict every K), then the cells they single "
                      "out, each between two target-only runs, and with --batch-sizes batches of prompts against "
                      "batched target-only decoding; every run stored in SQLite as it finishes.")


def _dry_run(cfg, db_path: Path, shard: str | None = None, measure: bool = False, loader=None,
             resume: bool = False) -> None:
    """Print the plan of `cfg` and its rough duration, priced with (in this order of preference) costs
    measured here now (`measure`: `specdec.bench.runner.measure_here`, models loaded and freed one
    configuration at a time; `loader` as `run_sweep`'s), the costs this sweep stored in `db_path`, or the
    reference costs of the configuration's runtime (`specdec.bench.estimate.reference_costs`). The store is
    opened read-only; with `resume`, it refuses what ``--resume`` itself would (`Store.check_resume`)."""
    from specdec.bench import sweep as S
    from specdec.bench.store import Store
    from specdec.core.costs import CostCurve

    prepared = S.prepare(cfg)
    sid = prepared.sweep_id
    plan = shard_plan(prepared.plan, prepared.prompts, shard)  # the shard's part of the plan (all when None)
    done: set[str] = set()
    costs_by = {}
    if db_path.is_file():  # a --resume prices only the runs left (what the sweep would skip is not run again)
        with Store(db_path, readonly=True) as store:
            if resume:
                store.check_resume(sid, resume=True)
            done = store.done_cells(sid)
            stored = {label: store.load_costs(sid, label) for label in cfg.configs}
        if not measure:
            costs_by = {label: CostCurve.from_costs(c) for label, c in stored.items() if c is not None}
    n_planned = len(plan)
    plan = [c for c in plan if not c.is_done(sid, done)]
    sources = [f"costs stored in {db_path}"] if costs_by else []
    if measure:
        from specdec.bench.runner import measure_here
        from specdec.measure.environment import machine_info

        for rc in cfg.runtime_configs():
            costs_by[rc.label] = CostCurve.from_costs(measure_here(cfg, rc, prepared, loader=loader, echo=_echo))
        m = machine_info(cfg.device, cfg.threads)
        threads = cfg.threads or "default"
        sources = [f"costs measured now on this machine ({m.get('cpu_model', '?')}, {threads} threads)"]
    references = []
    for rc in cfg.runtime_configs():
        if rc.label not in costs_by:
            costs_by[rc.label], ref = S.reference_costs(rc.target_backend, rc.draft_backend, rc.dtype or cfg.dtype)
            references.append(f"{rc.label}: {ref}")
    if references:
        sources.append("reference costs of the default pair on 2 cores (" + "; ".join(references) + ")")
    source = " and ".join(sources)
    parts = _plan_estimate(cfg, prepared.plan, plan, costs_by)
    _echo(f"sweep {sid}: target {prepared.target}, draft {prepared.draft}; {len(prepared.prompts)} prompts, configs "
          f"{', '.join(cfg.configs)}; {cfg.max_new_tokens} new tokens, {cfg.repeats} repeat(s)")
    left = f" ({n_planned - len(plan)} of {n_planned} already done in {db_path}: the runs left)" \
        if len(plan) < n_planned else ""
    batches = {(c.batch_size, c.batch_id) for c in plan if c.batch_id is not None}
    if batches:
        per_b = {b: sum(1 for bb, _ in batches if bb == b) for b in sorted({b for b, _ in batches})}
        _echo("batch axis: " + ", ".join(f"B={b}: {n} batches" for b, n in per_b.items()) + " of one prompt group "
              "each, every batched run between two batched target-only runs of its prompts at its B")
    _echo(f"{len(plan)} timed generations{left}:")
    for key, n in S.plan_summary(plan).items():
        _echo(f"  {key:<34} {n}")
    if (idle := idle_policies(cfg)) is not None:
        _echo(idle)
    timed, warm, measure_s, instr = parts
    _echo(f"rough estimate: {S.format_duration(timed)} timed + {S.format_duration(warm)} warm-ups + "
          f"{S.format_duration(measure_s)} cost measurement + {S.format_duration(instr)} traces and calibration = "
          f"{S.format_duration(sum(parts))} "
          f"(model loading excluded), from {source}, ~100-token prompts and an ASSUMED acceptance alpha = 0.5")
    if sum(parts) > MAIN_JOB_S and not done and shard is None and cfg.prompts is None:
        _echo(_what_fits(cfg, costs_by))


#: The main job's duration on one machine (seconds): a dry run of the built-in prompts over it says what fits.
MAIN_JOB_S = 35 * 60


def _plan_estimate(cfg, full_plan, plan, costs_by) -> tuple[float, float, float, float]:
    """Rough seconds of `plan` (the runs of `full_plan` still to do) priced with `costs_by` ({config label:
    `CostCurve`}): ``(timed runs, warm-ups, cost measurement, traces and calibration blocks)``."""
    from specdec.bench import sweep as S

    timed, warm = S.estimate_plan_s(plan, costs_by, max_new_tokens=cfg.max_new_tokens,
                                    warmup_tokens=cfg.warmup_tokens)
    batch_ns = batch_cost_ns(cfg)[0]
    measure_s = sum(S.cost_measurement_s(costs_by[label], S.cost_max_n(cfg), cfg.cost_repeats, batch_ns)
                    for label in cfg.configs)
    traced = {(c.config_label, c.prompt.id) for c in plan if c.batch_id is None}  # traces and blocks: B = 1 only
    chains = 0 if cfg.greedy else len(chain_drafter_names(cfg.methods))
    instr = sum(S.instrumentation_s(costs_by[label], max_n=S.cost_max_n(cfg), traces=cfg.traces,
                                    calibration_repeats=calibration_passes(cfg, full_plan, label, pid),
                                    new_tokens=cfg.max_new_tokens, chain_drafters=chains)
                for label, pid in traced)
    return timed, warm, measure_s, instr


def _what_fits(cfg, costs_by) -> str:
    """One line for a plan of the built-in prompts estimated over `MAIN_JOB_S`: the most prompts per type
    whose plan fits it on the same costs (each count's plan priced like the full one), and what a per-type
    claim then rests on."""
    from specdec.bench import sweep as S

    budget = f"{MAIN_JOB_S // 60} min"
    total = None
    for n in range(cfg.prompts_per_type - 1, 0, -1):
        smaller = dataclasses.replace(cfg, prompts_per_type=n)
        plan = S.prepare(smaller).plan
        total = sum(_plan_estimate(smaller, plan, plan, costs_by))
        if total <= MAIN_JOB_S:
            claim = ("fewer than 5 prompts per type: the report's per-type figures are labelled too few units, "
                     "with no verdicts" if n < 5 else "per-type verdicts over 5+ prompts each")
            return (f"over the main job's ~{budget} on these costs: --prompts-per-type {n} fits "
                    f"(~{S.format_duration(total)}; {claim})")
    if total is None:
        return f"over the main job's ~{budget} on these costs"
    return (f"over the main job's ~{budget} on these costs, even with --prompts-per-type 1 "
            f"(~{S.format_duration(total)}): a faster runtime configuration (--configs) or fewer --prompt-types")


# ------------------------------------------------------------------------------------------------ costs


def costs(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "auto",
    threads: ThreadsOpt = None,
    backend: BackendOpt = "transformers",
    draft_backend: DraftBackendOpt = None,
    compile: CompileOpt = False,
    max_n: Annotated[int, typer.Option(help="Time target forwards of 1..max-n tokens.")] = 17,
    repeats: Annotated[int, typer.Option(help="Timed forwards per n (median reported).")] = 3,
    context_tokens: Annotated[int, typer.Option(help="Tokens in the warm cache.")] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (last line).")] = False,
    arch: Annotated[str | None, typer.Option(
        "--arch", help="Instead of a pair: published architectures built with RANDOM weights (timing only), "
        "e.g. gpt2,gpt2-medium,gpt2-large; c is given for the original study's pairs and the default pair.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="With --arch: also write the JSON here.")] = None,
    quant: QuantOpt = None,
    draft_dtype: DraftDtypeOpt = None,
    draft_quant: DraftQuantOpt = None,
    bandwidth_mib: Annotated[float, typer.Option(
        "--bandwidth-mib", help="MiB per buffer of the streaming copy that measures the machine's memory "
        "bandwidth (the roofline).")] = 512,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out file (never a results "
                                        "store).")] = False,
    gguf_type: GGUFTypeOpt = None,
) -> None:
    """Measure c (draft step / target step) and the target's forward-time curve on a warm cache, and the
    target's roofline: weight bytes read per step, achieved GB/s at n = 1 and its share of the machine's
    memory bandwidth (a streaming copy; GB/s = 1e9 bytes/s). On llama.cpp it also states what ran: each
    GGUF's tensor weight types, whether weights were repacked (and, where AMX kept repacking off, one line
    saying so), and the ggml environment switches (``--json``: ``"runtime"``)."""
    from specdec import models
    from specdec.measure.timing import measure_costs
    from specdec.runtimes.loading import load_pair
    from specdec.runtimes.precision import draft_quant_arg, resolve_dtype

    dtype = resolve_dtype(dtype, device)  # auto: the rule `generate` follows (specdec.runtimes.precision.default_dtype)
    if out is not None:  # checked before minutes of timing: never a results store, never overwritten silently
        from specdec.paths import check_output

        with cli_errors():
            out = check_output(out, force=force)
    if arch is not None:
        _arch_costs(arch, device=device, dtype=dtype, threads=threads, max_n=max_n, repeats=repeats,
                    context_tokens=context_tokens, as_json=as_json, out=out)
        return
    with cli_errors():
        gguf_type = _gguf_type(gguf_type, backend)  # before any model loads
        target_spec, draft_spec = models.resolve_pair(pair, target, draft)
        typer.echo(f"loading {target_spec} and {draft_spec} ...", err=True)
        loaded = load_pair(target_spec, draft_spec, backend=backend, draft_backend=draft_backend, device=device,
                           dtype=dtype, threads=threads, compile=compile, quant=quant, draft_dtype=draft_dtype,
                           draft_quant=draft_quant_arg(draft_quant),
                           **({"gguf_type": gguf_type} if gguf_type is not None else {}))
        from specdec.runtimes.llamacpp_record import pair_record, record_lines

        runtime = pair_record(loaded)
        from specdec.core.costs import DRAFT_PREFILL_NS

        # the draft's prefill-sized forwards too: a policy built from this output prices its deferred prefill
        result = measure_costs(loaded, max_n=max_n, repeats=repeats, context_tokens=context_tokens,
                               draft_extra_ns=DRAFT_PREFILL_NS)
        from specdec.measure.roofline import measure_bandwidth, roofline, weight_bytes

        bandwidth = measure_bandwidth(bandwidth_mib, threads=threads)
        roof = roofline(weight_bytes(loaded.target), result["target_step_s"], bandwidth)
    if as_json:
        out = {
            "target": target_spec, "draft": draft_spec, "backend": backend,
            "draft_backend": draft_backend or backend, "device": device, "dtype": dtype,
            "threads": threads, "compiled": compile, "quant": quant, "draft_dtype": draft_dtype or dtype,
            "draft_quant": quant if draft_quant is None else draft_quant, "gguf_type": gguf_type,
            **result, "roofline": roof, "bandwidth": bandwidth, "runtime": runtime,
        }  # fmt: skip
        typer.echo(json.dumps(out, sort_keys=True))
        return
    _print_costs(result, roof, bandwidth, record_lines(runtime))


def _gguf_type(gguf_type: str | None, backend: str) -> str | None:
    """``--gguf-type`` checked (`specdec.models.requant.check_gguf_type`); None when not given.

    Raises:
        ValueError: given for a backend other than llama.cpp, or not a requantization type.
    """
    if gguf_type is None:
        return None
    from specdec.models.requant import check_gguf_type

    if backend != "llamacpp":
        raise ValueError("--gguf-type applies to the llama.cpp backend only (add --backend llamacpp)")
    return check_gguf_type(gguf_type)


def _print_costs(result: dict, roof: dict, bandwidth: dict, runtime_lines: list[str]) -> None:
    """``specdec costs``'s text output: the steps and c, the draft's longer forwards, the target's forward
    curve with v(n), the roofline and what the models ran on."""
    c = result["c"]
    typer.echo(f"target step  {result['target_step_s'] * 1e3:9.2f} ms")
    if result["draft_step_s"] is not None:
        typer.echo(f"draft step   {result['draft_step_s'] * 1e3:9.2f} ms")
        typer.echo(f"c            {c:9.3f}  (draft step / target step)")
        longer = {n: s for n, s in (result["draft_forward_s"] or {}).items() if n > 1}
        if longer:
            typer.echo("draft forward (its deferred prefill's price): "
                       + ", ".join(f"{n} tokens {s * 1e3:.1f} ms" for n, s in longer.items()))
    typer.echo("target forward, warm cache of "
               f"{result['context_tokens']} tokens (median of {result['repeats']}):")
    typer.echo("   n      ms   spread ms   v(n) target steps")
    for n, s in result["target_forward_s"].items():
        spread = result["target_forward_spread_s"][n]
        typer.echo(f"  {n:2d} {s * 1e3:8.2f} {spread * 1e3:10.2f} {result['verify_steps'][n]:10.2f}")
    typer.echo(f"roofline: target weights {roof['weight_bytes'] / 1e6:.1f} MB read per step, "
               f"{roof['achieved_gbps']:.2f} GB/s achieved at n = 1; machine bandwidth "
               f"{roof['bandwidth_gbps']:.2f} GB/s (streaming copy of {bandwidth['size_mib']:g} MiB, best of "
               f"{bandwidth['repeats']}): share {roof['bandwidth_share']:.2f}")
    for line in runtime_lines:
        typer.echo(line)


def _arch_costs(names: str, *, device, dtype, threads, max_n, repeats, context_tokens, as_json, out) -> None:
    """``specdec costs --arch``: time randomly initialized published architectures (`specdec.measure.archs`)."""
    from specdec.bench.sweep import machine_info
    from specdec.measure import archs
    from specdec.runtimes.loading import set_threads

    with cli_errors():
        chosen = archs.resolve_archs(names)
        set_threads(threads)
        typer.echo(f"timing {', '.join(a.name for a in chosen)} ({archs.RANDOM_WEIGHTS_LABEL}) ...", err=True)
        result = archs.measure_arch_costs(chosen, dtype=dtype, device=device, max_n=max_n, repeats=repeats,
                                          context_tokens=context_tokens)
    result["threads"] = threads
    result["machine"] = machine_info(device, threads)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True, default=str))
        return
    typer.echo(archs.format_arch_costs(result))


# ----------------------------------------------------------------------------------------------- export


def export(
    db: Annotated[Path, typer.Option(help="SQLite results file.")],
    out: Annotated[Path, typer.Option(help="Output file.")],
    format: Annotated[
        str | None, typer.Option("--format", help="csv, jsonl or parquet (default: from --out's suffix).")
    ] = None,
    sweep_id: Annotated[str | None, typer.Option(help="Only this sweep's runs.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out file (never a results "
                                        "store).")] = False,
) -> None:
    """Export every run, single-sequence and batched (column kind), joined with its sweep's configuration, to
    CSV, JSON Lines or Parquet."""
    from specdec.bench.export import EXPORT_FORMATS, export_runs

    with cli_errors():
        fmt = format
        if fmt is None:
            fmt = out.suffix.lower().lstrip(".")
            if fmt not in EXPORT_FORMATS:
                raise ValueError(f"cannot tell the format from {out.name}; pass --format "
                                 f"{'|'.join(EXPORT_FORMATS)}")
        n = export_runs(db, fmt, out, sweep_id=sweep_id, force=force)
    typer.echo(f"{n} runs written to {out} ({n.by_kind['single']} single-sequence, {n.by_kind['batch']} batched; "
               f"column kind tells them apart)")


def register(app: typer.Typer) -> None:
    """Add the ``sweep``, ``costs``, ``export`` and ``merge`` commands to `app`."""
    app.command("sweep")(sweep)
    app.command("costs")(costs)
    app.command("export")(export)
    app.command("merge")(merge)  # [shards] specdec/bench/cluster_commands.py
