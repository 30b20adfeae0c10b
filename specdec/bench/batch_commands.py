"""CLI: ``specdec batch-sweep`` (`specdec.bench.batch_sweep`): speedup of speculative decoding against batched
target-only decoding at each batch size B. Every user error is one line on stderr (status 2); an
interrupted sweep exits with 130 and says how to resume."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specdec.errors import cli_errors
from specdec.options import DraftOpt, PairOpt, TargetOpt, ThreadsOpt

__all__ = ["batch_sweep"]


def batch_sweep(
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    batch_sizes: Annotated[str, typer.Option("--batch-sizes", help="Batch sizes B (1..16), comma-separated.")]
    = "1,2,4,8",
    configs: Annotated[str, typer.Option("--configs", help="Runtime configurations: auto (transformers-bf16 where "
                                         "the CPU has native bf16 kernels, else transformers-eager), llamacpp, "
                                         "...; comma-separated.")] = "auto",
    groups: Annotated[str, typer.Option("--groups", help="Prompt groups: code, prose, repetitive, mixed (one of "
                                        "each type); comma-separated.")] = "code,prose,repetitive",
    batches: Annotated[int, typer.Option("--batches", help="Distinct prompt sets per (group, B): the units the "
                                         "intervals are computed over.")] = 3,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="New tokens per row.")] = 64,
    methods: Annotated[str, typer.Option("--methods", help="Drafting methods: draft (the draft model), ngram "
                                         "(prompt lookup); comma-separated.")] = "draft,ngram",
    max_k: Annotated[int, typer.Option("--max-k", help="Largest K priced; the calibration times 1..max-k+1 "
                                       "tokens per row.")] = 16,
    calibration_repeats: Annotated[int, typer.Option("--calibration-repeats", help="Timed passes of the "
                                                     "batched calibration.")] = 3,
    single_reference: Annotated[bool, typer.Option(
        "--single-reference/--no-single-reference", help="Also decode each prompt alone (untimed) and count the "
        "rows that differ from it.")] = True,
    threads: ThreadsOpt = None,
    device: Annotated[str, typer.Option("--device", help="cpu | cuda (transformers).")] = "cpu",
    db: Annotated[Path, typer.Option("--db", help="SQLite results file.")] = Path("results/batch.db"),
    resume: Annotated[bool, typer.Option("--resume", help="Continue the batch sweep with these settings: skip "
                                         "stored runs, retry failed ones.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and a rough duration; load no "
                                          "model.")] = False,
) -> None:
    """Speedup against batch size: per (configuration, group, B, batch) a batched target-only run between every
    two of speculative decoding at the batch-priced fixed K, the batch-aware cost policy and an A/A run;
    every run stored in SQLite as it finishes."""
    from specdec.bench import batch_sweep as BS
    from specdec.bench.store_access import StoreError

    with cli_errors():
        cfg = BS.make_batch_config(pair=pair, target=target, draft=draft, batch_sizes=batch_sizes, configs=configs,
                                   groups=groups, batches=batches, max_new_tokens=max_new_tokens, methods=methods,
                                   max_k=max_k, calibration_repeats=calibration_repeats, threads=threads,
                                   device=device, single_reference=single_reference)
        if db.is_dir():
            raise StoreError(f"{db}: is a directory, not a results store; name a file (e.g. {db}/batch.db)")
        if dry_run:
            _dry_run(cfg, db, resume)
            return
        try:
            result = BS.run_batch_sweep(cfg, db, resume=resume, echo=typer.echo)
        except KeyboardInterrupt:
            typer.echo(f"\ninterrupted: finished runs are saved in {db}; rerun the same command with --resume to "
                       "continue", err=True)
            raise typer.Exit(130) from None
    typer.echo(f"batch sweep {result.sweep_id}: {result.status}; {result.ran} runs now, {result.skipped} stored "
               f"before, {result.failed} failed; report with: specdec report --db {db} --out REPORT_DIR")


def _dry_run(cfg, db: Path, resume: bool) -> None:
    """Print the plan and its rough duration; the store, when it exists, is opened read-only to count the
    runs a --resume would skip."""
    from specdec.bench import batch_sweep as BS
    from specdec.bench.estimate import format_duration
    from specdec.bench.store import Store
    from specdec.bench.store_batch import BatchTables, batch_cell_key

    sid = BS.sweep_id_of(cfg)
    cells = BS.plan_cells(cfg)
    keys = [batch_cell_key(sid, c.config_label, c.group, c.batch_size, c.batch_idx, s, m, p)
            for c in cells for s, (m, p) in enumerate(c.runs)]
    done: set[str] = set()
    if db.is_file():
        with Store(db, readonly=True) as store:
            bt = BatchTables(store)
            bt.check_resume(sid, resume=resume)
            done = bt.done_cells(sid)
    left = [k for k in keys if k not in done]
    target, draft = BS._resolve_models(cfg)
    typer.echo(f"batch sweep {sid}: target {target}, draft {draft}; configs {', '.join(cfg.configs)}; groups "
               f"{', '.join(cfg.groups)}; B = {','.join(map(str, cfg.batch_sizes))}; {cfg.batches} batches per "
               f"(group, B); {cfg.max_new_tokens} new tokens per row; methods {', '.join(cfg.methods)}")
    typer.echo(f"{len(cells)} cells x {len(BS.run_sequence(cfg.methods))} runs = {len(keys)} timed batched "
               f"generations" + (f" ({len(keys) - len(left)} already stored in {db}: {len(left)} left)"
                                 if done else ""))
    typer.echo("per cell: " + " ".join(m + (f"/{p}" if p else "") for m, p in BS.run_sequence(cfg.methods)))
    est = BS.estimate_s(cfg)
    share = len(left) / len(keys) if keys else 0.0
    for label, s in est.items():
        typer.echo(f"  {label}: rough estimate {format_duration(s * share)} (model loading excluded)")
    typer.echo(f"rough estimate: {format_duration(sum(est.values()) * share)} in all, from reference costs of the "
               "default pair on 2 cores and an ASSUMED acceptance alpha = 0.5 at K = 3; not a measurement")
