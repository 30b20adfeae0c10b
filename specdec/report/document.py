"""The report's document model (sections of paragraphs, tables of plain strings, preformatted text,
bullet lists and figures) and the number formatting every table uses.

Nothing here escapes text: :mod:`specdec.report.render` escapes every string when it writes HTML or
Markdown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["Bullets", "Pre", "Section", "Table", "ci", "f", "i", "key_columns", "num", "pct", "s", "table_of", "yn"]


# --------------------------------------------------------------------------------------------------
# document model
# --------------------------------------------------------------------------------------------------


@dataclass
class Table:
    """A table of plain strings. `md`: also in the Markdown summary; `collapsed`: folded in HTML."""

    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    md: bool = True
    collapsed: bool = False
    limit: int | None = None  # rows shown (the rest counted)


@dataclass
class Section:
    title: str
    anchor: str
    blocks: list[Any] = field(default_factory=list)  # str (paragraph) | Table | Pre | Bullets | FigureEntry


@dataclass
class Pre:
    text: str
    md: bool = True


@dataclass
class Bullets:
    items: list[str]
    md: bool = True


# --------------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------------


def num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def f(x: Any, digits: int = 2, empty: str = "-") -> str:
    """A number with `digits` decimals; NaN/None -> `empty`; inf -> 'never'."""
    v = num(x)
    if v is None:
        return empty
    if math.isinf(v):
        return "never" if v > 0 else "-inf"
    return f"{v:.{digits}f}"


def pct(x: Any) -> str:
    v = num(x)
    return "-" if v is None else f"{100 * v:.0f}%"


def ci(lo: Any, hi: Any, digits: int = 2) -> str:
    if num(lo) is None or num(hi) is None:
        return "-"
    return f"[{f(lo, digits)}, {f(hi, digits)}]"


def i(x: Any) -> str:
    v = num(x)
    return "-" if v is None else str(int(v))


def yn(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "yes" if bool(x) else "no"


def s(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return str(x)


#: Header -> column of the key columns the report's tables share (``"K"`` is the integer ``k``).
_KEY_COLUMNS = {"config": "config_label", "target": "target", "pair": "pair", "prompt": "prompt_id",
                "prompt type": "prompt_type", "method": "method", "policy": "policy"}


def key_columns(*headers: str) -> list[tuple[str, Any]]:
    """`table_of` column specs for key columns, by header (``"config"``, ``"pair"``, ``"prompt type"``,
    ``"method"``, ``"policy"``, ``"K"``, ...); KeyError for a header that is not a key column."""
    specs: list[tuple[str, Any]] = []
    for h in headers:
        if h == "K":
            specs.append((h, lambda r: i(r["k"])))
        else:
            col = _KEY_COLUMNS[h]
            specs.append((h, lambda r, col=col: s(r[col])))
    return specs


def table_of(df: pd.DataFrame, spec: list[tuple[str, Any]]) -> Table:
    """Table from `df` with columns `spec` = [(header, row -> str)]."""
    headers = [h for h, _ in spec]
    body = [[fn(r) for _, fn in spec] for _, r in df.iterrows()] if df is not None and len(df) else []
    return Table(headers, body)
