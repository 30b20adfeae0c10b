"""The study report: several results stores read side by side (``specdec study --db A --db B ... --out DIR``).

One store holds one sweep, and the study's configurations are separate sweeps (bf16 and fp32 on every
built-in prompt, llama.cpp, the padded target-only decoder), so the question a reader brings - *per prompt
type, which configuration and K pay, by how much, and what is fastest* - needs them together. This module
analyses each store on its own (`specdec.report.analyze`: every speedup stays a ratio of runs paired in
time on one machine, inside its own store) and only then puts the results next to each other; no ratio
divides runs of two stores. What it adds:

* `type_table`: per prompt type and (store, configuration) the default policy's paired speedup with its
  interval, the best timed cell (`specdec.report.headline.headline_table`'s rule), alpha-hat, tokens per
  target forward, target-only tokens/s and the best fixed K per drafter predicted from the traces.
* `headline_rows`: per prompt type the best of those cells over every configuration (chosen after the fact:
  optimistic), drawn by `study_figure` with every configuration's default policy and the A/A noise floor.
* `fastest_table`: per prompt type and configuration target-only and the fastest speculative cell in
  tokens/s (timed in different sweeps, so only the speedups are paired), and the fastest overall.
* `duration_table`: how long each store took (generation seconds, and wall time from the runs' clock).

Units: tokens/s, seconds. The stores are read, never written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specdec.report import tables as T
from specdec.report.analysis import Analysis, analyze
from specdec.report.comparisons import exactness
from specdec.report.document import Bullets, Section, Table, ci, f, i, pct
from specdec.report.figure_kit import FigureEntry, colour_cycle, new_figure, save_figure, tex_safe
from specdec.report.headline import (
    DEFAULT_CELL,
    HOW_TO_READ_FIRST,
    aa_floor,
    headline_table,
    padded_reference,
)
from specdec.report.load import load_store
from specdec.report.vocab import ALL_PROMPTS, BASELINE, SPEC_METHODS

__all__ = [
    "StudyResult",
    "StudySource",
    "cell_label",
    "default_pivot",
    "duration_table",
    "fastest_per_type",
    "fastest_rows",
    "fastest_table",
    "headline_rows",
    "load_sources",
    "study_figure",
    "study_sections",
    "type_table",
    "write_study",
]

#: A gap between two consecutive runs of a store longer than this (seconds) starts a new sitting: the wall
#: time of a store sharded over days is the sum of its sittings, not first-to-last.
SITTING_GAP_S = 1800.0


@dataclass
class StudySource:
    """One store of the study: its file stem (``label``) and its analysis."""

    label: str
    analysis: Analysis


def load_sources(dbs: Sequence[str | Path]) -> list[StudySource]:
    """Analyse every store of `dbs` (the newest sweep of each).

    Raises:
        FileNotFoundError: a store does not exist. ValueError: a path is not a results store, or two stores
            have the same file stem (their rows would carry the same label).
    """
    labels = [Path(db).stem for db in dbs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two stores share a file name: {', '.join(labels)}; the study labels rows by it")
    return [StudySource(label, analyze(load_store(db))) for label, db in zip(labels, dbs, strict=True)]


def cell_label(r) -> str:
    """``"<config>, draft K=3"`` / ``"<config>, ngram cost"``: a cell's configuration, drafter and K or policy."""
    what = r["method"] + (f" K={int(r['k'])}" if r["policy"] in ("fixed", "-") else f" {r['policy']}")
    return f"{r['config_label']}, {what}"


_TYPE_COLUMNS = ["store", "config_label", "prompt_type", "n_prompts", "default_speedup", "default_lo", "default_hi",
                 "default_verdict", "default_n", "alpha_hat", "block_efficiency", "best", "speedup", "speedup_lo",
                 "speedup_hi", "verdict", "n_aligned", "baseline_tok_s", "draft_best_k", "draft_predicted",
                 "ngram_best_k", "ngram_predicted"]


