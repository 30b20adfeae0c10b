"""Tables of the report, derived from the raw counts and timings of the results store.

Reads the store with plain ``sqlite3`` + ``pandas.read_sql_query`` (schema: ``specdec/bench/store.py``,
schema_version 1) and never writes to it. Every rate is derived here from raw counts summed over runs
(definitions in :mod:`specdec.metrics`); every prediction comes from :mod:`specdec.theory`.

Conventions used by every table:

* A **cell** is one ``(config_label, pair, prompt_type, method, policy, k)``; it holds all repeats of all
  prompts of that type. ``policy`` is ``"-"`` and ``k`` is 0 where the store has NULL (baseline, peers
  without K). ``pair`` falls back to the target name where the store has none (prompt lookup).
* **speedup** (dimensionless) = a method's end-to-end tokens/s / our target-only ``baseline`` tokens/s on
  the same ``config_label``, target and prompt. The baseline side of each run is the prompt's baseline
  run nearest it in time (`_nearest_baseline`: the baseline runs bracket a prompt's other runs, and a
  resumed sweep can leave them hours apart). Per prompt, each side is the median over its repeats; the
  cell's speedup is the median over prompts of those per-prompt ratios, with a 95 % percentile-bootstrap
  CI resampling prompts (:func:`specdec.theory.bootstrap_ratio_ci`, ``paired=True``). With a single
  aligned prompt the repeats are resampled instead (per-run ratio to that prompt's baseline median);
  with a single run there is no interval (CI NaN, verdict :data:`SINGLE_RUN`) -- the default CPU plan
  (one prompt per type, one repeat) gives that per prompt type, and its intervals come from the pooled
  rows (``"(all prompts)"``), whose unit is the prompt.
* **verdict**: :func:`specdec.theory.verdict` of that CI: ``"win"`` (CI above 1), ``"loss"`` (CI below
  1), ``"no measurable difference"``.
* Runs whose ``error`` is set are failed cells: excluded from every figure and listed in the gaps.
* Missing data never raises: a table that cannot be computed is empty and a sentence saying what is
  missing goes to :attr:`Analysis.missing`.

Units: tokens/s, seconds (``*_s``), milliseconds (``*_ms``); shares are fractions of ``total_s``.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specdec import theory

__all__ = [
    "ALL_PROMPTS",
    "SINGLE_RUN",
    "Analysis",
    "CostInfo",
    "StoreData",
    "adaptive_table",
    "analyze",
    "baseline_stability_table",
    "best_k_table",
    "break_even_table",
    "cell_table",
    "cost_infos",
    "drift_cells",
    "drift_runs",
    "equality_table",
    "gaps_table",
    "load_store",
    "model_table",
    "optimal_k_table",
    "peer_table",
    "position_acceptance",
    "prepare_runs",
    "runtime_table",
    "speedup_condition_table",
]

#: Label of the rows that pool every prompt type.
ALL_PROMPTS = "(all prompts)"
#: Verdict of a cell holding a single run of a single prompt: a point estimate without an interval.
SINGLE_RUN = "single run (no interval)"

SWEEP_COLUMNS = ["sweep_id", "name", "config_json", "created_at", "git_commit", "machine_json", "status"]
RUN_COLUMNS = [
    "run_id", "sweep_id", "cell_key", "config_label", "pair", "target", "draft", "target_backend",
    "draft_backend", "compiled", "device", "dtype", "threads", "prompt_id", "prompt_type", "chat_template",
    "prompt_tokens", "method", "policy", "k", "repeat", "seed", "temperature", "top_k", "top_p",
    "max_new_tokens", "new_tokens", "finish_reason", "token_ids", "matches_baseline", "num_rounds",
    "num_drafted", "num_accepted", "num_rejections", "prefill_s", "ttft_s", "decode_s", "total_s",
    "draft_s", "verify_s", "tokens_per_s", "error", "created_at",
]
ROUND_COLUMNS = [
    "run_id", "round_idx", "k", "k_requested", "num_accepted", "accept_flags", "next_kind", "num_emitted",
    "draft_s", "verify_s", "other_s", "alpha_estimate",
]
COST_COLUMNS = ["sweep_id", "config_label", "role", "n_tokens", "seconds", "repeats", "spread_s"]

#: Our speculative methods (the analytical model applies to them).
SPEC_METHODS = ("draft", "ngram")
#: Peer implementations measured in the same run.
PEER_METHODS = ("hf_generate", "hf_assisted", "hf_prompt_lookup", "llama_prompt_lookup")
#: Policies that choose K per round.
ADAPTIVE_POLICIES = ("heuristic", "confidence", "cost")
#: Which of our methods each peer is compared with (ours, peer); K must match except for hf_generate.
PEER_PAIRS = (
    ("baseline", "hf_generate"),
    ("draft", "hf_assisted"),
    ("ngram", "hf_prompt_lookup"),
    ("ngram", "llama_prompt_lookup"),
)

CELL_KEY = ["config_label", "pair", "prompt_type", "method", "policy", "k"]


# --------------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------------


@dataclass
class StoreData:
    """The rows of one sweep, read from a results store.

    Attributes:
        db_path: the store file.
        sweep_id: the selected sweep (None when the store holds none).
        sweep: the selected ``sweeps`` row as a dict (None when the sweep has no row there).
        sweeps: every ``sweeps`` row in the store (to name the sweeps not reported).
        runs: the selected sweep's ``runs`` rows, failed ones included (columns of the schema).
        rounds: ``rounds`` rows of those runs.
        costs: ``costs`` rows of the sweep.
        meta: the ``meta`` table as a dict.
        notes: sentences about what the store lacks, found while loading.
    """

    db_path: str
    sweep_id: str | None
    sweep: dict | None
    sweeps: pd.DataFrame
    runs: pd.DataFrame
    rounds: pd.DataFrame
    costs: pd.DataFrame
    meta: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _empty(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _conform(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Add the schema columns an older/partial store lacks (as NaN), keep any extra ones."""
    for c in columns:
        if c not in df.columns:
            df[c] = np.nan
    return df


def _connect(path: Path) -> sqlite3.Connection:
    try:
        con = sqlite3.connect(f"file:{path.resolve().as_posix()}?mode=ro", uri=True)
        con.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        return con
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path} is not a readable SQLite results store: {exc}") from exc


