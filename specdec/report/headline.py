"""The report's first screen: a short "how to read this", one headline figure and a five-line verdict.

The headline figure shows, per prompt type, the speculative cell with the highest paired speedup (any of our
drafters, any runtime configuration, fixed K or an adaptive policy: chosen after the fact, so optimistic)
with its 95 % interval, next to the default policy (the sweep's default drafter with the cost policy, fixed
before any run: the figure a user can expect), against the A/A noise floor (target-only timed as a method: the interval
noise alone reaches on this machine). Each speedup is over the target-only decoding of its own configuration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import drafter
from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.cells import best_cell
from specdec.report.comparisons import exactness
from specdec.report.document import Bullets, Section, ci, f, pct
from specdec.report.figure_kit import FigureEntry, Namer, new_figure, save_figure, tex_safe
from specdec.report.load import default_policy_of
from specdec.report.vocab import ALL_PROMPTS, OUR_DRAFTERS

__all__ = ["HOW_TO_READ_FIRST", "aa_floor", "cell_label", "cell_what", "headline_figure",
           "headline_section", "headline_table", "padded_reference", "verdict_lines"]

#: The short "how to read this" of the first screen; the definitions of every metric are in the appendix.
HOW_TO_READ_FIRST = [
    ("The answer (first section) prices every prompt from its acceptance trace (the target's output and what "
     "each drafter would have proposed there) and its calibration block (the target's forwards of 1..17 "
     "tokens and the draft step, timed at the prompt's context): every K and the default policy, per prompt, "
     "from one target-only run. Timed runs on some prompts check those predictions (predicted / measured)."),
    ("Speedup = a method's end-to-end tokens/s (prefill included) over target-only decoding of the same prompt "
     "on the same runtime configuration, paired: every timed run sits between two target-only runs and is "
     "divided by their geometric mean, so a machine that drifts cancels."),
    ("A prompt type's speedup is the geometric mean over its prompts with a 95 % t-interval (the unit is the "
     "prompt); 'win' = the interval lies above 1, 'loss' = below 1; under 5 prompts no verdict is given."),
    ("The A/A noise floor is target-only timed as if it were a method: how far from 1 noise alone goes on this "
     "machine. A speedup inside it is no speedup."),
    ("'Best' cells (configuration, drafter, K) are picked after the fact and so are optimistic; the default "
     "policy (the sweep's default drafter under the cost policy, named below) is fixed before the run and is the "
     "figure to expect."),
    ("Definitions of every metric are in 'Appendix: definitions'; the machine, library versions and the raw "
     "sweep configuration in 'Appendix: where the data came from'."),
]


def default_words(default: tuple[str, str]) -> str:
    """The default policy in words: ``"draft model, cost policy"``, ``"mixed (suffix or draft model), cost policy"``."""
    e = drafter(default[0])
    return f"{e.label if e.name in e.label else f'{e.name} ({e.label})'}, {default[1]} policy"


def headline_table(cells: pd.DataFrame, default: tuple[str, str] | None = None) -> pd.DataFrame:
    """Per prompt type: the best speculative cell (among those measured on the most prompts of the type) and
    the default policy's cell on the same configuration.

    Args:
        cells: the report's cell table (`specdec.report.tables.CELLS`).
        default: the default policy as (drafter, policy) (`Analysis.default_policy`; None:
            `specdec.report.load.default_policy_of` the cells).

    Returns:
        One row per prompt type (sorted by the best speedup, highest first) with ``prompt_type``,
        ``config_label``, ``method``, ``policy``, ``k``, ``speedup``, ``speedup_lo``, ``speedup_hi``,
        ``verdict``, ``n_aligned``, ``tok_s`` of the best cell, and ``default_speedup``, ``default_lo``,
        ``default_hi``, ``default_verdict``, ``default_n`` of the default policy on the best cell's
        configuration (NaN / "" where it was not run). Empty without speculative cells.
    """
    cols = ["prompt_type", "config_label", "method", "policy", "k", "speedup", "speedup_lo", "speedup_hi",
            "verdict", "n_aligned", "tok_s", "default_speedup", "default_lo", "default_hi", "default_verdict",
            "default_n"]
    if cells.empty or "speedup" not in cells.columns:
        return pd.DataFrame(columns=cols)
    default = default or default_policy_of(cells)
    spec = cells[cells["method"].isin(OUR_DRAFTERS) & (cells["prompt_type"] != ALL_PROMPTS)
                 & np.isfinite(cells["speedup"].astype(float))]
    rows = []
    for ptype, g in spec.groupby("prompt_type", sort=True):
        best = best_cell(g)  # a cell of one prompt would otherwise win by chance over cells of five
        rec = {c: best[c] for c in cols[:11]}
        d = g[(g["config_label"] == best["config_label"]) & (g["method"] == default[0])
              & (g["policy"] == default[1])]
        if len(d):
            d = d.iloc[0]
            rec.update(default_speedup=d["speedup"], default_lo=d["speedup_lo"], default_hi=d["speedup_hi"],
                       default_verdict=d["verdict"], default_n=d["n_aligned"])
        else:
            rec.update(default_speedup=np.nan, default_lo=np.nan, default_hi=np.nan, default_verdict="",
                       default_n=0)
        rows.append(rec)
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values("speedup", ascending=False).reset_index(drop=True)


def _pooled(a: Analysis, method: str, col: str) -> pd.DataFrame:
    """The pooled rows of `method` (one per configuration) whose `col` is finite."""
    ov = a[T.OVERALL]
    if ov.empty or "method" not in ov.columns:
        return ov
    return ov[(ov["method"] == method) & np.isfinite(ov[col].astype(float))]


def aa_floor(a: Analysis) -> tuple[float, float, str] | None:
    """The widest pooled A/A interval over the configurations: (lo, hi, label), or None without A/A runs."""
    aa = _pooled(a, "aa", "speedup_lo")
    if aa.empty:
        return None
    r = aa.assign(width=aa["speedup_hi"].astype(float) - aa["speedup_lo"].astype(float)).sort_values("width").iloc[-1]
    return float(r["speedup_lo"]), float(r["speedup_hi"]), str(r["config_label"])


def padded_reference(a: Analysis) -> tuple[float, float, float, str] | None:
    """The pooled speedup of ``baseline_padded`` (target-only with each step padded to the cheapest measured
    shape) over plain target-only: (speedup, lo, hi, config_label), the configuration with the largest one;
    None without such runs. Where it is above 1, plain target-only is not the fastest target-only decoder."""
    p = _pooled(a, "baseline_padded", "speedup")
    if p.empty:
        return None
    r = p.sort_values("speedup").iloc[-1]
    return float(r["speedup"]), float(r["speedup_lo"]), float(r["speedup_hi"]), str(r["config_label"])


def cell_what(r) -> str:
    """``"draft K=3"`` / ``"ngram cost"``: a cell's drafter and K or policy."""
    return r["method"] + (f" K={int(r['k'])}" if r["policy"] in ("fixed", "-") else f" {r['policy']}")


