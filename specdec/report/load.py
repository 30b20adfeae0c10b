"""Reading a results store and normalising its runs: the first step of every report table.

Reads the store with plain ``sqlite3`` + ``pandas.read_sql_query`` (schema: ``specdec/bench/store.py``,
schema_version 1) and never writes to it. A store that lacks a table or a column still loads: the missing
parts come back empty with the schema's columns and :attr:`StoreData.notes` says what is missing.

`prepare_runs` turns the raw ``runs`` rows into the frame every table groups: NULL keys get the labels
of :mod:`specdec.report.vocab` (a **cell** is defined there), and ``failed``/``ok`` flags are added.
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

from specdec.bench import store
from specdec.catalogue.drafters import default_policy
from specdec.core.metrics import RATES
from specdec.store_info import machine_label, missing_shards

__all__ = [
    "COST_COLUMNS",
    "ROUND_COLUMNS",
    "RUN_COLUMNS",
    "SWEEP_COLUMNS",
    "StoreData",
    "axis_sweeps",
    "default_policy_of",
    "empty_frame",
    "ensure_prepared",
    "is_missing",
    "load_store",
    "parse_json",
    "prepare_runs",
    "run_rate",
    "with_round_stats",
]

#: Columns of each store table as the report reads them (schema_version 1). ``runs`` and ``rounds`` come
#: from the store's own declaration; tests/test_report.py pins all four to its CREATE TABLE statements.
# The store's columns, in table order, from its one schema declaration (`specdec.bench.store.TABLES`).
SWEEP_COLUMNS = list(store.columns("sweeps"))
RUN_COLUMNS = list(store.columns("runs"))
ROUND_COLUMNS = list(store.columns("rounds"))
COST_COLUMNS = list(store.columns("costs"))
_TABLES = ("sweeps", "runs", "rounds", "costs")


@dataclass
class StoreData:
    """The rows of one sweep, read from a results store.

    Attributes:
        db_path: the store file.
        sweep_id: the selected sweep (None when the store holds none).
        sweep: the selected ``sweeps`` row as a dict (None when the sweep has no row there).
        sweeps: every ``sweeps`` row in the store (to name the sweeps not reported).
        runs: the selected sweep's single-sequence ``runs`` rows, failed ones included (columns of the schema);
            its batched rows (``batch_size`` > 1) are the batch section's (`specdec.report.batches`).
        rounds: ``rounds`` rows of those runs.
        costs: ``costs`` rows of the sweep.
        meta: the ``meta`` table as a dict.
        notes: sentences about what the store lacks, found while loading.
        machines: the ``machines`` table (machine_id, machine_json) of stores written by sharded sweeps
            and merges (empty for older stores, whose one machine is the sweep's ``machine_json``).
        traces, calibration: the sweep's acceptance traces (JSON columns as text) and calibration blocks
            (empty for stores written before them). roofline: weight bytes and bandwidth per configuration.
        machine_costs: each machine's own start-up cost curve (``costs`` columns plus ``machine_id``; empty
            for stores written before them, where ``costs`` is the only curve).
        synthetic: the synthetic-acceptance measurements attached to the sweep (`specdec.report.synthetic`;
            decoded documents, oldest first).
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
    machines: pd.DataFrame = field(default_factory=lambda: empty_frame(["machine_id", "machine_json"]))
    traces: pd.DataFrame = field(default_factory=lambda: empty_frame(list(store.columns("traces"))))
    calibration: pd.DataFrame = field(default_factory=lambda: empty_frame(list(store.columns("calibration"))))
    roofline: pd.DataFrame = field(default_factory=lambda: empty_frame(list(store.columns("roofline"))))
    machine_costs: pd.DataFrame = field(default_factory=lambda: empty_frame(list(store.columns("machine_costs"))))
    synthetic: list[dict] = field(default_factory=list)

    def machine_runs(self) -> list[tuple[str, str, int, int]]:
        """The machines that timed this sweep's runs, by machine id: ``(machine_id, label, runs, baseline runs)``.

        ``runs`` counts every run of the machine (failed ones included), ``baseline runs`` its successful
        target-only runs; ``label`` is `specdec.store_info.machine_label` of the ``machines`` row. Empty
        when no run records its machine (older single-machine stores)."""
        from specdec.report.vocab import BASELINE

        ids = self.runs["machine_id"].dropna().astype(str)
        labels = dict(zip(self.machines["machine_id"].astype(str), self.machines["machine_json"], strict=False))
        ok = self.runs[self.runs["error"].isna()]
        return [(mid, machine_label(labels.get(mid)), int(n),
                 int(((ok["machine_id"].astype(str) == mid) & (ok["method"] == BASELINE)).sum()))
                for mid, n in ids.value_counts().sort_index().items()]

    def costs_machine(self) -> str | None:
        """The machine id whose own start-up costs (``machine_costs``) equal the sweep-level ``costs`` rows (the
        last curve measured in that file; in a merged store the first shard's), or None: no per-machine costs (older
        stores), or no machine's rows match every sweep-level row (config_label, role, n_tokens, seconds)."""
        if self.costs.empty or self.machine_costs.empty:
            return None

        def rows(df: pd.DataFrame) -> dict[tuple[str, str, int], float]:
            return {(str(r.config_label), str(r.role), int(r.n_tokens)): float(r.seconds)
                    for r in df.itertuples() if not is_missing(r.n_tokens) and not is_missing(r.seconds)}

        want = rows(self.costs)
        for mid, g in self.machine_costs.groupby("machine_id", sort=True):
            have = rows(g)
            if want and have.keys() == want.keys() and all(math.isclose(have[k], v, rel_tol=1e-9)
                                                           for k, v in want.items()):
                return str(mid)
        return None

    def costs_note(self) -> str | None:
        """One sentence for the sections priced with the sweep-level ``costs`` (speedup condition, analytical
        model, runtimes) when several machines timed the store: which machine measured those costs
        (`costs_machine`) and where each machine's own are. None for a one-machine store."""
        machines = self.machine_runs()
        if len(machines) < 2:
            return None
        mid = self.costs_machine()
        label = {m: lab for m, lab, _, _ in machines}.get(mid or "", "")
        who = (f"those of machine {mid}{f' ({label})' if label else ''}" if mid else
               "which machine measured them is not recorded in this store")
        return (f"Costs here are the sweep-level start-up costs: {who}. {len(machines)} machines timed this "
                "store's runs; each machine's own step times are in 'Appendix: where the data came from', and "
                "acceptance-trace predictions price each prompt with its own machine's costs.")


