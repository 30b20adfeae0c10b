"""The drafters side by side, per prompt type: the draft model, the cross-tokenizer draft (``xtok``), prompt
lookup (``ngram``) and the suffix drafters (``suffix``, and ``suffix_corpus`` whose corpus is the other
prompts' target-only outputs), and the paired ratio of two drafters on the same prompts.

A drafter's runs are taken as the sweep planned them: the runs planned under policy ``best`` (each prompt at
the fixed K its acceptance trace predicted fastest; stored as that fixed K, planned as ``best`` in the run's
``cell_key``) form one row, ``K = best``; runs planned at a fixed K form one row per K. A row's tokens per
target forward (block efficiency) and its speedup over target-only decoding, with its interval over the
type's prompts, come from the report's cell machinery (`specdec.report.cells.cell_table`: each run paired
with its neighbouring target-only runs).

The ratio of two drafters A/B (e.g. suffix vs prompt lookup) is paired twice: each run is divided by its own
neighbouring target-only runs, and per prompt A's geometric-mean ratio is divided by B's; the interval is
over the prompts both were measured on (`specdec.core.stats.ratio_interval`), so the machine's drift between the
two drafters' runs cancels as it does in each speedup.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec.catalogue import drafters as catalogue_drafters
from specdec.core import stats
from specdec.report.cells import cell_table
from specdec.report.load import ensure_prepared
from specdec.report.speedup import PROMPT_KEY, paired_reference
from specdec.report.vocab import ALL_PROMPTS, BASELINE

__all__ = ["DRAFTERS", "DRAFTER_RATIOS", "PLANNED_BEST", "drafter_ratio_table", "drafter_table", "round_sources",
           "with_planned_best"]

#: The drafters compared, in the table's order, with the words the report uses for them (the catalogue's).
DRAFTERS: dict[str, str] = {name: e.label for name, e in catalogue_drafters.DRAFTERS.items()}
#: The paired ratios the report prints: (numerator, denominator, label).
DRAFTER_RATIOS: tuple[tuple[str, str, str], ...] = (
    ("suffix", "ngram", "suffix vs prompt lookup"),
    ("suffix_corpus", "suffix", "suffix with corpus vs suffix"),
)
#: The ``policy`` a run planned under policy ``best`` carries in these tables (its ``k`` reads 0).
PLANNED_BEST = "best"


def with_planned_best(runs: pd.DataFrame) -> pd.DataFrame:
    """Prepared `runs` where a drafter's run planned under policy ``best`` (its ``cell_key``'s policy part)
    reads ``policy = "best"``, ``k = 0``: one cell per prompt type however many K its prompts' traces chose.
    Other runs are unchanged."""
    df = ensure_prepared(runs).copy()
    if df.empty or "cell_key" not in df.columns:
        return df
    planned = df["cell_key"].astype(str).str.split("|").str[5]
    best = (planned == PLANNED_BEST) & df["method"].isin(list(DRAFTERS))
    df["chosen_k"] = df["k"]
    df.loc[best, "policy"] = PLANNED_BEST
    df.loc[best, "k"] = 0
    return df


def drafter_table(runs: pd.DataFrame, rounds: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (config, prompt type, drafter, K-or-best), per prompt type and pooled over every type
    (``prompt_type`` = `ALL_PROMPTS`).

    Args:
        runs: the store's runs (raw or prepared); rounds: its rounds (block efficiency needs them).

    Returns:
        Columns ``config_label``, ``prompt_type``, ``method``, ``drafter`` (its words), ``k`` (``"best"`` or
        the fixed K), ``ks`` (the K the runs used, e.g. ``"2-6"``), ``n_prompts``, ``tokens_per_forward``
        (block efficiency: tokens committed per target forward, bonus included), ``acceptance_rate``,
        ``speedup``, ``speedup_lo``, ``speedup_hi``, ``verdict``, ``sources`` (a combining drafter's share of
        its rounds by the part that drafted them, `round_sources`; "" for a drafter of one kind); empty when no
        drafter ran. Only fixed-K runs and runs planned under policy best (adaptive policies have their own
        section).
    """
    cols = ["config_label", "prompt_type", "method", "drafter", "k", "ks", "n_prompts", "tokens_per_forward",
            "acceptance_rate", "speedup", "speedup_lo", "speedup_hi", "verdict", "sources"]
    df = with_planned_best(runs)
    if df.empty or not df["method"].isin(list(DRAFTERS)).any():
        return pd.DataFrame(columns=cols)
    keep = df[(df["method"] == BASELINE) | (df["method"].isin(list(DRAFTERS))
                                            & df["policy"].isin(["fixed", "-", PLANNED_BEST]))]
    parts = [cell_table(keep, rounds), cell_table(keep, rounds, pool_prompt_types=True)]
    cells = pd.concat([p for p in parts if len(p)], ignore_index=True)
    cells = cells[cells["method"].isin(list(DRAFTERS))]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    used = keep[keep["ok"]]
    rows = []
    for _, c in cells.iterrows():
        sel = (used["config_label"] == c["config_label"]) & (used["method"] == c["method"]) & (
            used["policy"] == c["policy"]) & (used["k"] == c["k"])
        if c["prompt_type"] != ALL_PROMPTS:
            sel &= used["prompt_type"] == c["prompt_type"]
        ks = sorted({int(k) for k in used.loc[sel, "chosen_k"]})
        rows.append({
            "config_label": c["config_label"], "prompt_type": c["prompt_type"], "method": c["method"],
            "drafter": DRAFTERS[c["method"]], "k": PLANNED_BEST if c["policy"] == PLANNED_BEST else str(int(c["k"])),
            "ks": "" if not ks else str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}",
            "n_prompts": int(c["n_prompts"]), "tokens_per_forward": c.get("block_efficiency", np.nan),
            "acceptance_rate": c.get("acceptance_rate", np.nan), "speedup": c["speedup"],
            "speedup_lo": c["speedup_lo"], "speedup_hi": c["speedup_hi"], "verdict": c["verdict"],
            "sources": round_sources(rounds, used.loc[sel, "run_id"]),
        })  # fmt: skip
    order = {m: i for i, m in enumerate(DRAFTERS)}
    out = pd.DataFrame(rows, columns=cols)
    out["_t"] = out["prompt_type"].eq(ALL_PROMPTS)
    out["_m"] = out["method"].map(order)
    out["_k"] = out["k"].map(lambda k: -1 if k == PLANNED_BEST else int(k))
    return out.sort_values(["config_label", "_t", "prompt_type", "_m", "_k"]).drop(columns=["_t", "_m", "_k"]
                                                                                    ).reset_index(drop=True)