def type_table(sources: Sequence[StudySource]) -> pd.DataFrame:
    """Per prompt type, store and configuration: the default policy, the best timed cell and the traces' best K.

    Returns:
        One row per (store, config_label, prompt_type) with speculative cells, columns `_TYPE_COLUMNS`:
        ``default_*`` the default policy's cell (draft model, cost policy; NaN where not run), ``alpha_hat``
        and ``block_efficiency`` (tokens per target forward, bonus token included) of that cell, ``best`` /
        ``speedup`` / ``speedup_lo`` / ``speedup_hi`` / ``verdict`` / ``n_aligned`` the best timed cell among
        those measured on the most prompts of the type (`headline_table`), ``baseline_tok_s`` the
        target-only cell's tokens/s, and ``<drafter>_best_k`` / ``<drafter>_predicted`` the fixed K with the
        highest decode speedup predicted from the acceptance traces (NaN without traces).
    """
    rows = []
    for src in sources:
        cells, best_k = src.analysis[T.CELLS], src.analysis[T.TRACE_BEST_K]
        if cells.empty:
            continue
        cells = cells[cells["prompt_type"] != ALL_PROMPTS]
        for label, c in cells.groupby("config_label", sort=True):
            head = headline_table(c)
            for _, h in head.iterrows():
                ptype = h["prompt_type"]
                mine = c[c["prompt_type"] == ptype]
                d = mine[(mine["method"] == DEFAULT_CELL[0]) & (mine["policy"] == DEFAULT_CELL[1])]
                b = mine[mine["method"] == BASELINE]
                rec = {"store": src.label, "config_label": label, "prompt_type": ptype,
                       "n_prompts": int(mine["n_prompts_expected"].max()),
                       "default_speedup": h["default_speedup"], "default_lo": h["default_lo"],
                       "default_hi": h["default_hi"], "default_verdict": h["default_verdict"],
                       "default_n": h["default_n"],
                       "alpha_hat": float(d["alpha_hat"].iloc[0]) if len(d) else np.nan,
                       "block_efficiency": float(d["block_efficiency"].iloc[0]) if len(d) else np.nan,
                       "best": cell_label(h), "speedup": h["speedup"], "speedup_lo": h["speedup_lo"],
                       "speedup_hi": h["speedup_hi"], "verdict": h["verdict"], "n_aligned": h["n_aligned"],
                       "baseline_tok_s": float(b["tok_s"].iloc[0]) if len(b) else np.nan}
                for m in ("draft", "ngram"):
                    t = best_k[(best_k["config_label"] == label) & (best_k["prompt_type"] == ptype)
                               & (best_k["method"] == m)] if len(best_k) else best_k
                    rec[f"{m}_best_k"] = float(t["best_k"].iloc[0]) if len(t) else np.nan
                    rec[f"{m}_predicted"] = float(t["predicted"].iloc[0]) if len(t) else np.nan
                rows.append(rec)
    return pd.DataFrame(rows, columns=_TYPE_COLUMNS)


def headline_rows(types: pd.DataFrame) -> pd.DataFrame:
    """Per prompt type the best timed cell over every store and configuration of `types` (`type_table`),
    among the cells measured on the most prompts of the type (a cell of one prompt cannot win the pick by
    chance over cells of five). Sorted by that speedup, highest first."""
    if types.empty:
        return types
    rows = []
    for _, g in types.groupby("prompt_type", sort=True):
        g = g[np.isfinite(g["speedup"].astype(float))]
        if g.empty:
            continue
        wide = g[g["n_aligned"] == g["n_aligned"].max()]
        rows.append(wide.sort_values("speedup", ascending=False).iloc[0])
    return pd.DataFrame(rows).sort_values("speedup", ascending=False).reset_index(drop=True)


def _floors(sources: Sequence[StudySource]) -> list[tuple[float, float, str]]:
    return [fl for s in sources if (fl := aa_floor(s.analysis)) is not None]


def _padded(sources: Sequence[StudySource]) -> list[tuple[float, float, float, str]]:
    return [p for s in sources if (p := padded_reference(s.analysis)) is not None]