def empty_frame(columns: list[str]) -> pd.DataFrame:
    """An empty frame with object columns `columns` (what a table the store lacks reads as)."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})


def _conform(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Add the schema columns an older/partial store lacks (as NaN), keep any extra ones."""
    for c in columns:
        if c not in df.columns:
            df[c] = np.nan
    return df


def is_missing(x: Any) -> bool:
    """True for None, NaN and pandas' missing markers; False for anything else (never raises)."""
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def parse_json(text: Any) -> Any:
    """`text` parsed as JSON; None when missing; ``{"(unparsed)": text}`` when it is not JSON."""
    if text is None or is_missing(text):
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return {"(unparsed)": str(text)}


def _connect(path: Path) -> sqlite3.Connection:
    """Read-only, checked by the store's `connect` (a damaged store, or one that lost its ``-wal`` file, is one
    line naming the file)."""
    connect = store.connect

    try:
        con = connect(path, readonly=True, timeout_s=5.0)
        con.row_factory = None
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
    try:
        return _read(con, path, sweep)
    finally:
        con.close()


def _read(con: sqlite3.Connection, path: Path, sweep: str | None) -> StoreData:
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    notes = [f"the store has no '{t}' table" for t in _TABLES if t not in tables]

    def read(sql: str, params: tuple = (), table: str = "", columns: list[str] | None = None):
        if table and table not in tables:
            return empty_frame(columns or [])
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
    sweep_id = _select_sweep(sweeps, run_sweeps, sweep, path, notes)
    sweep_row = None
    if sweep_id is not None:
        sel = sweeps[sweeps["sweep_id"].astype(str) == sweep_id]
        if len(sel):
            sweep_row = {k: (None if is_missing(v) else v) for k, v in sel.iloc[0].to_dict().items()}
        else:
            notes.append(f"sweep {sweep_id} has runs but no row in 'sweeps' (machine and config unknown)")
    params = (sweep_id,)
    runs = _conform(read("SELECT * FROM runs WHERE sweep_id = ? ORDER BY run_id", params, "runs",
                         RUN_COLUMNS), RUN_COLUMNS)
    batched = pd.to_numeric(runs["batch_size"], errors="coerce").fillna(1) > 1  # the batch section's
    runs = runs[~batched].reset_index(drop=True)
    if "runs" in tables and "rounds" in tables:
        rounds = read(
            "SELECT r.* FROM rounds r JOIN runs u ON r.run_id = u.run_id WHERE u.sweep_id = ? "
            "ORDER BY r.run_id, r.round_idx", params)
    else:
        rounds = empty_frame(ROUND_COLUMNS)
    rounds = _conform(rounds, ROUND_COLUMNS)
    rounds = rounds[rounds["run_id"].isin(runs["run_id"])].reset_index(drop=True) if batched.any() else rounds
    costs = _conform(read("SELECT * FROM costs WHERE sweep_id = ?", params, "costs", COST_COLUMNS),
                     COST_COLUMNS)
    machines = read("SELECT machine_id, machine_json FROM machines", table="machines",
                    columns=["machine_id", "machine_json"])
    tcols, ccols = list(store.columns("traces")), list(store.columns("calibration"))
    traces = _conform(read("SELECT * FROM traces WHERE sweep_id = ?", params, "traces", tcols), tcols)
    calibration = _conform(read("SELECT * FROM calibration WHERE sweep_id = ?", params, "calibration", ccols),
                           ccols)
    rcols = list(store.columns("roofline"))
    roofline = _conform(read("SELECT * FROM roofline WHERE sweep_id = ?", params, "roofline", rcols), rcols)
    mcols = list(store.columns("machine_costs"))
    machine_costs = _conform(read("SELECT * FROM machine_costs WHERE sweep_id = ?", params, "machine_costs", mcols),
                             mcols)
    shards = read("SELECT shard FROM shards WHERE sweep_id = ?", params, "shards", ["shard"])
    held = sorted(set(shards["shard"].dropna().astype(str)))
    absent = missing_shards(held)
    if absent:
        notes.append(f"the store holds shard(s) {', '.join(held)} of this sweep, not {', '.join(absent)}: every "
                     "table and pooled figure covers the held shards' prompts only (`specdec merge` adds the "
                     "others)")
    synthetic = read("SELECT doc_json FROM synthetic WHERE sweep_id = ? ORDER BY created_at", params, "synthetic",
                     ["doc_json"])
    return StoreData(str(path), sweep_id, sweep_row, sweeps, runs, rounds, costs, meta, notes, machines,
                     traces, calibration, roofline, machine_costs, [json.loads(d) for d in synthetic["doc_json"]])