def round_sources(rounds: pd.DataFrame | None, run_ids) -> str:
    """The rounds of `run_ids` by the part of a combining drafter that drafted them (``rounds.draft_source``:
    the mixed drafter's ``suffix``, ``model`` or ``none``), as shares of those rounds, e.g.
    ``"suffix 61%, model 30%, none 9%"`` (largest first); "" where no round carries a source (a drafter of
    one kind, or a store written before sources were recorded)."""
    if rounds is None or rounds.empty or "draft_source" not in rounds.columns:
        return ""
    src = rounds.loc[rounds["run_id"].isin(set(run_ids)), "draft_source"].dropna()
    if src.empty:
        return ""
    shares = src.value_counts(normalize=True)
    return ", ".join(f"{name} {share:.0%}" for name, share in shares.items())


def _per_prompt_ratios(df: pd.DataFrame, ref: dict[int, float]) -> pd.Series:
    """Per (`PROMPT_KEY`) unit: the geometric mean over its runs of tokens/s divided by the run's paired
    target-only reference."""
    r = df.assign(_ref=df["run_id"].map(lambda i: ref.get(int(i), np.nan)),
                  _val=pd.to_numeric(df["tokens_per_s"], errors="coerce"))
    r = r[np.isfinite(r["_ref"]) & np.isfinite(r["_val"]) & (r["_ref"] > 0) & (r["_val"] > 0)]
    if r.empty:
        return pd.Series(dtype=float)
    return np.exp(np.log(r["_val"] / r["_ref"]).groupby([r[k] for k in PROMPT_KEY]).mean())


def drafter_ratio_table(runs: pd.DataFrame, pairs: tuple[tuple[str, str, str], ...] = DRAFTER_RATIOS
                        ) -> pd.DataFrame:
    """Per (config, prompt type, and pooled over types) and per pair (A, B, label) of `pairs`: the paired
    ratio A/B (module docstring), for A and B both planned under policy best, or both at the same fixed K.

    Returns:
        Columns ``config_label``, ``prompt_type``, ``comparison`` (the label), ``k`` (``"best"`` or the K),
        ``n_prompts`` (prompts both ran on), ``ratio``, ``ratio_lo``, ``ratio_hi``, ``verdict`` (a ratio above
        1: A is faster); empty when no pair was measured on a common prompt.
    """
    cols = ["config_label", "prompt_type", "comparison", "k", "n_prompts", "ratio", "ratio_lo", "ratio_hi",
            "verdict"]
    df = with_planned_best(runs)
    if df.empty:
        return pd.DataFrame(columns=cols)
    ok = df[df["ok"]]
    ref, _ = paired_reference(ok)
    rows = []
    for a, b, label in pairs:
        both = ok[ok["method"].isin([a, b]) & ok["policy"].isin(["fixed", "-", PLANNED_BEST])]
        if both.empty:
            continue
        for (config, policy, k), g in both.groupby(["config_label", "policy", "k"], sort=True):
            types = sorted(g["prompt_type"].unique())
            for ptype in [*types, ALL_PROMPTS]:
                sub = g if ptype == ALL_PROMPTS else g[g["prompt_type"] == ptype]
                ra = _per_prompt_ratios(sub[sub["method"] == a], ref)
                rb = _per_prompt_ratios(sub[sub["method"] == b], ref)
                common = ra.index.intersection(rb.index)
                if not len(common):
                    continue
                ci = stats.ratio_interval((ra[common] / rb[common]).to_numpy(float))
                rows.append({"config_label": config, "prompt_type": ptype, "comparison": label,
                             "k": PLANNED_BEST if policy == PLANNED_BEST else str(int(k)),
                             "n_prompts": len(common), "ratio": ci.center, "ratio_lo": ci.lo, "ratio_hi": ci.hi,
                             "verdict": ci.verdict})
    return pd.DataFrame(rows, columns=cols)
