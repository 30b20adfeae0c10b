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


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to `app`.

    The command raises FileNotFoundError (no store at --db) and ValueError (not an SQLite store, unknown
    or ambiguous --sweep); the CLI's ``main()`` turns those into one line on stderr.
    """

    @app.command("report")
    def report(
        db: Annotated[Path, typer.Option("--db", help="Results store (SQLite) written by `specdec bench`.")],
        out: OutOpt,
        sweep: Annotated[
            str | None, typer.Option("--sweep", help="Sweep id (or unique prefix); default: the newest.")
        ] = None,
    ) -> None:
        """Write a self-contained HTML report, a Markdown summary and the figures (PNG + SVG)."""
        from specdec.report.render import write_report

        result = write_report(db, out_dir(out, inputs=[db]), sweep)
        a = result.analysis
        typer.echo(f"sweep {a.store.sweep_id or '(none)'}: {len(a.store.runs)} runs, "
                   f"{len(result.drawn)} figures drawn, {len(result.skipped)} skipped")
        for line in a.missing:
            typer.echo(f"  missing: {line}")
        typer.echo(f"wrote {result.html}")
        typer.echo(f"wrote {result.markdown}")
        typer.echo(f"wrote {result.figures_dir}/ ({2 * len(result.drawn)} files)")

