"""What specdec's Python decoding loop costs per round, read from a store's timed runs.

A run's decode time (``decode_s``: end to end minus prefill) splits into the model forwards and the rest:
the target's forwards (``rounds.forward_s``), the draft model's steps (``rounds.draft_s`` of a drafter that
needs a model: its forwards dominate it) and everything else - the loop in Python: drafting by a model-free
drafter (prompt lookup, the suffix drafter), verification, rollback, sampling and the bookkeeping between
rounds. This prints, per configuration, method and K (or policy), the loop's milliseconds per round and its
share of decode time, each a mean over prompts (per prompt the median over its runs) with a 95% t-interval
(fewer than 5 prompts: labelled). A native loop (llama.cpp's own speculative decoding) runs the same
forwards without this share: the share bounds what a loop without Python could gain, 1 / (1 - share).

    python benchmarks/loop_cost.py --db results/suffix_llamacpp_all.db --db results/bf16_all.db
"""

from __future__ import annotations

import argparse
import math
import sqlite3

import pandas as pd
from scipy import stats as st

from specdec.catalogue.drafters import model_drafters

QUERY = """
SELECT u.run_id, u.config_label, u.prompt_id, u.method, u.policy, u.k, u.decode_s, u.num_rounds,
       SUM(r.forward_s) AS forward_s, SUM(r.draft_s) AS draft_s, COUNT(r.round_idx) AS rounds
FROM runs u JOIN rounds r ON r.run_id = u.run_id
WHERE u.error IS NULL AND u.decode_s > 0 AND (u.batch_id IS NULL OR u.batch_id = '')
GROUP BY u.run_id HAVING SUM(r.forward_s) IS NOT NULL
"""


def _interval(xs: pd.Series) -> str:
    """``mean [lo, hi] (n)`` of `xs` with a 95% t-interval; ``(n, fewer than 5)`` below 5 units."""
    n = len(xs)
    m = float(xs.mean())
    if n < 2:
        return f"{m:.3g} (1 unit)"
    half = float(st.t.ppf(0.975, n - 1)) * float(xs.std(ddof=1)) / math.sqrt(n)
    few = ", fewer than 5" if n < 5 else ""
    return f"{m:.3g} [{m - half:.3g}, {m + half:.3g}] ({n}{few})"


def _what(r) -> str:
    """`` K=4`` for a fixed K, `` cost`` for a policy, ``""`` for target-only."""
    if pd.notna(r.policy) and r.policy != "fixed":
        return f" {r.policy}"
    return f" K={int(r.k)}" if pd.notna(r.k) and r.k else ""


def loop_costs(db: str) -> pd.DataFrame:
    """Per timed run of `db`: loop seconds (decode minus forwards), per round and as a share of decode."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        cols = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
        query = QUERY if "batch_id" in cols else QUERY.replace(" AND (u.batch_id IS NULL OR u.batch_id = '')", "")
        df = pd.read_sql_query(query, con)
    finally:
        con.close()
    model = df["method"].isin(model_drafters())
    forwards = df["forward_s"] + df["draft_s"].fillna(0.0).where(model, 0.0)
    df["loop_s"] = (df["decode_s"] - forwards).clip(lower=0.0)
    df["loop_ms_per_round"] = 1000 * df["loop_s"] / df["rounds"]
    df["loop_share"] = df["loop_s"] / df["decode_s"]
    df["what"] = df["method"] + df.apply(_what, axis=1)
    return df


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", action="append", required=True, help="a results store (repeatable)")
    args = ap.parse_args()
    for db in args.db:
        df = loop_costs(db)
        print(f"\n{db}: {len(df)} runs with per-round forward times")
        print(f"{'configuration':22s} {'method':18s} {'loop ms per round':34s} {'% of decode time':34s}")
        for (label, what), g in df.groupby(["config_label", "what"], sort=True):
            per = g.groupby("prompt_id")[["loop_ms_per_round", "loop_share"]].median()
            print(f"{label:22s} {what:18s} {_interval(per['loop_ms_per_round']):34s} "
                  f"{_interval(100 * per['loop_share']):34s}")


if __name__ == "__main__":
    main()