def load_store(db: str | Path, sweep: str | None = None) -> StoreData:
    """Read one sweep from the results store at `db` (read-only).

    Args:
        db: path of the SQLite store.
        sweep: a sweep id or a unique prefix of one; None picks the newest sweep (by ``sweeps.created_at``,
            else the one with the newest run) and notes the others.

    Returns:
        `StoreData`; tables the store lacks come back empty with the schema's columns, and ``notes`` says so.

    Raises:
        FileNotFoundError: `db` does not exist.
        ValueError: `db` is not an SQLite database, or `sweep` matches no sweep or several.
    """
    path = Path(db)
    if not path.exists():
        raise FileNotFoundError(f"results store not found: {path}")
    if path.is_dir():
        raise ValueError(f"results store path is a directory, not a file: {path}")
    con = _connect(path)
    notes: list[str] = []
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        for t in ("sweeps", "runs", "rounds", "costs"):
            if t not in tables:
                notes.append(f"the store has no '{t}' table")

        def read(sql: str, params: tuple = (), table: str = "", columns: list[str] | None = None):
            if table and table not in tables:
                return _empty(columns or [])
            return pd.read_sql_query(sql, con, params=params)

        meta: dict = {}
        if "meta" in tables:
            meta = {str(k): v for k, v in con.execute("SELECT key, value FROM meta")}
            version = meta.get("schema_version")
            if version is not None and str(version) != "1":
                notes.append(f"store schema_version is {version}; this report reads version 1")

        sweeps = _conform(read("SELECT * FROM sweeps", table="sweeps", columns=SWEEP_COLUMNS), SWEEP_COLUMNS)
        run_sweeps = read(
            "SELECT sweep_id, COUNT(*) AS n, MAX(run_id) AS last_run FROM runs GROUP BY sweep_id",
            table="runs", columns=["sweep_id", "n", "last_run"],
        )
        ids = list(dict.fromkeys([*sweeps["sweep_id"].dropna().astype(str), *run_sweeps["sweep_id"].dropna().astype(str)]))
        sweep_id: str | None
        if sweep is not None:
            matches = [i for i in ids if i == sweep] or [i for i in ids if i.startswith(sweep)]
            if not matches:
                listed = ", ".join(ids) if ids else "none"
                raise ValueError(f"no sweep {sweep!r} in {path} (sweeps: {listed})")
            if len(matches) > 1:
                raise ValueError(f"sweep prefix {sweep!r} is ambiguous: {', '.join(matches)}")
            sweep_id = matches[0]
        elif not ids:
            sweep_id = None
            notes.append("the store holds no sweep")
        else:
            sweep_id = _newest_sweep(sweeps, run_sweeps, ids)
            others = [i for i in ids if i != sweep_id]
            if others:
                notes.append(
                    f"the store holds {len(others)} other sweep(s) not in this report "
                    f"({', '.join(others)}); pass --sweep ID to report one of them"
                )

        sweep_row = None
        if sweep_id is not None:
            sel = sweeps[sweeps["sweep_id"].astype(str) == sweep_id]
            if len(sel):
                sweep_row = {k: (None if _isnan(v) else v) for k, v in sel.iloc[0].to_dict().items()}
            else:
                notes.append(f"sweep {sweep_id} has runs but no row in 'sweeps' (machine and config unknown)")
        params = (sweep_id,)
        runs = _conform(read("SELECT * FROM runs WHERE sweep_id = ? ORDER BY run_id", params, "runs",
                             RUN_COLUMNS), RUN_COLUMNS)
        if "runs" in tables and "rounds" in tables:
            rounds = read(
                "SELECT r.* FROM rounds r JOIN runs u ON r.run_id = u.run_id WHERE u.sweep_id = ? "
                "ORDER BY r.run_id, r.round_idx", params)
        else:
            rounds = _empty(ROUND_COLUMNS)
        rounds = _conform(rounds, ROUND_COLUMNS)
        costs = _conform(read("SELECT * FROM costs WHERE sweep_id = ?", params, "costs", COST_COLUMNS),
                         COST_COLUMNS)
    finally:
        con.close()
    return StoreData(str(path), sweep_id, sweep_row, sweeps, runs, rounds, costs, meta, notes)


def _newest_sweep(sweeps: pd.DataFrame, run_sweeps: pd.DataFrame, ids: list[str]) -> str:
    created = {str(r.sweep_id): (str(r.created_at) if not _isnan(r.created_at) else "")
               for r in sweeps.itertuples()}
    last_run = {str(r.sweep_id): float(r.last_run) for r in run_sweeps.itertuples()}
    return max(ids, key=lambda i: (created.get(i, ""), last_run.get(i, -1.0)))


def _isnan(x: Any) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------------
# preparation
# --------------------------------------------------------------------------------------------------


def prepare_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Normalise the keys of a ``runs`` frame; adds ``failed`` (bool) and ``ok`` (bool) columns.

    ``config_label``/``prompt_type``/``method`` NULL -> ``"(none)"``; ``target`` NULL -> ``"-"``; ``pair``
    NULL -> the target; ``policy`` NULL -> ``"-"``; ``k`` and ``repeat`` NULL -> 0 (ints). ``ok`` = not
    failed and a finite positive ``tokens_per_s``. Returns a copy.
    """
    df = _conform(runs.copy(), RUN_COLUMNS)
    # Plain object columns: grouping on pandas' Arrow-backed strings is several times slower here.
    def text(col: str, default) -> pd.Series:
        return df[col].where(df[col].notna(), default).astype(str).astype(object)

    for col in ("config_label", "prompt_type", "method", "prompt_id"):
        df[col] = text(col, "(none)")
    df["target"] = text("target", "-")
    df["pair"] = text("pair", df["target"])
    df["policy"] = text("policy", "-")
    for col in ("k", "repeat"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0).astype(int)
    num_cols = ["new_tokens", "num_rounds", "num_drafted", "num_accepted", "num_rejections", "prefill_s",
                "ttft_s", "decode_s", "total_s", "draft_s", "verify_s", "tokens_per_s", "matches_baseline",
                "temperature"]
    for col in num_cols:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    err = df["error"]
    df["failed"] = err.notna() & (err.astype(str).str.strip() != "")
    tps = df["tokens_per_s"]
    df["ok"] = ~df["failed"] & np.isfinite(tps) & (tps > 0)
    return df


def _round_stats(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per run: speculative rounds (k > 0), emitted tokens, rounds traced. Indexed by run_id."""
    if rounds is None or rounds.empty:
        return pd.DataFrame(columns=["spec_rounds", "emitted", "traced_rounds"], dtype=float)
    r = rounds.copy()
    r["k"] = pd.to_numeric(r["k"], errors="coerce").fillna(0)
    r["num_emitted"] = pd.to_numeric(r["num_emitted"], errors="coerce")
    r["spec"] = (r["k"] > 0).astype(int)
    g = r.groupby("run_id")
    return pd.DataFrame({
        "spec_rounds": g["spec"].sum(),
        "emitted": g["num_emitted"].sum(min_count=1),
        "traced_rounds": g["spec"].size(),
    })