def study_figure(sources: Sequence[StudySource], types: pd.DataFrame, out: Path) -> FigureEntry:
    """The study's headline figure (``study_headline``): per prompt type, the best cell over every
    configuration (bar from 1 with its 95 % interval; green win, red loss, grey neither) and each
    configuration's default policy (a marker with its interval), the widest pooled A/A interval shaded and
    each configuration's padded target-only decoder dashed. Skipped without speculative cells."""
    head = headline_rows(types)
    if head.empty:
        return FigureEntry("study_headline", "headline", "Headline", "", skipped="no speculative cell")
    head = head.iloc[::-1].reset_index(drop=True)
    configs = sorted({(r.store, r.config_label) for r in types.itertuples()
                      if np.isfinite(float(r.default_speedup))})
    fig = new_figure(10, 2.2 + 0.5 * len(head))
    ax = fig.subplots()
    y = np.arange(len(head))
    sp, lo, hi = (head[c].astype(float).to_numpy() for c in ("speedup", "speedup_lo", "speedup_hi"))
    colours = ["#2e7d32" if v == "win" else "#c62828" if v == "loss" else "#90a4ae" for v in head["verdict"]]
    ax.barh(y, sp - 1.0, left=1.0, height=0.6, color=colours, alpha=0.35,
            label="best cell over configurations (after the fact)")
    has = np.isfinite(lo) & np.isfinite(hi)
    ax.errorbar(sp[has], y[has], xerr=np.vstack([sp[has] - lo[has], hi[has] - sp[has]]), fmt="none",
                ecolor="black", capsize=3, lw=1)
    step = 0.6 / max(len(configs), 1)
    xs = [sp, lo[has], hi[has], [1.0]]  # every plotted value: the axis limits cover them all
    for j, ((store, label), colour) in enumerate(zip(configs, colour_cycle(len(configs)), strict=True)):
        d = types[(types["store"] == store) & (types["config_label"] == label)].set_index("prompt_type")
        d = d.reindex(head["prompt_type"])
        v, vlo, vhi = (d[c].astype(float).to_numpy() for c in ("default_speedup", "default_lo", "default_hi"))
        yy = y - 0.3 + step * (j + 0.5)
        ok = np.isfinite(v)
        okh = ok & np.isfinite(vlo) & np.isfinite(vhi)
        ax.errorbar(v[okh], yy[okh], xerr=np.vstack([v[okh] - vlo[okh], vhi[okh] - v[okh]]), fmt="none",
                    ecolor=colour, capsize=2, lw=0.8)
        ax.plot(v[ok], yy[ok], "D", mfc="white", mec=colour, ms=5, ls="none",
                label=tex_safe(f"default policy, {label} ({store})"))
        xs += [v[ok], vlo[okh], vhi[okh]]
    for p, colour in zip(_padded(sources), ("#6a1b9a", "#4a148c", "#311b92"), strict=False):
        ax.axvline(p[0], color=colour, lw=1.1, ls="--", label=tex_safe(f"target-only padded ({p[3]}): {p[0]:.2f}x"))
    floors = _floors(sources)
    if floors:
        lo_f, hi_f, lab = max(floors, key=lambda t: t[1] - t[0])
        ax.axvspan(lo_f, hi_f, color="#ffb300", alpha=0.3, label=tex_safe(f"A/A noise floor (widest: {lab})"))
    ax.axvline(1.0, color="black", lw=1)
    every = np.concatenate([np.asarray(x, dtype=float) for x in xs])
    left, right = float(np.nanmin(every)), float(np.nanmax(every))
    for yi, r in zip(y, head.itertuples()):
        top = r.speedup_hi if np.isfinite(float(r.speedup_hi)) else r.speedup
        ax.text(float(top) + 0.03, yi + 0.18, tex_safe(f"{float(r.speedup):.2f}x {r.best}"), fontsize=7)
    ax.set_yticks(y, [tex_safe(p) for p in head["prompt_type"]])
    ax.set_xlim(left - 0.05, right + 0.3 * (right - left) + 0.1)
    ax.set_xlabel("speedup over target-only decoding on the same configuration (paired; 1 = parity)")
    ax.set_title("Per prompt type: the best configuration and K, and every configuration's default policy",
                 fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=7)
    return save_figure(fig, out, FigureEntry(
        "study_headline", "headline", "Headline: speedup per prompt type, every configuration",
        "Per prompt type, the timed cell with the highest paired speedup over every configuration, drafter, K "
        "and policy, among the cells measured on the most prompts of the type (chosen after the fact, so "
        "optimistic): a bar from 1 with its 95 % t-interval over the type's prompts (green: win, red: loss, "
        "grey: no measurable difference). Diamonds: the default policy (draft model, cost policy), fixed before "
        "the run, on each configuration, with its interval. Shaded: the widest pooled A/A interval of the "
        "stores (how far noise alone reaches); dashed: target-only decoding padded to its cheapest step shape, "
        "where measured. Each speedup is over target-only decoding of its own configuration, timed in its own "
        "store."))


