"""specdec beside llama.cpp's own speculative decoding, per prompt type: the fastest native configuration and
the fastest of ours, each against its own target-only, and the two against each other.

The native methods (`specdec.catalogue.peers.NATIVE_PEERS`) run llama.cpp's ``llama-server`` on the same GGUF
files, threads and prompts as our llama.cpp configuration, each run between two of our target-only runs. So
every run's ratio to its neighbours (`specdec.report.speedup.paired_reference`) cancels the machine's drift,
and two methods are compared per prompt through those ratios:

- a native speculative method against **native** target-only: its ratio over native target-only's ratio on
  the same prompt (both to our bracketing runs);
- one of our cells (a drafter under a policy or at a fixed K) against **our** target-only: its ratio;
- ours against native: our cell's ratio over the native method's ratio on the same prompt.

Per prompt the ratio is the geometric mean over its runs (repeats); a type's figure is the geometric mean over
its prompts with the t-interval (`specdec.core.stats.ratio_interval`; a verdict needs 5 prompts). The fastest
configuration of each side in a type is the one with the highest geometric-mean tokens/s over the type's
prompts, chosen after the fact among those measured (said so wherever it is shown).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import DRAFTERS
from specdec.catalogue.peers import NATIVE_PEERS, NATIVE_TARGET
from specdec.core import stats
from specdec.report.load import ensure_prepared
from specdec.report.predicted import positive_geomean
from specdec.report.speedup import PROMPT_KEY, paired_reference
from specdec.report.vocab import ALL_PROMPTS, BASELINE, FIXED_POLICIES

__all__ = ["native_table"]

#: The columns of `native_table`.
COLUMNS = [
    "config_label", "target", "prompt_type", "n_prompts", "target_tok_s", "native_target_tok_s",
    "native_target_ratio", "native_target_lo", "native_target_hi",
    "best_native", "native_tok_s", "native_ratio", "native_lo", "native_hi", "native_verdict",
    "best_ours", "ours_tok_s", "ours_ratio", "ours_lo", "ours_hi", "ours_verdict",
    "ours_vs_native", "vs_lo", "vs_hi", "vs_verdict",
]  # fmt: skip


def _cell_name(method: str, policy: str, k: float) -> str:
    """How a configuration is named in the table: ``suffix cost``, ``ngram K=8``, ``native_ngram_mod``."""
    if method in DRAFTERS:
        return f"{method} K={int(k)}" if policy in FIXED_POLICIES else f"{method} {policy}"
    return f"{method} K={int(k)}" if k else method


def _per_prompt(ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per prompt (rows: `PROMPT_KEY` + ``prompt_type``) and configuration (columns, `_cell_name`): the mean
    log of its runs' paired ratios to our target-only, and the median tokens/s."""
    ref, _ = paired_reference(ok)
    r = ok.assign(_ref=ok["run_id"].map(lambda i: ref.get(int(i), np.nan)))
    r = r[np.isfinite(r["_ref"]) & (r["_ref"] > 0) & (r["tokens_per_s"] > 0)]
    r = r.assign(_log=np.log(r["tokens_per_s"] / r["_ref"]),
                 _cell=[_cell_name(m, p, k) for m, p, k in zip(r["method"], r["policy"], r["k"], strict=True)])
    keys = [*PROMPT_KEY, "prompt_type"]
    logs = r.pivot_table(index=keys, columns="_cell", values="_log", aggfunc="mean")
    rates = r.pivot_table(index=keys, columns="_cell", values="tokens_per_s", aggfunc="median")
    return logs, rates


def _interval(logs: pd.Series) -> tuple[float, float, float, str]:
    ci = stats.ratio_interval(np.exp(logs.dropna().to_numpy(float)))
    return ci.center, ci.lo, ci.hi, ci.verdict


