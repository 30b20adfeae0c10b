"""Comparisons beyond the baseline: ours against the peers, output equality, adaptive K policies
against the best fixed K, and the runtimes (config_labels) side by side.

Ratios use :func:`specdec.report.speedup.ratio_ci` (geometric mean over prompts of per-prompt tokens/s
ratios, t-interval on their logs, no verdict below 5 prompts); a **cell** and a **pooled row** are defined in :mod:`specdec.report.vocab`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import DRAFT_MODEL, PROMPT_LOOKUP
from specdec.catalogue.peers import PEER_PAIRS
from specdec.report.cells import best_fixed, fixed_k_cells
from specdec.report.load import ensure_prepared
from specdec.report.model import CostInfo
from specdec.report.speedup import paired_ratio_ci, paired_reference, per_prompt_median, ratio_ci
from specdec.report.vocab import (
    ADAPTIVE_POLICIES,
    ALL_PROMPTS,
    BASELINE,
    EACH_TYPE_BEST_K,
    FIXED_POLICIES,
    OUR_DRAFTERS,
)

__all__ = [
    "adaptive_table", "equality_table", "exactness", "peer_table", "runtime_by_type_table", "runtime_summary_table",
]


def _match(runs: pd.DataFrame) -> float:
    """Share of `runs` whose tokens equal our baseline's, over those where it was recorded (NaN: none)."""
    m = runs["matches_baseline"].dropna()
    return float(m.mean()) if len(m) else np.nan


def _peer_rows(ours_m: str, peer_m: str, ok: pd.DataFrame) -> list[dict]:
    """Rows of `peer_table` for one (ours, peer) method pair: same K, or, for a peer without K (``k`` 0),
    against each K of ours (target-only ours: K does not apply)."""
    peer = ok[ok["method"] == peer_m]
    ours = ok[(ok["method"] == ours_m) & ok["policy"].isin(FIXED_POLICIES)]
    rows = []
    for (label, target, k), pg in peer.groupby(["config_label", "target", "k"], sort=True):
        og = ours[(ours["config_label"] == label) & (ours["target"] == target)]
        if ours_m == BASELINE:
            cases = [(k, og)]
        elif k:
            cases = [(k, og[og["k"] == k])]
        else:
            cases = list(og.groupby("k", sort=True))
        for kk, ok_og in cases:
            if not ok_og.empty:
                names = (ours_m if ours_m == BASELINE else f"{ours_m} K={kk}", f"{peer_m} K={k}" if k else peer_m)
                rows.extend(_pair_rows(label, target, int(kk), names, ok_og, pg))
    return rows


def _pair_rows(label: str, target: str, k: int, names: tuple[str, str], og: pd.DataFrame,
               pg: pd.DataFrame) -> list[dict]:
    """`peer_table` rows of our runs `og` against the peer's runs `pg`: per shared prompt type, and pooled."""
    rows = []
    types = sorted(set(pg["prompt_type"]) & set(og["prompt_type"]))
    for ptype in [*types, ALL_PROMPTS]:
        o = og if ptype == ALL_PROMPTS else og[og["prompt_type"] == ptype]
        p = pg if ptype == ALL_PROMPTS else pg[pg["prompt_type"] == ptype]
        res = ratio_ci(o, per_prompt_median(p))
        if res["n_aligned"] == 0:
            continue
        rows.append({
            "config_label": label, "target": target, "prompt_type": ptype, "ours": names[0], "peer": names[1],
            "k": k, "ratio": res["speedup"], "ratio_lo": res["speedup_lo"], "ratio_hi": res["speedup_hi"],
            "verdict": res["verdict"], "n_prompts": res["n_aligned"],
            "ours_tok_s": float(o["tokens_per_s"].median()), "peer_tok_s": float(p["tokens_per_s"].median()),
            "ours_match": _match(o), "peer_match": _match(p),
        })  # fmt: skip
    return rows