def fastest_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per prompt type and configuration: target-only tokens/s, the padded target-only decoder's (where
    measured), and the speculative cell (draft model or prompt lookup, fixed K or a policy) with the highest
    tokens/s, with its paired speedup.

    Args:
        cells: report cell tables (`specdec.report.tables.CELLS`), several stores concatenated; with a
            ``store`` column, a configuration found in two stores gets one ``config`` per store,
            ``"<config> (<store>)"``.

    Returns:
        Columns ``prompt_type``, ``config``, ``target_only``, ``padded``, ``best_spec`` (``"draft K=2"``,
        ``"ngram cost"``; ``"-"`` without one), ``spec_tok_s``, ``speedup`` (tokens/s; NaN where absent).
        Tokens/s of different configurations were timed at different times: only ``speedup`` is paired.
    """
    cols = ["prompt_type", "config", "target_only", "padded", "best_spec", "spec_tok_s", "speedup"]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    cells = cells[cells["prompt_type"] != ALL_PROMPTS]
    if "store" in cells.columns:  # one configuration timed in two stores: two columns, named by store
        twice = cells.groupby("config_label")["store"].nunique()
        cells = cells.assign(config_label=[f"{c} ({s})" if twice[c] > 1 else c
                                           for c, s in zip(cells["config_label"], cells["store"], strict=True)])
    spec = cells[cells["method"].isin(SPEC_METHODS) & np.isfinite(cells["tok_s"].astype(float))]
    rows = []
    for (label, ptype), b in cells[cells["method"] == BASELINE].groupby(["config_label", "prompt_type"]):
        s = spec[(spec["config_label"] == label) & (spec["prompt_type"] == ptype)]
        best = s.sort_values("tok_s", ascending=False).iloc[0] if len(s) else None
        pad = cells[(cells["method"] == "baseline_padded") & (cells["config_label"] == label)
                    & (cells["prompt_type"] == ptype)]
        rows.append({"prompt_type": ptype, "config": label, "target_only": float(b["tok_s"].iloc[0]),
                     "padded": float(pad["tok_s"].iloc[0]) if len(pad) else np.nan,
                     "best_spec": "-" if best is None else cell_label(best).split(", ", 1)[1],
                     "spec_tok_s": np.nan if best is None else float(best["tok_s"]),
                     "speedup": np.nan if best is None else float(best["speedup"])})
    return pd.DataFrame(rows, columns=cols)


def fastest_per_type(fast: pd.DataFrame) -> pd.DataFrame:
    """Per prompt type of `fast` (`fastest_table`): the fastest way to generate over every configuration and
    decoder (target-only, padded target-only, the best speculative cell): ``prompt_type``, ``fastest``,
    ``tok_s``, ``speculative`` (whether it speculates)."""
    rows = []
    for ptype, g in fast.groupby("prompt_type", sort=True):
        best = (0.0, "", False)
        for r in g.itertuples():
            for val, name, spec in ((r.target_only, f"{r.config} target-only", False),
                                    (r.padded, f"{r.config} target-only padded", False),
                                    (r.spec_tok_s, f"{r.config} {r.best_spec}", True)):
                if np.isfinite(val) and val > best[0]:
                    best = (float(val), name, spec)
        rows.append({"prompt_type": ptype, "fastest": best[1], "tok_s": best[0], "speculative": best[2]})
    return pd.DataFrame(rows, columns=["prompt_type", "fastest", "tok_s", "speculative"])


def fastest_rows(fast: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the "fastest way to generate" table of `fast` (`fastest_table`): per prompt type,
    per configuration ``"<target-only> (padded <tok/s>) / <best speculative> (<cell>, <speedup>x)"``, then
    the fastest overall."""
    configs = sorted(fast["config"].unique()) if len(fast) else []
    best = fastest_per_type(fast).set_index("prompt_type") if len(fast) else pd.DataFrame()
    rows = []
    for ptype, g in fast.groupby("prompt_type", sort=True):
        parts = []
        for c in configs:
            r = g[g["config"] == c]
            if r.empty:
                parts.append("-")
                continue
            r = r.iloc[0]
            pad = f" (padded {f(r.padded, 1)})" if np.isfinite(r.padded) else ""
            parts.append(f"{f(r.target_only, 1)}{pad} / {f(r.spec_tok_s, 1)} ({r.best_spec}, {f(r.speedup)}x)")
        b = best.loc[ptype]
        rows.append([ptype, *parts, f"{b['fastest']} ({f(b['tok_s'], 1)} tok/s)"])
    return ["prompt type", *[f"{c}: target-only / best speculative (x paired)" for c in configs], "fastest"], rows