def cell_label(r) -> str:
    """``"<config>, draft K=3"`` / ``"<config>, ngram cost"``: a cell's configuration, drafter and K or policy."""
    return f"{r['config_label']}, {cell_what(r)}"


def headline_figure(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    """The headline figure (kind ``headline``): one row per prompt type, the best cell's speedup with its 95 %
    interval (bar and whisker), the default policy's (hollow diamond), parity at 1 and the A/A interval
    shaded. Skipped (with the reason) without speculative cells."""
    t = headline_table(a[T.CELLS], a.default_policy)
    if t.empty:
        return [FigureEntry("headline", "headline", "Headline", "",
                            skipped="no speculative cell with a measured speedup")]
    t = t.iloc[::-1].reset_index(drop=True)  # highest on top
    fig = new_figure(9.5, 2.0 + 0.42 * len(t))
    ax = fig.subplots()
    y = np.arange(len(t))
    sp = t["speedup"].astype(float).to_numpy()
    lo = t["speedup_lo"].astype(float).to_numpy()
    hi = t["speedup_hi"].astype(float).to_numpy()
    colours = ["#2e7d32" if v == "win" else "#c62828" if v == "loss" else "#90a4ae" for v in t["verdict"]]
    ax.barh(y, sp - 1.0, left=1.0, height=0.55, color=colours, alpha=0.85, label="best cell (after the fact)")
    has = np.isfinite(lo) & np.isfinite(hi)
    ax.errorbar(sp[has], y[has], xerr=np.vstack([sp[has] - lo[has], hi[has] - sp[has]]), fmt="none",
                ecolor="black", capsize=3, lw=1)
    dsp = t["default_speedup"].astype(float).to_numpy()
    dlo = t["default_lo"].astype(float).to_numpy()
    dhi = t["default_hi"].astype(float).to_numpy()
    dd = np.isfinite(dsp)
    if dd.any():
        ax.plot(dsp[dd], y[dd] - 0.32, "D", mfc="white", mec="#1565c0", ms=6, ls="none",
                label=f"default policy ({', '.join(a.default_policy)})")
        dh = dd & np.isfinite(dlo) & np.isfinite(dhi)
        ax.errorbar(dsp[dh], y[dh] - 0.32, xerr=np.vstack([dsp[dh] - dlo[dh], dhi[dh] - dsp[dh]]), fmt="none",
                    ecolor="#1565c0", capsize=2, lw=0.8)
    padded = padded_reference(a)
    if padded is not None:
        ax.axvline(padded[0], color="#6a1b9a", lw=1.2, ls="--",
                   label=tex_safe(f"target-only padded ({padded[3]}): {padded[0]:.2f}x"))
    floor = aa_floor(a)
    if floor is not None:
        ax.axvspan(floor[0], floor[1], color="#ffb300", alpha=0.25, label=tex_safe(f"A/A noise floor ({floor[2]})"))
    ax.axvline(1.0, color="black", lw=1)
    for yi, (_, r) in zip(y, t.iterrows()):
        ax.text(max(float(r["speedup"]), float(r["speedup_hi"]) if np.isfinite(r["speedup_hi"]) else 0) + 0.02,
                yi, tex_safe(f"{float(r['speedup']):.2f}x  {cell_label(r)}"), va="center", fontsize=7)
    ax.set_yticks(y, [tex_safe(p) for p in t["prompt_type"]])
    right = np.nanmax(np.concatenate([sp, hi[has], dsp[dd]])) if len(sp) else 1.0
    left = np.nanmin(np.concatenate([sp, lo[has], dsp[dd], [1.0]]))
    ax.set_xlim(min(left, 1.0) - 0.05, right + 0.55 * max(right - 1.0, 0.4) + 0.1)
    ax.set_xlabel("speedup over target-only (paired; 1 = parity)")
    ax.set_title("Speedup per prompt type: best cell and the default policy, with 95 % intervals", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=7)  # below the axes, never on bars
    return [save_figure(fig, out, FigureEntry(
        name("headline"), "headline", "Headline: speedup per prompt type",
        "Per prompt type, the speculative cell with the highest paired speedup among those measured on the most "
        "prompts of the type (any configuration, drafter, K or policy; chosen after the fact, so optimistic) as a bar from 1 with its 95 % t-interval over the type's "
        "prompts (green: win, red: loss, grey: no measurable difference or too few prompts for a verdict), and "
        f"the default policy ({default_words(a.default_policy)}; hollow diamond) on the same configuration. Shaded: the "
        "pooled A/A interval, how far noise alone reaches; dashed, where measured: target-only decoding padded "
        "to its cheapest step shape, a faster target-only decoder than the baseline. Each speedup is over target-only decoding on its own "
        "configuration."))]


def _single(r) -> str:
    """``"; a single run"`` for a cell measured on one prompt, else ``""``."""
    return "; a single run" if int(r["n_aligned"] or 0) <= 1 else ""


def verdict_lines(a: Analysis) -> list[str]:
    """The five-line verdict under the headline figure (fewer when the store lacks the data)."""
    t = headline_table(a[T.CELLS], a.default_policy)
    if t.empty:
        return ["No speculative cell with a measured speedup in this store."]
    lines = []
    v = t["verdict"].value_counts()
    n = len(t)
    lines.append(f"At its best cell (chosen after the fact), speculation wins on {v.get('win', 0)} of {n} prompt "
                 f"types, loses on {v.get('loss', 0)}, and shows no measurable difference or has too few prompts "
                 f"for a verdict on {n - v.get('win', 0) - v.get('loss', 0)}.")
    top, low = t.iloc[0], t.iloc[-1]
    lines.append(f"Highest: {top['prompt_type']} {f(top['speedup'])}x {ci(top['speedup_lo'], top['speedup_hi'])} "
                 f"({cell_label(top)}{_single(top)}); lowest best cell: {low['prompt_type']} {f(low['speedup'])}x "
                 f"{ci(low['speedup_lo'], low['speedup_hi'])} ({cell_label(low)}{_single(low)}).")
    ov = a[T.OVERALL]
    default = a.default_policy
    d = ov[(ov["method"] == default[0]) & (ov["policy"] == default[1])] if len(ov) else ov
    if len(d):
        parts = [f"{r.config_label} {f(r.speedup)}x {ci(r.speedup_lo, r.speedup_hi)} over {int(r.n_aligned)} "
                 f"prompts ({r.verdict})" for r in d.itertuples()]
        dv = t["default_verdict"].value_counts()
        # default_verdict is the default policy on each type's best-cell configuration: say so when there are several
        where = " on the configuration of the type's best cell" if d["config_label"].nunique() > 1 else ""
        lines.append(f"The default policy ({default_words(default)}), fixed before the run, pooled over all prompts: "
                     + "; ".join(parts) + f"; per type{where} it wins on {dv.get('win', 0)} and loses on "
                     f"{dv.get('loss', 0)} of {int((t['default_verdict'] != '').sum())}.")
    floor, padded = aa_floor(a), padded_reference(a)
    refs = []
    if floor is not None:
        refs.append(f"A/A noise floor ({floor[2]}): target-only against itself lies in [{floor[0]:.3f}, "
                    f"{floor[1]:.3f}]; a speedup inside that band is noise on this machine")
    if padded is not None:
        refs.append(f"target-only padded to its cheapest measured step shape ({padded[3]}) runs at "
                    f"{f(padded[0])}x {ci(padded[1], padded[2])} of plain target-only: a speedup below that is "
                    "beaten without speculating")
    if refs:
        text = "; ".join(refs)
        lines.append(text[0].upper() + text[1:] + ".")
    ex = exactness(a[T.EQUALITY])
    if len(ex):
        parts = [f"{r.config_label} {r.n_equal} of {r.n_checked} ({pct(r.n_equal / r.n_checked)})"
                 for r in ex.itertuples()]
        if parts:
            lines.append("Greedy speculative runs that reproduced their configuration's target-only output "
                         "token for token: " + "; ".join(parts) + ".")
    return lines[:5]


def headline_section(a: Analysis, figures: list[FigureEntry]) -> Section:
    """The headline: its figure (when drawn) and the five-line verdict."""
    sec = Section("Timed cells per prompt type", "headline")
    sec.blocks.extend(e for e in figures if e.kind == "headline" and not e.skipped)
    sec.blocks.append(Bullets(verdict_lines(a)))
    return sec
