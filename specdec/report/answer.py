"""The report's answer: per prompt type, does speculative decoding beat target-only decoding here, with which
drafter and K, by how much, and how far the figures can be trusted.

Every traced prompt is priced from its acceptance trace and calibration block (`specdec.report.predicted`):
the default policy's and every drafter's fixed-K decode speedup (prefill left out on both sides), predicted
per prompt. A type's figure is the geometric mean over its prompts with a 95 % t-interval (the unit is the
prompt, `specdec.core.stats.ratio_interval`); a drafter's K is the one with the highest geometric mean over
the type's prompts (chosen on those prompts, so mildly optimistic).

The sweep's timed runs check the predictions (`predicted_vs_measured`: predicted / measured, paired; the unit
is the prompt, its cells pooled first). Where that check has an interval (2 prompts or more), a type's
interval is widened by it (lo / r_hi, hi / r_lo for r = predicted / measured), so a verdict also survives the
model's own bias; a check over fewer than `MIN_UNITS` prompts is labelled rough but still widens (a model
checked on few prompts never gives stronger verdicts than one checked on many); without a check the verdict
rests on the predictions alone and says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import drafter, grid_drafters
from specdec.core import stats
from specdec.core.stats import MIN_UNITS
from specdec.report.load import default_policy_of, ensure_prepared, is_missing, run_rate
from specdec.report.predicted import PromptModel, trace_best_k
from specdec.report.speedup import paired_reference

__all__ = ["ANSWER_COLUMNS", "model_check", "predicted_vs_measured", "summary", "type_answer",
           "widened"]

ANSWER_COLUMNS = ["config_label", "prompt_type", "n_prompts", "default", "default_lo", "default_hi",
                  "default_verdict", "best_method", "best_k", "best", "best_lo", "best_hi", "best_verdict",
                  "drafters", "n_timed", "timed"]


def _timed_records(rounds: pd.DataFrame, run_id: int):
    from specdec.core.metrics import RoundRecord

    g = rounds[rounds["run_id"] == run_id].sort_values("round_idx")
    return [RoundRecord(k=int(x.k), num_accepted=int(x.num_accepted), accept_flags=(), next_kind=str(x.next_kind),
                        num_emitted=int(x.num_emitted), draft_s=_seconds(x, "draft_s"),
                        verify_s=_seconds(x, "verify_s"), other_s=_seconds(x, "other_s"))
            for x in g.itertuples(index=False)]


def _seconds(row, col: str) -> float:
    """A stored round's seconds in `col` (0.0 where the store has none: a round that carries no time)."""
    v = getattr(row, col, None)
    return 0.0 if is_missing(v) or not np.isfinite(float(v)) else float(v)


def predicted_vs_measured(runs: pd.DataFrame, rounds: pd.DataFrame, models: Sequence[PromptModel]
                          ) -> pd.DataFrame:
    """Per timed greedy run of a drafter of the predicted grid (`grid_drafters`: fixed K or a policy) on a traced
    prompt: the replay check, the predicted and the measured (paired) decode speedup. The replay of a policy
    run is fed that run's round seconds (`TraceModel.rounds`'s ``clock``): a ledger that weighs measured
    seconds decides as it did live; the predicted speedup prices those rounds on the curve.

    Columns: run_id, config_label, prompt_id, prompt_type, method, policy, k, replay_exact (the replayed
    rounds equal the timed rounds), mismatch (first differing round, text), predicted, measured, ratio
    (predicted / measured), n_adjacent (baselines adjacent in time to the run).
    """
    from specdec.engine.traces import compare_rounds

    cols = ["run_id", "config_label", "prompt_id", "prompt_type", "method", "policy", "k", "replay_exact",
            "mismatch", "predicted", "measured", "ratio", "n_adjacent"]
    df = ensure_prepared(runs)
    ok = df[df["ok"]].copy()
    if ok.empty or not models:
        return pd.DataFrame(columns=cols)
    ok["decode_tokens_per_s"] = run_rate(ok, "decode_tokens_per_s")
    ref, adj = paired_reference(ok, "decode_tokens_per_s")
    by_key = {(m.key[0], m.key[1], m.key[2]): m for m in models}
    rows = []
    for r in ok[ok["method"].isin(grid_drafters())].itertuples(index=False):
        if not is_missing(getattr(r, "temperature", 0.0)) and float(r.temperature or 0.0) > 0:
            continue
        mid = "" if is_missing(getattr(r, "machine_id", None)) else str(r.machine_id)
        m = by_key.get((r.config_label, r.prompt_id, mid))
        if m is None:
            continue
        timed = _timed_records(rounds, int(r.run_id))
        try:
            # the timed run's seconds fed to its policy's ledger as the live run's were: the replay checks it
            replayed = m.rounds(r.method, int(r.k), r.policy or "fixed", clock=timed)
        except ValueError:
            continue
        # a confidence stop past a rejected draft token is off the trace: the replayed K is an upper bound
        diff = compare_rounds(timed, replayed, k_upper_bound=r.policy == "confidence" and drafter(r.method).needs_model)
        meas = r.decode_tokens_per_s / ref[int(r.run_id)] if int(r.run_id) in ref else np.nan
        pred = m.speedup(r.method, replayed)
        rows.append({"run_id": int(r.run_id), "config_label": r.config_label, "prompt_id": r.prompt_id,
                     "prompt_type": r.prompt_type, "method": r.method, "policy": r.policy, "k": int(r.k),
                     "replay_exact": not diff, "mismatch": "" if not diff else json.dumps(diff[0]),
                     "predicted": pred, "measured": meas,
                     "ratio": pred / meas if meas and np.isfinite(meas) and meas > 0 else np.nan,
                     "n_adjacent": adj.get(int(r.run_id), 0)})
    return pd.DataFrame(rows, columns=cols)


