"""A store's batched runs in one shape, whoever wrote them: the first step of the report's batch section.

Two writers: ``specdec sweep --batch-sizes`` stores a batched run of B prompts as B rows of ``runs``
(``batch_size`` > 1, ``batch_id``, ``row``; the batch's wall time and aggregate tokens/s on every row), and
the former batch harness stored one ``batch_runs`` row per batched run (its published stores). Both are
converted here on load, so every later step has one path: one row per batched run with

``sweep_id, config_label, group_name, batch_size, batch`` (the batch within its group and B), ``order`` (its
place among its batch's runs, from 0: the harness's ``seq``, else the rank of its first row's ``run_id``), ``method,
policy, k`` (policy ``fixed`` for the K the batch pricing chose, ``cost`` for the batch cost policy),
``tokens_per_s`` (aggregate), ``total_s, prefill_s, new_tokens, num_accepted, row_rounds`` (the rows' rounds),
``predicted_speedup``, ``rows_mismatch_batched, rows_mismatch_single`` (rows differing from the batched /
single-sequence target-only rows) and ``error``.

A sweep with batched runs also contributes its single-sequence runs as B = 1 (each prompt a batch of one, in
the group its type has in the sweep's batches): target-only, the A/A run, and the cells planned under the
policies a batch runs (``best`` as ``fixed``, ``cost``). Reads the store only (read-only).
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pandas as pd

from specdec.bench import store

__all__ = ["SHAPE", "load_batch_runs"]

#: The columns of a batched run in the one shape.
SHAPE = ["sweep_id", "config_label", "group_name", "batch_size", "batch", "order", "method", "policy", "k",
         "tokens_per_s", "total_s", "prefill_s", "new_tokens", "num_accepted", "row_rounds", "predicted_speedup",
         "rows_mismatch_batched", "rows_mismatch_single", "error"]
#: The planned policy of a run (its ``cell_key``'s) as the batch section names it.
_POLICY = {"best": "fixed", "cost": "cost", "-": None}


def load_batch_runs(db: str | Path, sweep_id: str | None = None) -> tuple[pd.DataFrame, str]:
    """The batched runs the batch section reports, in the one shape (see the module), and what they are.

    Args:
        db: the store. sweep_id: the sweep the report reports; its batched runs (in ``runs``) when it has
            any, else the newest batch sweep of the former harness's tables.

    Returns:
        ``(frame, source)``: source says whose runs they are (``"sweep ID"`` / ``"batch sweep ID"``); an empty
        frame (and ``""``) when the store holds none.

    Raises:
        ValueError: the store cannot be read.
    """
    con = store.connect(Path(db), readonly=True, timeout_s=5.0)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        cols = {r[1] for r in con.execute("PRAGMA table_info(runs)")} if "runs" in tables else set()
        if sweep_id is not None and "batch_size" in cols:
            runs = pd.read_sql_query("SELECT * FROM runs WHERE sweep_id = ? ORDER BY run_id", con, params=(sweep_id,))
            if (pd.to_numeric(runs["batch_size"], errors="coerce") > 1).any():
                return from_runs(runs), f"sweep {sweep_id}"
        if "batch_runs" in tables:
            old = pd.read_sql_query("SELECT * FROM batch_runs ORDER BY run_id", con)
            if len(old):
                ids = list(dict.fromkeys(old["sweep_id"].astype(str)))
                newest = str(old.iloc[-1]["sweep_id"])
                left = [i for i in ids if i != newest]
                others = f" (the newest run's; left out: {', '.join(left)})" if left else ""
                return from_batch_table(old), f"batch sweep {newest}{others}"
        return pd.DataFrame(columns=SHAPE), ""
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{db}: cannot read its batched runs ({exc})") from None
    finally:
        con.close()


def from_batch_table(old: pd.DataFrame) -> pd.DataFrame:
    """``batch_runs`` rows (the former harness) in the one shape; a store of several batch sweeps keeps the
    newest run's."""
    newest = str(old.iloc[-1]["sweep_id"])
    old = old[old["sweep_id"].astype(str) == newest]
    return old.rename(columns={"batch_idx": "batch", "seq": "order"})[SHAPE].reset_index(drop=True)