def _fastest(rates: pd.DataFrame, cells: list[str]) -> tuple[str | None, float]:
    """The cell of `cells` with the highest geometric-mean tokens/s over the prompts that ran it (None: none)."""
    geo = {c: positive_geomean(rates[c]) for c in cells if c in rates and rates[c].notna().any()}
    if not geo:
        return None, np.nan
    best = max(geo, key=geo.get)
    return best, geo[best]


def _row(logs: pd.DataFrame, rates: pd.DataFrame, key: dict) -> dict | None:
    """One row of `native_table` for the prompts of `logs` / `rates` (one type, or all)."""
    cells = list(logs.columns)
    native = [c for c in cells if c.split(" ")[0] in NATIVE_PEERS.values() and not c.startswith(NATIVE_TARGET)]
    ours = [c for c in cells if c.split(" ")[0] in DRAFTERS]
    if NATIVE_TARGET not in cells or not native:
        return None
    rec = dict.fromkeys(COLUMNS, np.nan) | key
    rec["n_prompts"] = int(logs[NATIVE_TARGET].notna().sum())
    rec["target_tok_s"] = positive_geomean(rates[BASELINE]) if BASELINE in rates else np.nan
    rec["native_target_tok_s"] = positive_geomean(rates[NATIVE_TARGET])
    rec["native_target_ratio"], rec["native_target_lo"], rec["native_target_hi"], _ = _interval(logs[NATIVE_TARGET])
    best_n, rec["native_tok_s"] = _fastest(rates, native)
    rec["best_native"] = best_n
    rec["native_ratio"], rec["native_lo"], rec["native_hi"], rec["native_verdict"] = _interval(
        logs[best_n] - logs[NATIVE_TARGET])
    best_o, rec["ours_tok_s"] = _fastest(rates, ours)
    if best_o is None:
        return rec
    rec["best_ours"] = best_o
    rec["ours_ratio"], rec["ours_lo"], rec["ours_hi"], rec["ours_verdict"] = _interval(logs[best_o])
    rec["ours_vs_native"], rec["vs_lo"], rec["vs_hi"], rec["vs_verdict"] = _interval(logs[best_o] - logs[best_n])
    return rec


def native_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration, target and prompt type (and pooled, ``prompt_type`` = ``"(all prompts)"``), where
    llama.cpp's native methods ran: the fastest native speculative method and the fastest of our speculative
    cells (by tokens/s, chosen after the fact among those measured), each with its paired ratio to its own
    target-only, and ours over native (module docstring).

    Columns (`COLUMNS`): tokens/s are geometric means over the type's prompts; ``native_target_ratio`` is
    native target-only over ours (with its interval); ``native_ratio`` / ``ours_ratio`` each side's best over
    its own target-only; ``ours_vs_native`` ours over native (> 1: ours faster); ``*_lo`` / ``*_hi`` the 95%
    interval over prompts and ``*_verdict`` its verdict ("too few units" below 5 prompts). Empty (with these
    columns) where no native method and native target-only ran.
    """
    df = ensure_prepared(runs)
    ok = df[df["ok"]] if len(df) else df
    if ok.empty or not ok["method"].isin([NATIVE_TARGET]).any():
        return pd.DataFrame(columns=COLUMNS)
    logs, rates = _per_prompt(ok)
    rows = []
    for (label, target), lg in logs.groupby(level=["config_label", "target"], sort=True):
        rt = rates.loc[lg.index]
        groups = [(t, lg.xs(t, level="prompt_type", drop_level=False)) for t in
                  sorted(set(lg.index.get_level_values("prompt_type")))] + [(ALL_PROMPTS, lg)]
        for ptype, g in groups:
            rec = _row(g.dropna(axis=1, how="all"), rt.loc[g.index].dropna(axis=1, how="all"),
                       {"config_label": label, "target": target, "prompt_type": ptype})
            if rec is not None:
                rows.append(rec)
    return pd.DataFrame(rows, columns=COLUMNS)
