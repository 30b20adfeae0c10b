"""The report documents: one self-contained HTML page and a Markdown summary.

The page is built once as a list of sections holding plain-text paragraphs, tables of plain strings and
figures, then rendered twice. Every string is escaped at rendering time (``html.escape`` for HTML, the
same plus ``|`` for Markdown tables), so text from the store (prompt ids and types, model names, error
messages, configuration) can never inject markup. The HTML has no external reference: figures are
embedded as base64 PNG data URIs, the CSS is inline, there is no script, and ``://`` in store text is
written as ``:&#47;&#47;`` so not even a URL string appears in the source.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec.report.analysis import Analysis, analyze
from specdec.report.document import Bullets, Pre, Section, Table
from specdec.report.load import axis_sweeps, load_store
from specdec.report.plots import FigureEntry, make_figures
from specdec.report.sections import build_sections
from specdec.report.sections_batch import batch_report  # the batch axis's section, when the store has one

__all__ = ["ReportResult", "html_page", "markdown_page", "render_html", "render_markdown", "write_report"]


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.85em;display:block;overflow-x:auto}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}
caption{caption-side:top;text-align:left;font-style:italic;padding:.2em 0}
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.85em}
figure{margin:1.5em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#444}nav a{margin-right:1em}
.win{color:#2e7d32;font-weight:bold}.loss{color:#c62828;font-weight:bold}
"""


def esc(text: Any) -> str:
    """HTML-escape `text` (quotes included); '://' is written as ':&#47;&#47;' so the page holds no URL."""
    return html.escape(str(text), quote=True).replace("://", ":&#47;&#47;")


def _html_cell(text: str) -> str:
    cls = {"win": "win", "loss": "loss"}.get(text)
    return f'<td class="{cls}">{esc(text)}</td>' if cls else f"<td>{esc(text)}</td>"


