"""The report's batch section: speedup of speculative decoding against batched target-only decoding at each
batch size B, from a store's batched runs in one shape (`specdec.report.batches.load_batch_runs`: a sweep's
batched rows of ``runs``, or the former batch harness's ``batch_runs``); nothing when it has none.

Pairing as the single-stream report: a run's ratio is its aggregate tokens/s (every row's new tokens over the
batch's end-to-end seconds) over the geometric mean of the batched target-only runs just before and after
it among its batch's runs (the same configuration, group, B and batch); the batches are the units, so a
(configuration, group, B, method) speedup is the geometric mean of its batches' ratios with a t-interval on
their logs (`specdec.core.stats.ratio_interval`). The crossover B is the first B whose interval lies below
1. Reads the store only (read-only, `specdec.bench.store.connect`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specdec.core.stats import geometric_mean, ratio_interval
from specdec.report.batches import load_batch_runs
from specdec.report.document import Section, Table
from specdec.report.figure_kit import MARKERS, FigureEntry, colour_cycle, new_figure, save_figure, tex_safe

__all__ = ["batch_ratios", "batch_report", "batch_summary", "crossovers"]

_ORDER = {"baseline": 0, "draft": 1, "ngram": 2, "aa": 3}


def _name(method: str, policy) -> str:
    return method if not isinstance(policy, str) else f"{method}/{policy}"


def _decode_tps(r) -> float:
    """A run's new tokens over its end-to-end seconds minus the batch prefill (NaN-safe: 0 when unknown)."""
    try:
        d = float(r.total_s) - float(r.prefill_s)
    except (TypeError, ValueError):
        return 0.0
    return float(r.new_tokens) / d if d > 0 and math.isfinite(d) else 0.0