def _sittings(created: pd.Series, total_s: pd.Series) -> tuple[float, int]:
    """Wall seconds and number of sittings of runs finished at `created` (ISO times) lasting `total_s`: a run
    starts a new sitting after a gap over `SITTING_GAP_S`; each sitting counts from its first run's start."""
    t = pd.to_datetime(created, utc=True, errors="coerce")
    order = t.sort_values().index
    t, d = t[order], total_s[order].astype(float).fillna(0.0)
    if t.isna().all():
        return float("nan"), 0
    wall, n, prev = 0.0, 0, None
    for ti, di in zip(t, d, strict=True):
        if pd.isna(ti):
            continue
        if prev is None or (ti - prev).total_seconds() > SITTING_GAP_S + di:
            wall += di
            n += 1
        else:
            wall += (ti - prev).total_seconds()
        prev = ti
    return wall, n


def duration_table(sources: Sequence[StudySource]) -> pd.DataFrame:
    """How long each store took: ``store``, ``sweep_id``, ``configs``, ``runs``, ``failed``, ``machines``
    (distinct machine ids), ``generation_s`` (sum of the runs' end-to-end seconds), ``wall_s`` and
    ``sittings`` (the runs' clock, gaps over `SITTING_GAP_S` starting a sitting; model loading, traces and
    calibration between runs included), ``first`` and ``last`` (ISO times of the first and last run)."""
    rows = []
    for s in sources:
        st = s.analysis.store
        r = st.runs
        wall, n = _sittings(r["created_at"], r["total_s"]) if len(r) else (float("nan"), 0)
        rows.append({"store": s.label, "sweep_id": st.sweep_id or "-",
                     "configs": ", ".join(sorted(set(r["config_label"].dropna().astype(str)))) or "-",
                     "runs": len(r), "failed": int(r["error"].notna().sum()) if len(r) else 0,
                     "machines": int(r["machine_id"].dropna().nunique()) if len(r) else 0,
                     "generation_s": float(r["total_s"].astype(float).sum()) if len(r) else 0.0,
                     "wall_s": wall, "sittings": n,
                     "first": str(r["created_at"].min()) if len(r) else "-",
                     "last": str(r["created_at"].max()) if len(r) else "-"})
    return pd.DataFrame(rows)


def _hours(seconds: float) -> str:
    from specdec.bench.estimate import format_duration

    return format_duration(seconds) if np.isfinite(seconds) else "-"


def _verdict_lines(sources: Sequence[StudySource], types: pd.DataFrame, fast: pd.DataFrame) -> list[str]:
    lines = []
    pooled = []
    for s in sources:
        ov = s.analysis[T.OVERALL]
        if ov.empty:
            continue
        d = ov[(ov["method"] == DEFAULT_CELL[0]) & (ov["policy"] == DEFAULT_CELL[1])]
        for r in d.itertuples():
            g = types[(types["store"] == s.label) & (types["config_label"] == r.config_label)]
            v = g["default_verdict"].value_counts()
            pooled.append(f"{r.config_label} {f(r.speedup)}x {ci(r.speedup_lo, r.speedup_hi)} over "
                          f"{i(r.n_aligned)} prompts, wins on {v.get('win', 0)} of {len(g)} types and loses on "
                          f"{v.get('loss', 0)}")
    if pooled:
        lines.append("The default policy (draft model, cost policy), fixed before the run: " + "; ".join(pooled) + ".")
    head = headline_rows(types)
    if len(head):
        v = head["verdict"].value_counts()
        top, low = head.iloc[0], head.iloc[-1]
        lines.append(f"At the best configuration and K per type (chosen after the fact) speculation wins on "
                     f"{v.get('win', 0)} of {len(head)} types and loses on {v.get('loss', 0)}; highest "
                     f"{top['prompt_type']} {f(top['speedup'])}x {ci(top['speedup_lo'], top['speedup_hi'])} "
                     f"({top['best']}), lowest {low['prompt_type']} {f(low['speedup'])}x "
                     f"{ci(low['speedup_lo'], low['speedup_hi'])} ({low['best']}).")
    if len(fast):
        per = fastest_per_type(fast)
        counts = per["fastest"].value_counts()
        lines.append("Fastest way to generate per type (tokens/s; configurations timed at different times): "
                     + "; ".join(f"{name} on {n} of {len(per)}" for name, n in counts.items()) + ".")
    floors = _floors(sources)
    if floors:
        lines.append("A/A noise floors (target-only timed as a method): " + "; ".join(
            f"{lab} [{lo:.3f}, {hi:.3f}]" for lo, hi, lab in floors) + "; a speedup inside them is noise.")
    ex = [r for s in sources for r in exactness(s.analysis[T.EQUALITY]).itertuples()]
    if ex:
        lines.append("Greedy speculative runs token-identical to their configuration's target-only output: " + "; ".join(
            f"{r.config_label} {r.n_equal} of {r.n_checked} ({pct(r.n_equal / r.n_checked)})" for r in ex
            if r.n_checked) + ".")
    return lines[:5]