def _html_table(t: Table) -> str:
    rows = t.rows if t.limit is None else t.rows[: t.limit]
    parts = ["<table>"]
    if t.caption:
        parts.append(f"<caption>{esc(t.caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in t.headers) + "</tr></thead><tbody>")
    for row in rows:
        parts.append("<tr>" + "".join(_html_cell(c) for c in row) + "</tr>")
    parts.append("</tbody></table>")
    if t.limit is not None and len(t.rows) > t.limit:
        parts.append(f"<p>... and {len(t.rows) - t.limit} more rows.</p>")
    body = "\n".join(parts)
    if t.collapsed:
        return f"<details><summary>{esc(t.caption or 'table')} ({len(t.rows)} rows)</summary>\n{body}\n</details>"
    return body


def _html_figure(e: FigureEntry) -> str:
    data = base64.b64encode(Path(e.png).read_bytes()).decode("ascii") if e.png else ""
    return (f'<figure id="{esc(e.name)}"><img alt="{esc(e.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{esc(e.title)}.</b> {esc(e.caption)} "
            f"(Files: figures/{esc(e.name)}.png, figures/{esc(e.name)}.svg)</figcaption></figure>")


def _title(a: Analysis) -> str:
    title = "Speculative decoding report"
    if a.store.sweep and a.store.sweep.get("name"):
        title += f": {a.store.sweep['name']}"
    return title


def html_page(title: str, sections: Sequence[Section]) -> str:
    """`sections` as one self-contained HTML page titled `title` (inline CSS, figures as base64 PNG, no
    script; every string escaped)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
           "<nav>" + "".join(f'<a href="#{sec.anchor}">{esc(sec.title)}</a>' for sec in sections) + "</nav>"]
    for sec in sections:
        out.append(f'<section id="{sec.anchor}"><h2>{esc(sec.title)}</h2>')
        for b in sec.blocks:
            if isinstance(b, str):
                out.append(f"<p>{esc(b)}</p>")
            elif isinstance(b, Table):
                out.append(_html_table(b))
            elif isinstance(b, Pre):
                out.append(f"<pre>{esc(b.text)}</pre>")
            elif isinstance(b, Bullets):
                out.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in b.items) + "</ul>")
            elif isinstance(b, FigureEntry):
                out.append(_html_figure(b))
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def render_html(a: Analysis, figures: list[FigureEntry], extra: Sequence[Section] = ()) -> str:
    """The report as one self-contained HTML page (inline CSS, figures as base64 PNG, no script); `extra`
    sections go before the figures."""
    return html_page(_title(a), build_sections(a, figures, extra))


# --------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------


def _md(text: Any) -> str:
    """Text for Markdown (outside code fences): '&' and '<' escaped so a viewer that renders raw HTML
    shows store text verbatim instead of running it; link and image syntax ('](', '][', '![') broken so
    store text cannot make a viewer follow or load a URL; pipes and newlines neutralised for tables."""
    text = str(text).replace("&", "&amp;").replace("<", "&lt;")
    text = text.replace("](", "]\\(").replace("][", "]\\[").replace("![", "!\\[")
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _md_table(t: Table) -> str:
    rows = t.rows if t.limit is None else t.rows[: t.limit]
    out = []
    if t.caption:
        out.append(f"*{_md(t.caption)}*\n")
    out.append("| " + " | ".join(_md(h) for h in t.headers) + " |")
    out.append("|" + "|".join("---" for _ in t.headers) + "|")
    out.extend("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)
    if not rows:
        out.append("| " + " | ".join("-" for _ in t.headers) + " |")
    if t.limit is not None and len(t.rows) > t.limit:
        out.append(f"\n... and {len(t.rows) - t.limit} more rows.")
    return "\n".join(out)


def markdown_page(title: str, sections: Sequence[Section]) -> str:
    """`sections` as Markdown titled `title`: tables marked ``md``, figure links (``figures/<name>.png``),
    every string escaped."""
    out = [f"# {_md(title)}", ""]
    for sec in sections:
        out += [f"## {_md(sec.title)}", ""]
        for b in sec.blocks:
            if isinstance(b, str):
                out += [_md(b), ""]
            elif isinstance(b, Table):
                if b.md:
                    out += [_md_table(b), ""]
                else:
                    out += [f"*{_md(b.caption)}* ({len(b.rows)} rows, in report.html)", ""]
            elif isinstance(b, Pre) and b.md:
                out += ["```json", b.text.replace("```", "'''"), "```", ""]
            elif isinstance(b, Bullets) and b.md:
                out += [f"- {_md(x)}" for x in b.items] + [""]
            elif isinstance(b, FigureEntry):
                out += [f"![{_md(b.title).replace('[', '(').replace(']', ')')}](figures/{b.name}.png)", "",
                        f"*{_md(b.caption)}*", ""]
    return "\n".join(out).rstrip() + "\n"


def render_markdown(a: Analysis, figures: list[FigureEntry], extra: Sequence[Section] = ()) -> str:
    """The Markdown summary: the key tables, figure links (``figures/<name>.png``), the gaps, and `extra`."""
    return markdown_page(_title(a), build_sections(a, figures, extra))


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


@dataclass
class ReportResult:
    """Paths written by `write_report` and what they were built from."""

    html: Path
    markdown: Path
    figures_dir: Path
    figures: list[FigureEntry]
    analysis: Analysis

    @property
    def drawn(self) -> list[FigureEntry]:
        return [e for e in self.figures if not e.skipped]

    @property
    def skipped(self) -> list[FigureEntry]:
        return [e for e in self.figures if e.skipped]


def _beside(a: Analysis, b: Analysis) -> Section:
    """The section setting `a`'s sweep beside `b`'s (`specdec.report.beside`)."""
    from specdec.report import tables as T
    from specdec.report.beside import beside_section, beside_table, sweep_label

    return beside_section(beside_table(a[T.TRACE_GRID], b[T.TRACE_GRID]),
                          sweep_label(a.store.runs, a.store.sweep_id), sweep_label(b.store.runs, b.store.sweep_id))


def write_report(db: str | Path, out: str | Path, sweep: str | None = None,
                 beside: str | Path | None = None) -> ReportResult:
    """Analyse the store `db` and write ``out/report.html``, ``out/report.md`` and ``out/figures/``.

    Args:
        db: results store (SQLite, schema of ``specdec/bench/store.py``).
        out: output directory (created if needed); existing report files are overwritten.
        sweep: sweep id or unique prefix; None = the newest sweep.
        beside: another store whose newest sweep is set beside this one per prompt type and drafter
            (`specdec.report.beside`: greedy beside sampled, say); None: no such section. The other sweeps
            of `db` on this one's temperature axis (`specdec.report.load.axis_sweeps`) are set beside it
            the same way, one section each.

    Returns:
        `ReportResult` with the paths, the figure entries (drawn and skipped) and the analysis.

    Raises:
        FileNotFoundError: `db` (or `beside`) does not exist.
        ValueError: `db` (or `beside`) is not an SQLite store, or `sweep` matches no sweep or several.
        OSError: `out` cannot be written.
    """
    store = load_store(db, sweep)
    # read before anything is written: the sweeps of this one's temperature axis, then --beside's
    others = [analyze(load_store(db, sid)) for sid in axis_sweeps(store)]
    others += [analyze(load_store(beside))] if beside is not None else []
    analysis = analyze(store)
    out_dir = Path(out)
    fig_dir = out_dir / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = make_figures(analysis, fig_dir)
    extra, batch_figures = batch_report(db, fig_dir, analysis.store.sweep_id)
    extra = [*(_beside(analysis, other) for other in others), *extra]
    html_path = out_dir / "report.html"
    md_path = out_dir / "report.md"
    html_path.write_text(render_html(analysis, figures, extra), encoding="utf-8")
    md_path.write_text(render_markdown(analysis, figures, extra), encoding="utf-8")
    return ReportResult(html_path, md_path, fig_dir, figures + batch_figures, analysis)
