"""CLI: ``specdec report --db DB --out DIR [--sweep ID]`` and ``specdec study --db A --db B ... --out DIR``.

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
    """The output directory named by ``--out``, checked by `specdec.bench.paths.check_output` before any
    store is read: writing into an existing directory is fine, an existing file is never replaced.

    Raises:
        ValueError: `value` is empty or blank (``Path("")`` would silently mean the current directory), is
            one of `inputs` (the stores read), or is an existing file (a results store or any other).
    """
    from specdec.bench.paths import check_output

    if not value.strip():
        raise ValueError("--out is empty: name an output directory (e.g. --out results/report)")
    return check_output(value, inputs=inputs, directory=True)


def register(app: typer.Typer) -> None:
    """Add the ``report`` and ``study`` commands to `app`.

    The commands raise FileNotFoundError (no store at --db) and ValueError (not an SQLite store, unknown
    or ambiguous --sweep); the CLI's ``main()`` turns those into one line on stderr.
    """

    @app.command("report")
    def report(
        db: Annotated[Path, typer.Option("--db", help="Results store (SQLite) written by `specdec bench`.")],
        out: OutOpt,
        sweep: Annotated[
            str | None, typer.Option("--sweep", help="Sweep id (or unique prefix); default: the newest.")
        ] = None,
        arch_costs: Annotated[
            Path | None, typer.Option("--arch-costs", help="A `specdec costs --arch --out` file: adds the "
                                      "section 'The original pairs' (predicted from measured costs).")
        ] = None,
    ) -> None:
        """Write a self-contained HTML report, a Markdown summary and the figures (PNG + SVG)."""
        from specdec.report.render import write_report

        result = write_report(db, out_dir(out, inputs=[db]), sweep, arch_costs=arch_costs)
        a = result.analysis
        typer.echo(f"sweep {a.store.sweep_id or '(none)'}: {len(a.store.runs)} runs, "
                   f"{len(result.drawn)} figures drawn, {len(result.skipped)} skipped")
        for line in a.missing:
            typer.echo(f"  missing: {line}")
        typer.echo(f"wrote {result.html}")
        typer.echo(f"wrote {result.markdown}")
        typer.echo(f"wrote {result.figures_dir}/ ({2 * len(result.drawn)} files)")

    @app.command("study")
    def study(
        db: Annotated[list[Path], typer.Option("--db", help="Results store (repeatable): each one's newest "
                                               "sweep, analysed on its own, then side by side.")],
        out: OutOpt,
        report: Annotated[list[str] | None, typer.Option(
            "--report", help="Path of a per-store report to list in the study (repeatable).")] = None,
        title: Annotated[str, typer.Option("--title", help="Page title.")] = "Speculative decoding study",
        peers_db: Annotated[list[Path] | None, typer.Option(
            "--peers-db", help="Store read only for 'Against transformers' own decoders' and the duration "
            "table (repeatable): its peer comparisons pool with the other stores', its cells stay out of the "
            "per-type tables.")] = None,
    ) -> None:
        """Write the study report: several stores side by side (headline per prompt type over every
        configuration, the fastest way to generate, ours against transformers' own decoders, how long each
        store took)."""
        from specdec.report.study import write_study

        result = write_study(db, out_dir(out, inputs=[*db, *(peers_db or ())]), report or (), title=title,
                             peer_dbs=peers_db or ())
        typer.echo(f"{len(db) + len(peers_db or ())} stores, {len(result.types)} (store, configuration, prompt type) rows"
                   + (f"; headline figure skipped: {result.figure.skipped}" if result.figure.skipped else ""))
        for line in result.missing:
            typer.echo(f"  missing: {line}")
        typer.echo(f"wrote {result.html}")
        typer.echo(f"wrote {result.markdown}")