def axis_sweeps(data: StoreData) -> list[str]:
    """The other sweeps of `data`'s file on its sweep's temperature axis (``specdec sweep --temperatures``):
    those whose stored identity equals its own but for the sampling keys (`specdec.bench.store.same_axis`),
    ordered by temperature; [] when the sweep has no stored identity."""
    meaning = {str(sid): parse_json(cj) for sid, cj in zip(data.sweeps["sweep_id"], data.sweeps["config_json"],
                                                            strict=True)}
    mine = meaning.get(str(data.sweep_id))
    if not isinstance(mine, dict):
        return []
    same = [(float(m.get("temperature") or 0.0), sid) for sid, m in meaning.items()
            if sid != data.sweep_id and isinstance(m, dict) and store.same_axis(m, mine)]
    return [sid for _, sid in sorted(same)]


def _select_sweep(sweeps: pd.DataFrame, run_sweeps: pd.DataFrame, sweep: str | None, path: Path,
                  notes: list[str]) -> str | None:
    """The sweep id `sweep` names (id or unique prefix), else the newest; notes the sweeps left out."""
    ids = list(dict.fromkeys([*sweeps["sweep_id"].dropna().astype(str),
                              *run_sweeps["sweep_id"].dropna().astype(str)]))
    if sweep is not None:
        matches = [i for i in ids if i == sweep] or [i for i in ids if i.startswith(sweep)]
        if not matches:
            listed = ", ".join(ids) if ids else "none"
            raise ValueError(f"no sweep {sweep!r} in {path} (sweeps: {listed})")
        if len(matches) > 1:
            raise ValueError(f"sweep prefix {sweep!r} is ambiguous: {', '.join(matches)}")
        return matches[0]
    if not ids:
        notes.append("the store holds no sweep")
        return None
    created = {str(r.sweep_id): (str(r.created_at) if not is_missing(r.created_at) else "")
               for r in sweeps.itertuples()}
    last_run = {str(r.sweep_id): float(r.last_run) for r in run_sweeps.itertuples()}
    sweep_id = max(ids, key=lambda i: (created.get(i, ""), last_run.get(i, -1.0)))
    others = [i for i in ids if i != sweep_id]
    if others:
        notes.append(
            f"the store holds {len(others)} other sweep(s) not in this report "
            f"({', '.join(others)}); pass --sweep ID to report one of them"
        )
    return sweep_id


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


