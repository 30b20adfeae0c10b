"""What every figure of the report shares: the `FigureEntry` record, file naming, the matplotlib figure
(Agg canvas, no pyplot state), saving as PNG + SVG, colours and the K axis."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = [
    "DPI",
    "MARKERS",
    "PHASES",
    "VERDICT_COLOURS",
    "FigureEntry",
    "Namer",
    "colour_cycle",
    "fit_texts_right",
    "k_axis",
    "new_figure",
    "prompt_types",
    "save_figure",
    "sorted_groups",
    "tex_safe",
]

DPI = 110
VERDICT_COLOURS = {"win": "#2e7d32", "loss": "#c62828", "no measurable difference": "#757575"}
#: Scatter marker per speculative method (others: "^").
MARKERS = {"draft": "o", "ngram": "s"}
PHASES = (("prefill", "#9e9e9e"), ("draft", "#1f77b4"), ("verify", "#ff7f0e"), ("other", "#d4c28a"))


@dataclass
class FigureEntry:
    """One figure of the report.

    Attributes:
        name: file stem (unique, filesystem-safe).
        kind: the figure type (the file stem prefixes listed in :mod:`specdec.report.plots`).
        title: human title (contains store text: escape it before it reaches HTML).
        caption: what the figure shows, units and how to read it.
        png: path of the PNG file (None when skipped).
        svg: path of the SVG file (None when skipped).
        skipped: why the figure was not drawn (None when drawn).
    """

    name: str
    kind: str
    title: str
    caption: str
    png: Path | None = None
    svg: Path | None = None
    skipped: str | None = None


def tex_safe(text: object) -> str:
    """Store text made safe for matplotlib: '$' would start mathtext."""
    return str(text).replace("$", r"\$")


class Namer:
    """Unique, filesystem-safe file stems from parts (case-insensitively unique)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, *parts: object) -> str:
        stem = "__".join(re.sub(r"[^A-Za-z0-9._-]+", "-", str(p)).strip("-.") or "x" for p in parts)[:120]
        name, i = stem, 2
        while name.lower() in self.used:
            name, i = f"{stem}-{i}", i + 1
        self.used.add(name.lower())
        return name


def new_figure(width: float = 8.0, height: float = 5.0):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def save_figure(fig, out: Path, entry: FigureEntry) -> FigureEntry:
    entry.png = out / f"{entry.name}.png"
    entry.svg = out / f"{entry.name}.svg"
    fig.savefig(entry.png, dpi=DPI, format="png", metadata={"Software": None})
    import matplotlib

    # A fixed salt for the SVG element ids (random otherwise): a report regenerates byte for byte.
    with matplotlib.rc_context({"svg.hashsalt": "specdec"}):
        fig.savefig(entry.svg, format="svg", metadata={"Date": None})
    return entry


def sorted_groups(df: pd.DataFrame, keys: list[str]):
    if df is None or df.empty:
        return []
    return list(df.groupby(keys, sort=True))


def prompt_types(df: pd.DataFrame) -> list[str]:
    return sorted(set(df["prompt_type"].astype(str)))


def colour_cycle(n: int):
    from matplotlib import colormaps

    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def k_axis(ax, ks: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.minorticks_off()


def fit_texts_right(ax, texts, left: float, right: float, margin_px: float = 6.0, passes: int = 3) -> None:
    """Set the x limits of `ax` (linear scale) to ``[left, R]`` with the smallest ``R >= right`` at which
    every text of `texts` (placed in data coordinates, left-aligned) ends inside the axes.

    A label's width is fixed in pixels while its position scales with the axis range, so a padding in data
    units either clips long labels or leaves a wide empty margin; this measures each label on the figure's
    renderer and solves ``x_px + width_px <= axes width`` for R. Constrained layout may resize the axes
    after a change, hence a few passes.

    Args:
        ax: a matplotlib Axes. texts: `matplotlib.text.Text` objects drawn on it. left, right: the data range
            the axis must cover at least. margin_px: room kept right of the longest label, in pixels.
    """
    ax.set_xlim(left, right)
    fig = ax.get_figure()
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure: measure on the Agg canvas the PNG uses
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    for _ in range(passes):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        width_px = ax.get_window_extent(renderer).width
        lo, hi = ax.get_xlim()
        need = right  # solved afresh each pass: the layout of the previous pass may have moved the axes
        for t in texts:
            w = t.get_window_extent(renderer).width + margin_px
            x = float(t.get_position()[0])
            if w < width_px:
                need = max(need, lo + (x - lo) / (1.0 - w / width_px))
        if abs(need - hi) <= 1e-6 * abs(hi):
            return
        ax.set_xlim(lo, need)
