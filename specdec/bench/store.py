"""The results store: one SQLite file (stdlib `sqlite3`, WAL mode) holding sweeps, runs, rounds and costs.

Schema (version 1; `docs/STORE.md` documents every column):

- ``sweeps``: one row per sweep configuration. ``sweep_id`` is ``sha256[:16]`` of the canonical JSON of the
  configuration that gives rows their meaning (`sweep_id_for`).
- ``runs``: one row per timed generation (a cell x repeat), unique by ``cell_key``
  (``sweep_id|config_label|prompt_id|method|k|policy|repeat``). A failed run is a row with ``error`` set.
- ``rounds``: the per-round trace of our own runs (baseline, draft, ngram), keyed by ``(run_id, round_idx)``.
- ``costs``: measured step/forward times per sweep x config_label x role x n_tokens.
- ``meta``: ``schema_version``.

Durability: each run and its rounds are written in ONE transaction (`record_run`), so killing the process
at any moment loses at most the run in flight; WAL with ``synchronous=FULL`` keeps committed runs across a
crash. Derived figures (acceptance rate, alpha-hat, speedup, ...) are never stored: they are computed at
analysis time from the raw counts (see `specdec.metrics`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from specdec.bench import machines as _machines  # [shards] per-run machine record (specdec/bench/machines.py)

__all__ = [
    "EXPORT_FORMATS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "Store",
    "StoreError",
    "SweepExistsError",
    "SweepNotFoundError",
    "canonical_json",
    "cell_key",
    "export_runs",
    "sweep_id_for",
]

SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT
);
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id TEXT PRIMARY KEY,
    name TEXT,
    config_json TEXT NOT NULL,
    created_at TEXT,
    git_commit TEXT,
    machine_json TEXT,
    status TEXT
);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY,
    sweep_id TEXT REFERENCES sweeps(sweep_id),
    cell_key TEXT NOT NULL UNIQUE,
    config_label TEXT,
    pair TEXT, target TEXT, draft TEXT,
    target_backend TEXT, draft_backend TEXT, compiled INTEGER,
    device TEXT, dtype TEXT, threads INTEGER,
    prompt_id TEXT, prompt_type TEXT, chat_template INTEGER, prompt_tokens INTEGER,
    method TEXT, policy TEXT, k INTEGER, repeat INTEGER, seed INTEGER,
    temperature REAL, top_k INTEGER, top_p REAL, max_new_tokens INTEGER,
    new_tokens INTEGER, finish_reason TEXT, token_ids TEXT, matches_baseline INTEGER,
    num_rounds INTEGER, num_drafted INTEGER, num_accepted INTEGER, num_rejections INTEGER,
    prefill_s REAL, ttft_s REAL, decode_s REAL, total_s REAL, draft_s REAL, verify_s REAL,
    tokens_per_s REAL,
    error TEXT,
    created_at TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep_id, config_label, prompt_id, method);
CREATE TABLE IF NOT EXISTS rounds (
    run_id INTEGER REFERENCES runs(run_id),
    round_idx INTEGER,
    k INTEGER, k_requested INTEGER, num_accepted INTEGER, accept_flags TEXT, next_kind TEXT,
    num_emitted INTEGER, draft_s REAL, verify_s REAL, other_s REAL, alpha_estimate REAL,
    PRIMARY KEY (run_id, round_idx)
);
CREATE TABLE IF NOT EXISTS costs (
    sweep_id TEXT, config_label TEXT, role TEXT, n_tokens INTEGER,
    seconds REAL, repeats INTEGER, spread_s REAL,
    PRIMARY KEY (sweep_id, config_label, role, n_tokens)
);
"""