def peer_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Our implementation against the peers measured in the same sweep.

    Pairs compared (ours vs peer, `specdec.catalogue.peers.PEER_PAIRS`): baseline vs hf_generate and
    native_target; draft-K vs hf_assisted-K and native_draft-K; ngram-K vs hf_prompt_lookup-K and
    llama_prompt_lookup-K (same config_label, target, K; ours with a fixed policy); a peer without K
    (llama.cpp's model-free drafters) against each K of ours. ``ratio`` = our tokens/s / the peer's tokens/s per prompt
    (medians over repeats), geometric mean over prompts with a t-interval (> 1: ours is faster). One row
    per prompt type and one pooled (``prompt_type`` = ``"(all prompts)"``). ``ours_match``/``peer_match``
    are the output-equality rates (matches_baseline) of the runs compared.
    """
    cols = ["config_label", "target", "prompt_type", "ours", "peer", "k", "ratio", "ratio_lo", "ratio_hi",
            "verdict", "n_prompts", "ours_tok_s", "peer_tok_s", "ours_match", "peer_match"]
    df = ensure_prepared(runs)
    ok = df[df["ok"]]
    rows = [row for ours_m, peer_m in PEER_PAIRS for row in _peer_rows(ours_m, peer_m, ok)]
    return pd.DataFrame(rows, columns=cols)


def equality_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Output-equality rate per (config_label, method, policy, k): share of runs whose tokens equal our
    baseline's on the same prompt (``matches_baseline`` = 1), over the runs where it was recorded."""
    cols = ["config_label", "method", "policy", "k", "n_checked", "n_equal", "equal_rate"]
    df = ensure_prepared(runs)
    ok = df[df["ok"] & df["matches_baseline"].notna() & (df["method"] != BASELINE)]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    g = ok.groupby(["config_label", "method", "policy", "k"], sort=True)["matches_baseline"]
    out = pd.DataFrame({"n_checked": g.size(), "n_equal": g.sum().astype(int), "equal_rate": g.mean()})
    return out.reset_index()[cols]


def exactness(equality: pd.DataFrame) -> pd.DataFrame:
    """The one count of exactness the report and the study (`study/`) quote:
    per configuration, the greedy runs of our speculative engine (``OUR_DRAFTERS``: every drafter, fixed K and
    policies) that finished and whose output was compared with the same configuration's
    target-only output (``matches_baseline`` recorded, only under greedy decoding), and how many equal it.

    Args:
        equality: `equality_table` of the runs (the report's ``equality`` table).

    Returns:
        Columns ``config_label``, ``n_checked``, ``n_equal``, ``n_diverged``; one row per configuration with
        checked runs (empty frame with those columns when none).
    """
    cols = ["config_label", "n_checked", "n_equal", "n_diverged"]
    eq = equality[equality["method"].isin(OUR_DRAFTERS)] if len(equality) else equality
    if eq.empty:
        return pd.DataFrame(columns=cols)
    g = eq.groupby("config_label", sort=True)[["n_checked", "n_equal"]].sum().astype(int).reset_index()
    return g.assign(n_diverged=g["n_checked"] - g["n_equal"])[cols]


def _adaptive_rec(r: Any, prompt_type: str) -> dict:
    """The adaptive cell `r`'s part of an `adaptive_table` row; the best-fixed columns empty."""
    return {"config_label": r.config_label, "pair": r.pair, "prompt_type": prompt_type,
            "method": r.method, "policy": r.policy, "k_cap": int(r.k), "mean_k": r.mean_k,
            "alpha_hat": r.alpha_hat, "speedup": r.speedup, "speedup_lo": r.speedup_lo,
            "speedup_hi": r.speedup_hi, "verdict": r.verdict, "best_fixed_k": np.nan,
            "best_fixed_speedup": np.nan, "vs_best_fixed": np.nan, "vs_best_lo": np.nan,
            "vs_best_hi": np.nan, "vs_best_verdict": ""}


def _vs_fixed(rec: dict, ad_runs: pd.DataFrame, fx_runs: pd.DataFrame) -> dict:
    """`rec` with the adaptive runs' tokens/s over the fixed-K runs' (per prompt and machine, `ratio_ci`)."""
    res = ratio_ci(ad_runs, per_prompt_median(fx_runs))
    rec.update(vs_best_fixed=res["speedup"], vs_best_lo=res["speedup_lo"], vs_best_hi=res["speedup_hi"],
               vs_best_verdict=res["verdict"])
    return rec


def _adaptive_row(r: Any, ok: pd.DataFrame, fixed: pd.DataFrame, pooled: bool) -> dict:
    """One row of `adaptive_table`: the adaptive cell `r` against the best fixed K among `fixed`."""
    sel = (ok["config_label"] == r.config_label) & (ok["pair"] == r.pair) & (ok["method"] == r.method)
    if not pooled:
        sel &= ok["prompt_type"] == r.prompt_type
    rec = _adaptive_rec(r, r.prompt_type)
    b = best_fixed(fixed[(fixed["config_label"] == r.config_label) & (fixed["pair"] == r.pair)
                         & (fixed["method"] == r.method) & (fixed["prompt_type"] == r.prompt_type)])
    if b is None:
        return rec
    rec.update(best_fixed_k=int(b["k"]), best_fixed_speedup=b["speedup"])
    ad_runs = ok[sel & (ok["policy"] == r.policy) & (ok["k"] == r.k)]
    return _vs_fixed(rec, ad_runs, ok[sel & ok["policy"].isin(FIXED_POLICIES) & (ok["k"] == b["k"])])


def _each_type_best_row(r: Any, ok: pd.DataFrame, fixed: pd.DataFrame) -> dict | None:
    """The pooled adaptive cell `r` against each prompt type's own best fixed K (`best_fixed` of the type's
    cells in `fixed`), pooled over every prompt that has both: per prompt, tokens/s over the tokens/s of
    its type's best K, so a sweep that timed each type's K from the traces (``--type-ks``) compares the
    policy with per-type tuning, not with one K for all types. ``best_fixed_speedup`` is those fixed-K runs'
    paired speedup over target-only, pooled the same way; ``best_fixed_k`` stays empty (one K per type).
    None when no prompt type has a fixed-K cell."""
    sel = (ok["config_label"] == r.config_label) & (ok["pair"] == r.pair) & (ok["method"] == r.method)
    fx = fixed[(fixed["config_label"] == r.config_label) & (fixed["pair"] == r.pair)
               & (fixed["method"] == r.method)]
    parts = []
    for ptype, g in fx.groupby("prompt_type"):
        if (b := best_fixed(g)) is not None:
            parts.append(ok[sel & (ok["prompt_type"] == ptype) & ok["policy"].isin(FIXED_POLICIES)
                            & (ok["k"] == b["k"])])
    if not parts:
        return None
    fx_runs = pd.concat(parts)
    rec = _adaptive_rec(r, EACH_TYPE_BEST_K)
    rec["best_fixed_speedup"] = paired_ratio_ci(fx_runs, paired_reference(ok)[0])["speedup"]
    return _vs_fixed(rec, ok[sel & (ok["policy"] == r.policy) & (ok["k"] == r.k)], fx_runs)


def adaptive_table(runs: pd.DataFrame, cells: pd.DataFrame, overall: pd.DataFrame | None = None) -> pd.DataFrame:
    """Adaptive K policies against the best fixed K (chosen after the fact) and the baseline.

    One row per (config_label, pair, prompt_type, method, policy) with an adaptive policy, plus pooled
    rows (prompt_type ``"(all prompts)"``, where the best fixed K is the single K best over all prompts)
    when `overall` (the pooled rows) is given, each followed by a row against each prompt type's own best
    fixed K (prompt_type `EACH_TYPE_BEST_K`, `_each_type_best_row`; ``best_fixed_k`` empty). Columns:
    ``k_cap`` (the cell's K), ``mean_k`` (drafted per speculative round), ``speedup`` (vs baseline, with CI and verdict), ``best_fixed_k``,
    ``best_fixed_speedup``, ``vs_best_fixed`` = adaptive tokens/s / best-fixed tokens/s per prompt (median,
    paired CI) with its verdict.
    """
    cols = ["config_label", "pair", "prompt_type", "method", "policy", "k_cap", "mean_k", "alpha_hat",
            "speedup", "speedup_lo", "speedup_hi", "verdict", "best_fixed_k", "best_fixed_speedup",
            "vs_best_fixed", "vs_best_lo", "vs_best_hi", "vs_best_verdict"]
    df = ensure_prepared(runs)
    ok = df[df["ok"]]
    rows = []
    per_type_fixed = fixed_k_cells(cells)
    for frame, pooled in ((cells, False), (overall, True)):
        if frame is None or frame.empty:
            continue
        fixed = fixed_k_cells(frame)
        for r in frame[frame["policy"].isin(ADAPTIVE_POLICIES)].itertuples():
            rows.append(_adaptive_row(r, ok, fixed, pooled))
            if pooled and (each := _each_type_best_row(r, ok, per_type_fixed)) is not None:
                rows.append(each)
    return pd.DataFrame(rows, columns=cols)


def _cost_columns(info: CostInfo | None) -> dict:
    out = {"target_step_ms": 1000 * info.target_step_s if info and info.target_step_s else np.nan,
           "draft_step_ms": 1000 * info.draft_step_s if info and info.draft_step_s else np.nan,
           "c": info.c if info and info.c is not None else np.nan}
    for n in (2, 5, 9, 17):
        out[f"v({n})"] = info.v[n] if info and info.v and n in info.v else np.nan
    return out


def runtime_summary_table(cells: pd.DataFrame, overall: pd.DataFrame, infos: dict[str, CostInfo],
                          model: pd.DataFrame) -> pd.DataFrame:
    """Runtimes (config_labels) side by side: one row per config_label.

    Columns: ``target_step_ms``, ``draft_step_ms``, ``c``, ``v(2)``, ``v(5)``, ``v(9)``, ``v(17)`` (where
    measured, NaN otherwise), ``baseline_tok_s`` (median over baseline cells), the best pooled draft-model
    K (prompt lookup's when the config has no draft-model row) with its speedup and verdict, and
    ``median_efficiency`` (median of measured/refined over its cells, from the ``model`` table).
    """
    labels = sorted(set(cells["config_label"]) | set(infos)) if len(cells) else sorted(infos)
    rows = []
    for label in labels:
        rec: dict[str, Any] = {"config_label": label, **_cost_columns(infos.get(label))}
        base = cells[(cells["config_label"] == label) & (cells["method"] == BASELINE)] if len(cells) else cells
        rec["baseline_tok_s"] = float(base["tok_s"].median()) if len(base) else np.nan
        ov = fixed_k_cells(overall[overall["config_label"] == label]) if len(overall) else overall
        ov = ov[ov["method"] == DRAFT_MODEL] if len(ov) and (ov["method"] == DRAFT_MODEL).any() else ov
        b = best_fixed(ov) if len(ov) else None
        if b is not None:
            rec.update(best_method=b["method"], best_k=int(b["k"]), best_speedup=b["speedup"],
                       best_verdict=b["verdict"])
        else:
            rec.update(best_method="", best_k=np.nan, best_speedup=np.nan, best_verdict="")
        m = model[model["config_label"] == label]["efficiency"].dropna() if len(model) else pd.Series(dtype=float)
        rec["median_efficiency"] = float(m.median()) if len(m) else np.nan
        rows.append(rec)
    return pd.DataFrame(rows)


def runtime_by_type_table(best: pd.DataFrame) -> pd.DataFrame:
    """Best K per prompt type and runtime, from the ``best_k`` table: one row per prompt type, one column
    per config_label, each ``"K=<best> <speedup>x (<verdict>)"`` for the draft-model method (prompt lookup
    when a config has no draft-model cells). Empty when there is nothing to show."""
    pick = []
    for label, g in (best.groupby("config_label") if len(best) else []):
        meth = next((m for m in (DRAFT_MODEL, PROMPT_LOOKUP) if (g["method"] == m).any()), None)
        if meth is None:
            continue
        for r in g[g["method"] == meth].itertuples():
            pick.append({"prompt_type": r.prompt_type, "config_label": f"{label} ({meth}, {r.pair})",
                         "value": f"K={r.best_k} {r.speedup:.2f}x ({r.verdict})"})
    if not pick:
        return pd.DataFrame()
    p = pd.DataFrame(pick).drop_duplicates(["prompt_type", "config_label"])
    by_type = p.pivot(index="prompt_type", columns="config_label", values="value").fillna("-").reset_index()
    by_type.columns.name = None
    return by_type