def summary(pvm: pd.DataFrame) -> dict:
    """Headline figures of `predicted_vs_measured`: replay exact share, median predicted/measured, its
    spread, and the share of cells within 10 %."""
    if pvm.empty:
        return {"n": 0}
    r = pvm["ratio"].astype(float)
    r = r[np.isfinite(r)]
    return {"n": len(pvm), "n_exact": int(pvm["replay_exact"].sum()),
            "median_ratio": float(r.median()) if len(r) else np.nan,
            "within_10pct": float(((r - 1).abs() <= 0.10).mean()) if len(r) else np.nan,
            "interval": stats.ratio_interval(r.to_numpy()) if len(r) >= 2 else None}


def model_check(pvm: pd.DataFrame) -> pd.DataFrame:
    """The timed check of the predictions: predicted / measured per config_label and drafter, and pooled.

    Args:
        pvm: the `predicted_vs_measured` table (one row per timed cell of a traced prompt).

    Returns:
        Columns config_label, method (``"all"`` for the pooled row), n (prompts), ratio, lo, hi (geometric mean
        and 95 % t-interval of predicted / measured over prompts: `pooled_ratios`), n_runs (cells), n_exact
        (cells whose replayed rounds equal the timed ones).
    """
    out = pooled_ratios(pvm, lambda h: {"n_exact": int(h["replay_exact"].sum())})
    return out if len(out) else pd.DataFrame(columns=[*out.columns, "n_exact"])


def pooled_ratios(df: pd.DataFrame, extra=None) -> pd.DataFrame:
    """A check's ``ratio`` column (predicted / measured, one row per timed run) pooled per config_label and
    method and over all methods (``"all"``). The unit is the prompt: a prompt's runs share its trace and
    costs, so their errors are not independent; each prompt's runs are first pooled by geometric mean.

    Returns:
        Columns config_label, method, n (prompts), n_runs, ratio, lo, hi (geometric mean over the prompts and
        its 95 % t-interval, `specdec.core.stats.ratio_interval`), plus what ``extra(rows)`` adds (a dict of
        columns per group).
    """
    cols = ["config_label", "method", "n", "n_runs", "ratio", "lo", "hi"]
    if df is None or df.empty:
        return pd.DataFrame(columns=cols)
    ok = df[np.isfinite(df["ratio"].astype(float)) & (df["ratio"].astype(float) > 0)]
    rows = []
    for label, g in ok.groupby("config_label", sort=True):
        for method, h in [("all", g), *g.groupby("method", sort=True)]:
            per_prompt = np.exp(np.log(h["ratio"].astype(float)).groupby(h["prompt_id"]).mean())
            r = stats.ratio_interval(per_prompt.to_numpy())
            rows.append({"config_label": label, "method": method, "n": r.n, "n_runs": len(h), "ratio": r.center,
                         "lo": r.lo, "hi": r.hi, **(extra(h) if extra else {})})
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=cols)


def widened(ci: stats.RatioInterval, check: tuple[float, float] | None) -> tuple[float, float, str]:
    """`ci`'s interval widened by the model check's pooled interval ``(r_lo, r_hi)`` of predicted / measured
    (None: unchecked, kept as is), and the verdict on the widened interval (`MIN_UNITS` prompts at least)."""
    lo, hi = ci.lo, ci.hi
    if check is not None and np.isfinite(lo) and np.isfinite(hi):
        lo, hi = lo / check[1], hi / check[0]
    if ci.n < MIN_UNITS or not np.isfinite(lo):
        return lo, hi, "too few prompts"
    return lo, hi, "win" if lo > 1 else "loss" if hi < 1 else "no measurable difference"


