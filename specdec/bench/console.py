"""The sweep's console lines: one per finished cell, from its stored rows and the rates of `specdec.core.metrics`;
errors as one line."""

from __future__ import annotations

import math
import statistics

from specdec.bench.methods import METHODS
from specdec.bench.plan import PlannedRun
from specdec.core.metrics import rates
from specdec.errors import one_line as _one_line

__all__ = ["ERR_LEN", "one_line", "summary_line"]

ERR_LEN = 300  # characters kept of an error message


def one_line(exc: BaseException) -> str:
    """`exc` as one line of at most `ERR_LEN` characters: its type and the first line of its message (what a
    failed run stores as its ``error`` and what the console prints); `specdec.errors.one_line`'s rule."""
    return _one_line(exc, with_type=True, limit=ERR_LEN)


def summary_line(cell: PlannedRun, rows: list[dict], baseline: list[float] | None) -> str:
    """The console line of a finished cell: median tokens/s, speedup against the median of `baseline`
    (tokens/s of the prompt's baseline runs), pooled acceptance rate and alpha-hat (`specdec.core.metrics.RATES`),
    equality with the baseline, failures."""
    head = cell.describe()
    ok = [r for r in rows if not r.get("error")]
    if not ok:
        what = "SKIPPED" if str(rows[-1]["error"]).startswith("skipped:") else "FAILED"
        return f"{head}: {what} ({rows[-1]['error']})"
    tps_all = [r["tokens_per_s"] for r in ok if r["tokens_per_s"] is not None]
    tps = statistics.median(tps_all) if any(tps_all) else math.nan
    parts = [f"{tps:.2f} tok/s"]
    if not METHODS[cell.method].reference and baseline:
        parts.append(f"x{tps / statistics.median(baseline):.2f} vs baseline")
    counts = {c: sum(r.get(c) or 0 for r in ok) for c in ("num_drafted", "num_accepted", "num_rejections")}
    if counts["num_drafted"]:
        acceptance, alpha_hat = rates(counts, ("acceptance_rate", "alpha_hat")).values()
        parts.append(f"acceptance {acceptance:.2f}")
        if not math.isnan(alpha_hat):
            parts.append(f"alpha-hat {alpha_hat:.2f}")
    matches = [r.get("matches_baseline") for r in ok if r.get("matches_baseline") is not None]
    if matches:
        parts.append("= baseline" if all(matches) else "DIFFERS from baseline")
    if len(ok) < len(rows):
        parts.append(f"{len(rows) - len(ok)} failed")
    return f"{head}: " + ", ".join(parts)