#: Columns of ``runs`` that a caller fills (``run_id`` is assigned by SQLite).
RUN_COLUMNS: tuple[str, ...] = (
    "sweep_id", "cell_key", "config_label",
    "pair", "target", "draft", "target_backend", "draft_backend", "compiled", "device", "dtype", "threads",
    "prompt_id", "prompt_type", "chat_template", "prompt_tokens",
    "method", "policy", "k", "repeat", "seed", "temperature", "top_k", "top_p", "max_new_tokens",
    "new_tokens", "finish_reason", "token_ids", "matches_baseline",
    "num_rounds", "num_drafted", "num_accepted", "num_rejections",
    "prefill_s", "ttft_s", "decode_s", "total_s", "draft_s", "verify_s", "tokens_per_s",
    "error", "created_at",
    "machine_id",  # [shards] added by specdec.bench.machines.ensure_machine_schema
)  # fmt: skip

ROUND_COLUMNS: tuple[str, ...] = (
    "round_idx", "k", "k_requested", "num_accepted", "accept_flags", "next_kind", "num_emitted",
    "draft_s", "verify_s", "other_s", "alpha_estimate",
)  # fmt: skip

#: Columns the sweep's row contributes to each exported run (prefixed with ``sweep_``).
_SWEEP_EXPORT = ("name", "config_json", "created_at", "git_commit", "machine_json", "status")

EXPORT_FORMATS = ("csv", "jsonl", "parquet")


class StoreError(ValueError):
    """A results-store problem meant for the user (one-line message)."""


class SweepExistsError(StoreError):
    """The sweep already has runs in this database and ``--resume`` was not given."""


class SweepNotFoundError(StoreError):
    """``--resume`` was given but this database holds no sweep with this configuration."""


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no whitespace, ASCII only: the same object always gives the same string."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def sweep_id_for(config: Mapping[str, Any]) -> str:
    """``sha256(canonical_json(config))[:16]`` (hex): the id of the sweep whose rows `config` gives meaning to."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


def _key_part(value: Any) -> str:
    return "-" if value is None else str(value)


def cell_key(
    sweep_id: str, config_label: str, prompt_id: str, method: str, k: int | None, policy: str | None,
    repeat: int,
) -> str:
    """The unique key of one timed run: ``sweep_id|config_label|prompt_id|method|k|policy|repeat``
    (``-`` stands for a NULL k or policy)."""
    parts = (sweep_id, config_label, prompt_id, method, k, policy, repeat)
    return "|".join(_key_part(p) for p in parts)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _clean(value: Any) -> Any:
    """SQLite-ready scalar: NaN/inf -> NULL, bools -> 0/1, lists/dicts -> JSON."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


