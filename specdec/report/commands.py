"""CLI: ``specdec report --db DB --out DIR [--sweep ID]``.

`register` adds the command to the project's Typer app; the heavy imports (pandas, matplotlib) happen
when the command runs, not when the CLI starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

OutOpt = Annotated[str, typer.Option("--out", help="Output directory: report.html, report.md, figures/.")]


def out_dir(value: str, *, inputs: Iterable[str | Path] = ()) -> Path:
    """The output directory named by ``--out``, checked by `specdec.paths.check_output` before any
    store is read: writing into an existing directory is fine, an existing file is never replaced.

    Raises:
        ValueError: `value` is empty or blank (``Path("")`` would silently mean the current directory), is
            one of `inputs` (the stores read), or is an existing file (a results store or any other).
    """
    from specdec.paths import check_output

    if not value.strip():
        raise ValueError("--out is empty: name an output directory (e.g. --out results/report)")
    return check_output(value, inputs=inputs, directory=True)


def batch_sweeps(db: str | Path) -> tuple[list[str], list[str], str | None, int]:
    """The former batch harness's tables: ``(batch sweep ids, single-sequence sweep ids, the batch sweep the
    batch section reports when the sweep has no batched runs of its own (the newest run's), its number of
    batched runs)``; empty when the store cannot be read (`write_report` says why)."""
    import sqlite3

    from specdec.bench.store import Store

    try:
        with Store(db, readonly=True) as st:
            ids = [r[0] for r in st.conn.execute("SELECT sweep_id FROM batch_sweeps ORDER BY sweep_id")]
            singles = [r[0] for r in st.conn.execute("SELECT sweep_id FROM sweeps")]
            newest = st.conn.execute("SELECT sweep_id FROM batch_runs ORDER BY run_id DESC LIMIT 1").fetchone()
            n = 0 if newest is None else st.conn.execute(
                "SELECT COUNT(*) FROM batch_runs WHERE sweep_id = ?", (newest[0],)).fetchone()[0]
    except (ValueError, OSError, sqlite3.Error):
        return [], [], None, 0
    return ids, singles, newest[0] if newest else None, int(n)


def sweep_batched_runs(db: str | Path, sweep_id: str | None) -> int:
    """How many batched runs (B > 1; each is B rows of ``runs``) sweep `sweep_id` holds (0 for a store
    from before the batch axis)."""
    import sqlite3

    from specdec.bench.store import Store

    try:
        with Store(db, readonly=True) as st:
            return int(st.conn.execute("SELECT COUNT(*) FROM runs WHERE sweep_id = ? AND batch_size > 1 AND row = 0",
                                       (sweep_id,)).fetchone()[0])
    except (ValueError, OSError, sqlite3.Error):
        return 0


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to `app`.

    The command raises FileNotFoundError (no store at --db) and ValueError (not an SQLite store, unknown
    or ambiguous --sweep); the CLI's ``main()`` turns those into one line on stderr.
    """

    @app.command("report")
    def report(
        db: Annotated[Path, typer.Option("--db", help="Results store (SQLite) written by `specdec sweep`.")],
        out: OutOpt,
        sweep: Annotated[
            str | None, typer.Option("--sweep", help="Sweep id (or unique prefix); default: the newest.")
        ] = None,
        beside: Annotated[
            Path | None, typer.Option("--beside", help="Another store: its newest sweep side by side with this "
                                      "one per prompt type and drafter (best K, speedup, tokens per forward), "
                                      "e.g. a greedy sweep beside a sampled one.")
        ] = None,
    ) -> None:
        """Write a self-contained HTML report, a Markdown summary and the figures (PNG + SVG)."""
        from specdec.report.render import write_report

        out_path = out_dir(out, inputs=[db, *([beside] if beside is not None else [])])
        ids, singles, newest, n_batched = batch_sweeps(db)
        named = [i for i in ids if sweep and i.startswith(sweep)]
        if named and not any(i.startswith(sweep) for i in singles):  # --sweep selects a single-sequence sweep
            raise ValueError(f"--sweep {sweep}: {named[0]} is a batch sweep of {db}; its runs are in the report's "
                             f"batch section, which reports the newest batch sweep ({newest}): run without --sweep")
        result = write_report(db, out_path, sweep, beside=beside)
        a = result.analysis
        n_own = sweep_batched_runs(db, a.store.sweep_id)
        batched = (f"; {n_own} batched runs (B > 1)" if n_own
                   else f"; batch sweep {newest}: {n_batched} batched runs" if newest else "")
        typer.echo(f"sweep {a.store.sweep_id or '(none)'}: {len(a.store.runs)} runs{batched}, "
                   f"{len(result.drawn)} figures drawn, {len(result.skipped)} skipped")
        for line in a.missing:
            typer.echo(f"  missing: {line}")
        typer.echo(f"wrote {result.html}")
        typer.echo(f"wrote {result.markdown}")
        typer.echo(f"wrote {result.figures_dir}/ ({2 * len(result.drawn)} files)")