def default_policy_of(runs: pd.DataFrame, grid: pd.DataFrame | None = None) -> tuple[str, str]:
    """The default policy of a store, as (drafter, policy): `specdec.catalogue.drafters.default_policy` of the
    drafters whose cost policy its runs timed, else of those its trace grid (`grid`) prices under the cost
    policy, else the catalogue's default."""
    for frame in (runs, grid):
        if frame is not None and not frame.empty and {"method", "policy"} <= set(frame.columns):
            timed = frame.loc[frame["policy"] == "cost", "method"].dropna().astype(str).unique()
            if len(timed):
                return default_policy(timed)
    return default_policy()


def ensure_prepared(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` itself when it is already a `prepare_runs` frame, else `prepare_runs(runs)`."""
    return runs if "ok" in runs.columns else prepare_runs(runs)


def run_rate(runs: pd.DataFrame, name: str) -> pd.Series:
    """`specdec.core.metrics.RATES` ``[name]`` of each run (row) of `runs`, from its count columns: NaN where a count
    is missing or the denominator is not > 0.

    Raises:
        KeyError: an unknown rate, or `runs` lacks one of its counts.
    """
    rate = RATES[name]
    num = sum(pd.to_numeric(runs[c], errors="coerce") for c in rate.numerator)
    den = sum(pd.to_numeric(runs[c], errors="coerce") for c in rate.denominator)
    return num / den.where(den > 0)


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


def with_round_stats(ok: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """`ok` runs with ``spec_rounds`` (rounds with K > 0) and ``emitted`` (tokens committed) per run.

    From the round trace where there is one; a run without a trace counts every round of a method with
    K > 0 as speculative (fixed K) and all its new tokens as emitted.
    """
    stats = _round_stats(rounds)
    df = ok.join(stats, on="run_id") if len(stats) else ok.assign(spec_rounds=np.nan, emitted=np.nan,
                                                                    traced_rounds=np.nan)
    no_trace = df["traced_rounds"].isna()
    spec_default = np.where(df["k"] > 0, df["num_rounds"], 0)
    df["spec_rounds"] = np.where(no_trace, spec_default, df["spec_rounds"]).astype(float)
    df["emitted"] = np.where(no_trace | df["emitted"].isna(), df["new_tokens"], df["emitted"]).astype(float)
    return df