class Store:
    """An open results database.

    Args:
        path: the SQLite file (created with its parent directory when missing).

    Raises:
        StoreError: the file is not a SQLite database, or was written by another schema version.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.machine_id: str | None = None  # [shards] the machine of this process, set by begin_sweep
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            with self.transaction():
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self.conn.execute(stmt)
                row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    self.conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,)
                    )
                elif row[0] != SCHEMA_VERSION:
                    raise StoreError(
                        f"{self.path}: results schema version {row[0]}, this specdec writes version "
                        f"{SCHEMA_VERSION}; use a new --db"
                    )
                _machines.ensure_machine_schema(self.conn)  # [shards] machines, machine_costs, shards tables
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a specdec results database ({exc})") from None

    # ----------------------------------------------------------------------------------------- basics

    def close(self) -> None:
        """Close the connection (committed data is already on disk)."""
        self.conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception, which is re-raised)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # ----------------------------------------------------------------------------------------- sweeps

    def sweeps(self) -> list[dict]:
        """Every sweep in the database, oldest first, with its number of runs and failed runs."""
        rows = self.conn.execute(
            """SELECT s.*, (SELECT COUNT(*) FROM runs r WHERE r.sweep_id = s.sweep_id) AS n_runs,
                      (SELECT COUNT(*) FROM runs r WHERE r.sweep_id = s.sweep_id AND r.error IS NOT NULL)
                      AS n_errors
               FROM sweeps s ORDER BY s.created_at, s.sweep_id"""
        ).fetchall()
        return [dict(r) for r in rows]

    def get_sweep(self, sweep_id: str) -> dict | None:
        """The ``sweeps`` row of `sweep_id` as a dict, or None."""
        row = self.conn.execute("SELECT * FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()
        return dict(row) if row is not None else None

    def count_runs(self, sweep_id: str, *, errors: bool | None = None) -> int:
        """Runs recorded for `sweep_id` (``errors=True``: failed ones only, False: successful only)."""
        sql = "SELECT COUNT(*) FROM runs WHERE sweep_id = ?"
        if errors is True:
            sql += " AND error IS NOT NULL"
        elif errors is False:
            sql += " AND error IS NULL"
        return int(self.conn.execute(sql, (sweep_id,)).fetchone()[0])

    def _describe_sweeps(self) -> str:
        items = []
        for s in self.sweeps():
            try:
                cfg = json.loads(s["config_json"])
            except (TypeError, ValueError):
                cfg = {}
            brief = ", ".join(
                f"{k}={cfg[k]}" for k in ("target", "draft", "max_new_tokens", "temperature") if k in cfg
            )
            items.append(
                f"{s['sweep_id']} ({s['name'] or 'unnamed'}; {s['n_runs']} runs; {s['status']}; {brief})"
            )
        return "; ".join(items) if items else "none"

    def begin_sweep(
        self,
        sweep_id: str,
        config: Mapping[str, Any],
        *,
        resume: bool,
        name: str | None = None,
        machine: Mapping[str, Any] | None = None,
        git_commit: str | None = None,
    ) -> dict:
        """Create or reopen the sweep `sweep_id` and mark it ``running``.

        Args:
            sweep_id: `sweep_id_for(config)`.
            config: the meaning-giving configuration (stored as canonical JSON).
            resume: continue an existing sweep; without it, a sweep that already has runs is refused.
            name, machine, git_commit: recorded when the sweep is created (kept as they were on resume).

        Returns:
            The ``sweeps`` row (dict).

        Raises:
            SweepExistsError: not `resume` and the sweep already has runs (use --resume or a new --db).
            SweepNotFoundError: `resume` and no sweep with this configuration exists (lists the sweeps that do).
        """
        with self.transaction():
            self.machine_id = _machines.register_machine(self.conn, machine)  # [shards]
            row = self.get_sweep(sweep_id)
            if resume and row is None:
                raise SweepNotFoundError(
                    f"--resume: {self.path} holds no sweep with this configuration (id {sweep_id}); "
                    f"sweeps there: {self._describe_sweeps()}. Rerun with the same settings as the sweep "
                    f"to continue, or drop --resume to start a new sweep"
                )
            if row is not None and not resume and self.count_runs(sweep_id) > 0:
                raise SweepExistsError(
                    f"{self.path} already holds {self.count_runs(sweep_id)} runs of this sweep "
                    f"(id {sweep_id}); pass --resume to continue it, or --db NEW.db to start afresh"
                )
            if row is None:
                self.conn.execute(
                    "INSERT INTO sweeps (sweep_id, name, config_json, created_at, git_commit, machine_json, "
                    "status) VALUES (?, ?, ?, ?, ?, ?, 'running')",
                    (
                        sweep_id, name, canonical_json(config), _now(), git_commit,
                        json.dumps(machine, sort_keys=True) if machine is not None else None,
                    ),
                )  # fmt: skip
            else:
                self.conn.execute("UPDATE sweeps SET status = 'running' WHERE sweep_id = ?", (sweep_id,))
        return self.get_sweep(sweep_id)  # type: ignore[return-value]

    def set_status(self, sweep_id: str, status: str) -> None:
        """Set ``sweeps.status`` to ``'running'``, ``'done'`` or ``'interrupted'``.

        Raises:
            ValueError: another status.
        """
        if status not in ("running", "done", "interrupted"):
            raise ValueError(f"unknown sweep status {status!r}")
        with self.transaction():
            self.conn.execute("UPDATE sweeps SET status = ? WHERE sweep_id = ?", (status, sweep_id))

    # ------------------------------------------------------------------------------------------- runs

    def done_cells(self, sweep_id: str) -> set[str]:
        """``cell_key`` of every successful run of `sweep_id` (failed runs are not done: resume retries them)."""
        rows = self.conn.execute(
            "SELECT cell_key FROM runs WHERE sweep_id = ? AND error IS NULL", (sweep_id,)
        ).fetchall()
        return {r[0] for r in rows}

    def record_run(self, row: Mapping[str, Any], rounds: Iterable[Mapping[str, Any]] = ()) -> int:
        """Insert one run and its rounds in ONE transaction; return its ``run_id``.

        A previous row with the same ``cell_key`` (a failed run being retried) is replaced, its rounds
        deleted with it, in the same transaction.

        Args:
            row: values for `RUN_COLUMNS` (missing ones are NULL; ``created_at`` defaults to now, UTC).
                Lists (``token_ids``) are stored as JSON; NaN/inf as NULL.
            rounds: dicts with the `ROUND_COLUMNS` (``round_idx`` defaults to the position); ``accept_flags``
                may be a string like ``'1101'`` or a sequence of bools.

        Raises:
            ValueError: ``cell_key`` or ``sweep_id`` missing, or an unknown column.
        """
        unknown = set(row) - set(RUN_COLUMNS)
        if unknown:
            raise ValueError(f"unknown runs column(s): {', '.join(sorted(unknown))}")
        if not row.get("cell_key") or not row.get("sweep_id"):
            raise ValueError("a run needs sweep_id and cell_key")
        values = {c: _clean(row.get(c)) for c in RUN_COLUMNS}
        if values["created_at"] is None:
            values["created_at"] = _now()
        if values["machine_id"] is None:
            values["machine_id"] = self.machine_id  # [shards] the machine that timed the run
        round_rows = []
        for i, r in enumerate(rounds):
            d = {c: r.get(c) for c in ROUND_COLUMNS}
            if d["round_idx"] is None:
                d["round_idx"] = i
            flags = d["accept_flags"]
            if flags is not None and not isinstance(flags, str):
                d["accept_flags"] = "".join("1" if f else "0" for f in flags)
            round_rows.append(tuple(_clean(d[c]) for c in ROUND_COLUMNS))
        cols = ", ".join(RUN_COLUMNS)
        marks = ", ".join("?" for _ in RUN_COLUMNS)
        with self.transaction():
            old = self.conn.execute(
                "SELECT run_id FROM runs WHERE cell_key = ?", (values["cell_key"],)
            ).fetchone()
            if old is not None:
                self.conn.execute("DELETE FROM rounds WHERE run_id = ?", (old[0],))
                self.conn.execute("DELETE FROM runs WHERE run_id = ?", (old[0],))
            cur = self.conn.execute(
                f"INSERT INTO runs ({cols}) VALUES ({marks})", tuple(values[c] for c in RUN_COLUMNS)
            )
            run_id = int(cur.lastrowid)
            if round_rows:
                rcols = ", ".join(("run_id",) + ROUND_COLUMNS)
                rmarks = ", ".join("?" for _ in range(len(ROUND_COLUMNS) + 1))
                self.conn.executemany(
                    f"INSERT INTO rounds ({rcols}) VALUES ({rmarks})", [(run_id,) + r for r in round_rows]
                )
        return run_id

    def runs(self, sweep_id: str | None = None, **where: Any) -> list[dict]:
        """Rows of ``runs`` (dicts, ``token_ids`` left as JSON text), filtered by equality on columns.

        Raises:
            ValueError: an unknown column in `where`.
        """
        conds, params = [], []
        if sweep_id is not None:
            where["sweep_id"] = sweep_id
        for col, val in where.items():
            if col not in RUN_COLUMNS and col != "run_id":
                raise ValueError(f"unknown runs column {col!r}")
            if val is None:
                conds.append(f"{col} IS NULL")
            else:
                conds.append(f"{col} = ?")
                params.append(val)
        sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(conds) if conds else "") + " ORDER BY run_id"
        return [dict(r) for r in self.conn.execute(sql, params).fetchall()]

    def rounds_of(self, run_id: int) -> list[dict]:
        """The ``rounds`` rows of one run, in order."""
        rows = self.conn.execute(
            "SELECT * FROM rounds WHERE run_id = ? ORDER BY round_idx", (run_id,)
        ).fetchall()
        return [dict(r) for r in rows]

    def baseline_tokens(self, sweep_id: str, config_label: str, prompt_id: str) -> list[int] | None:
        """Token ids of our successful baseline run for this config_label and prompt (lowest repeat), or None."""
        row = self.conn.execute(
            "SELECT token_ids FROM runs WHERE sweep_id = ? AND config_label = ? AND prompt_id = ? "
            "AND method = 'baseline' AND error IS NULL ORDER BY repeat LIMIT 1",
            (sweep_id, config_label, prompt_id),
        ).fetchone()
        return json.loads(row[0]) if row is not None and row[0] is not None else None

    # ------------------------------------------------------------------------------------------ costs

    def save_costs(self, sweep_id: str, config_label: str, costs: Mapping[str, Any]) -> None:
        """Store a `specdec.bench.costs.measure_costs` result (replacing any earlier one) in one transaction.

        Rows: role ``'target'``, n_tokens 1..max_n from ``target_forward_s``; role ``'draft'`` from
        ``draft_forward_s`` (at least n_tokens 1 = the draft step) when a draft was measured. ``c`` is derived.
        ``repeats`` per row: ``draft_repeats`` for the draft's rows when given, else ``repeats``.
        """
        rows = []
        for role in ("target", "draft"):
            repeats = costs.get(f"{role}_repeats") or costs.get("repeats")  # draft_repeats: 3x the target's
            fwd = costs.get(f"{role}_forward_s") or {}
            spread = costs.get(f"{role}_forward_spread_s") or {}
            for n, s in fwd.items():
                sp = spread.get(n, spread.get(str(n)))
                rows.append((sweep_id, config_label, role, int(n), _clean(float(s)), repeats, _clean(sp)))
        with self.transaction():
            self.conn.execute(
                "DELETE FROM costs WHERE sweep_id = ? AND config_label = ?", (sweep_id, config_label)
            )
            self.conn.executemany("INSERT INTO costs VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            if self.machine_id is not None:  # [shards] each machine's own curve
                self.conn.execute("DELETE FROM machine_costs WHERE sweep_id = ? AND config_label = ? AND "
                                  "machine_id = ?", (sweep_id, config_label, self.machine_id))
                self.conn.executemany("INSERT INTO machine_costs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                      [(r[0], self.machine_id, *r[1:]) for r in rows])

    def load_costs(self, sweep_id: str, config_label: str) -> dict | None:
        """The costs stored for this sweep and config_label, in `measure_costs`'s shape, or None when absent.

        Keys: ``target_step_s``, ``draft_step_s`` (None without a draft), ``c`` (draft/target step; None
        without a draft), ``target_forward_s`` / ``draft_forward_s`` (``{n: seconds}``), the matching
        ``*_spread_s`` (IQR seconds), ``repeats`` (the target's) and ``draft_repeats``.
        Once `begin_sweep` has set this process's machine, the costs are that machine's own (None when only
        other machines measured them, so the sweep measures its own); stores without per-machine costs
        give the ``costs`` table's.
        """
        rows = _machines.machine_cost_rows(self.conn, sweep_id, config_label, self.machine_id)  # [shards]
        if rows is None:
            rows = self.conn.execute(
                "SELECT role, n_tokens, seconds, repeats, spread_s FROM costs WHERE sweep_id = ? AND "
                "config_label = ? ORDER BY role, n_tokens",
                (sweep_id, config_label),
            ).fetchall()
        if not rows:
            return None
        out: dict[str, Any] = {
            "target_forward_s": {}, "target_forward_spread_s": {},
            "draft_forward_s": {}, "draft_forward_spread_s": {}, "repeats": None, "draft_repeats": None,
        }  # fmt: skip
        for role, n, s, reps, spread in rows:
            out[f"{role}_forward_s"][int(n)] = s
            out[f"{role}_forward_spread_s"][int(n)] = spread
            out["repeats" if role == "target" else "draft_repeats"] = reps
        t1 = out["target_forward_s"].get(1)
        d1 = out["draft_forward_s"].get(1)
        out["target_step_s"] = t1
        out["draft_step_s"] = d1
        out["c"] = d1 / t1 if (d1 is not None and t1) else None
        if not out["draft_forward_s"]:
            out["draft_forward_s"] = out["draft_forward_spread_s"] = None
        return out


# ---------------------------------------------------------------------------------------------- export


def _export_rows(store: Store, sweep_id: str | None) -> list[dict]:
    sweep_cols = ", ".join(f"s.{c} AS sweep_{c}" for c in _SWEEP_EXPORT)
    sql = f"SELECT r.*, {sweep_cols} FROM runs r LEFT JOIN sweeps s ON s.sweep_id = r.sweep_id"
    params: tuple = ()
    if sweep_id is not None:
        sql += " WHERE r.sweep_id = ?"
        params = (sweep_id,)
    sql += " ORDER BY r.run_id"
    return [dict(r) for r in store.conn.execute(sql, params).fetchall()]


def export_runs(db: str | Path, fmt: str, out: str | Path, *, sweep_id: str | None = None) -> int:
    """Write every run (or one sweep's), joined with its sweep's row, to `out`; return the row count.

    Columns: all ``runs`` columns (``token_ids`` stays a JSON string) plus ``sweep_name``,
    ``sweep_config_json``, ``sweep_created_at``, ``sweep_git_commit``, ``sweep_machine_json``,
    ``sweep_status``.

    Args:
        db: an existing results database.
        fmt: ``"csv"``, ``"jsonl"`` (one object per line) or ``"parquet"`` (needs pyarrow).
        out: output file (parent directories are created).
        sweep_id: only this sweep's runs.

    Raises:
        StoreError: `db` does not exist or is not a results database; unknown `sweep_id`.
        ValueError: unknown format, or parquet without pyarrow installed.
    """
    fmt = fmt.lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if not Path(db).is_file():
        raise StoreError(f"{db}: no such results database")
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                "parquet export needs pyarrow: pip install 'specdec[parquet]' (or use --format csv/jsonl)"
            ) from None
    with Store(db) as store:
        if sweep_id is not None and store.get_sweep(sweep_id) is None:
            raise StoreError(f"{db}: no sweep {sweep_id!r}; sweeps there: {store._describe_sweeps()}")
        rows = _export_rows(store, sweep_id)
        decl = {r[1]: (r[2] or "TEXT").upper() for r in store.conn.execute("PRAGMA table_info(runs)")}
    columns = list(decl) + [f"sweep_{c}" for c in _SWEEP_EXPORT]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        with open(out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "jsonl":
        with open(out, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    else:
        # An explicit schema from the SQLite declarations, so an all-NULL column still gets its type.
        types = {"INTEGER": pa.int64(), "REAL": pa.float64(), "TEXT": pa.string()}
        schema = pa.schema([(c, types.get(decl.get(c, "TEXT"), pa.string())) for c in columns])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(out))
    return len(rows)