def default_pivot(types: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the per-type summary of `types` (`type_table`): one row per prompt type (the
    headline's order), one column per (configuration, store) with the default policy's ``"1.45x [1.17, 1.78]
    win (5)"``, and the best timed cell over every configuration."""
    head = headline_rows(types)
    keys = sorted({(r.config_label, r.store) for r in types.itertuples()})
    rows = []
    for h in head.itertuples():
        row = [h.prompt_type]
        for label, store in keys:
            d = types[(types["prompt_type"] == h.prompt_type) & (types["config_label"] == label)
                      & (types["store"] == store)]
            if d.empty or not np.isfinite(float(d["default_speedup"].iloc[0])):
                row.append("-")
                continue
            d = d.iloc[0]
            verdict = str(d["default_verdict"]).replace(" (no interval)", "")
            row.append(f"{f(d['default_speedup'])}x {ci(d['default_lo'], d['default_hi'])} {verdict} "
                       f"({i(d['default_n'])})".replace(" - ", " "))
        row.append(f"{h.best}: {f(h.speedup)}x {ci(h.speedup_lo, h.speedup_hi)}")
        rows.append(row)
    return ["prompt type", *[f"{label} ({store})" for label, store in keys], "best timed cell"], rows


def _k(x: float, pred: float) -> str:
    return "-" if not np.isfinite(x) else f"K={int(x)}: {f(pred)}"


def study_sections(sources: Sequence[StudySource], types: pd.DataFrame, figure: FigureEntry,
                   reports: Sequence[str] = ()) -> list[Section]:
    """The study report's sections: how to read it, the headline (`figure`, five-line verdict), per prompt
    type (`types`: `type_table` of `sources`), the fastest way to generate, how long it took, the per-store
    reports (`reports`: their paths, as text) and the definitions."""
    from specdec.report.sections import HOW_TO_READ

    cells = pd.concat([s.analysis[T.CELLS].assign(store=s.label) for s in sources if len(s.analysis[T.CELLS])],
                      ignore_index=True) if any(len(s.analysis[T.CELLS]) for s in sources) else pd.DataFrame()
    fast = fastest_table(cells)
    how = Section("How to read this", "how")
    how.blocks.append(Bullets([
        (f"This report puts {len(sources)} results stores side by side ({', '.join(s.label for s in sources)}). "
         "Each store is its own sweep, analysed on its own: every speedup below is paired inside one store on "
         "one machine; nothing divides runs of two stores."), *HOW_TO_READ_FIRST[:4]]))
    head = Section("Headline", "headline")
    if not figure.skipped:
        head.blocks.append(figure)
    head.blocks.append(Bullets(_verdict_lines(sources, types, fast)))

    per = Section("Per prompt type", "types")
    per.blocks.append(Table(*default_pivot(types), caption=(
        "The default policy (draft model, cost policy) per prompt type and configuration: paired speedup, 95 % "
        "interval over the type's prompts, verdict, and (n) the prompts it ran on; then the best timed cell over "
        "every configuration (after the fact). Types in the headline's order.")))
    per.blocks.append(Table(
        ["prompt type", "store", "config", "prompts", "default policy", "verdict", "alpha-hat",
         "tokens per target forward", "best timed cell", "draft model: best K, predicted",
         "prompt lookup: best K, predicted"],
        [[r.prompt_type, r.store, r.config_label, i(r.n_prompts),
          f"{f(r.default_speedup)}x {ci(r.default_lo, r.default_hi)}" if np.isfinite(float(r.default_speedup)) else "-",
          r.default_verdict or "-", f(r.alpha_hat), f(r.block_efficiency),
          f"{r.best}: {f(r.speedup)}x {ci(r.speedup_lo, r.speedup_hi)} ({r.verdict})",
          _k(r.draft_best_k, r.draft_predicted), _k(r.ngram_best_k, r.ngram_predicted)]
         for r in types.sort_values(["prompt_type", "store", "config_label"]).itertuples()],
        collapsed=True, caption=("Per prompt type and configuration: the default policy's paired speedup with its 95 % interval "
                 "over the type's prompts, its alpha-hat and tokens per target forward, the best timed cell "
                 "(among those on the most prompts of the type), and the fixed K per drafter with the highest "
                 "decode speedup predicted from the acceptance traces (every K in 1..16 replayed, priced with "
                 "the prompt's calibration block; geometric mean over the type's prompts).")))

    fastest = Section("The fastest way to generate", "fastest")
    fastest.blocks.append(Table(
        *fastest_rows(fast),
        caption=("Tokens/s end to end (median per cell; target-only, in parentheses target-only padded to its "
                 "cheapest step shape, then the fastest speculative cell with its paired speedup). "
                 "Configurations were timed in different sweeps, hours or days apart: only the speedups are "
                 "paired; read tokens/s across columns as single observations.")))

    took = Section("How long it took", "duration")
    dur = duration_table(sources)
    took.blocks.append(Table(
        ["store", "sweep", "configs", "runs (failed)", "machines", "generation", "wall (sittings)", "first run",
         "last run"],
        [[r.store, r.sweep_id, r.configs, f"{r.runs} ({r.failed})", str(r.machines), _hours(r.generation_s),
          f"{_hours(r.wall_s)} ({r.sittings})", r.first, r.last] for r in dur.itertuples()],
        caption=("generation: the runs' end-to-end seconds summed; wall: the runs' clock, a gap of over "
                 f"{int(SITTING_GAP_S / 60)} minutes starting a new sitting (model loading, traces and calibration "
                 "between runs included).")))
    if len(dur):
        took.blocks.append(f"In all: {int(dur['runs'].sum())} timed generations, {_hours(dur['generation_s'].sum())} "
                           f"of generation, {_hours(dur['wall_s'].sum())} of wall time in "
                           f"{int(dur['sittings'].sum())} sittings.")
    sections = [how, head, per, fastest, took]
    if reports:
        more = Section("Per-store reports", "reports")
        more.blocks.append("Every table behind these figures, per store (acceptance traces, the K grid, "
                           "predicted vs measured, per-run tables, machines and the raw sweep configuration):")
        more.blocks.append(Bullets(list(reports)))
        sections.append(more)
    definitions = Section("Appendix: definitions", "definitions")
    definitions.blocks.append(Bullets(HOW_TO_READ))
    sections.append(definitions)
    return sections


@dataclass
class StudyResult:
    """What `write_study` wrote: the paths, the figure and the per-type table."""

    html: Path
    markdown: Path
    figure: FigureEntry
    types: pd.DataFrame


def write_study(dbs: Sequence[str | Path], out: str | Path, reports: Sequence[str] = (),
                title: str = "Speculative decoding study") -> StudyResult:
    """Analyse the stores `dbs` and write ``out/report.html`` (self-contained), ``out/report.md`` and
    ``out/figures/study_headline.{png,svg}``.

    Args:
        dbs: results stores (SQLite, `specdec/bench/store.py`); each one's newest sweep is read.
        out: output directory (created if needed; existing files overwritten).
        reports: paths of the per-store reports, listed (as text) in the section "Per-store reports".
        title: the page title.

    Raises:
        FileNotFoundError: a store does not exist. ValueError: a path is not a results store, or two stores
        share a file name. OSError: `out` cannot be written.
    """
    from specdec.report.render import html_page, markdown_page

    sources = load_sources(dbs)
    out_dir = Path(out)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    types = type_table(sources)
    figure = study_figure(sources, types, fig_dir)
    sections = study_sections(sources, types, figure, reports)
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    html_path.write_text(html_page(title, sections), encoding="utf-8")
    md_path.write_text(markdown_page(title, sections), encoding="utf-8")
    return StudyResult(html_path, md_path, figure, types)
