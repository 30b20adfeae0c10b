"""CLI glue for sweeps on several machines: ``specdec merge`` and ``specdec sweep --executor ray``.

`specdec.bench.commands` calls `check_executor` and `sweep_on_ray` from ``specdec sweep`` and registers
`merge`; the logic lives in `specdec.bench.shard`, `specdec.bench.merge` and `specdec.bench.ray_executor`.
User errors are one line on stderr, exit 2 (the same format as the other commands).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["EXECUTORS", "check_executor", "merge", "sweep_on_ray"]

EXECUTORS = ("local", "ray")


def check_executor(executor: str, shard: str | None, address: str | None) -> str:
    """Validate ``--executor`` / ``--shard`` / ``--address`` together; return the executor name.

    Raises:
        ValueError: unknown executor; ``--shard`` with ``--executor ray`` (Ray makes the shards);
            ``--address`` without Ray; ``--executor ray`` with Ray not installed; a malformed ``--shard``.
    """
    from specdec.bench.shard import parse_shard

    executor = (executor or "local").lower()
    if executor not in EXECUTORS:
        raise ValueError(f"--executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    parse_shard(shard)
    if executor == "ray":
        if shard is not None:
            raise ValueError("--shard and --executor ray exclude each other: Ray runs every shard, one per node")
        from specdec.bench.ray_executor import require_ray

        require_ray()
    elif address is not None:
        raise ValueError("--address is the Ray cluster's address: use it with --executor ray")
    return executor


def sweep_on_ray(cfg, db: Path, *, resume: bool, address: str | None, progress: bool,
                 max_runs: int | None) -> None:
    """``specdec sweep --executor ray``: run the shards on Ray, merge them into `db`, print the outcome.

    Raises:
        ValueError: see `specdec.bench.ray_executor.run_sweep_ray`; every shard failed.
    """
    from specdec.bench.ray_executor import run_sweep_ray

    res = run_sweep_ray(cfg, db=db, resume=resume, address=address, progress=progress, echo=typer.echo,
                        max_runs=max_runs)
    failed = [s for s in res.shards if s.status == "failed"]
    typer.echo(f"sweep {res.sweep_id}: {res.status}; {len(res.shards) - len(failed)}/{len(res.shards)} "
               f"shard(s) stored, merged into {db}")
    if failed:
        typer.echo(f"{len(failed)} shard(s) failed ({', '.join(s.shard for s in failed)}); rerun the same "
                   f"command with --resume to finish them", err=True)
        if len(failed) == len(res.shards):
            raise ValueError(f"every shard failed; first error: {failed[0].error}")


def merge(
    shards: Annotated[list[Path], typer.Argument(help="Shard stores (SQLite files) of one sweep (or batch sweep).")],
    out: Annotated[Path, typer.Option("--out", help="The merged store (created, or added to).")],
) -> None:
    """Merge the shard stores of one sweep (specdec sweep --shard I/N) into one store, batched runs included."""
    from specdec.bench.machines import machine_label
    from specdec.bench.merge import merge_stores
    from specdec.bench.store import Store
    from specdec.errors import cli_errors

    with cli_errors():
        res = merge_stores(out, shards, echo=typer.echo)
    with cli_errors(), Store(out, readonly=True) as st:
        labels = {mid: machine_label(js) for mid, js in st.conn.execute("SELECT * FROM machines")}
    typer.echo(f"merged {len(shards)} store(s) into {out}: sweep {', '.join(res.sweep_ids) or 'none'}, {res.added} "
               f"runs added ({res.duplicates} duplicate(s) kept once); batch sweep "
               f"{', '.join(res.batch_sweep_ids) or 'none'}, {res.batch_added} batched runs added "
               f"({res.batch_duplicates} duplicate(s) kept once); shards {', '.join(res.shards) or 'unrecorded'}, "
               f"status {res.status}")
    for mid, label in labels.items():
        typer.echo(f"  machine {mid}: {label}")
