"""Figures of the report (matplotlib, Agg canvas, no pyplot state): each one written as PNG and SVG.

Every figure is built from the tables of :class:`specdec.report.analysis.Analysis`; a figure whose data
is absent is not drawn and comes back as a `FigureEntry` with ``skipped`` saying why. A figure that
fails to draw on unexpected data is skipped the same way (with the error), so one bad figure never
stops the report.

Figures (file stem prefixes):

* ``answer_vs_k``, ``answer_vs_acceptance`` -- per prompt type, the traces' predicted speedup against K
  (timed cells on it) and against block efficiency (:mod:`specdec.report.sections_answer`; the first section).
* ``headline`` -- per prompt type, the best cell's and the default policy's speedup with 95 % intervals, and
  the A/A noise floor (:mod:`specdec.report.headline`; shown in the report's first section).
* ``heatmap`` -- speedup, prompt type x K, per (config, pair, method); diverging colormap centred at 1.
* ``speedup_vs_k`` -- speedup against K, one line per prompt type, with 95 % CI bars.
* ``alpha_vs_speedup`` -- measured alpha-hat against measured speedup per cell, with the model's curves.
* ``best_k`` -- best fixed K and its speedup per prompt type.
* ``predicted_vs_measured`` -- refined (else ideal) predicted speedup against measured, with y = x.
* ``time_breakdown`` -- ms per new token in prefill / drafting / verification / other, stacked, per K.
* ``acceptance_by_position`` -- P(accept at draft position i | position i reached).
* ``verification_cost`` -- v(n) = t(n)/t(1) against n, with the ideal flat 1 and the per-token line n.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specdec.catalogue.drafters import DRAFT_MODEL, PROMPT_LOOKUP
from specdec.core import theory
from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.cells import spec_fixed_cells
from specdec.report.figure_kit import (
    MARKERS,
    PHASES,
    VERDICT_COLOURS,
    FigureEntry,
    Namer,
    colour_cycle,
    k_axis,
    new_figure,
    prompt_types,
    save_figure,
    sorted_groups,
    tex_safe,
)
from specdec.report.headline import headline_figure
from specdec.report.sections_answer import answer_figures
from specdec.report.vocab import FIXED_POLICIES, SPEC_METHODS

__all__ = ["FigureEntry", "make_figures"]

# --------------------------------------------------------------------------------------------------
# the figures
# --------------------------------------------------------------------------------------------------


def _heatmaps(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    from matplotlib import colormaps
    from matplotlib.colors import TwoSlopeNorm

    fx = spec_fixed_cells(a[T.CELLS])
    if fx.empty:
        return [FigureEntry("heatmap", "heatmap", "Speedup heatmap", "",
                            skipped="no fixed-K speculative cell with a measured speedup")]
    entries = []
    for (label, pair, method), g in sorted_groups(fx, ["config_label", "pair", "method"]):
        types = prompt_types(g)
        ks = sorted(set(g["k"].astype(int)))
        grid = np.full((len(types), len(ks)), np.nan)
        verdicts = np.full((len(types), len(ks)), "", dtype=object)
        for r in g.itertuples():
            i, j = types.index(str(r.prompt_type)), ks.index(int(r.k))
            grid[i, j], verdicts[i, j] = r.speedup, r.verdict
        vmin = min(np.nanmin(grid), 0.99)
        vmax = max(np.nanmax(grid), 1.01)
        fig = new_figure(1.6 + 0.9 * len(ks) + 1.5, 1.2 + 0.42 * len(types) + 0.6)
        ax = fig.subplots()
        cmap = colormaps["RdBu"].with_extremes(bad="#dddddd")
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=TwoSlopeNorm(1.0, vmin, vmax), aspect="auto")
        for i in range(len(types)):
            for j in range(len(ks)):
                if np.isfinite(grid[i, j]):
                    mark = {"win": " \u25b2", "loss": " \u25bc"}.get(verdicts[i, j], "")
                    far = abs(grid[i, j] - 1.0) > 0.6 * max(vmax - 1.0, 1.0 - vmin)
                    ax.text(j, i, f"{grid[i, j]:.2f}{mark}", ha="center", va="center", fontsize=8,
                            color="white" if far else "black")
        ax.set_xticks(range(len(ks)), [str(k) for k in ks])
        ax.set_yticks(range(len(types)), [tex_safe(t) for t in types])
        ax.set_xlabel("K (draft tokens per round)")
        ax.set_ylabel("prompt type")
        ax.set_title(tex_safe(f"Speedup over target-only: {label} / {pair} / {method}"), fontsize=10)
        fig.colorbar(im, ax=ax, label="speedup (x baseline tokens/s; 1 = parity)")
        entries.append(save_figure(fig, out, FigureEntry(
            name("heatmap", label, pair, method), "heatmap",
            f"Speedup heatmap - {label} / {pair} / {method}",
            "End-to-end speedup (method tokens/s / baseline tokens/s, geometric mean over prompts) per prompt "
            "type and K. Blue > 1 (faster), red < 1 (slower), white = parity. \u25b2 win (95 % CI above 1), "
            "\u25bc loss (CI below 1), no mark: no measurable difference, too few units (under 5) or a single run. "
            "Grey: not measured.")))
    return entries


def _speedup_vs_k(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    fx = spec_fixed_cells(a[T.CELLS])
    if fx.empty:
        return [FigureEntry("speedup_vs_k", "speedup_vs_k", "Speedup vs K", "",
                            skipped="no fixed-K speculative cell with a measured speedup")]
    entries = []
    for (label, pair, method), g in sorted_groups(fx, ["config_label", "pair", "method"]):
        types = prompt_types(g)
        ks = sorted(set(g["k"].astype(int)))
        fig = new_figure(9, 5)
        ax = fig.subplots()
        for j, (colour, ptype) in enumerate(zip(colour_cycle(len(types)), types)):
            s = g[g["prompt_type"] == ptype].sort_values("k")
            y = s["speedup"].to_numpy(float)
            err = np.vstack([y - s["speedup_lo"].to_numpy(float), s["speedup_hi"].to_numpy(float) - y])
            # dodge the lines sideways (in log2 K) so their error bars do not hide each other
            dodge = 2.0 ** (0.25 * (j - (len(types) - 1) / 2) / max(len(types), 1))
            ax.errorbar(s["k"].to_numpy(float) * dodge, y, yerr=np.clip(err, 0, None), marker="o", ms=4,
                        capsize=2, lw=1.3, color=colour, label=tex_safe(ptype))
        ax.axhline(1.0, color="black", lw=1, ls="--")
        k_axis(ax, ks)
        ax.set_xlabel("K (draft tokens per round, log scale)")
        ax.set_ylabel("speedup (x baseline tokens/s)")
        ax.set_title(tex_safe(f"Speedup vs K: {label} / {pair} / {method}"), fontsize=10)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="prompt type")
        entries.append(save_figure(fig, out, FigureEntry(
            name("speedup_vs_k", label, pair, method), "speedup_vs_k",
            f"Speedup vs K - {label} / {pair} / {method}",
            "Speedup per prompt type against K with its 95 % t-interval (across prompts; none for a "
            "single run). Lines are shifted slightly sideways so the bars stay visible. Dashed line: parity "
            "with target-only decoding.")))
    return entries


def _alpha_vs_speedup(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    fx = spec_fixed_cells(a[T.CELLS])
    if len(fx):
        fx = fx[np.isfinite(fx["alpha_hat"].astype(float))]
    if fx.empty:
        return [FigureEntry("alpha_vs_speedup", "alpha_vs_speedup", "Acceptance vs speedup", "",
                            skipped="no fixed-K speculative cell with both alpha-hat and speedup")]
    entries = []
    grid = np.linspace(0.0, 1.0, 201)
    for (label, pair), g in sorted_groups(fx, ["config_label", "pair"]):
        ks = sorted(set(g["k"].astype(int)))
        colours = dict(zip(ks, colour_cycle(len(ks))))
        info = a.costs.get(label)
        fig = new_figure(8.5, 5.5)
        ax = fig.subplots()
        for (method, k), s in g.groupby(["method", "k"]):
            ax.scatter(s["alpha_hat"], s["speedup"], color=colours[int(k)], marker=MARKERS.get(method, "^"),
                       edgecolor="black", linewidth=0.4, s=36, label=f"{method} K={k}", zorder=3)
        curve_note = "No model curve: costs (c, v) were not measured for this config."
        if info is not None and info.c_for(DRAFT_MODEL) is not None and (g["method"] == DRAFT_MODEL).any():
            c = info.c_for(DRAFT_MODEL)
            for k in ks:
                if info.v:
                    y = theory.refined_speedup(grid, k, c, info.v)
                else:
                    y = theory.ideal_speedup(grid, k, c)
                ax.plot(grid, y, color=colours[k], lw=1, alpha=0.8)
            curve_note = (f"Lines: the {'refined' if info.v else 'ideal'} model for the draft model at each K "
                          f"(c = {c:.3f}{', measured v(K+1)' if info.v else ', v(K+1) = 1'}).")
        elif info is not None and (g["method"] == PROMPT_LOOKUP).any():
            for k in ks:
                y = theory.refined_speedup(grid, k, 0.0, info.v) if info.v else theory.ideal_speedup(grid, k, 0.0)
                ax.plot(grid, y, color=colours[k], lw=1, alpha=0.8)
            curve_note = "Lines: the model for prompt lookup (c = 0) at each K."
        ax.axhline(1.0, color="black", lw=1, ls="--")
        top = float(np.nanmax(g["speedup"].to_numpy(float)))
        ax.set_ylim(0, max(2.0, top * 1.15))
        ax.set_xlim(0, 1.02)
        ax.set_xlabel("alpha-hat = accepted / (accepted + rejections)")
        ax.set_ylabel("speedup (x baseline tokens/s)")
        ax.set_title(tex_safe(f"Acceptance vs speedup: {label} / {pair}"), fontsize=10)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        entries.append(save_figure(fig, out, FigureEntry(
            name("alpha_vs_speedup", label, pair), "alpha_vs_speedup",
            f"Acceptance vs speedup - {label} / {pair}",
            "Each point is one cell (prompt type x method x K): measured alpha-hat against measured median "
            f"speedup. {curve_note} Dashed: parity.")))
    return entries


def _best_k(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    best = a[T.BEST_K]
    best = best[best["method"].isin(SPEC_METHODS)] if len(best) else best
    if best.empty:
        return [FigureEntry("best_k", "best_k", "Best K", "", skipped="no fixed-K speculative cell with a speedup")]
    entries = []
    for (label, pair, method), g in sorted_groups(best, ["config_label", "pair", "method"]):
        g = g.sort_values("prompt_type")
        y = g["speedup"].to_numpy(float)
        err = np.clip(np.vstack([y - g["speedup_lo"].to_numpy(float), g["speedup_hi"].to_numpy(float) - y]), 0, None)
        fig = new_figure(max(6.0, 0.6 * len(g) + 2), 5)
        ax = fig.subplots()
        x = np.arange(len(g))
        colours = [VERDICT_COLOURS.get(v, "#757575") for v in g["verdict"]]
        ax.bar(x, y, color=colours, yerr=err, capsize=3, edgecolor="black", linewidth=0.4)
        for xi, yi, k in zip(x, y, g["best_k"]):
            ax.annotate(f"K={k}", (xi, yi), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        ax.axhline(1.0, color="black", lw=1, ls="--")
        ax.set_xticks(x, [tex_safe(t) for t in g["prompt_type"]], rotation=35, ha="right")
        ax.set_xlabel("prompt type")
        ax.set_ylabel("speedup at the best K (x baseline tokens/s)")
        ax.set_title(tex_safe(f"Best fixed K per prompt type: {label} / {pair} / {method}"), fontsize=10)
        entries.append(save_figure(fig, out, FigureEntry(
            name("best_k", label, pair, method), "best_k", f"Best K - {label} / {pair} / {method}",
            "For each prompt type, the K with the highest median speedup (label) and that speedup with its "
            "95 % CI. Green: win, red: loss, grey: no measurable difference. The best K is chosen after "
            "the fact, so its speedup is optimistic.")))
    return entries


def _predicted_vs_measured(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    m = a[T.MODEL]
    if m.empty:
        return [FigureEntry("predicted_vs_measured", "predicted_vs_measured", "Predicted vs measured", "",
                            skipped="no model prediction (needs costs and fixed-K speculative cells)")]
    m = m.copy()
    use_refined = m["refined"].notna().any()
    m["pred"] = m["refined"] if use_refined else m["ideal"]
    m = m[np.isfinite(m["pred"].astype(float)) & np.isfinite(m["speedup"].astype(float))]
    if m.empty:
        return [FigureEntry("predicted_vs_measured", "predicted_vs_measured", "Predicted vs measured", "",
                            skipped="no cell with both a prediction and a measured speedup")]
    fig = new_figure(6.5, 6)
    ax = fig.subplots()
    labels = sorted(set(m["config_label"]))
    colours = dict(zip(labels, colour_cycle(len(labels))))
    for (label, method), s in m.groupby(["config_label", "method"]):
        ax.scatter(s["pred"], s["speedup"], color=colours[label], marker=MARKERS.get(method, "^"),
                   edgecolor="black", linewidth=0.4, s=32, label=tex_safe(f"{label} / {method}"), zorder=3)
    hi = float(max(m["pred"].max(), m["speedup"].max(), 1.0)) * 1.1
    ax.plot([0, hi], [0, hi], color="black", lw=1, label="y = x (runtime as efficient as the model)")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_aspect("equal")
    kind = "refined (measured v(K+1))" if use_refined else "ideal (v(K+1) = 1)"
    ax.set_xlabel(f"predicted speedup, {kind.split(' ')[0]} model")
    ax.set_ylabel("measured speedup (x baseline tokens/s)")
    ax.set_title("Predicted vs measured speedup", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return [save_figure(fig, out, FigureEntry(
        name("predicted_vs_measured"), "predicted_vs_measured", "Predicted vs measured speedup",
        f"Each point is one fixed-K cell: the {kind} prediction from its measured alpha-hat and c, against "
        "the measured median speedup. Below y = x the runtime delivers less than the model predicts "
        "(efficiency = measured / predicted < 1).")
    )]


def _time_breakdown(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    ov = a[T.OVERALL]
    need = ["draft_ms_per_token", "verify_ms_per_token", "total_ms_per_token"]
    if ov.empty or not all(c in ov.columns for c in need):
        return [FigureEntry("time_breakdown", "time_breakdown", "Time breakdown", "",
                            skipped="no successful run with timings")]
    ov = ov[ov["policy"].isin(FIXED_POLICIES) & np.isfinite(ov["total_ms_per_token"].astype(float))]
    base = ov[ov["method"] == "baseline"]
    spec = ov[ov["method"].isin(SPEC_METHODS) & (ov["k"] > 0)]
    if spec.empty:
        return [FigureEntry("time_breakdown", "time_breakdown", "Time breakdown", "",
                            skipped="no fixed-K speculative run with timings")]
    entries = []
    for (label, pair, method), g in sorted_groups(spec, ["config_label", "pair", "method"]):
        g = g.sort_values("k")
        b = base[base["config_label"] == label]
        b = b[b["pair"] == pair] if (b["pair"] == pair).any() else b
        rows = ([("baseline", b.iloc[0])] if len(b) else []) + [(f"K={int(r['k'])}", r) for _, r in g.iterrows()]
        fig = new_figure(max(6.0, 0.8 * len(rows) + 2.5), 5)
        ax = fig.subplots()
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for phase, colour in PHASES:
            vals = np.array([float(r.get(f"{phase}_ms_per_token", np.nan)) for _, r in rows])
            vals = np.nan_to_num(vals, nan=0.0)
            ax.bar(x, vals, bottom=bottom, color=colour, edgecolor="black", linewidth=0.3, label=phase)
            bottom += vals
        ax.set_xticks(x, [lab for lab, _ in rows])
        ax.set_xlabel("method / K (pooled over prompt types)")
        ax.set_ylabel("ms per new token")
        ax.set_title(tex_safe(f"Where the time goes: {label} / {pair} / {method}"), fontsize=10)
        ax.legend(fontsize=8, title="phase")
        entries.append(save_figure(fig, out, FigureEntry(
            name("time_breakdown", label, pair, method), "time_breakdown",
            f"Time breakdown - {label} / {pair} / {method}",
            "Milliseconds per new token (sum of seconds over runs / sum of new tokens), split into prefill, "
            "drafting (draft_s), verification (verify_s: target forward + acceptance) and everything else "
            "(rollback, bookkeeping). The bar height is 1000 / tokens-per-second.")))
    return entries


def _positions(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    p = a[T.POSITIONS]
    if p.empty:
        return [FigureEntry("acceptance_by_position", "acceptance_by_position", "Acceptance by position", "",
                            skipped="no per-round trace (rounds.accept_flags) for fixed-K speculative runs")]
    entries = []
    for (label, pair, method), g in sorted_groups(p, ["config_label", "pair", "method"]):
        types = prompt_types(g)
        fig = new_figure(9, 5)
        ax = fig.subplots()
        for colour, ptype in zip(colour_cycle(len(types)), types):
            s = g[g["prompt_type"] == ptype].sort_values("position")
            ax.plot(s["position"], s["p"], marker="o", ms=3, lw=1.2, color=colour, label=tex_safe(ptype))
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("draft position i (1 = first drafted token)")
        ax.set_ylabel("P(accept at i | reached i)")
        ax.set_title(tex_safe(f"Acceptance by draft position: {label} / {pair} / {method}"), fontsize=10)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="prompt type")
        entries.append(save_figure(fig, out, FigureEntry(
            name("acceptance_by_position", label, pair, method), "acceptance_by_position",
            f"Acceptance by draft position - {label} / {pair} / {method}",
            "Share of rounds accepting the draft token at position i among rounds that drafted it with "
            "every earlier position accepted, pooled over the fixed K values. A flat line is the i.i.d. "
            "acceptance the model assumes; a falling one means alpha decays along the draft.")))
    return entries


def _verification_cost(a: Analysis, out: Path, name: Namer) -> list[FigureEntry]:
    curves = {label: info for label, info in a.costs.items() if info.v and len(info.v) >= 2}
    if not curves:
        return [FigureEntry("verification_cost", "verification_cost", "Verification cost curve", "",
                            skipped="no target forward times for n >= 2 tokens in 'costs'")]
    fig = new_figure(7.5, 5)
    ax = fig.subplots()
    n_max = max(info.max_n for info in curves.values())
    ns = np.arange(1, n_max + 1)
    ax.plot(ns, np.ones_like(ns, dtype=float), color="black", ls="--", lw=1,
            label="ideal: v(n) = 1 (free parallel verification)")
    ax.plot(ns, ns, color="grey", ls=":", lw=1.2, label="per-token: v(n) = n (no parallelism)")
    for colour, (label, info) in zip(colour_cycle(len(curves)), sorted(curves.items())):
        xs = list(info.v)
        ax.plot(xs, [info.v[n] for n in xs], marker="o", ms=4, color=colour,
                label=tex_safe(f"{label} (t(1) = {1000 * info.target_step_s:.2f} ms)"))
    ax.set_xlabel("n (tokens in one target forward, warm cache)")
    ax.set_ylabel("v(n) = t(n) / t(1)  (target single-token steps)")
    ax.set_ylim(0, max(2.0, max(max(i.v.values()) for i in curves.values()) * 1.1))
    ax.set_title("Verification cost curve", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return [save_figure(fig, out, FigureEntry(
        name("verification_cost"), "verification_cost", "Verification cost curve",
        "Measured time of one target forward over n tokens relative to a single-token step. Verifying K "
        "drafts costs v(K+1). The classic analysis assumes the dashed line (v = 1); the dotted line is no "
        "parallelism at all."))]


_BUILDERS = (
    ("answer", answer_figures),
    ("headline", headline_figure),
    ("heatmap", _heatmaps),
    ("speedup_vs_k", _speedup_vs_k),
    ("alpha_vs_speedup", _alpha_vs_speedup),
    ("best_k", _best_k),
    ("predicted_vs_measured", _predicted_vs_measured),
    ("time_breakdown", _time_breakdown),
    ("acceptance_by_position", _positions),
    ("verification_cost", _verification_cost),
)


def make_figures(analysis: Analysis, fig_dir: str | Path) -> list[FigureEntry]:
    """Draw every figure of `analysis` into `fig_dir` (created if needed) as ``<name>.png`` and
    ``<name>.svg``.

    Returns one `FigureEntry` per drawn figure plus one per figure type that was skipped, with the reason
    (absent data, or the error when drawing failed). Never raises on data problems; raises OSError when
    `fig_dir` cannot be written.
    """
    out = Path(fig_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = Namer()
    entries: list[FigureEntry] = []
    for kind, build in _BUILDERS:
        try:
            entries.extend(build(analysis, out, name))
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn is reported, not fatal
            entries.append(FigureEntry(kind, kind, kind, "", skipped=f"drawing failed: {type(exc).__name__}: {exc}"))
    return entries