def _mismatches(flags: pd.Series) -> float:
    """Rows whose flag is 0 (NaN when no row was checked)."""
    f = pd.to_numeric(flags, errors="coerce").dropna()
    return float((f == 0).sum()) if len(f) else math.nan


def from_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """One sweep's ``runs`` rows in the one shape: each batched run's rows as one run, and the single-sequence
    runs as B = 1 (see the module)."""
    runs = runs.assign(batch_size=pd.to_numeric(runs["batch_size"], errors="coerce").fillna(1).astype(int),
                       planned=runs["cell_key"].astype(str).str.split("|").str[5].map(_POLICY))
    batched = runs[runs["batch_size"] > 1]
    run_of = batched["cell_key"].astype(str).str.split("|").str[3:7].str.join("|")  # method|k|policy|repeat
    out = []
    for (label, batch_id, _), g in batched.groupby(["config_label", "batch_id", run_of], sort=False):
        first = g.iloc[0]
        out.append({"sweep_id": first["sweep_id"], "config_label": label, "group_name": store.batch_group(batch_id),
                    "batch_size": int(first["batch_size"]), "batch": batch_id, "order": int(g["run_id"].min()),
                    "method": first["method"], "policy": first["planned"], "k": first["k"],
                    "tokens_per_s": first["batch_tokens_per_s"], "total_s": first["batch_total_s"],
                    "prefill_s": first["prefill_s"], "new_tokens": g["new_tokens"].sum(min_count=1),
                    "num_accepted": g["num_accepted"].sum(min_count=1), "row_rounds": g["num_rounds"].sum(min_count=1),
                    "predicted_speedup": first["predicted_speedup"],
                    "rows_mismatch_batched": _mismatches(g["matches_baseline"]),
                    "rows_mismatch_single": _mismatches(g["matches_single"]),
                    "error": next(iter(g["error"].dropna()), None)})  # fmt: skip
    shaped = pd.DataFrame(out, columns=SHAPE)
    group_of = {t: store.batch_group(b) for t, b in zip(batched["prompt_type"], batched["batch_id"], strict=True)}
    names = set(zip(shaped["method"], shaped["policy"], strict=True))
    single = runs[(runs["batch_size"] == 1) & runs["prompt_type"].isin(group_of)]
    single = single.assign(order=single.groupby(["config_label", "prompt_id"])["run_id"].rank(method="first") - 1)
    kept = [(m, p) in names for m, p in zip(single["method"], single["planned"], strict=True)]
    single = single[pd.Series(kept, index=single.index, dtype=bool)]
    ones = pd.DataFrame({
        "sweep_id": single["sweep_id"], "config_label": single["config_label"],
        "group_name": single["prompt_type"].map(group_of), "batch_size": 1, "batch": single["prompt_id"],
        "order": single["order"].astype(int), "method": single["method"], "policy": single["planned"],
        "k": single["k"], "tokens_per_s": single["tokens_per_s"], "total_s": single["total_s"],
        "prefill_s": single["prefill_s"], "new_tokens": single["new_tokens"], "num_accepted": single["num_accepted"],
        "row_rounds": single["num_rounds"], "predicted_speedup": math.nan,
        "rows_mismatch_batched": (pd.to_numeric(single["matches_baseline"], errors="coerce") == 0).astype(float)
        .where(single["matches_baseline"].notna()),
        "rows_mismatch_single": (pd.to_numeric(single["matches_baseline"], errors="coerce") == 0).astype(float)
        .where(single["matches_baseline"].notna()), "error": single["error"]})  # fmt: skip
    shaped["order"] = shaped.groupby(["config_label", "batch"])["order"].rank(method="first").astype(int) - 1
    return pd.concat([ones, shaped], ignore_index=True)[SHAPE] if len(ones) else shaped
