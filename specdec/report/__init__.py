"""The report: tables (`analysis`), figures (`plots`) and the HTML/Markdown documents (`render`) built
from a results store.

Entry point: :func:`write_report` (``specdec report --db DB --out DIR [--sweep ID]`` on the CLI).
Importing this package does not import matplotlib; drawing does.
"""

from __future__ import annotations

from specdec.report.analysis import Analysis, StoreData, analyze, load_store
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
