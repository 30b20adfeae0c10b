"""The report's first section (`answer_section`): per prompt type, whether speculative decoding beats
target-only decoding on this machine, from every traced prompt's prediction checked against the timed runs
(:mod:`specdec.report.answer`), and its two figures per type: the predicted speedup against K with the timed
cells on it, and the predicted speedup against the acceptance that produced it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specdec.core import stats
from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.answer import model_check
from specdec.report.document import Bullets, Section, ci, f, i, s, table_of
from specdec.report.figure_kit import (
    FigureEntry,
    Namer,
    colour_cycle,
    k_axis,
    new_figure,
    save_figure,
    tex_safe,
)
from specdec.report.headline import aa_floor, default_words
from specdec.report.predicted import positive_geomean

__all__ = ["answer_figures", "answer_section"]

_VERDICTS = ("win", "loss", "no measurable difference", "too few prompts")


def _counts(col: pd.Series) -> str:
    v = col.value_counts()
    return ", ".join(f"{word} on {v.get(word, 0)}" for word in _VERDICTS if v.get(word, 0)) or "no verdict"


def _sampled_timed(check: pd.DataFrame, label: str, ptype: str) -> str:
    """The type's timed sampled runs (`specdec.report.sampled.sampled_check`), per drafter and K (or policy):
    their measured block efficiency beside the one their sampled traces predict (a sampled run's speedup is
    not predicted run by run), ``"tokens/forward: draft K=4 3.20 (predicted 2.74, 1 run)"``, a policy's
    ``"draft cost (K up to 16) ..."``; "" without any."""
    t = check[(check["config_label"] == label) & (check["prompt_type"] == ptype)] if len(check) else check
    if not len(t):
        return ""
    parts = []
    for (method, policy, k), h in t.groupby(["method", "policy", "k"], sort=True):
        n = len(h)
        what = f"{method} K={int(k)}" if policy == "fixed" else f"{method} (K up to {int(k)})"
        parts.append(f"{what} {stats.geometric_mean(h['measured']):.2f} (predicted "
                     f"{stats.geometric_mean(h['predicted']):.2f}, {n} run{'s' if n > 1 else ''})")
    return "tokens/forward: " + "; ".join(parts)


def _check_line(a: Analysis) -> str:
    """The timed check of the predictions, pooled and per drafter."""
    mc = model_check(a[T.PREDICTED])
    if mc.empty and len(a[T.SAMPLED]):
        from specdec.report.sampled import sampled_summary

        pooled = "; ".join(f"{r.config_label} {f(r.ratio, 3)} {ci(r.lo, r.hi, 3)} ({r.n} prompts, {r.n_runs} runs)"
                           for r in sampled_summary(a[T.SAMPLED]).itertuples() if r.method == "all")
        return ("Sampled decoding: each prompt is priced in expectation from its sampled trace (a fixed K exactly, "
                "a K policy as the mean of simulated runs). The expectation's block efficiency against the timed "
                f"sampled runs' (predicted / measured; each run one draw): {pooled}. Their speedups are not "
                "checked run by run, and the intervals are over prompts only.")
    if mc.empty:
        return ("No timed speculative run of a traced prompt: the predictions are unchecked on this store, and "
                "the intervals are over prompts only.")
    parts = []
    for label, g in mc.groupby("config_label", sort=True):
        pooled = g[g["method"] == "all"].iloc[0]
        per = "; ".join(f"{r.method} {f(r.ratio, 3)} {ci(r.lo, r.hi, 3)} ({r.n} prompts)"
                        for r in g[g["method"] != "all"].itertuples())
        few = "" if pooled["n"] >= stats.MIN_UNITS else " - fewer than 5 prompts: a rough check"
        parts.append(f"{label}: {f(pooled['ratio'], 3)} {ci(pooled['lo'], pooled['hi'], 3)} over {int(pooled['n'])} "
                     f"prompts ({int(pooled['n_runs'])} timed cells){few}; per drafter {per}; replayed rounds "
                     f"equal to the timed ones in {int(pooled['n_exact'])} of {int(pooled['n_runs'])} cells")
    return ("The predictions checked against the timed runs (predicted / measured decode speedup, paired; 1 = "
            "exact; a prompt's cells pooled first, the interval over prompts): " + ". ".join(parts) + ". The "
            "table's intervals are widened by the pooled interval.")


def _pooled_default(a: Analysis) -> str | None:
    """The default policy over every traced prompt (predicted) and over its timed prompts (measured)."""
    g = a[T.TRACE_GRID]
    if g.empty:
        return None
    parts = []
    default = a.default_policy
    for label, h in g[(g["method"] == default[0]) & (g["policy"] == default[1])].groupby("config_label"):
        v = h["predicted"].astype(float)
        r = stats.ratio_interval(v[np.isfinite(v) & (v > 0)])
        text = f"{label}: predicted {f(r.center)}x {ci(r.lo, r.hi)} over {r.n} prompts"
        ov = a[T.OVERALL]
        m = ov[(ov["config_label"] == label) & (ov["method"] == default[0])
               & (ov["policy"] == default[1])] if len(ov) else ov
        if len(m):
            n = int(m["n_aligned"].iloc[0])
            text += (f", timed {f(m['speedup'].iloc[0])}x {ci(m['speedup_lo'].iloc[0], m['speedup_hi'].iloc[0])} "
                     f"end to end over {n} prompt{'s' if n != 1 else ''}"
                     + (" (too few for a verdict)" if n < stats.MIN_UNITS else f" ({m['verdict'].iloc[0]})"))
        parts.append(text)
    return (f"The default policy ({default_words(default)}), fixed before any run, pooled: " + "; ".join(parts) + "."
            if parts else None)


def answer_section(a: Analysis, figures: list[FigureEntry]) -> Section:
    """The answer per prompt type: counts of win / loss / no difference, the default policy pooled, the timed
    check of the predictions, the A/A noise floor, the table, and its figures."""
    sec = Section("The answer: when speculative decoding beats target-only decoding here", "answer")
    t = a[T.ANSWER]
    if t.empty:
        sec.blocks.append("No acceptance trace in this store: the per-type answer needs each prompt's trace and "
                          "calibration block (a greedy sweep records them; see 'Timed cells' below).")
        return sec
    n = t["n_prompts"]
    each = f"{int(n.min())}" if n.min() == n.max() else f"{int(n.min())}-{int(n.max())}"
    lines = [(f"Per prompt type over {each} prompts each ({int(n.sum())} in all), every prompt priced from its "
              "acceptance trace and calibration block (decode speedup, prefill excluded; intervals over the type's "
              f"prompts). The best drafter at the K its type needs: {_counts(t['best_verdict'])} of {len(t)} "
              f"types; the default policy: {_counts(t['default_verdict'])}.")]
    lines += [x for x in (_pooled_default(a), _check_line(a)) if x]
    floor = aa_floor(a)
    if floor is not None:
        lines.append(f"A/A noise floor ({floor[2]}): target-only timed as a method lies in [{floor[0]:.3f}, "
                     f"{floor[1]:.3f}] of its neighbours; a timed speedup inside that band is noise here.")
    sec.blocks.append(Bullets(lines))
    several = t["config_label"].nunique() > 1
    cols = [("config", lambda r: s(r["config_label"]))] if several else []
    tab = table_of(t, cols + [
        ("prompt type", lambda r: s(r["prompt_type"])), ("prompts", lambda r: i(r["n_prompts"])),
        ("best drafter, K", lambda r: f"{r['best_method']} K={int(r['best_k'])}" if pd.notna(r["best_k"]) else "-"),
        ("speedup", lambda r: f(r["best"])), ("95% CI", lambda r: ci(r["best_lo"], r["best_hi"])),
        ("verdict", lambda r: s(r["best_verdict"])),
        ("default policy", lambda r: f(r["default"])), ("default CI", lambda r: ci(r["default_lo"], r["default_hi"])),
        ("default verdict", lambda r: s(r["default_verdict"] or None)),
        ("every drafter at its best K", lambda r: s(r["drafters"])),
        ("timed (measured, predicted)",
         lambda r: s(r["timed"]) or _sampled_timed(a[T.SAMPLED], r["config_label"], r["prompt_type"]) or "none"),
    ])
    tab.caption = ("Predicted decode speedups over target-only per prompt type; a drafter's K is chosen on the "
                   "type's prompts (mildly optimistic). Verdicts need 5 prompts; 'timed' cells are single runs "
                   "where they say '1 run'.")
    sec.blocks.append(tab)
    sec.blocks.extend(e for e in figures if e.kind in ("answer_vs_k", "answer_vs_acceptance") and not e.skipped)
    return sec


def _geomean_by_k(m: pd.DataFrame) -> pd.Series:
    """Per K, the geometric mean of the positive predictions of `m` (one drafter's rows of one type)."""
    return m.groupby("k")["predicted"].apply(positive_geomean)


def _draw_vs_k(ax, h: pd.DataFrame, timed: pd.DataFrame, colour) -> None:
    """One type's panel of speedup against K: each drafter's predicted curve, its timed fixed-K runs on it."""
    for method, m in h.groupby("method", sort=True):
        curve = _geomean_by_k(m)
        ax.plot(curve.index, curve.to_numpy(float), color=colour[method], lw=1.3, label=method)
        tm = timed[(timed["method"] == method) & (timed["policy"] == "fixed")] if len(timed) else timed
        if len(tm):
            ax.plot(tm["k"], tm["measured"], "o", mfc="white", mec=colour[method], ms=5)
    k_axis(ax, [1, 2, 4, 8, 16])


def _draw_vs_acceptance(ax, h: pd.DataFrame, timed: pd.DataFrame, colour) -> None:
    """One type's panel of speedup against acceptance: per prompt and drafter, at the drafter's best K."""
    for method, m in h.groupby("method", sort=True):
        b = m[m["k"] == _geomean_by_k(m).idxmax()]
        ax.scatter(b["block_efficiency"], b["predicted"], color=colour[method], s=14, label=method,
                   edgecolor="black", linewidth=0.3)


#: The answer's figures: kind -> (draw one type's panel, x label, y label, title, caption).
_FIGURES = {
    "answer_vs_k": (_draw_vs_k, "K (log scale)", "decode speedup over target-only", "Speedup against K",
                    ("Per prompt type: each drafter's predicted decode speedup at K = 1..16 (geometric mean over "
                     "the type's prompts, from their traces and calibration blocks); hollow circles: timed "
                     "fixed-K runs (measured, paired; single runs). Dashed: parity with target-only decoding.")),
    "answer_vs_acceptance": (
        _draw_vs_acceptance, "tokens per target forward (block efficiency, bonus included)",
        "predicted decode speedup", "Speedup against acceptance",
        ("Per prompt type, one point per prompt and drafter at the drafter's best K for the type: the tokens "
         "each target forward commits against the predicted decode speedup. Acceptance alone does not decide: "
         "the draft model pays for its tokens in draft steps, prompt lookup and the suffix drafter do not, and a "
         "longer verification costs more target time.")),
}


def _per_type_figure(a: Analysis, out: Path, name: Namer, kind: str) -> list[FigureEntry]:
    """Figure `kind` of `_FIGURES` per configuration: one panel per prompt type (4 to a row), drafters coloured
    alike in every panel, parity dashed; skipped without a trace."""
    draw, xlabel, ylabel, title, caption = _FIGURES[kind]
    grid, pvm = a[T.TRACE_GRID], a[T.PREDICTED]
    fx = grid[grid["policy"] == "fixed"] if len(grid) else grid
    if fx.empty:
        return [FigureEntry(kind, kind, title, "", skipped="no acceptance trace")]
    entries = []
    for label, g in fx.groupby("config_label", sort=True):
        types = sorted(set(g["prompt_type"]))
        methods = sorted(set(g["method"]))
        colour = dict(zip(methods, colour_cycle(len(methods))))
        cols = min(4, len(types))
        fig = new_figure(3.0 * cols + 1.5, 2.4 * ((len(types) + cols - 1) // cols) + 1.0)
        axes = fig.subplots((len(types) + cols - 1) // cols, cols, squeeze=False).ravel()
        for ax, ptype in zip(axes, types):
            h = g[g["prompt_type"] == ptype]
            timed = pvm[(pvm["config_label"] == label) & (pvm["prompt_type"] == ptype)] if len(pvm) else pvm
            draw(ax, h, timed, colour)
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            ax.set_title(tex_safe(f"{ptype} ({h['prompt_id'].nunique()} prompts)"), fontsize=8)
        for ax in axes[len(types):]:
            ax.set_visible(False)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside upper center", ncol=len(methods), fontsize=7)
        fig.supxlabel(xlabel, fontsize=8)
        fig.supylabel(ylabel, fontsize=8)
        entries.append(save_figure(fig, out, FigureEntry(name(kind, label), kind,
                                                         f"{title} per prompt type - {label}", caption)))
    return entries


def answer_figures(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    """The answer's two figures per configuration (`FigureEntry` kinds ``answer_vs_k`` and
    ``answer_vs_acceptance``), skipped with the reason where the store holds no trace."""
    return [e for kind in _FIGURES for e in _per_type_figure(a, out, name, kind)]
