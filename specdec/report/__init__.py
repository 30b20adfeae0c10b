"""The report: tables (`analysis`, built by the registry in `tables`), figures (`plots`) and the
HTML/Markdown documents (`render`) built from a results store.

Modules: `vocab` (method/policy names; what a *cell* is), `load` (reading the store, normalising runs),
`speedup` (speedup statistics), `cells` (the cell table, best fixed K), `model` (costs and the analytical
model), `comparisons` (peers, equality, adaptive policies, runtimes), `diagnostics` (acceptance by
position, gaps, coverage, baseline stability, machine drift), `tables` (the table registry), `analysis`
(`analyze`: every registered table and what is missing).

Entry point: :func:`write_report` (``specdec report --db DB --out DIR [--sweep ID]`` on the CLI).
Importing this package does not import matplotlib; drawing does.
"""

from __future__ import annotations

from specdec.report.analysis import Analysis, analyze
from specdec.report.load import StoreData, load_store
from specdec.report.render import ReportResult, render_html, render_markdown, write_report

__all__ = [
    "Analysis",
    "ReportResult",
    "StoreData",
    "analyze",
    "load_store",
    "render_html",
    "render_markdown",
    "write_report",
]
