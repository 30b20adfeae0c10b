"""The analytical model against the measurement: measured costs, break-even alpha, predicted speedup
and predicted optimal K per fixed-K cell of our speculative methods.

Every prediction comes from :mod:`specdec.core.theory` (Leviathan et al. 2023, refined with the measured
verification cost curve v(n)); c is one draft step / one target step, v(n) one target forward over n
tokens / one single-token step. A **cell** is defined in :mod:`specdec.report.vocab`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import DRAFT_MODEL, PROMPT_LOOKUP, analytic_c
from specdec.core import theory
from specdec.core.costs import DRAFT_ROLE, TARGET_ROLE, CostCurve
from specdec.core.metrics import RATES
from specdec.report.cells import spec_fixed_cells

__all__ = [
    "CostInfo",
    "break_even_table",
    "cost_infos",
    "model_table",
    "optimal_k_table",
    "spec_ks_by_config",
    "speedup_condition_table",
]

_GROUP = ["config_label", "pair", "prompt_type", "method"]


@dataclass(frozen=True)
class CostInfo:
    """Measured costs of one config_label.

    Attributes:
        config_label: the runtime configuration.
        target_step_s: seconds of one warm target single-token step (None if not measured).
        draft_step_s: seconds of one warm draft single-token step (None if not measured).
        c: draft_step_s / target_step_s (None when either is missing).
        v: relative verification cost ``{n: t(n) / t(1)}`` (None without the target curve).
        target_s: the raw target curve ``{n: seconds}``.
    """

    config_label: str
    target_step_s: float | None
    draft_step_s: float | None
    c: float | None
    v: dict[int, float] | None
    target_s: dict[int, float]

    def c_for(self, method: str) -> float | None:
        """c used by the model for `method` (`specdec.catalogue.drafters.analytic_c`): the measured c for the
        draft model, 0 for prompt lookup (lookup is free in the model; its real cost lands in the
        efficiency), None otherwise."""
        return analytic_c(method, self.c)

    def v_at(self, n: int) -> float:
        """v(n) by :func:`specdec.core.theory.cost_at` (NaN without a curve)."""
        return theory.cost_at(self.v, n) if self.v else np.nan

    @property
    def max_n(self) -> int:
        """Largest n of the measured curve (0 without one)."""
        return max(self.v) if self.v else 0

    def break_even(self, k: int, c: float) -> tuple[float, str]:
        """``(break-even alpha, model)`` for K = `k` at draft cost `c`: the refined model with the
        measured v when there is one, else the ideal one (v(K+1) = 1)."""
        if self.v:
            return theory.break_even_alpha(k, c, self.v), "refined"
        return theory.break_even_alpha(k, c), "ideal"


def cost_infos(costs: pd.DataFrame) -> dict[str, CostInfo]:
    """`CostInfo` per config_label from ``costs`` rows (role 'draft'/'target', n_tokens, seconds).

    Non-finite or non-positive timings are ignored. ``v`` needs the target's n = 1 time.
    """
    out: dict[str, CostInfo] = {}
    if costs is None or costs.empty:
        return out
    df = costs.copy()
    df["n_tokens"] = pd.to_numeric(df["n_tokens"], errors="coerce")
    df["seconds"] = pd.to_numeric(df["seconds"], errors="coerce")
    df = df[np.isfinite(df["n_tokens"]) & np.isfinite(df["seconds"]) & (df["seconds"] > 0) & (df["n_tokens"] >= 1)]
    df["config_label"] = df["config_label"].where(df["config_label"].notna(), "(none)").astype(str)
    for label, g in df.groupby("config_label", sort=True):
        tgt = {int(r.n_tokens): float(r.seconds) for r in g[g["role"] == TARGET_ROLE].itertuples()}
        dr = {int(r.n_tokens): float(r.seconds) for r in g[g["role"] == DRAFT_ROLE].itertuples()}
        t1, d1 = tgt.get(1), dr.get(1)
        v = CostCurve(tgt).relative() if t1 else None
        c = d1 / t1 if (t1 and d1) else None
        out[label] = CostInfo(label, t1, d1, c, v, dict(sorted(tgt.items())))
    return out


def spec_ks_by_config(cells: pd.DataFrame) -> dict[str, list[int]]:
    """The K values of our speculative fixed-K cells, per config_label (sorted)."""
    fx = spec_fixed_cells(cells) if len(cells) else cells
    return {label: sorted(set(g["k"].astype(int))) for label, g in (fx.groupby("config_label") if len(fx) else [])}


def break_even_table(infos: dict[str, CostInfo], ks_by_config: dict[str, list[int]]) -> pd.DataFrame:
    """Minimum alpha at which each K breaks even, per config_label and method.

    For ``draft`` (measured c) and ``ngram`` (c = 0): ``break_even_ideal`` with v(K+1) = 1 and
    ``break_even_refined`` with the measured v (:func:`specdec.core.theory.break_even_alpha`); ``inf`` means no
    alpha breaks even. ``v_extrapolated`` is True when K+1 exceeds the largest measured n.
    """
    cols = ["config_label", "method", "k", "c", "v_k1", "break_even_ideal", "break_even_refined",
            "v_extrapolated"]
    rows = []
    for label, ks in sorted(ks_by_config.items()):
        info = infos.get(label)
        if info is None:
            continue
        for method in (DRAFT_MODEL, PROMPT_LOOKUP):  # the other c = 0 drafters break even where lookup does
            c = info.c_for(method)
            if c is None:
                continue
            for k in sorted(set(ks)):
                rows.append({
                    "config_label": label, "method": method, "k": k, "c": c,
                    "v_k1": info.v_at(k + 1),
                    "break_even_ideal": theory.break_even_alpha(k, c),
                    "break_even_refined": theory.break_even_alpha(k, c, info.v) if info.v else np.nan,
                    "v_extrapolated": bool(info.v) and k + 1 > info.max_n,
                })
    return pd.DataFrame(rows, columns=cols)


def _modelled(cells: pd.DataFrame, infos: dict[str, CostInfo]):
    """``(row, info, c)`` for each fixed-K cell of our methods with an alpha-hat and a modelled c."""
    for r in spec_fixed_cells(cells).itertuples():
        info = infos.get(r.config_label)
        if info is None or not np.isfinite(r.alpha_hat):
            continue
        c = info.c_for(r.method)
        if c is not None:
            yield r, info, c


def speedup_condition_table(cells: pd.DataFrame, infos: dict[str, CostInfo]) -> pd.DataFrame:
    """Per fixed-K cell of our methods: measured alpha-hat against the break-even alpha of its K.

    ``break_even`` is the refined one when v was measured, else the ideal one (``model`` says which);
    ``clears`` = alpha_hat > break_even; ``agrees`` = the model's side (clears or not) matches the
    measured verdict (a ``"no measurable difference"`` cell agrees with neither and gets NaN).
    """
    cols = ["config_label", "pair", "prompt_type", "method", "k", "alpha_hat", "break_even", "model",
            "clears", "speedup", "verdict", "agrees"]
    rows = []
    for r, info, c in _modelled(cells, infos):
        be, model = info.break_even(int(r.k), c)
        clears = bool(r.alpha_hat > be)
        agrees = np.nan
        if r.verdict in ("win", "loss"):
            agrees = clears == (r.verdict == "win")
        rows.append({"config_label": r.config_label, "pair": r.pair, "prompt_type": r.prompt_type,
                     "method": r.method, "k": int(r.k), "alpha_hat": r.alpha_hat, "break_even": be,
                     "model": model, "clears": clears, "speedup": r.speedup, "verdict": r.verdict,
                     "agrees": agrees})
    return pd.DataFrame(rows, columns=cols)


def model_table(cells: pd.DataFrame, infos: dict[str, CostInfo]) -> pd.DataFrame:
    """Predicted against measured speedup per fixed-K cell of our methods.

    Columns: the cell key; ``alpha_hat``; ``c``; ``v_k1`` = v(K+1); ``expected_tokens`` =
    (1 - a^(K+1)) / (1 - a) (model, bonus included) against the measured ``block_efficiency``;
    ``ideal`` = :func:`specdec.core.theory.ideal_speedup`; ``refined`` = :func:`specdec.core.theory.refined_speedup`
    (NaN without v); ``speedup`` (measured); ``efficiency`` = measured / refined (the runtime's
    efficiency; NaN without v).
    """
    cols = ["config_label", "pair", "prompt_type", "method", "k", "alpha_hat", "c", "v_k1",
            "expected_tokens", "block_efficiency", "ideal", "refined", "speedup", "speedup_lo", "speedup_hi",
            "efficiency"]
    rows = []
    for r, info, c in _modelled(cells, infos):
        k, a = int(r.k), float(r.alpha_hat)
        refined = theory.refined_speedup(a, k, c, info.v) if info.v else np.nan
        rows.append({
            "config_label": r.config_label, "pair": r.pair, "prompt_type": r.prompt_type, "method": r.method,
            "k": k, "alpha_hat": a, "c": c, "v_k1": info.v_at(k + 1),
            "expected_tokens": theory.expected_tokens_per_round(a, k),
            "block_efficiency": r.block_efficiency, "ideal": theory.ideal_speedup(a, k, c),
            "refined": refined, "speedup": r.speedup, "speedup_lo": r.speedup_lo, "speedup_hi": r.speedup_hi,
            "efficiency": r.speedup / refined if np.isfinite(refined) and refined > 0 else np.nan,
        })
    return pd.DataFrame(rows, columns=cols)


def optimal_k_table(cells: pd.DataFrame, infos: dict[str, CostInfo], best: pd.DataFrame) -> pd.DataFrame:
    """Predicted optimal K (:func:`specdec.core.theory.optimal_k` over the K values tried, with alpha pooled
    over them) against the measured best K, per (config_label, pair, prompt_type, method).

    Columns: key, ``alpha_pooled`` = sum accepted / (sum accepted + sum rejections) over the fixed-K
    cells, ``model`` ('refined' or 'ideal'), ``predicted_k``, ``predicted_speedup``, ``best_k``,
    ``speedup`` (measured at best_k), ``agree`` (predicted_k == best_k).
    """
    cols = [*_GROUP, "alpha_pooled", "model", "predicted_k", "predicted_speedup", "best_k", "speedup", "agree"]
    fx = spec_fixed_cells(cells)
    if fx.empty:
        return pd.DataFrame(columns=cols)
    best_idx = best.set_index(_GROUP) if len(best) else None
    rows = []
    for key, g in fx.groupby(_GROUP, sort=True):
        info = infos.get(key[0])
        c = info.c_for(key[3]) if info else None
        acc, rej = g["num_accepted"].sum(), g["num_rejections"].sum()
        if c is None or not (np.isfinite(acc) and np.isfinite(rej)) or acc + rej <= 0:
            continue
        alpha = RATES["alpha_hat"].of({"num_accepted": acc, "num_rejections": rej})
        ks = sorted(set(g["k"].astype(int)))
        pk, ps = theory.optimal_k(alpha, c, info.v if info.v else None, ks=ks)
        rec = {"config_label": key[0], "pair": key[1], "prompt_type": key[2], "method": key[3],
               "alpha_pooled": alpha, "model": "refined" if info.v else "ideal", "predicted_k": pk,
               "predicted_speedup": ps, "best_k": np.nan, "speedup": np.nan, "agree": np.nan}
        if best_idx is not None and key in best_idx.index:
            b = best_idx.loc[key]
            rec.update(best_k=int(b["best_k"]), speedup=b["speedup"], agree=int(b["best_k"]) == pk)
        rows.append(rec)
    return pd.DataFrame(rows, columns=cols)