def batch_ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per non-baseline run (of `runs`, in the one shape of `specdec.report.batches`) with a successful
    baseline on each side (or one, at its batch's edge): ``config_label, group_name, batch_size, batch, method,
    policy, name, k, ratio, predicted,
    base_tps, tps, accepted_per_row_round, rows, mismatch_batched, mismatch_single``; ``decode_ratio`` is the
    same ratio on decode tokens/s (new tokens over end-to-end minus the batch prefill), which a batch of long
    prompts and few new tokens would otherwise dilute."""
    ok = runs[runs["error"].isna()] if len(runs) else runs
    out = []
    for key, cell in ok.groupby(["sweep_id", "config_label", "group_name", "batch_size", "batch"], sort=True):
        by_seq = {int(r.order): r for r in cell.itertuples()}
        for s, r in by_seq.items():
            if r.method == "baseline" or not r.tokens_per_s or r.tokens_per_s <= 0:
                continue
            nb = [by_seq[j].tokens_per_s for j in (s - 1, s + 1)
                  if j in by_seq and by_seq[j].method == "baseline" and by_seq[j].tokens_per_s]
            if not nb:
                continue
            base = math.exp(sum(math.log(x) for x in nb) / len(nb))
            dnb = [_decode_tps(by_seq[j]) for j in (s - 1, s + 1) if j in by_seq and by_seq[j].method == "baseline"]
            dnb = [x for x in dnb if x > 0]
            d_self = _decode_tps(r)
            decode_ratio = (d_self / math.exp(sum(math.log(x) for x in dnb) / len(dnb))
                            if dnb and d_self > 0 else math.nan)
            out.append({
                "config_label": key[1], "group_name": key[2], "batch_size": int(key[3]), "batch": key[4],
                "method": r.method, "policy": r.policy, "name": _name(r.method, r.policy), "k": r.k,
                "ratio": r.tokens_per_s / base, "decode_ratio": decode_ratio, "predicted": r.predicted_speedup, "base_tps": base,
                "tps": r.tokens_per_s,
                "accepted_per_row_round": (r.num_accepted / r.row_rounds) if r.row_rounds else math.nan,
                "rows": int(r.batch_size), "mismatch_batched": r.rows_mismatch_batched,
                "mismatch_single": r.rows_mismatch_single,
            })  # fmt: skip
    return pd.DataFrame(out)


#: The group name of the rows that pool every group's batches (per configuration, B and method/policy).
POOLED = "all groups"


def batch_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per (configuration, group, B, method/policy): the speedup over batched target-only (geometric mean
    over batches, 95% interval), mean aggregate tokens/s of both, accepted tokens per row-round, the
    geometric mean of the predicted speedups, the fixed K(s) used and the mismatching rows; with more than
    one group, also one row per (configuration, B, method/policy) over the batches of every group (group
    `POOLED`)."""
    if len(ratios) and ratios["group_name"].nunique() > 1:
        ratios = pd.concat([ratios, ratios.assign(group_name=POOLED)], ignore_index=True)
    rows = []
    for (label, group, b, name), g in ratios.groupby(["config_label", "group_name", "batch_size", "name"], sort=True):
        iv = ratio_interval(g["ratio"])
        pred = [p for p in g["predicted"] if isinstance(p, (int, float)) and p > 0 and math.isfinite(p)]
        ks = sorted({int(k) for k in g["k"].dropna()}) if g["policy"].iloc[0] == "fixed" else []
        rows.append({
            "config_label": label, "group_name": group, "batch_size": int(b), "name": name,
            "method": g["method"].iloc[0], "policy": g["policy"].iloc[0], "n": iv.n, "speedup": iv.center,
            "lo": iv.lo, "hi": iv.hi, "tps": g["tps"].mean(), "base_tps": g["base_tps"].mean(),
            "decode_speedup": geometric_mean(g["decode_ratio"].dropna()) if g["decode_ratio"].notna().any()
            else math.nan,
            "accepted_per_row_round": g["accepted_per_row_round"].mean(),
            "predicted": geometric_mean(pred) if pred else math.nan, "ks": ks, "rows": int(g["rows"].sum()),
            "mismatch_batched": g["mismatch_batched"].sum(min_count=1),
            "mismatch_single": g["mismatch_single"].sum(min_count=1),
        })  # fmt: skip
    return pd.DataFrame(rows)


def crossovers(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (configuration, group, method/policy): the first B whose speedup interval lies below 1
    (``"none up to B = max"`` otherwise; ``"n/a (one batch)"`` marks Bs without an interval)."""
    rows = []
    for (label, group, name), g in summary.groupby(["config_label", "group_name", "name"], sort=True):
        if name == "aa":
            continue
        g = g.sort_values("batch_size")
        below = [int(r.batch_size) for r in g.itertuples() if isinstance(r.hi, float) and r.hi < 1.0]
        text = f"B = {below[0]}" if below else f"none up to B = {int(g['batch_size'].max())}"
        if not below and g["hi"].isna().any():
            text += " (some B have one batch: no interval)"
        rows.append({"config_label": label, "group_name": group, "name": name, "crossover": text})
    return pd.DataFrame(rows)


def _x(v, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _speedup_text(r) -> str:
    if r.n < 2 or not math.isfinite(r.lo):
        return f"{_x(r.speedup)}x (n = {r.n})"
    return f"{_x(r.speedup)}x [{_x(r.lo)}, {_x(r.hi)}] (n = {r.n})"


def _mismatch(v, rows: int) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{int(v)}/{rows}"


def _figure(summary: pd.DataFrame, out: Path) -> FigureEntry:
    """Speedup over batched target-only against B: one panel per configuration, one colour per group,
    solid for the fixed K, dashed for the cost policy, a marker per drafting method; bars are the 95%
    intervals over batches."""
    entry = FigureEntry("batch__speedup_vs_b", "batch", "Speedup against batch size",
                        "Speedup of speculative decoding over batched target-only decoding at the same B (geometric "
                        "mean over batches, bars: 95% interval), per configuration (panel) and prompt group "
                        "(colour), on a log axis that follows the centres (wider bars are cut at its edge); solid: the fixed K the batch pricing predicts best, dashed: the batch-aware "
                        "cost policy; circle: draft model, square: prompt lookup. Below the dotted line "
                        "speculation is slower than plain batched decoding.")
    from matplotlib.ticker import NullLocator

    data = summary[summary["method"] != "aa"]
    if data.empty:
        entry.skipped = "no speculative batch run with a baseline on each side"
        return entry
    labels = sorted(set(data["config_label"]))
    groups = sorted(set(data["group_name"]))
    colours = dict(zip(groups, colour_cycle(len(groups)), strict=True))
    fig = new_figure(width=5.0 * len(labels) + 1.0, height=4.2)
    axes = fig.subplots(1, len(labels), squeeze=False)[0]
    for ax, label in zip(axes, labels, strict=True):
        d = data[data["config_label"] == label]
        for (group, name), g in d.groupby(["group_name", "name"], sort=True):
            g = g.sort_values("batch_size")
            x, y = g["batch_size"].to_numpy(), g["speedup"].to_numpy()
            lo = (y - g["lo"].fillna(pd.Series(y, index=g.index)).to_numpy()).clip(min=0)
            hi = (g["hi"].fillna(pd.Series(y, index=g.index)).to_numpy() - y).clip(min=0)
            method, policy = g["method"].iloc[0], g["policy"].iloc[0]
            ax.errorbar(x, y, yerr=[lo, hi], color=colours[group], marker=MARKERS.get(method, "^"),
                        linestyle="-" if policy == "fixed" else "--", capsize=3,
                        label=tex_safe(f"{group} {name}"))
        ax.axhline(1.0, color="#757575", linestyle=":", linewidth=1)
        # ratios on a log axis; an interval of two or three batches can be very wide: the axis follows the
        # centres (bars past it are cut at the edge)
        centres = [v for v in d["speedup"] if math.isfinite(v) and v > 0] + [1.0]
        ax.set_yscale("log")
        lo_y, hi_y = min(centres) / 1.5, max(centres) * 1.5
        ax.set_ylim(lo_y, hi_y)
        ticks = [t for t in (0.1, 0.2, 0.3, 0.5, 0.7, 0.85, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0) if lo_y <= t <= hi_y]
        ax.set_yticks(ticks, [f"{t:g}x" for t in ticks])
        ax.yaxis.set_minor_locator(NullLocator())
        bs = sorted(set(d["batch_size"]))
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs)
        ax.set_xticklabels([str(b) for b in bs])
        ax.minorticks_off()
        ax.set_xlabel("batch size B (rows decoded together)")
        ax.set_ylabel("speedup over batched target-only (x)")
        ax.set_title(tex_safe(label))
        ax.legend(fontsize=7)
    out.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, out, entry)


def batch_report(db: str | Path, fig_dir: Path,
                 sweep_id: str | None = None) -> tuple[list[Section], list[FigureEntry]]:
    """The batch section and its figure for the store `db` (``([], [])`` when it holds no batched run): the
    batched runs of sweep `sweep_id` (the report's), else the former harness's newest batch sweep.

    Raises:
        ValueError: the store's batched runs cannot be read.
    """
    runs, source = load_batch_runs(db, sweep_id)
    if runs.empty:
        return [], []
    sec = Section("Speedup against batch size", "batch")
    ratios = batch_ratios(runs)
    n_err = int(runs["error"].notna().sum())
    sec.blocks.append(
        f"{len(runs)} batched runs ({n_err} failed) of {source}. Each "
        "speculative run is paired with the batched target-only runs on either side of it AT THE SAME B (never "
        "B single streams); speedup = aggregate tokens/s (all rows' new tokens over the batch's end-to-end "
        "seconds) over theirs (decode speedup: the same without the batch prefill, geometric mean); batches are "
        "the units of the intervals (95%, t on log ratios). Predicted: the batch pricing (the configuration's "
        "measured batch costs) at the pre-run's acceptance. Mismatching rows: rows whose greedy tokens differ "
        "from the batched / single-sequence target-only rows (counted, not fatal: batched bf16 and llama.cpp "
        "kernels may flip a near tie).")
    if ratios.empty:
        sec.blocks.append("No speculative batch run has a successful baseline beside it yet.")
        return [sec], []
    summary = batch_summary(ratios).sort_values(
        ["config_label", "group_name", "batch_size", "name"],
        key=lambda c: c.map(lambda n: (_ORDER.get(n.split("/")[0], 9), n)) if c.name == "name" else c)
    headers = ["config", "group", "B", "method", "K", "speedup [95% CI]", "decode speedup", "tok/s spec",
               "tok/s target-only",
               "accepted / row-round", "predicted", "mismatch batched", "mismatch single"]
    table_rows = [[r.config_label, r.group_name, str(r.batch_size), r.name,
                   ",".join(map(str, r.ks)) if r.ks else ("policy" if r.policy == "cost" else "-"),
                   _speedup_text(r), _x(r.decode_speedup) + "x", _x(r.tps, 1), _x(r.base_tps, 1),
                   _x(r.accepted_per_row_round) if r.method != "aa" else "-",
                   _x(r.predicted) + "x" if r.method != "aa" else "-",
                   _mismatch(r.mismatch_batched, r.rows), _mismatch(r.mismatch_single, r.rows)]
                  for r in summary.itertuples()]
    sec.blocks.append(Table(headers, table_rows, caption="Speedup over batched target-only decoding per "
                            "configuration, group and B (aa: target-only timed as a method, the noise floor)."))
    cross = crossovers(summary)
    if not cross.empty:
        sec.blocks.append(Table(["config", "group", "method", "crossover B (interval below 1)"],
                                [[r.config_label, r.group_name, r.name, r.crossover] for r in cross.itertuples()],
                                caption="The first batch size at which speculation is measurably slower than "
                                        "batched target-only decoding."))
    fig = _figure(summary, fig_dir)
    if fig.skipped is None:
        sec.blocks.append(fig)
    return [sec], [fig]