def _with_round_stats(ok: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    stats = _round_stats(rounds)
    df = ok.join(stats, on="run_id") if len(stats) else ok.assign(spec_rounds=np.nan, emitted=np.nan,
                                                                    traced_rounds=np.nan)
    # Runs without a trace: every round of a method with K > 0 counts as speculative (fixed K), all new
    # tokens as emitted.
    no_trace = df["traced_rounds"].isna()
    spec_default = np.where(df["k"] > 0, df["num_rounds"], 0)
    df["spec_rounds"] = np.where(no_trace, spec_default, df["spec_rounds"]).astype(float)
    df["emitted"] = np.where(no_trace | df["emitted"].isna(), df["new_tokens"], df["emitted"]).astype(float)
    return df


# --------------------------------------------------------------------------------------------------
# speedup
# --------------------------------------------------------------------------------------------------


def _nearest_baseline(ok: pd.DataFrame) -> dict[int, int]:
    """run_id -> run_id of the baseline run of the same (config_label, target, prompt_id) nearest in time
    (run_id order is insertion order; ties -> the earlier). A baseline run maps to itself.

    A prompt's baseline runs bracket its other runs; when a sweep was resumed hours later (or the machine
    changed speed) they can be far apart, and the speedup of a run is then measured against the baseline
    taken closest to it rather than against a median that mixes two machine states."""
    keys = ["config_label", "target", "prompt_id"]
    base = ok[ok["method"] == "baseline"]
    if base.empty or "run_id" not in ok.columns:
        return {}
    ids_by = {k: np.sort(g["run_id"].to_numpy(dtype=np.int64)) for k, g in base.groupby(keys)}
    out: dict[int, int] = {}
    for r in ok[["run_id", *keys]].itertuples(index=False):
        ids = ids_by.get((r.config_label, r.target, r.prompt_id))
        if ids is None or pd.isna(r.run_id):
            continue
        out[int(r.run_id)] = int(ids[np.argmin(np.abs(ids - int(r.run_id)))])  # argmin: first = earlier
    return out


def _ratio_ci(runs: pd.DataFrame, ref: pd.Series | dict, ref_keys: list[str] | None = None) -> dict:
    """Speedup of `runs` over per-prompt reference medians `ref` (see module docstring).

    `ref` (a Series or dict, tokens/s) is keyed by ``ref_keys`` tuples (default config_label, target,
    prompt_id). Returns a dict with
    speedup, speedup_lo, speedup_hi, verdict, n_aligned (prompts with both sides), ci_over.
    """
    out = {"speedup": np.nan, "speedup_lo": np.nan, "speedup_hi": np.nan, "verdict": "",
           "n_aligned": 0, "ci_over": ""}
    if runs.empty or len(ref) == 0:
        return out
    keys = ref_keys or ["config_label", "target", "prompt_id"]
    per_prompt = runs.groupby(keys)["tokens_per_s"].median().to_dict()
    ref_d = ref.to_dict() if isinstance(ref, pd.Series) else ref
    common = [key for key in per_prompt if key in ref_d]
    if not common:
        return out
    num = np.array([per_prompt[key] for key in common], dtype=float)
    den = np.array([ref_d[key] for key in common], dtype=float)
    if len(common) >= 2:
        point, lo, hi = theory.bootstrap_ratio_ci(num, den, paired=True)
        over = "prompts"
    else:
        key = common[0]
        mask = np.ones(len(runs), dtype=bool)
        for col, val in zip(keys, key):
            mask &= (runs[col] == val).to_numpy()
        sel = runs["tokens_per_s"].to_numpy(float)[mask]
        if len(sel) < 2:
            # One run of one prompt: a point, no interval, no verdict (a zero-width "CI" would claim
            # certainty that a single measurement cannot give).
            out.update(speedup=float(sel[0]) / float(ref_d[key]) if len(sel) else float(num[0] / den[0]),
                       verdict=SINGLE_RUN, n_aligned=1, ci_over="none (one run)")
            return out
        point, lo, hi = theory.bootstrap_ci(sel / float(ref_d[key]))
        over = "repeats (one prompt)"
    out.update(speedup=point, speedup_lo=lo, speedup_hi=hi, verdict=theory.verdict(lo, hi),
               n_aligned=len(common), ci_over=over)
    return out


def _counts(g: pd.DataFrame) -> dict:
    """Rates from raw counts summed over the runs of `g` (definitions in specdec.metrics)."""
    def total(col):
        s = g[col].dropna()
        return float(s.sum()) if len(s) else np.nan

    drafted, accepted, rejections = total("num_drafted"), total("num_accepted"), total("num_rejections")
    rounds, spec_rounds = total("num_rounds"), total("spec_rounds")
    with_rounds = g[g["num_rounds"].fillna(0) > 0]
    emitted = float(with_rounds["emitted"].sum()) if len(with_rounds) else np.nan

    def ratio(a, b):
        return a / b if (np.isfinite(a) and np.isfinite(b) and b > 0) else np.nan

    return {
        "num_drafted": drafted,
        "num_accepted": accepted,
        "num_rejections": rejections,
        "num_rounds": rounds,
        "acceptance_rate": ratio(accepted, drafted),
        "alpha_hat": ratio(accepted, accepted + rejections),
        "mean_accepted": ratio(accepted, spec_rounds),
        "block_efficiency": ratio(emitted, rounds),
        "mean_k": ratio(drafted, spec_rounds),
    }


def _times(g: pd.DataFrame) -> dict:
    """Time shares (fractions of total_s, summed over runs) and ms per new token of each phase."""
    t = g[(g["total_s"] > 0) & g["new_tokens"].notna()]
    total = float(t["total_s"].sum()) if len(t) else np.nan
    tokens = float(t["new_tokens"].sum()) if len(t) else np.nan
    out = {}
    parts = {}
    for name, col in (("prefill", "prefill_s"), ("draft", "draft_s"), ("verify", "verify_s")):
        s = t[col]
        parts[name] = float(s.sum()) if len(s) and s.notna().all() else np.nan
    known = [v for v in parts.values() if np.isfinite(v)]
    parts["other"] = max(total - sum(known), 0.0) if (np.isfinite(total) and known) else np.nan
    for name, secs in parts.items():
        out[f"share_{name}"] = secs / total if (np.isfinite(total) and total > 0) else np.nan
        out[f"{name}_ms_per_token"] = 1000 * secs / tokens if (np.isfinite(tokens) and tokens > 0) else np.nan
    out["total_ms_per_token"] = 1000 * total / tokens if (np.isfinite(tokens) and tokens > 0) else np.nan
    return out


def cell_table(runs: pd.DataFrame, rounds: pd.DataFrame | None = None, *, pool_prompt_types: bool = False
               ) -> pd.DataFrame:
    """One row per cell (or per cell pooled over prompt types when `pool_prompt_types`).

    `runs` is a raw or `prepare_runs` frame; failed runs count in ``n_failed`` only.

    Columns: the cell key; ``n_prompts``, ``n_prompts_expected`` (prompts of that type in the sweep),
    ``n_runs``, ``n_failed``; ``tok_s`` (median end-to-end tokens/s over runs), ``ttft_ms`` (median time
    to first token), ``decode_tok_s`` (median new tokens / decode seconds), ``baseline_tok_s`` (median of the
    per-prompt baseline medians), ``speedup``/``speedup_lo``/``speedup_hi``/``verdict``/``n_aligned``/
    ``ci_over`` (see module docstring; the baseline's own rows have speedup 1 and verdict
    ``"baseline"``); raw counts and ``acceptance_rate``, ``alpha_hat``, ``mean_accepted``,
    ``block_efficiency``, ``mean_k`` (drafted per speculative round); ``share_{prefill,draft,verify,other}``
    and ``*_ms_per_token``; ``match_rate`` (mean of ``matches_baseline`` where recorded).
    """
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    key = [c for c in CELL_KEY if not (pool_prompt_types and c == "prompt_type")]
    if df.empty:
        return pd.DataFrame(columns=[*CELL_KEY, "speedup"])
    ok = _with_round_stats(df[df["ok"]], rounds if rounds is not None else _empty(ROUND_COLUMNS))
    near = _nearest_baseline(ok)
    base_tps = dict(zip(ok["run_id"], ok["tokens_per_s"], strict=False)) if near else {}
    expected = df.groupby(["config_label", "prompt_type"])["prompt_id"].nunique()
    expected_all = df.groupby("config_label")["prompt_id"].nunique()
    failed_counts = df[df["failed"]].groupby(key).size()
    rows = []
    groups = dict(list(ok.groupby(key, sort=True)))
    all_keys = sorted(set(groups) | set(failed_counts.index), key=lambda t: tuple(map(str, t)))
    for cell in all_keys:
        g = groups.get(cell, ok.iloc[0:0])
        rec = dict(zip(key, cell))
        if pool_prompt_types:
            rec["prompt_type"] = ALL_PROMPTS
            rec["n_prompts_expected"] = int(expected_all.get(rec["config_label"], 0))
        else:
            rec["n_prompts_expected"] = int(expected.get((rec["config_label"], rec["prompt_type"]), 0))
        rec["n_prompts"] = int(g["prompt_id"].nunique())
        rec["n_runs"] = len(g)
        rec["n_failed"] = int(failed_counts.get(cell, 0))
        rec["tok_s"] = float(g["tokens_per_s"].median()) if len(g) else np.nan
        ttft = g["ttft_s"].dropna()
        rec["ttft_ms"] = 1000 * float(ttft.median()) if len(ttft) else np.nan
        decode_s = g["decode_s"].where(g["decode_s"].notna(), g["total_s"] - g["prefill_s"])
        dec = (g["new_tokens"] / decode_s.where(decode_s > 0)).dropna()
        rec["decode_tok_s"] = float(dec.median()) if len(dec) else np.nan
        prompts = g[["config_label", "target", "prompt_id"]].drop_duplicates().itertuples(index=False, name=None)
        # per prompt: the median, over the cell's runs, of the baseline run nearest each of them in time
        ref_d: dict = {}
        for pkey, pg in g.groupby(["config_label", "target", "prompt_id"]):
            vals = [base_tps[near[int(i)]] for i in pg["run_id"] if int(i) in near]
            if vals:
                ref_d[pkey] = float(np.median(vals))
        refs = [ref_d[key] for key in prompts if key in ref_d]
        rec["baseline_tok_s"] = float(np.median(refs)) if refs else np.nan
        if rec["method"] == "baseline" and len(g):
            rec.update(speedup=1.0, speedup_lo=1.0, speedup_hi=1.0, verdict="baseline",
                       n_aligned=rec["n_prompts"], ci_over="")
        else:
            rec.update(_ratio_ci(g, ref_d))
        rec.update(_counts(g) if len(g) else {})
        rec.update(_times(g) if len(g) else {})
        mb = g["matches_baseline"].dropna()
        rec["match_rate"] = float(mb.mean()) if len(mb) else np.nan
        rec["n_matched_checked"] = len(mb)
        rows.append(rec)
    out = pd.DataFrame(rows)
    cols = [*CELL_KEY, "n_prompts", "n_prompts_expected", "n_runs", "n_failed", "tok_s", "baseline_tok_s",
            "speedup", "speedup_lo", "speedup_hi", "verdict", "n_aligned", "ci_over"]
    return out[cols + [c for c in out.columns if c not in cols]]


def _fixed(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells with one K throughout: policy fixed (or none) and K > 0, with a measured speedup."""
    if cells.empty:
        return cells
    m = cells["policy"].isin(["fixed", "-"]) & (cells["k"] > 0) & np.isfinite(cells["speedup"].astype(float))
    return cells[m]


def best_k_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Best fixed K per (config_label, pair, prompt_type, method): the K with the highest median speedup.

    Columns: the group key, ``best_k``, ``speedup``, ``speedup_lo``, ``speedup_hi``, ``verdict``,
    ``alpha_hat``, ``ks_tried`` (comma-separated K values), ``n_prompts``, ``same_prompts`` (every K
    measured on as many prompts; False when, e.g., secondary prompts only ran some K, so the K values
    are compared on different prompt sets). Ties go to the smaller K.
    Empty when no fixed-K cell has a speedup.
    """
    cols = ["config_label", "pair", "prompt_type", "method", "best_k", "speedup", "speedup_lo", "speedup_hi",
            "verdict", "alpha_hat", "ks_tried", "n_prompts", "same_prompts"]
    fx = _fixed(cells)
    if fx.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in fx.groupby(["config_label", "pair", "prompt_type", "method"], sort=True):
        g = g.sort_values(["speedup", "k"], ascending=[False, True])
        b = g.iloc[0]
        rows.append({
            "config_label": key[0], "pair": key[1], "prompt_type": key[2], "method": key[3],
            "best_k": int(b["k"]), "speedup": b["speedup"], "speedup_lo": b["speedup_lo"],
            "speedup_hi": b["speedup_hi"], "verdict": b["verdict"], "alpha_hat": b.get("alpha_hat", np.nan),
            "ks_tried": ",".join(str(k) for k in sorted(g["k"].astype(int))), "n_prompts": b["n_prompts"],
            "same_prompts": g["n_prompts"].nunique() == 1,
        })
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------------
# costs and the analytical model
# --------------------------------------------------------------------------------------------------


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
        """c used by the model for `method`: measured c for ``draft``, 0 for ``ngram`` (lookup is free
        in the model; its real cost lands in the efficiency), None otherwise."""
        if method == "ngram":
            return 0.0
        return self.c if method == "draft" else None

    def v_at(self, n: int) -> float:
        """v(n) by :func:`specdec.theory.cost_at` (NaN without a curve)."""
        return theory.cost_at(self.v, n) if self.v else np.nan

    @property
    def max_n(self) -> int:
        return max(self.v) if self.v else 0


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
        tgt = {int(r.n_tokens): float(r.seconds) for r in g[g["role"] == "target"].itertuples()}
        dr = {int(r.n_tokens): float(r.seconds) for r in g[g["role"] == "draft"].itertuples()}
        t1, d1 = tgt.get(1), dr.get(1)
        v = theory.relative_costs(tgt) if t1 else None
        c = d1 / t1 if (t1 and d1) else None
        out[label] = CostInfo(label, t1, d1, c, v, dict(sorted(tgt.items())))
    return out


def break_even_table(infos: dict[str, CostInfo], ks_by_config: dict[str, list[int]]) -> pd.DataFrame:
    """Minimum alpha at which each K breaks even, per config_label and method.

    For ``draft`` (measured c) and ``ngram`` (c = 0): ``break_even_ideal`` with v(K+1) = 1 and
    ``break_even_refined`` with the measured v (:func:`specdec.theory.break_even_alpha`); ``inf`` means no
    alpha breaks even. ``v_extrapolated`` is True when K+1 exceeds the largest measured n.
    """
    cols = ["config_label", "method", "k", "c", "v_k1", "break_even_ideal", "break_even_refined",
            "v_extrapolated"]
    rows = []
    for label, ks in sorted(ks_by_config.items()):
        info = infos.get(label)
        if info is None:
            continue
        for method in SPEC_METHODS:
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


def speedup_condition_table(cells: pd.DataFrame, infos: dict[str, CostInfo]) -> pd.DataFrame:
    """Per fixed-K cell of our methods: measured alpha-hat against the break-even alpha of its K.

    ``break_even`` is the refined one when v was measured, else the ideal one (``model`` says which);
    ``clears`` = alpha_hat > break_even; ``agrees`` = the model's side (clears or not) matches the
    measured verdict (a ``"no measurable difference"`` cell agrees with neither and gets NaN).
    """
    cols = ["config_label", "pair", "prompt_type", "method", "k", "alpha_hat", "break_even", "model",
            "clears", "speedup", "verdict", "agrees"]
    fx = _fixed(cells)
    rows = []
    for r in fx.itertuples():
        info = infos.get(r.config_label)
        if info is None or r.method not in SPEC_METHODS or not np.isfinite(r.alpha_hat):
            continue
        c = info.c_for(r.method)
        if c is None:
            continue
        if info.v:
            be, model = theory.break_even_alpha(int(r.k), c, info.v), "refined"
        else:
            be, model = theory.break_even_alpha(int(r.k), c), "ideal"
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
    ``ideal`` = :func:`specdec.theory.ideal_speedup`; ``refined`` = :func:`specdec.theory.refined_speedup`
    (NaN without v); ``speedup`` (measured); ``efficiency`` = measured / refined (the runtime's
    efficiency; NaN without v).
    """
    cols = ["config_label", "pair", "prompt_type", "method", "k", "alpha_hat", "c", "v_k1",
            "expected_tokens", "block_efficiency", "ideal", "refined", "speedup", "speedup_lo", "speedup_hi",
            "efficiency"]
    rows = []
    for r in _fixed(cells).itertuples():
        info = infos.get(r.config_label)
        if info is None or r.method not in SPEC_METHODS or not np.isfinite(r.alpha_hat):
            continue
        c = info.c_for(r.method)
        if c is None:
            continue
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
    """Predicted optimal K (:func:`specdec.theory.optimal_k` over the K values tried, with alpha pooled
    over them) against the measured best K, per (config_label, pair, prompt_type, method).

    Columns: key, ``alpha_pooled`` = sum accepted / (sum accepted + sum rejections) over the fixed-K
    cells, ``model`` ('refined' or 'ideal'), ``predicted_k``, ``predicted_speedup``, ``best_k``,
    ``speedup`` (measured at best_k), ``agree`` (predicted_k == best_k).
    """
    cols = ["config_label", "pair", "prompt_type", "method", "alpha_pooled", "model", "predicted_k",
            "predicted_speedup", "best_k", "speedup", "agree"]
    fx = _fixed(cells)
    if fx.empty:
        return pd.DataFrame(columns=cols)
    fx = fx[fx["method"].isin(SPEC_METHODS)]
    best_idx = best.set_index(["config_label", "pair", "prompt_type", "method"]) if len(best) else None
    rows = []
    for key, g in fx.groupby(["config_label", "pair", "prompt_type", "method"], sort=True):
        info = infos.get(key[0])
        c = info.c_for(key[3]) if info else None
        acc, rej = g["num_accepted"].sum(), g["num_rejections"].sum()
        if c is None or not (np.isfinite(acc) and np.isfinite(rej)) or acc + rej <= 0:
            continue
        alpha = theory.alpha_from_acceptance(acc, rej)
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


# --------------------------------------------------------------------------------------------------
# peers, equality, adaptive, runtimes
# --------------------------------------------------------------------------------------------------


def peer_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Our implementation against the peers measured in the same sweep.

    Pairs compared (ours vs peer): baseline vs hf_generate; draft-K vs hf_assisted-K; ngram-K vs
    hf_prompt_lookup-K and llama_prompt_lookup-K (same config_label, target, K; ours with a fixed policy).
    ``ratio`` = our tokens/s / the peer's tokens/s per prompt (medians over repeats), median over prompts
    with a paired bootstrap CI (> 1: ours is faster). One row per prompt type and one pooled
    (``prompt_type`` = ``"(all prompts)"``). ``ours_match``/``peer_match`` are the output-equality rates
    (matches_baseline) of the runs compared.
    """
    cols = ["config_label", "target", "prompt_type", "ours", "peer", "k", "ratio", "ratio_lo", "ratio_hi",
            "verdict", "n_prompts", "ours_tok_s", "peer_tok_s", "ours_match", "peer_match"]
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    ok = df[df["ok"]]
    rows = []
    for ours_m, peer_m in PEER_PAIRS:
        peer = ok[ok["method"] == peer_m]
        if peer.empty:
            continue
        ours = ok[(ok["method"] == ours_m) & ok["policy"].isin(["fixed", "-"])]
        for (label, target, k), pg in peer.groupby(["config_label", "target", "k"], sort=True):
            og = ours[(ours["config_label"] == label) & (ours["target"] == target)]
            if ours_m != "baseline":
                og = og[og["k"] == k]
            if og.empty:
                continue
            types = sorted(set(pg["prompt_type"]) & set(og["prompt_type"]))
            for ptype in [*types, ALL_PROMPTS]:
                o = og if ptype == ALL_PROMPTS else og[og["prompt_type"] == ptype]
                p = pg if ptype == ALL_PROMPTS else pg[pg["prompt_type"] == ptype]
                ref = p.groupby(["config_label", "target", "prompt_id"])["tokens_per_s"].median()
                res = _ratio_ci(o, ref)
                if res["n_aligned"] == 0:
                    continue
                om, pm = o["matches_baseline"].dropna(), p["matches_baseline"].dropna()
                rows.append({
                    "config_label": label, "target": target, "prompt_type": ptype,
                    "ours": ours_m if ours_m == "baseline" else f"{ours_m} K={k}",
                    "peer": peer_m if peer_m == "hf_generate" else f"{peer_m} K={k}", "k": k,
                    "ratio": res["speedup"], "ratio_lo": res["speedup_lo"], "ratio_hi": res["speedup_hi"],
                    "verdict": res["verdict"], "n_prompts": res["n_aligned"],
                    "ours_tok_s": float(o["tokens_per_s"].median()), "peer_tok_s": float(p["tokens_per_s"].median()),
                    "ours_match": float(om.mean()) if len(om) else np.nan,
                    "peer_match": float(pm.mean()) if len(pm) else np.nan,
                })
    return pd.DataFrame(rows, columns=cols)


def equality_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Output-equality rate per (config_label, method, policy, k): share of runs whose tokens equal our
    baseline's on the same prompt (``matches_baseline`` = 1), over the runs where it was recorded."""
    cols = ["config_label", "method", "policy", "k", "n_checked", "n_equal", "equal_rate"]
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    ok = df[df["ok"] & df["matches_baseline"].notna() & (df["method"] != "baseline")]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    g = ok.groupby(["config_label", "method", "policy", "k"], sort=True)["matches_baseline"]
    out = pd.DataFrame({"n_checked": g.size(), "n_equal": g.sum().astype(int), "equal_rate": g.mean()})
    return out.reset_index()[cols]


def adaptive_table(runs: pd.DataFrame, cells: pd.DataFrame, overall: pd.DataFrame | None = None) -> pd.DataFrame:
    """Adaptive K policies against the best fixed K (chosen after the fact) and the baseline.

    One row per (config_label, pair, prompt_type, method, policy) with an adaptive policy, plus pooled
    rows (prompt_type ``"(all prompts)"``, where the best fixed K is the single K best over all prompts)
    when `overall` (cells pooled over prompt types) is given. Columns: ``k_cap`` (the cell's K), ``mean_k``
    (drafted per speculative round), ``speedup`` (vs baseline, with CI and verdict), ``best_fixed_k``,
    ``best_fixed_speedup``, ``vs_best_fixed`` = adaptive tokens/s / best-fixed tokens/s per prompt (median,
    paired CI) with its verdict.
    """
    cols = ["config_label", "pair", "prompt_type", "method", "policy", "k_cap", "mean_k", "alpha_hat",
            "speedup", "speedup_lo", "speedup_hi", "verdict", "best_fixed_k", "best_fixed_speedup",
            "vs_best_fixed", "vs_best_lo", "vs_best_hi", "vs_best_verdict"]
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    ok = df[df["ok"]]
    rows = []
    for frame, pooled in ((cells, False), (overall, True)):
        if frame is None or frame.empty:
            continue
        ad = frame[frame["policy"].isin(ADAPTIVE_POLICIES)]
        fixed = _fixed(frame)
        for r in ad.itertuples():
            sel = (ok["config_label"] == r.config_label) & (ok["pair"] == r.pair) & (ok["method"] == r.method)
            if not pooled:
                sel &= ok["prompt_type"] == r.prompt_type
            ad_runs = ok[sel & (ok["policy"] == r.policy) & (ok["k"] == r.k)]
            fx = fixed[(fixed["config_label"] == r.config_label) & (fixed["pair"] == r.pair)
                       & (fixed["method"] == r.method) & (fixed["prompt_type"] == r.prompt_type)]
            rec = {"config_label": r.config_label, "pair": r.pair, "prompt_type": r.prompt_type,
                   "method": r.method, "policy": r.policy, "k_cap": int(r.k), "mean_k": r.mean_k,
                   "alpha_hat": r.alpha_hat, "speedup": r.speedup, "speedup_lo": r.speedup_lo,
                   "speedup_hi": r.speedup_hi, "verdict": r.verdict, "best_fixed_k": np.nan,
                   "best_fixed_speedup": np.nan, "vs_best_fixed": np.nan, "vs_best_lo": np.nan,
                   "vs_best_hi": np.nan, "vs_best_verdict": ""}
            if len(fx):
                b = fx.sort_values(["speedup", "k"], ascending=[False, True]).iloc[0]
                fx_runs = ok[sel & ok["policy"].isin(["fixed", "-"]) & (ok["k"] == b["k"])]
                ref = fx_runs.groupby(["config_label", "target", "prompt_id"])["tokens_per_s"].median()
                res = _ratio_ci(ad_runs, ref)
                rec.update(best_fixed_k=int(b["k"]), best_fixed_speedup=b["speedup"],
                           vs_best_fixed=res["speedup"], vs_best_lo=res["speedup_lo"],
                           vs_best_hi=res["speedup_hi"], vs_best_verdict=res["verdict"])
            rows.append(rec)
    return pd.DataFrame(rows, columns=cols)


def runtime_table(cells: pd.DataFrame, overall: pd.DataFrame, infos: dict[str, CostInfo],
                  best: pd.DataFrame, model: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runtimes (config_labels) side by side.

    Returns ``(summary, by_type)``. ``summary``: one row per config_label with ``target_step_ms``,
    ``draft_step_ms``, ``c``, ``v(2)``, ``v(5)``, ``v(9)``, ``v(17)`` (where measured, NaN otherwise),
    ``baseline_tok_s`` (median over baseline runs), the best pooled draft-model K with its speedup and
    verdict, and ``median_efficiency`` (median of measured/refined over its cells). ``by_type``: one
    row per prompt type, one column per config_label, each ``"K=<best> <speedup>x (<verdict>)"`` for the
    draft-model method (prompt lookup when a config has no draft-model cells).
    """
    labels = sorted(set(cells["config_label"]) | set(infos)) if len(cells) else sorted(infos)
    rows = []
    for label in labels:
        info = infos.get(label)
        rec: dict[str, Any] = {"config_label": label}
        rec["target_step_ms"] = 1000 * info.target_step_s if info and info.target_step_s else np.nan
        rec["draft_step_ms"] = 1000 * info.draft_step_s if info and info.draft_step_s else np.nan
        rec["c"] = info.c if info and info.c is not None else np.nan
        for n in (2, 5, 9, 17):
            rec[f"v({n})"] = info.v[n] if info and info.v and n in info.v else np.nan
        base = cells[(cells["config_label"] == label) & (cells["method"] == "baseline")] if len(cells) else cells
        rec["baseline_tok_s"] = float(base["tok_s"].median()) if len(base) else np.nan
        ov = _fixed(overall[overall["config_label"] == label]) if len(overall) else overall
        ov = ov[ov["method"] == "draft"] if len(ov) and (ov["method"] == "draft").any() else ov
        if len(ov):
            b = ov.sort_values(["speedup", "k"], ascending=[False, True]).iloc[0]
            rec.update(best_method=b["method"], best_k=int(b["k"]), best_speedup=b["speedup"],
                       best_verdict=b["verdict"])
        else:
            rec.update(best_method="", best_k=np.nan, best_speedup=np.nan, best_verdict="")
        m = model[model["config_label"] == label]["efficiency"].dropna() if len(model) else pd.Series(dtype=float)
        rec["median_efficiency"] = float(m.median()) if len(m) else np.nan
        rows.append(rec)
    summary = pd.DataFrame(rows)
    by_type = pd.DataFrame()
    if len(best):
        pick = []
        for label, g in best.groupby("config_label"):
            meth = "draft" if (g["method"] == "draft").any() else ("ngram" if (g["method"] == "ngram").any() else None)
            if meth is None:
                continue
            for r in g[g["method"] == meth].itertuples():
                pick.append({"prompt_type": r.prompt_type, "config_label": f"{label} ({meth}, {r.pair})",
                             "value": f"K={r.best_k} {r.speedup:.2f}x ({r.verdict})"})
        if pick:
            p = pd.DataFrame(pick).drop_duplicates(["prompt_type", "config_label"])
            by_type = p.pivot(index="prompt_type", columns="config_label", values="value").fillna("-")
            by_type = by_type.reset_index()
            by_type.columns.name = None
    return summary, by_type


# --------------------------------------------------------------------------------------------------
# traces and gaps
# --------------------------------------------------------------------------------------------------


def position_acceptance(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """P(accept at draft position i | position i reached), pooled over the fixed-K runs of our methods.

    Position i (1-based) is *reached* in a round when the round drafted >= i tokens and positions
    1..i-1 were accepted; it is *accepted* when additionally token i was accepted. The accepted prefix is
    the run of leading '1's of ``rounds.accept_flags`` (``num_accepted`` where the flags are NULL).

    Columns: config_label, pair, prompt_type, method, position, reached, accepted, p (= accepted/reached).
    """
    cols = ["config_label", "pair", "prompt_type", "method", "position", "reached", "accepted", "p"]
    if rounds is None or rounds.empty:
        return pd.DataFrame(columns=cols)
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    keep = df[df["ok"] & df["method"].isin(SPEC_METHODS) & df["policy"].isin(["fixed", "-"])]
    if keep.empty:
        return pd.DataFrame(columns=cols)
    r = rounds.merge(keep[["run_id", "config_label", "pair", "prompt_type", "method"]], on="run_id")
    if r.empty:
        return pd.DataFrame(columns=cols)
    flags = r["accept_flags"]
    lead = flags.map(lambda s: len(str(s)) - len(str(s).lstrip("1")) if isinstance(s, str) else np.nan)
    r["prefix"] = lead.where(lead.notna(), pd.to_numeric(r["num_accepted"], errors="coerce"))
    r["kk"] = pd.to_numeric(r["k"], errors="coerce")
    r = r[r["prefix"].notna() & r["kk"].notna() & (r["kk"] > 0)]
    rows = []
    for key, g in r.groupby(["config_label", "pair", "prompt_type", "method"], sort=True):
        a = g["prefix"].to_numpy(float)
        k = g["kk"].to_numpy(float)
        for i in range(1, int(k.max()) + 1):
            reached = int(np.sum((k >= i) & (a >= i - 1)))
            if reached == 0:
                continue
            accepted = int(np.sum((k >= i) & (a >= i)))
            rows.append(dict(zip(["config_label", "pair", "prompt_type", "method"], key),
                             position=i, reached=reached, accepted=accepted, p=accepted / reached))
    return pd.DataFrame(rows, columns=cols)


def gaps_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Failed runs (``error`` set), one row each: config_label, pair, prompt_id, prompt_type, method,
    policy, k, repeat, kind (``"skipped"`` when the error starts with ``skipped``: a method that cannot run
    on this runtime, planned and recorded as a gap; else ``"failed"``), error."""
    cols = ["config_label", "pair", "prompt_id", "prompt_type", "method", "policy", "k", "repeat", "kind", "error"]
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    out = df[df["failed"]].copy()
    out["kind"] = np.where(out["error"].astype(str).str.startswith("skipped"), "skipped", "failed")
    return out[cols].reset_index(drop=True)


def baseline_stability_table(runs: pd.DataFrame) -> pd.DataFrame:
    """How steady the denominator of every speedup is: one row per (config_label, target, prompt_id).

    Columns: ``prompt_type``, ``n_runs`` (successful baseline runs), ``median_tok_s``, ``min_tok_s``,
    ``max_tok_s``, ``spread`` = (max - min) / median (0 with one run; a large spread means the machine
    changed speed while the prompt's runs were taken, and every speedup of that prompt carries it), and
    ``hf_generate_tok_s`` / ``vs_hf_generate`` (median baseline / transformers' generate() on the same
    prompt, when that peer ran: a third, independent measurement of target-only decoding).
    """
    cols = ["config_label", "target", "prompt_id", "prompt_type", "n_runs", "median_tok_s", "min_tok_s",
            "max_tok_s", "spread", "hf_generate_tok_s", "vs_hf_generate"]
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    ok = df[df["ok"]]
    base = ok[ok["method"] == "baseline"]
    if base.empty:
        return pd.DataFrame(columns=cols)
    key = ["config_label", "target", "prompt_id"]
    gen = ok[ok["method"] == "hf_generate"].groupby(key)["tokens_per_s"].median().to_dict()
    rows = []
    for k, g in base.groupby(key, sort=True):
        tps = g["tokens_per_s"].astype(float)
        med = float(tps.median())
        hf = gen.get(k, np.nan)
        rows.append({"config_label": k[0], "target": k[1], "prompt_id": k[2],
                     "prompt_type": g["prompt_type"].iloc[0], "n_runs": len(g), "median_tok_s": med,
                     "min_tok_s": float(tps.min()), "max_tok_s": float(tps.max()),
                     "spread": float((tps.max() - tps.min()) / med) if med > 0 else np.nan,
                     "hf_generate_tok_s": hf, "vs_hf_generate": med / hf if hf and not _isnan(hf) else np.nan})
    return pd.DataFrame(rows, columns=cols)


#: |drift| above this marks a run as taken while the machine ran at another speed than its baseline.
DRIFT_FLAG = 0.15


def drift_runs(runs: pd.DataFrame, rounds: pd.DataFrame, infos: dict[str, CostInfo]) -> pd.DataFrame:
    """Each run's own target speed, inferred from its round trace, against its prompt's baseline runs.

    A shared CPU (a VM whose neighbours take memory bandwidth) can change speed by 2x within minutes, and a
    speedup divides two runs taken minutes apart. Every traced round times one target forward over
    ``k + 1`` tokens (``verify_s``); dividing by the configuration's measured relative cost ``v(k + 1)``
    gives that round's *equivalent single-step time*, and its median over the run's rounds is the run's
    ``step_s`` (seconds per target step while it ran). Only n within the measured cost curve are used.

    One row per successful run with a trace: the run's keys, ``step_s``, ``baseline_step_s`` (``step_s`` of
    the prompt's baseline run nearest in time, as in `cell_table`), ``drift`` = step_s / baseline_step_s - 1
    (> 0: the machine was slower than during the baseline), ``speedup`` (tokens/s over that baseline's)
    and ``normalized_speedup`` = speedup x (1 + drift): the speedup had the machine kept the baseline's
    speed, assuming the draft and the rest of the loop slowed down in the same proportion as the target
    (all are memory-bound here). A model-based correction, reported next to the raw figure, never instead.
    """
    cols = ["run_id", "config_label", "pair", "target", "prompt_id", "prompt_type", "method", "policy", "k",
            "step_s", "baseline_step_s", "drift", "speedup", "normalized_speedup"]
    df = runs if "ok" in runs.columns else prepare_runs(runs)
    ok = df[df["ok"] & df["method"].isin(["baseline", *SPEC_METHODS])]
    if ok.empty or rounds is None or rounds.empty:
        return pd.DataFrame(columns=cols)
    r = rounds[["run_id", "k", "verify_s"]].copy()
    r["k"] = pd.to_numeric(r["k"], errors="coerce")
    r["verify_s"] = pd.to_numeric(r["verify_s"], errors="coerce")
    r = r.merge(ok[["run_id", "config_label"]], on="run_id")
    r = r[np.isfinite(r["k"]) & np.isfinite(r["verify_s"]) & (r["verify_s"] > 0)]
    parts = []
    for label, g in r.groupby("config_label"):
        info = infos.get(label)
        if info is None or not info.v:
            continue
        rel = (g["k"].astype(int) + 1).map(info.v).astype(float)  # NaN where n was not measured
        parts.append(g.assign(eq=g["verify_s"] / rel).dropna(subset=["eq"]))
    if not parts:
        return pd.DataFrame(columns=cols)
    step = pd.concat(parts).groupby("run_id")["eq"].median().rename("step_s")
    out = ok.join(step, on="run_id")
    out = out[out["step_s"].notna()].copy()
    # each run against the baseline run nearest it in time (as the speedups of `cell_table`)
    near = _nearest_baseline(df[df["ok"]])
    step_of = dict(zip(out["run_id"].astype(int), out["step_s"], strict=True))
    tps_of = dict(zip(df["run_id"], df["tokens_per_s"], strict=False))
    nb = out["run_id"].astype(int).map(near)
    out["baseline_step_s"] = nb.map(step_of).astype(float)
    out["baseline_tok_s"] = nb.map(tps_of).astype(float)
    out["drift"] = out["step_s"] / out["baseline_step_s"] - 1.0
    out["speedup"] = out["tokens_per_s"] / out["baseline_tok_s"]
    out["normalized_speedup"] = out["speedup"] * (1.0 + out["drift"])
    return out[cols].reset_index(drop=True)


def drift_cells(dr: pd.DataFrame) -> pd.DataFrame:
    """`drift_runs` per cell (median over its runs): ``n_runs``, ``drift``, ``speedup``,
    ``normalized_speedup``, ``flagged`` (|drift| > `DRIFT_FLAG`). Baseline rows are left out."""
    cols = [*CELL_KEY, "n_runs", "drift", "speedup", "normalized_speedup", "flagged"]
    d = dr[(dr["method"] != "baseline") & dr["drift"].notna()] if len(dr) else dr
    if d is None or d.empty:
        return pd.DataFrame(columns=cols)
    g = d.groupby(CELL_KEY, sort=True)
    out = pd.DataFrame({"n_runs": g.size(), "drift": g["drift"].median(), "speedup": g["speedup"].median(),
                        "normalized_speedup": g["normalized_speedup"].median()}).reset_index()
    out["flagged"] = out["drift"].abs() > DRIFT_FLAG
    return out[cols]


def coverage_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells holding fewer prompts than the sweep has of their type (n_prompts < n_prompts_expected):
    by plan (secondary prompts run only some K) or because runs failed."""
    cols = [*CELL_KEY, "n_prompts", "n_prompts_expected", "n_failed"]
    if cells.empty:
        return pd.DataFrame(columns=cols)
    return cells[cells["n_prompts"] < cells["n_prompts_expected"]][cols].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# everything
# --------------------------------------------------------------------------------------------------


@dataclass
class Analysis:
    """Everything the report shows.

    Attributes:
        store: the `StoreData` analysed.
        tables: name -> DataFrame; names: ``cells``, ``overall``, ``best_k``, ``break_even``,
            ``condition``, ``model``, ``optimal_k``, ``peers``, ``equality``, ``adaptive``,
            ``runtimes``, ``runtimes_by_type``, ``positions``, ``gaps``, ``coverage``,
            ``baseline_stability``, ``drift_runs``, ``drift``.
        costs: `CostInfo` per config_label.
        missing: sentences naming what is absent from the store (and so from the report).
    """

    store: StoreData
    tables: dict[str, pd.DataFrame]
    costs: dict[str, CostInfo]
    missing: list[str]

    def table(self, name: str) -> pd.DataFrame:
        """The named table (an empty frame when absent)."""
        return self.tables.get(name, pd.DataFrame())

    @property
    def sweep_config(self) -> dict | None:
        """The sweep's configuration parsed from ``config_json`` (None when absent or not JSON)."""
        return _json(self.store.sweep.get("config_json") if self.store.sweep else None)

    @property
    def machine(self) -> dict | None:
        """The machine description parsed from ``machine_json`` (None when absent or not JSON)."""
        return _json(self.store.sweep.get("machine_json") if self.store.sweep else None)


def _json(text: Any) -> Any:
    if text is None or _isnan(text):
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return {"(unparsed)": str(text)}


def analyze(store: StoreData) -> Analysis:
    """Compute every table of the report from `store`; never raises on missing or partial data.

    A part that fails on unexpected data leaves its table empty and adds a sentence to ``missing``.
    """
    missing = list(store.notes)
    tables: dict[str, pd.DataFrame] = {}

    def attempt(name: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a report of what is there beats no report
            missing.append(f"{name} could not be computed: {type(exc).__name__}: {exc}")
            return None

    runs = prepare_runs(store.runs)
    infos = attempt("costs", cost_infos, store.costs) or {}
    if store.sweep_id is not None and runs.empty:
        missing.append(f"sweep {store.sweep_id} has no runs: no speedups, acceptance or timings")
    ok = runs[runs["ok"]]
    if len(runs) and ok.empty:
        missing.append("every run failed or was skipped: no successful measurement to analyse")
    for label in sorted(set(runs["config_label"])):
        if not ((ok["config_label"] == label) & (ok["method"] == "baseline")).any():
            missing.append(f"no successful baseline run for config '{label}': its speedups are unknown")
    if len(runs) and store.costs.empty:
        missing.append("no costs measured: c, the verification cost curve, break-even alpha and model "
                       "predictions are missing")
    else:
        for label in sorted(set(runs["config_label"])):
            info = infos.get(label)
            if info is None:
                missing.append(f"no costs for config '{label}': no break-even alpha or model prediction")
            elif info.v is None:
                missing.append(f"config '{label}': no target single-step time; verification cost curve unknown")
            elif info.c is None and (runs[(runs["config_label"] == label)]["method"] == "draft").any():
                missing.append(f"config '{label}': no draft step time, so c is unknown and draft-model "
                               "predictions are skipped (prompt lookup uses c = 0)")
    if len(ok) and store.rounds.empty:
        missing.append("no per-round trace (rounds): acceptance by draft position is missing")
    if len(ok) and not ok["method"].isin(SPEC_METHODS).any():
        missing.append("no speculative runs (draft / ngram): only baseline or peer rows")
    if len(ok) and not ok["method"].isin(PEER_METHODS).any():
        missing.append("no peer runs (hf_generate, hf_assisted, hf_prompt_lookup, llama_prompt_lookup)")
    if len(ok) and not ok["policy"].isin(ADAPTIVE_POLICIES).any():
        missing.append("no adaptive-policy runs (heuristic / confidence / cost)")
    if len(ok) and ok["temperature"].nunique() > 1:
        missing.append("the sweep mixes temperatures; cells pool them (speedups compare like with like "
                       "only under one sampling setting)")

    empty = pd.DataFrame()
    cells = attempt("the cell table", cell_table, runs, store.rounds)
    cells = cells if cells is not None else pd.DataFrame(columns=[*CELL_KEY, "speedup"])
    overall = attempt("the pooled cell table", cell_table, runs, store.rounds, pool_prompt_types=True)
    overall = overall if overall is not None else pd.DataFrame(columns=[*CELL_KEY, "speedup"])
    tables["cells"], tables["overall"] = cells, overall
    best = attempt("best K", best_k_table, cells)
    tables["best_k"] = best if best is not None else empty
    ks_by_config: dict[str, list[int]] = {}
    fx = _fixed(cells) if len(cells) else cells
    for label, g in (fx[fx["method"].isin(SPEC_METHODS)].groupby("config_label") if len(fx) else []):
        ks_by_config[label] = sorted(set(g["k"].astype(int)))
    for name, fn, args in (
        ("break_even", break_even_table, (infos, ks_by_config)),
        ("condition", speedup_condition_table, (cells, infos)),
        ("model", model_table, (cells, infos)),
        ("peers", peer_table, (runs,)),
        ("equality", equality_table, (runs,)),
        ("adaptive", adaptive_table, (runs, cells, overall)),
        ("positions", position_acceptance, (runs, store.rounds)),
        ("gaps", gaps_table, (runs,)),
        ("baseline_stability", baseline_stability_table, (runs,)),
        ("coverage", coverage_table, (cells,)),
    ):
        res = attempt(name.replace("_", " "), fn, *args)
        tables[name] = res if res is not None else empty
    dr = attempt("machine drift", drift_runs, runs, store.rounds, infos)
    tables["drift_runs"] = dr if dr is not None else empty
    dc = attempt("machine drift by cell", drift_cells, tables["drift_runs"]) if len(tables["drift_runs"]) else None
    tables["drift"] = dc if dc is not None else empty
    ok_best = tables["best_k"] if len(tables["best_k"]) else pd.DataFrame(columns=["config_label"])
    opt = attempt("optimal K", optimal_k_table, cells, infos, ok_best)
    tables["optimal_k"] = opt if opt is not None else empty
    rt = attempt("the runtime comparison", runtime_table, cells, overall, infos, ok_best,
                 tables["model"] if len(tables["model"]) else pd.DataFrame(columns=["config_label", "efficiency"]))
    tables["runtimes"], tables["runtimes_by_type"] = rt if rt is not None else (empty, empty)
    return Analysis(store, tables, infos, missing)
