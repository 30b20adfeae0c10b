"""The study report: several results stores read side by side.

    python -m study.report --db A --db B ... --out DIR [--report PATH ...] [--title T] [--peers-db C ...]
        [--arch-costs FILE]

One store holds one sweep, and the study's configurations are separate sweeps (bf16 and fp32 on every
built-in prompt, llama.cpp, the padded target-only decoder), so the question a reader brings - *per prompt
type, which configuration and K pay, by how much, and what is fastest* - needs them together. This module
analyses each store on its own (`specdec.report.analyze`: every speedup stays a ratio of runs paired in
time on one machine, inside its own store) and only then puts the results next to each other; no ratio
divides runs of two stores. What it adds:

* `study_analysis`: the stores' cell, pooled, equality and trace tables stacked, a configuration held by two
  stores renamed ``"<config> (<store>)"`` (`config_names`), so that the single-store headline functions
  (`headline_table`, `verdict_lines`, `aa_floor`, `padded_reference`) read every configuration at once.
* `type_table`: per prompt type and configuration the default policy's paired speedup with its interval,
  the best timed cell (`specdec.report.headline.headline_table`'s rule), alpha-hat, tokens per target
  forward, target-only tokens/s and the best fixed K per drafter predicted from the traces.
* `headline_rows`: per prompt type the best of those cells over every configuration (chosen after the fact:
  optimistic), drawn by `study_figure` with every configuration's default policy and the A/A noise floor.
* `fastest_table`: per prompt type and configuration target-only and the speculative cell of the highest
  paired speedup in tokens/s (timed in different sweeps, so only the speedups are paired), and the fastest
  overall.
* `duration_table`: how long each store took (generation seconds, and wall time from the runs' clock).
* `study_peers`: ours against transformers' own decoders (`specdec.report.comparisons.peer_table`) over every
  store that timed them, pooled per configuration and settings: each prompt's ratio stays inside its store,
  and the geometric mean runs over the prompts of all of them. Stores given as ``--peers-db`` enter only
  this section and the duration table (their one-prompt-per-type cells stay out of the per-type tables).
* ``--arch-costs FILE`` (a ``specdec costs --arch ... --out FILE`` measurement) adds the section "The
  original pairs" (`study.original`): the original GPT-2 study's pairs predicted from costs measured here.

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
from specdec.report.cells import best_cell
from specdec.report.comparisons import peer_table
from specdec.report.document import Bullets, Section, Table, ci, f, i
from specdec.report.figure_kit import (
    FigureEntry,
    colour_cycle,
    fit_texts_right,
    new_figure,
    save_figure,
    tex_safe,
)
from specdec.report.headline import (
    HOW_TO_READ_FIRST,
    aa_floor,
    cell_label,
    cell_what,
    headline_table,
    padded_reference,
    verdict_lines,
)
from specdec.report.load import load_store, prepare_runs
from specdec.report.sections_compare import peer_tables
from specdec.report.vocab import ALL_PROMPTS, BASELINE, PEER_METHODS, SPEC_METHODS

__all__ = [
    "StudyResult",
    "StudySource",
    "combined",
    "config_names",
    "default_pivot",
    "duration_table",
    "fastest_line",
    "fastest_per_type",
    "fastest_rows",
    "fastest_table",
    "headline_rows",
    "load_sources",
    "store_labels",
    "study_analysis",
    "study_figure",
    "study_gaps",
    "study_peers",
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


def store_labels(dbs: Sequence[str | Path]) -> list[str]:
    """The label of each store: its file stem, or ``"<folder>/<stem>"`` where two stores share a stem.

    Raises:
        ValueError: two paths still share a label (the same store given twice, say), naming them.
    """
    stems = [Path(db).stem for db in dbs]
    labels = [f"{Path(db).parent.name}/{st}" if stems.count(st) > 1 else st for db, st in zip(dbs, stems, strict=True)]
    twice = sorted({lab for lab in labels if labels.count(lab) > 1})
    if twice:
        raise ValueError(f"two stores share the label {twice[0]!r} ({', '.join(str(d) for d, lab in zip(dbs, labels, strict=True) if lab == twice[0])}); "
                         "give each store once, from folders or files of different names")
    return labels


def load_sources(dbs: Sequence[str | Path]) -> list[StudySource]:
    """Analyse every store of `dbs` (the newest sweep of each), after checking every path first.

    Raises:
        FileNotFoundError: a store does not exist. ValueError: no store, a path is not a results store, a
            store holds no runs, or two stores would carry the same label (`store_labels`).
    """
    if not dbs:
        raise ValueError("the study needs at least one store (--db)")
    labels = store_labels(dbs)
    for db in dbs:
        if not Path(db).is_file():
            raise FileNotFoundError(f"results store not found: {db}")
    sources = []
    for label, db in zip(labels, dbs, strict=True):
        a = analyze(load_store(db))
        if a.store.runs.empty:
            raise ValueError(f"{db}: no runs in its newest sweep ({'; '.join(a.missing) or 'empty store'}); "
                             "nothing to put beside the other stores")
        sources.append(StudySource(label, a))
    return sources


def config_names(sources: Sequence[StudySource]) -> dict[tuple[str, str], str]:
    """(store, config_label) -> the configuration's name in the study: the label itself, or
    ``"<label> (<store>)"`` where two stores hold the same configuration (timed in different sweeps, they are
    two columns, never one). Names are unique: if a plain label collides with a qualified one, every
    configuration is qualified by its store."""
    stores: dict[str, list[str]] = {}
    for s in sources:
        for label in sorted(set(s.analysis.store.runs["config_label"].dropna().astype(str))):
            stores.setdefault(label, []).append(s.label)
    names = {(st, label): f"{label} ({st})" if len(held) > 1 else label
             for label, held in stores.items() for st in held}
    if len(set(names.values())) < len(names):
        names = {(st, label): f"{label} ({st})" for st, label in names}
    return names


def combined(sources: Sequence[StudySource], table: T.ReportTable) -> pd.DataFrame:
    """`table` of every store stacked, with a ``store`` column and ``config_label`` renamed by `config_names`
    (so that one name means one store's configuration in every table)."""
    names = config_names(sources)
    frames = []
    for s in sources:
        d = s.analysis[table]
        if d.empty:
            continue
        d = d.assign(store=s.label)
        if "config_label" in d.columns:
            d["config_label"] = [names.get((s.label, str(c)), c) for c in d["config_label"]]
        frames.append(d)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def study_analysis(sources: Sequence[StudySource]) -> Analysis:
    """The stores' cell, pooled, equality and trace best-K tables stacked (`combined`) as one `Analysis`, so
    that the single-store headline functions (`headline_table`, `verdict_lines`, `aa_floor`,
    `padded_reference`) read every configuration at once. Each row was computed inside its own store; its
    ``store`` attribute is the first store's (provenance lives in the sources, not here)."""
    tables = {t.name: combined(sources, t) for t in (T.CELLS, T.OVERALL, T.EQUALITY, T.TRACE_BEST_K)}
    return Analysis(sources[0].analysis.store, tables, {}, [])


_TYPE_COLUMNS = ["store", "config_label", "prompt_type", "n_prompts", "default_speedup", "default_lo", "default_hi",
                 "default_verdict", "default_n", "alpha_hat", "block_efficiency", "best", "speedup", "speedup_lo",
                 "speedup_hi", "verdict", "n_aligned", "baseline_tok_s", "draft_best_k", "draft_predicted",
                 "ngram_best_k", "ngram_predicted"]


def type_table(a: Analysis) -> pd.DataFrame:
    """Per prompt type and configuration: the default policy, the best timed cell and the traces' best K.

    Args:
        a: `study_analysis` of the sources (or one store's `Analysis`).

    Returns:
        One row per (store, config_label, prompt_type) with speculative cells, columns `_TYPE_COLUMNS`:
        ``default_*`` the default policy's cell (draft model, cost policy; NaN where not run), ``alpha_hat``
        and ``block_efficiency`` (tokens per target forward, bonus token included) of that cell, ``best`` /
        ``speedup`` / ``speedup_lo`` / ``speedup_hi`` / ``verdict`` / ``n_aligned`` the best timed cell among
        those measured on the most prompts of the type (`headline_table`), ``baseline_tok_s`` the
        target-only cell's tokens/s, and ``<drafter>_best_k`` / ``<drafter>_predicted`` the fixed K with the
        highest decode speedup predicted from the acceptance traces (NaN without traces).
    """
    cells, best_k = a[T.CELLS], a[T.TRACE_BEST_K]
    if cells.empty:
        return pd.DataFrame(columns=_TYPE_COLUMNS)
    if "store" not in cells.columns:
        cells = cells.assign(store="")
    cells = cells[cells["prompt_type"] != ALL_PROMPTS]
    default = a.default_policy
    rows = []
    for (store, label), c in cells.groupby(["store", "config_label"], sort=True):
        for _, h in headline_table(c, default).iterrows():
            ptype = h["prompt_type"]
            mine = c[c["prompt_type"] == ptype]
            d = mine[(mine["method"] == default[0]) & (mine["policy"] == default[1])]
            b = mine[mine["method"] == BASELINE]
            rec = {"store": store, "config_label": label, "prompt_type": ptype,
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


def headline_rows(a: Analysis) -> pd.DataFrame:
    """Per prompt type the best timed cell over every configuration of `a` (`study_analysis`):
    `headline_table` of the stacked cells (among the cells on the most prompts of the type, ties to the
    smaller K), with ``best`` = its `cell_label`. Sorted by speedup, highest first."""
    head = headline_table(a[T.CELLS], a.default_policy)
    return head.assign(best=[cell_label(r) for _, r in head.iterrows()]) if len(head) else head.assign(best=[])


def study_figure(a: Analysis, types: pd.DataFrame, out: Path) -> FigureEntry:
    """The study's headline figure (``study_headline``): per prompt type, the best cell over every
    configuration (bar from 1 with its 95 % interval; green win, red loss, grey neither) and each
    configuration's default policy (a marker with its interval), the widest pooled A/A interval shaded and
    the largest padded target-only speedup dashed. Skipped without speculative cells.

    Args:
        a: `study_analysis` of the sources. types: `type_table` of `a`. out: the figures directory.
    """
    head = headline_rows(a)
    if head.empty:
        return FigureEntry("study_headline", "headline", "Headline", "", skipped="no speculative cell")
    head = head.iloc[::-1].reset_index(drop=True)
    configs = sorted({r.config_label for r in types.itertuples() if np.isfinite(float(r.default_speedup))})
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
    for j, (label, colour) in enumerate(zip(configs, colour_cycle(len(configs)), strict=True)):
        d = types[types["config_label"] == label].set_index("prompt_type").reindex(head["prompt_type"])
        v, vlo, vhi = (d[c].astype(float).to_numpy() for c in ("default_speedup", "default_lo", "default_hi"))
        yy = y - 0.3 + step * (j + 0.5)
        ok = np.isfinite(v)
        okh = ok & np.isfinite(vlo) & np.isfinite(vhi)
        ax.errorbar(v[okh], yy[okh], xerr=np.vstack([v[okh] - vlo[okh], vhi[okh] - v[okh]]), fmt="none",
                    ecolor=colour, capsize=2, lw=0.8)
        ax.plot(v[ok], yy[ok], "D", mfc="white", mec=colour, ms=5, ls="none",
                label=tex_safe(f"default policy, {label}"))
        xs += [v[ok], vlo[okh], vhi[okh]]
    padded = padded_reference(a)
    if padded is not None:
        ax.axvline(padded[0], color="#6a1b9a", lw=1.1, ls="--",
                   label=tex_safe(f"target-only padded ({padded[3]}): {padded[0]:.2f}x"))
        xs.append([padded[0]])
    floor = aa_floor(a)
    if floor is not None:
        ax.axvspan(floor[0], floor[1], color="#ffb300", alpha=0.3, label=tex_safe(f"A/A noise floor (widest: {floor[2]})"))
        xs.append([floor[0], floor[1]])
    ax.axvline(1.0, color="black", lw=1)
    every = np.concatenate([np.asarray(x, dtype=float) for x in xs])
    left, right = float(np.nanmin(every)), float(np.nanmax(every))
    labels = []
    for yi, r in zip(y, head.itertuples()):
        top = r.speedup_hi if np.isfinite(float(r.speedup_hi)) else r.speedup
        labels.append(ax.text(float(top) + 0.03, yi + 0.18, tex_safe(f"{float(r.speedup):.2f}x {r.best}"),
                              fontsize=7))
    ax.set_yticks(y, [tex_safe(p) for p in head["prompt_type"]])
    ax.set_xlabel("speedup over target-only decoding on the same configuration (paired; 1 = parity)")
    ax.set_title("Per prompt type: the best configuration and K, and every configuration's default policy",
                 fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=2, fontsize=7)
    fit_texts_right(ax, labels, left - 0.05, right + 0.05)  # the bar labels end inside the axes, no wider
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
    paired speedup among the cells on the most prompts of the type (a cell timed on one prompt is not set
    beside a median over five), with its median tokens/s. The speedup, not the tokens/s, picks it: a store
    resumed on another machine holds cells whose runs were timed at different machine speeds.

    Args:
        cells: report cell tables (`specdec.report.tables.CELLS`), several stores concatenated; with a
            ``store`` column, a configuration found in two stores gets one ``config`` per store,
            ``"<config> (<store>)"``.

    Returns:
        Columns ``prompt_type``, ``config``, ``target_only``, ``padded``, ``best_spec`` (``"draft K=2"``,
        ``"ngram cost"``; ``"-"`` without one), ``spec_tok_s``, ``speedup`` (tokens/s; NaN where absent),
        ``n_prompts`` (prompts of the speculative cell). Tokens/s of different configurations were timed at
        different times: only ``speedup`` is paired.
    """
    cols = ["prompt_type", "config", "target_only", "padded", "best_spec", "spec_tok_s", "speedup", "n_prompts"]
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
        best = best_cell(s)
        pad = cells[(cells["method"] == "baseline_padded") & (cells["config_label"] == label)
                    & (cells["prompt_type"] == ptype)]
        rows.append({"prompt_type": ptype, "config": label, "target_only": float(b["tok_s"].iloc[0]),
                     "padded": float(pad["tok_s"].iloc[0]) if len(pad) else np.nan,
                     "best_spec": "-" if best is None else cell_what(best),
                     "spec_tok_s": np.nan if best is None else float(best["tok_s"]),
                     "speedup": np.nan if best is None else float(best["speedup"]),
                     "n_prompts": 0 if best is None else int(best["n_aligned"])})
    return pd.DataFrame(rows, columns=cols)


def fastest_per_type(fast: pd.DataFrame) -> pd.DataFrame:
    """Per prompt type of `fast` (`fastest_table`): the fastest way to generate over every configuration and
    decoder (target-only, padded target-only, the best speculative cell): ``prompt_type``, ``fastest``,
    ``tok_s``, ``speculative`` (whether it speculates). Types with no finite tokens/s are left out."""
    rows = []
    for ptype, g in fast.groupby("prompt_type", sort=True):
        cand = [(float(val), name, spec) for r in g.itertuples()
                for val, name, spec in ((r.target_only, f"{r.config} target-only", False),
                                        (r.padded, f"{r.config} target-only padded", False),
                                        (r.spec_tok_s, f"{r.config} {r.best_spec}", True)) if np.isfinite(val)]
        if cand:
            val, name, spec = max(cand, key=lambda t: t[0])
            rows.append({"prompt_type": ptype, "fastest": name, "tok_s": val, "speculative": spec})
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
            spec = (f"{f(r.spec_tok_s, 1)} ({r.best_spec}, {f(r.speedup)}x)" if np.isfinite(r.spec_tok_s)
                    else "no speculative run")
            parts.append(f"{f(r.target_only, 1)}{pad} / {spec}")
        top = f"{best.loc[ptype, 'fastest']} ({f(best.loc[ptype, 'tok_s'], 1)} tok/s)" if ptype in best.index else "-"
        rows.append([ptype, *parts, top])
    return ["prompt type", *[f"{c}: target-only / best speculative (x paired)" for c in configs], "fastest"], rows


def _sittings(finished: pd.Series, total_s: pd.Series) -> tuple[float, int]:
    """Wall seconds and number of sittings of runs finished at `finished` (parsed times) lasting `total_s`: a
    run starts a new sitting after a gap over `SITTING_GAP_S`; each sitting counts from its first run's start."""
    order = finished.sort_values().index
    t, d = finished[order], total_s[order].astype(float).fillna(0.0)
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
    return (wall if n else float("nan")), n


def _target_precision(config_label: str, stored_dtype: str) -> str:
    """What the target of the configuration `config_label` ran in, given the ``runs.dtype`` a store holds.

    Stores record the target's precision per run (`specdec.bench.config.RuntimeConfig.target_precision`:
    ``"bfloat16"``, ``"float32+int8"``, ``"gguf"``), but older ones record the sweep's ``--dtype`` for every
    configuration, so the configuration's own rule is applied to the stored value's dtype (the part before
    ``+``: a recorded ``"float32+int8"`` stays itself, an older store's ``"float32"`` for an int8
    configuration becomes ``"float32+int8"``). A label the package does not know keeps the stored value."""
    from specdec.bench.config import RUNTIME_CONFIGS

    rc = RUNTIME_CONFIGS.get(config_label)
    return rc.target_precision(stored_dtype.split("+", 1)[0]) if rc is not None else stored_dtype


def _settings(runs: pd.DataFrame) -> str:
    """``"bfloat16, 64 new tokens, greedy"``: the target precision (`_target_precision` of each configuration),
    token budgets and sampling of a store's runs."""

    def values(col: str) -> list:
        return sorted(set(runs[col].dropna())) if col in runs.columns else []

    pairs = runs[["config_label", "dtype"]].dropna().drop_duplicates().itertuples(index=False)
    precisions = sorted({_target_precision(str(c), str(d)) for c, d in pairs})
    tokens = "/".join(str(int(n)) for n in values("max_new_tokens")) or "?"
    temps = values("temperature")
    sampling = "greedy" if temps == [0.0] else ("temperature " + "/".join(f"{t:g}" for t in temps) if temps else "?")
    return f"{', '.join(precisions) or 'precision not recorded'}, {tokens} new tokens, {sampling}"


def duration_table(sources: Sequence[StudySource]) -> pd.DataFrame:
    """The stores and how long each took: ``store``, ``sweep_id``, ``configs``, ``settings`` (dtypes, token
    budget, sampling: `_settings`), ``machine`` (the machines that timed its runs), ``runs``, ``failed``,
    ``machines`` (distinct machine ids), ``generation_s`` (sum of the runs' end-to-end seconds), ``wall_s``
    and ``sittings`` (the runs' clock, gaps over `SITTING_GAP_S` starting a sitting; model loading, traces and
    calibration between runs included), ``first`` and ``last`` (when the first and the last run finished,
    ISO, UTC)."""
    from specdec.bench.machines import machine_label

    rows = []
    for s in sources:
        st = s.analysis.store
        r = st.runs
        done = pd.to_datetime(r["created_at"], utc=True, errors="coerce")
        wall, n = _sittings(done, r["total_s"])
        by_id = dict(zip(st.machines["machine_id"].astype(str), st.machines["machine_json"], strict=False))
        ids = sorted(set(r["machine_id"].dropna().astype(str)))
        machines = sorted({machine_label(by_id.get(m)) for m in ids if m in by_id}) or [
            machine_label((st.sweep or {}).get("machine_json"))]
        rows.append({"store": s.label, "sweep_id": st.sweep_id or "-",
                     "configs": ", ".join(sorted(set(r["config_label"].dropna().astype(str)))) or "-",
                     "settings": _settings(r), "machine": "; ".join(machines),
                     "runs": len(r), "failed": int(r["error"].notna().sum()), "machines": len(ids),
                     "generation_s": float(r["total_s"].astype(float).sum()),
                     "wall_s": wall, "sittings": n,
                     "first": done.min().isoformat() if done.notna().any() else "-",
                     "last": done.max().isoformat() if done.notna().any() else "-"})
    return pd.DataFrame(rows)


def study_peers(sources: Sequence[StudySource]) -> pd.DataFrame:
    """Ours against the library peers over every store of `sources` that timed one (`PEER_METHODS`).

    Each store's runs are keyed apart (``prompt_id`` becomes ``"<store>/<prompt_id>"``), so that every
    per-prompt ratio divides two runs of one store (and one machine: `ratio_ci` also matches machines), and
    ``config_label`` becomes ``"<config>, <settings>"`` (`_settings`: precision, token budget, sampling), so
    that only stores of one configuration and settings pool. Then `peer_table` of the stacked runs: per
    prompt type and pooled, the geometric mean of the per-prompt ratios with a t-interval.

    Returns:
        `peer_table`'s columns plus ``stores`` (the stores whose peer runs a row pools, comma-separated);
        empty when no store timed a peer.
    """
    frames, held = [], {}
    for src in sources:
        runs = src.analysis.store.runs
        if runs.empty or not runs["method"].isin(PEER_METHODS).any():
            continue
        r = prepare_runs(runs)
        names = {label: f"{label}, {_settings(r[r['config_label'] == label])}" for label in set(r["config_label"])}
        r["config_label"] = r["config_label"].map(names)
        r["prompt_id"] = src.label + "/" + r["prompt_id"]
        for name in set(r.loc[r["method"].isin(PEER_METHODS), "config_label"]):
            held.setdefault(name, []).append(src.label)
        frames.append(r)
    if not frames:
        return pd.DataFrame(columns=[*peer_table(pd.DataFrame()).columns, "stores"])
    peers = peer_table(pd.concat(frames, ignore_index=True))
    return peers.assign(stores=[", ".join(held.get(c, [])) for c in peers["config_label"]])


def study_gaps(sources: Sequence[StudySource]) -> list[str]:
    """``"<store>: <what it lacks>"`` for every note of every store's analysis (missing shards, no peers, ...)."""
    return [f"{src.label}: {note}" for src in sources for note in src.analysis.missing]


def _hours(seconds: float) -> str:
    from specdec.bench.estimate import format_duration

    return format_duration(seconds) if np.isfinite(seconds) else "-"


def fastest_line(fast: pd.DataFrame) -> str | None:
    """One sentence: which decoder is the fastest way to generate on how many prompt types (None when none)."""
    per = fastest_per_type(fast) if len(fast) else pd.DataFrame()
    if per.empty:
        return None
    counts = per["fastest"].value_counts()
    return ("The fastest way to generate per type (tokens/s; configurations timed in different sweeps, so not "
            "paired): " + "; ".join(f"{name} on {n} of {len(per)}" for name, n in counts.items()) + ".")


def default_pivot(types: pd.DataFrame, head: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the per-type summary: one row per prompt type of `head` (`headline_rows`, in its
    order), one column per configuration of `types` (`type_table`) with the default policy's ``"1.45x [1.17,
    1.78] win (5)"`` (speedup, interval, verdict, prompts), and the best timed cell over every configuration."""
    keys = sorted(set(types["config_label"]))
    rows = []
    for h in head.itertuples():
        row = [h.prompt_type]
        for label in keys:
            d = types[(types["prompt_type"] == h.prompt_type) & (types["config_label"] == label)]
            if d.empty or not np.isfinite(float(d["default_speedup"].iloc[0])):
                row.append("-")
                continue
            d = d.iloc[0]
            verdict = str(d["default_verdict"]).replace(" (no interval)", "")
            row.append(f"{f(d['default_speedup'])}x {ci(d['default_lo'], d['default_hi'])} {verdict} "
                       f"({i(d['default_n'])})".replace(" - ", " "))
        row.append(f"{h.best}: {f(h.speedup)}x {ci(h.speedup_lo, h.speedup_hi)}")
        rows.append(row)
    return ["prompt type", *keys, "best timed cell"], rows


def _k(x: float, pred: float) -> str:
    return "-" if not np.isfinite(x) else f"K={int(x)}: {f(pred)}"


def study_sections(sources: Sequence[StudySource], a: Analysis, types: pd.DataFrame, figure: FigureEntry,
                   reports: Sequence[str] = (), peer_sources: Sequence[StudySource] = (),
                   extra: Sequence[Section] = ()) -> list[Section]:
    """The study report's sections: how to read it, the headline (`figure`, the five-line verdict of
    `specdec.report.headline.verdict_lines` over every configuration, the fastest decoder), per prompt type
    (`types`: `type_table` of `a`, the `study_analysis` of `sources`), the fastest way to generate, ours
    against transformers' own decoders (`study_peers` of `sources` and `peer_sources`; left out when no store
    timed a peer), the `extra` sections (e.g. `study.original.original_pairs_section`), how long it took
    (every store), the per-store reports (`reports`: their paths, as text) and the definitions."""
    from specdec.report.sections import HOW_TO_READ

    every = [*sources, *peer_sources]
    fast = fastest_table(a[T.CELLS])
    how = Section("How to read this", "how")
    also = (f"; {', '.join(s.label for s in peer_sources)} only in 'Against transformers' own decoders'"
            if peer_sources else "")
    how.blocks.append(Bullets([
        (f"This report puts {len(every)} results store(s) side by side ({', '.join(s.label for s in sources)}"
         f"{also}). Each store is its own sweep, analysed on its own: every speedup below is paired inside one "
         "store on one machine; nothing divides runs of two stores. A configuration held by two stores is named "
         "'<configuration> (<store>)'."), *HOW_TO_READ_FIRST[:4]]))
    head = Section("Headline", "headline")
    if not figure.skipped:
        head.blocks.append(figure)
    head.blocks.append(Bullets(verdict_lines(a)))
    if (line := fastest_line(fast)) is not None:
        head.blocks.append(line)

    per = Section("Per prompt type", "types")
    per.blocks.append(Table(*default_pivot(types, headline_rows(a)), caption=(
        "The default policy (draft model, cost policy) per prompt type and configuration: paired speedup, 95 % "
        "interval over the type's prompts, verdict, and (n) the prompts it ran on; then the best timed cell over "
        "every configuration (after the fact). Types in the headline's order.")))
    per.blocks.append(Table(
        ["prompt type", "config", "prompts", "default policy", "verdict", "alpha-hat",
         "tokens per target forward", "best timed cell", "draft model: best K, predicted",
         "prompt lookup: best K, predicted"],
        [[r.prompt_type, r.config_label, i(r.n_prompts),
          f"{f(r.default_speedup)}x {ci(r.default_lo, r.default_hi)}" if np.isfinite(float(r.default_speedup)) else "-",
          r.default_verdict or "-", f(r.alpha_hat), f(r.block_efficiency),
          f"{r.best}: {f(r.speedup)}x {ci(r.speedup_lo, r.speedup_hi)} ({r.verdict})",
          _k(r.draft_best_k, r.draft_predicted), _k(r.ngram_best_k, r.ngram_predicted)]
         for r in types.sort_values(["prompt_type", "config_label"]).itertuples()],
        collapsed=True, caption=(
            "Per prompt type and configuration: the default policy's paired speedup with its 95 % interval over "
            "the type's prompts, its alpha-hat and tokens per target forward, the best timed cell (among those "
            "on the most prompts of the type), and the fixed K per drafter with the highest decode speedup "
            "predicted from the acceptance traces (every K in 1..16 replayed, priced with the prompt's "
            "calibration block; geometric mean over the type's prompts).")))

    fastest = Section("The fastest way to generate", "fastest")
    fastest.blocks.append(Table(*fastest_rows(fast), caption=(
        "Tokens/s end to end (median per cell; target-only, in parentheses target-only padded to its cheapest "
        "step shape, then the speculative cell of the highest paired speedup among those on the most prompts of "
        "the type, with that speedup). Configurations were timed in different sweeps, hours or days apart, some on other "
        "prompt sets (the per-type table gives the prompts): only the speedups are paired; read tokens/s "
        "across columns as single observations.")))

    sections = [how, head, per, fastest]
    peers = study_peers(every)
    if len(peers):
        vs = Section("Against transformers' own decoders", "peers")
        vs.blocks.append(
            "Our decoders against transformers' on the same configuration, in the same store, prompt by prompt "
            "(target-only against generate(), the draft model against assisted generation, our prompt lookup "
            "against prompt_lookup_num_tokens at the same K): each ratio divides two runs of one store, and a "
            "pooled row is the geometric mean over the prompts of every store that timed the pair "
            f"({', '.join(sorted({st for row in peers['stores'] for st in row.split(', ')}))}), with its 95 % "
            "t-interval. "
            "A ratio within its interval of 1 is 'no measurable difference'.")
        vs.blocks.extend(peer_tables(peers))
        sections.append(vs)
    sections.extend(extra)

    took = Section("The stores and how long they took", "duration")
    dur = duration_table(every)
    took.blocks.append(Table(
        ["store", "sweep", "configs", "settings", "machine", "runs (failed)", "generation", "wall (sittings)",
         "first run finished", "last run finished"],
        [[r.store, r.sweep_id, r.configs, r.settings, r.machine, f"{r.runs} ({r.failed})", _hours(r.generation_s),
          f"{_hours(r.wall_s)} ({r.sittings})", r.first, r.last] for r in dur.itertuples()],
        caption=("generation: the runs' end-to-end seconds summed; wall: the runs' clock, a gap of over "
                 f"{int(SITTING_GAP_S / 60)} minutes starting a new sitting (model loading, traces and calibration "
                 "between runs included).")))
    if len(dur):
        took.blocks.append(f"In all: {int(dur['runs'].sum())} timed generations, {_hours(dur['generation_s'].sum())} "
                           f"of generation, {_hours(dur['wall_s'].sum())} of wall time in "
                           f"{int(dur['sittings'].sum())} sitting(s).")
    sections.append(took)
    lacks = study_gaps(every)
    if lacks:
        gaps = Section("What the stores lack", "gaps")
        gaps.blocks.append("Each store's own gaps, as its single-store report (`specdec report`) lists them:")
        gaps.blocks.append(Bullets(lacks))
        sections.append(gaps)
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
    """What `write_study` wrote: the paths, the figure, the per-type table and each store's gaps
    (``"<store>: <what it lacks>"``)."""

    html: Path
    markdown: Path
    figure: FigureEntry
    types: pd.DataFrame
    missing: list[str]


def write_study(dbs: Sequence[str | Path], out: str | Path, reports: Sequence[str] = (),
                title: str = "Speculative decoding study", peer_dbs: Sequence[str | Path] = (),
                arch_costs: str | Path | None = None) -> StudyResult:
    """Analyse the stores `dbs` and write ``out/report.html`` (self-contained), ``out/report.md`` and
    ``out/figures/study_headline.{png,svg}``.

    Args:
        dbs: results stores (SQLite, `specdec/bench/store.py`); each one's newest sweep is read.
        out: output directory (created if needed; existing files overwritten).
        reports: paths of the per-store reports, listed (as text) in the section "Per-store reports".
        title: the page title.
        peer_dbs: stores read only for the section "Against transformers' own decoders" (`study_peers`) and
            the duration table: comparisons with transformers' decoders on a few prompts per type, kept out
            of the per-type tables.
        arch_costs: a ``specdec costs --arch ... --out FILE`` measurement: adds the section "The original
            pairs" (`study.original.original_pairs_section`), read before anything is written.

    Raises:
        FileNotFoundError: a store or `arch_costs` does not exist. ValueError: no store in `dbs`, a path is not
            a results store, two stores share a file name, or `arch_costs` is not such a measurement (or its
            cost curve stops before K = 16). OSError: `out` cannot be written.
    """
    from specdec.report.render import html_page, markdown_page

    if not dbs:
        raise ValueError("the study needs at least one store (--db)")
    extra = []
    if arch_costs is not None:
        from study.original import load_arch_costs, original_pairs_section

        extra.append(original_pairs_section(load_arch_costs(arch_costs)))
    every = load_sources([*dbs, *peer_dbs])
    sources, peer_sources = every[:len(dbs)], every[len(dbs):]
    out_dir = Path(out)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    a = study_analysis(sources)
    types = type_table(a)
    figure = study_figure(a, types, fig_dir)
    sections = study_sections(sources, a, types, figure, reports, peer_sources, extra)
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    html_path.write_text(html_page(title, sections), encoding="utf-8")
    md_path.write_text(markdown_page(title, sections), encoding="utf-8")
    return StudyResult(html_path, md_path, figure, types, study_gaps(every))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m study.report``: write the study report (`write_study`) and print what it wrote.

    Returns the exit status: 0, or 2 after one ``study.report: error: ...`` line on stderr for a missing or
    unreadable store or costs file, an empty ``--out`` or an output directory that cannot be written (argparse
    itself exits 2 on a malformed command line). Nothing is written before every input has been read.
    """
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m study.report", description=(
        "The study report: several results stores side by side (headline per prompt type over every "
        "configuration, the fastest way to generate, ours against transformers' own decoders, how long each "
        "store took)."))
    ap.add_argument("--db", action="append", required=True, type=Path,
                    help="results store (repeatable): each one's newest sweep, analysed on its own, then side by side")
    ap.add_argument("--out", required=True, help="output directory: report.html, report.md, figures/")
    ap.add_argument("--report", action="append", default=[],
                    help="path of a per-store report to list in the study (repeatable)")
    ap.add_argument("--title", default="Speculative decoding study", help="page title")
    ap.add_argument("--peers-db", action="append", default=[], type=Path,
                    help="store read only for 'Against transformers' own decoders' and the duration table "
                    "(repeatable): its peer comparisons pool with the other stores', its cells stay out of the "
                    "per-type tables")
    ap.add_argument("--arch-costs", type=Path, default=None,
                    help="a `specdec costs --arch ... --out FILE` measurement: adds the section 'The original "
                    "pairs' (predicted from measured costs)")
    args = ap.parse_args(argv)
    try:
        if not args.out.strip():
            raise ValueError("--out is empty: name an output directory (e.g. --out results/study)")
        from specdec.paths import check_output

        out = check_output(args.out, inputs=[*args.db, *args.peers_db], directory=True)
        result = write_study(args.db, Path(out), args.report, title=args.title, peer_dbs=args.peers_db,
                             arch_costs=args.arch_costs)
    except (ValueError, OSError) as exc:  # FileNotFoundError is an OSError
        print(f"study.report: error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(args.db) + len(args.peers_db)} stores, {len(result.types)} (store, configuration, prompt type) rows"
          + (f"; headline figure skipped: {result.figure.skipped}" if result.figure.skipped else ""))
    for line in result.missing:
        print(f"  missing: {line}")
    print(f"wrote {result.html}")
    print(f"wrote {result.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
