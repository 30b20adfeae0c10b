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