def _best_fixed(best: pd.DataFrame, g: pd.DataFrame) -> tuple[str, int, pd.Series] | None:
    """The (drafter, K) with the highest geometric mean over prompts among `best` (`trace_best_k` of one type's
    grid rows `g`: each drafter at its best fixed K; the first drafter on a tie), with its per-prompt
    predictions (finite, positive); None without fixed-K rows."""
    if best.empty:
        return None
    b = best.loc[best["predicted"].idxmax()]
    v = g[(g["policy"] == "fixed") & (g["method"] == b["method"]) & (g["k"] == b["best_k"])]["predicted"]
    v = v.astype(float)
    return str(b["method"]), int(b["best_k"]), v[np.isfinite(v) & (v > 0)]


def _drafters_text(best: pd.DataFrame) -> str:
    """``"draft K=3 1.52x; ngram K=8 1.31x"``: each drafter at its best fixed K over the type's prompts
    (`trace_best_k`'s rows)."""
    return "; ".join(f"{r.method} K={int(r.best_k)} {r.predicted:.2f}x" for r in best.itertuples())


def _timed(pvm: pd.DataFrame, label: str, ptype: str) -> dict:
    """The type's timed cells (paired decode speedups of traced prompts), per drafter and K or policy:
    ``"draft cost 1.52x (predicted 1.49x, 1 run)"``; n_timed counts them."""
    t = pvm[(pvm["config_label"] == label) & (pvm["prompt_type"] == ptype)] if len(pvm) else pvm
    if not len(t):
        return {"n_timed": 0, "timed": ""}
    t = t[np.isfinite(t["measured"].astype(float)) & (t["measured"].astype(float) > 0)
          & np.isfinite(t["predicted"].astype(float)) & (t["predicted"].astype(float) > 0)]
    parts = []
    for (method, policy, k), h in t.groupby(["method", "policy", "k"], sort=True):
        what = f"{method} K={int(k)}" if policy in ("fixed", "-", None) else f"{method} {policy}"
        n = len(h)
        parts.append(f"{what} {stats.geometric_mean(h['measured']):.2f}x (predicted "
                     f"{stats.geometric_mean(h['predicted']):.2f}x, {n} run{'s' if n > 1 else ''})")
    return {"n_timed": len(t), "timed": "; ".join(parts)}


def type_answer(grid: pd.DataFrame, pvm: pd.DataFrame, default: tuple[str, str] | None = None) -> pd.DataFrame:
    """Per (config_label, prompt_type): the default policy's and the best drafter's predicted decode speedup
    over the type's traced prompts, each with its interval widened by the model check (`widened`) and verdict,
    every drafter at its best K, and the type's timed cells.

    Args:
        grid: the trace grid (`specdec.report.predicted.trace_grid`: one row per prompt, drafter, policy, K).
        pvm: `predicted_vs_measured` (the timed check).
        default: the default policy as (drafter, policy) (None: `specdec.report.load.default_policy_of` the
            grid).

    Returns:
        `ANSWER_COLUMNS`; ``n_timed`` counts the type's timed runs and ``timed`` lists them per drafter and K
        or policy, measured beside predicted. Empty without a grid.
    """
    if grid is None or grid.empty:
        return pd.DataFrame(columns=ANSWER_COLUMNS)
    checks = model_check(pvm)
    default = default or default_policy_of(grid)
    rows = []
    for (label, ptype), g in grid.groupby(["config_label", "prompt_type"], sort=True):
        pooled = checks[(checks["config_label"] == label) & (checks["method"] == "all")]
        check = ((float(pooled["lo"].iloc[0]), float(pooled["hi"].iloc[0]))
                 if len(pooled) and np.isfinite(float(pooled["lo"].iloc[0])) else None)
        rec: dict = {"config_label": label, "prompt_type": ptype, "n_prompts": int(g["prompt_id"].nunique())}
        d = g[(g["method"] == default[0]) & (g["policy"] == default[1])]["predicted"].astype(float)
        d = d[np.isfinite(d) & (d > 0)]
        ci = stats.ratio_interval(d)
        lo, hi, verdict = widened(ci, check)
        rec.update(default=ci.center, default_lo=lo, default_hi=hi, default_verdict=verdict if len(d) else "")
        per_drafter = trace_best_k(g)
        best = _best_fixed(per_drafter, g)
        if best is not None:
            ci = stats.ratio_interval(best[2])
            lo, hi, verdict = widened(ci, check)
            rec.update(best_method=best[0], best_k=best[1], best=ci.center, best_lo=lo, best_hi=hi,
                       best_verdict=verdict)
        rec["drafters"] = _drafters_text(per_drafter)
        rec.update(_timed(pvm, label, ptype))
        rows.append(rec)
    return pd.DataFrame(rows, columns=ANSWER_COLUMNS)
