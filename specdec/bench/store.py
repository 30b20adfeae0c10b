"""The results store: one SQLite file (stdlib `sqlite3`) holding sweeps, runs, rounds and costs.

The schema and the identities (`sweep_id_for`, `cell_key`) live in `specdec.bench.store_schema`, the
errors and the checks made on opening in `specdec.bench.store_access`, the measurement tables in
`specdec.bench.store_measurements`; this module re-exports their public names.

Durability: each run and its rounds are written in ONE transaction (`Store.record_run`), so killing the
process at any moment loses at most the run in flight. The store uses the rollback journal
(``journal_mode=DELETE``) with ``synchronous=FULL``, not WAL: when a commit returns, the run is in the
``.db`` file itself, so the file alone (copied, mailed, or left by a sweep killed with SIGKILL) holds
every committed run; in WAL mode committed runs stay in the ``-wal`` file until a checkpoint, and a ``.db``
copied without it silently loses them. Readers still work while a sweep writes (``specdec report`` during
a sweep): a reader and the writer share the file, and each commit waits at most a moment for readers (the
busy timeout). A read-only store or directory can still be read (``readonly=True`` writes nothing, not
even a journal). Stores written in WAL mode are switched to the rollback journal when opened for writing.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from specdec.bench import machines as _machines  # per-run machine record (specdec/bench/machines.py)
from specdec.bench.store_access import (
    StoreBusyError,
    StoreError,
    SweepExistsError,
    SweepNotFoundError,
    _is_busy,
    _storage_failure,
    check_writable,
    connect,
    damaged_error,
    writer_lock,
)
from specdec.bench.store_measurements import MeasurementTables
from specdec.bench.store_schema import (
    _SCHEMA,
    ROUND_COLUMNS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    TABLES,
    _add_missing_columns,
    _clean,
    _now,
    batch_group,
    batch_id_for,
    canonical_json,
    cell_key,
    columns,
    model_identity,
    same_axis,
    sweep_id_for,
)

__all__ = [
    "ROUND_COLUMNS", "RUN_COLUMNS", "SCHEMA_VERSION", "TABLES", "Store", "StoreBusyError", "StoreError",
    "SweepExistsError", "SweepNotFoundError", "batch_group", "batch_id_for", "canonical_json", "cell_key", "columns", "connect",
    "model_identity", "same_axis", "sweep_id_for", "writer_lock",
]  # fmt: skip


class Store(MeasurementTables):
    """An open results database.

    Args:
        path: the SQLite file (created with its parent directory when missing, unless `readonly`).
        busy_wait_s: how long to keep retrying while another process holds the database locked.
        readonly: read only: the file must exist, nothing is written to it (no schema upgrade, no journal);
            tables an older store lacks read as empty. For readers (export, merge sources, --dry-run).

    Raises:
        StoreError: the file (or directory) cannot be written (not `readonly`), is not a SQLite database,
            is damaged (the message names ``sqlite3 FILE ".recover"``), lost its ``-wal`` file, or was
            written by another schema version; `readonly` and no such file.
        StoreBusyError: another process kept it locked for `busy_wait_s` seconds.
    """

    def __init__(self, path: str | Path, *, busy_wait_s: float = 30.0, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if not readonly:
            check_writable(self.path)
        self.machine_id: str | None = None  # the machine of this process, set by begin_sweep
        self._busy_timeout_s = min(30.0, max(busy_wait_s, 0.05))  # sqlite's own wait on each statement
        t0 = time.monotonic()
        while True:
            try:
                self._open()
                return
            except sqlite3.OperationalError as exc:
                # Opening runs DDL and a journal-mode switch, which can fail at once ("database is locked")
                # while another process writes, without waiting on sqlite's busy timeout: retry, bounded.
                with contextlib.suppress(Exception):
                    self.conn.close()
                if not _is_busy(exc):
                    raise self._error(exc) from None
                if time.monotonic() - t0 >= busy_wait_s:
                    raise StoreBusyError(self.path, time.monotonic() - t0) from None
                time.sleep(0.2)

    def _error(self, exc: sqlite3.Error) -> StoreError:
        """One line for an SQLite error on this store (read-only, damaged, ...)."""
        text = str(exc).lower()
        if "readonly" in text or "read-only" in text:
            return StoreError(f"{self.path}: the results store cannot be written ({exc}); make it and its "
                              f"directory writable, or write to another --db")
        return damaged_error(self.path, exc)

    def _open(self) -> None:
        self.conn = connect(self.path, readonly=self.readonly, timeout_s=self._busy_timeout_s)
        try:
            if self.readonly:
                self._check_readable()
                return
            self.conn.execute("PRAGMA journal_mode=DELETE")  # every commit in the .db itself (module doc)
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            with self.transaction():
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self.conn.execute(stmt)
                self._check_version(insert=True)
                _add_missing_columns(self.conn)  # stores written before a column existed
        except sqlite3.OperationalError:
            raise  # the caller tells a busy store from a broken one
        except sqlite3.DatabaseError as exc:
            raise damaged_error(self.path, exc) from None

    def _check_version(self, *, insert: bool) -> None:
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None and insert:
            self.conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        elif row is not None and row[0] != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: results schema version {row[0]}, this specdec writes version "
                f"{SCHEMA_VERSION}; use a new --db"
            )

    def _check_readable(self) -> None:
        """A read-only store: it must hold the results tables; tables an older store lacks are made empty
        TEMP tables (the temp schema is this connection's own, nothing is written to the file)."""
        have = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "runs" not in have or "sweeps" not in have:
            raise StoreError(f"{self.path}: not a specdec results database (no runs or sweeps table)")
        if "meta" in have:
            self._check_version(insert=False)
        for stmt in _SCHEMA.split(";"):
            stmt = stmt.strip()
            if stmt.startswith("CREATE TABLE IF NOT EXISTS "):
                table = stmt.split()[5]
                if table not in have:
                    self.conn.execute(stmt.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))

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
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception, which is re-raised).

        Raises:
            StoreError: the store cannot be written (read-only file or directory, opened `readonly`), or
                SQLite finds it damaged: one line naming the file.
        """
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only; nothing can be written to it")
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not _storage_failure(exc):
                raise
            raise self._error(exc) from None
        try:
            yield self.conn
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.DatabaseError) and _storage_failure(exc):
                raise self._error(exc) from None
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if not _storage_failure(exc):
                raise
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            raise self._error(exc) from None

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

    def describe_sweeps(self) -> str:
        """One line naming every sweep in the database (id, name, runs, status, models), for error messages."""
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
            resume: continue an existing sweep; without it, a sweep that already has runs is refused. In a
                store that holds no sweep yet, `resume` starts this one (so the one command that resumes a
                killed sweep also starts it, e.g. a shard's first run).
            name, machine, git_commit: recorded when the sweep is created (kept as they were on resume).

        Returns:
            The ``sweeps`` row (dict).

        Raises:
            SweepExistsError: not `resume` and the sweep already has runs (use --resume or a new --db).
            SweepNotFoundError: `resume`, the store holds other sweeps and none with this configuration
                (lists the sweeps that do).
        """
        with self.transaction():
            self.machine_id = _machines.register_machine(self.conn, machine)
            self.check_resume(sweep_id, resume=resume)
            row = self.get_sweep(sweep_id)
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

    def check_resume(self, sweep_id: str, *, resume: bool) -> None:
        """Refuse what `begin_sweep` refuses, without writing (``--resume --dry-run`` checks the same).

        Raises:
            SweepExistsError: not `resume` and the sweep already has runs.
            SweepNotFoundError: `resume`, the store holds other sweeps and none with id `sweep_id`.
        """
        row = self.get_sweep(sweep_id)
        if resume and row is None and self.conn.execute("SELECT 1 FROM sweeps LIMIT 1").fetchone():
            raise SweepNotFoundError(
                f"--resume: {self.path} holds no sweep with this configuration (id {sweep_id}); "
                f"sweeps there: {self.describe_sweeps()}. Rerun with the same settings as the sweep "
                f"to continue, or drop --resume to start a new sweep"
            )
        if row is not None and not resume and self.count_runs(sweep_id) > 0:
            raise SweepExistsError(
                f"{self.path} already holds {self.count_runs(sweep_id)} runs of this sweep "
                f"(id {sweep_id}); pass --resume to continue it, or --db NEW.db to start afresh"
            )

    def set_status(self, sweep_id: str, status: str) -> None:
        """Set ``sweeps.status`` to ``'running'``, ``'done'`` or ``'interrupted'``.

        Raises:
            ValueError: another status.
        """
        if status not in ("running", "done", "interrupted"):
            raise ValueError(f"unknown sweep status {status!r}")
        with self.transaction():
            self.conn.execute("UPDATE sweeps SET status = ? WHERE sweep_id = ?", (status, sweep_id))

    def forget_empty_sweep(self, sweep_id: str) -> bool:
        """Delete a sweep that has no runs and no costs (one refused before anything ran), so the same
        settings can start it afresh; True when deleted, False (nothing changed) otherwise."""
        with self.transaction():
            if self.conn.execute("SELECT 1 FROM runs WHERE sweep_id = ? LIMIT 1", (sweep_id,)).fetchone():
                return False
            if self.conn.execute("SELECT 1 FROM costs WHERE sweep_id = ? LIMIT 1", (sweep_id,)).fetchone():
                return False
            return self.conn.execute("DELETE FROM sweeps WHERE sweep_id = ?", (sweep_id,)).rowcount > 0

    # ------------------------------------------------------------------------------------------- runs

    def done_cells(self, sweep_id: str) -> set[str]:
        """``cell_key`` of every successful run of `sweep_id` (failed runs are not done: resume retries them)."""
        rows = self.conn.execute(
            "SELECT cell_key FROM runs WHERE sweep_id = ? AND error IS NULL", (sweep_id,)
        ).fetchall()
        return {r[0] for r in rows}

    def record_run(self, row: Mapping[str, Any], rounds: Iterable[Mapping[str, Any]] = ()) -> int:
        """Insert one run and its rounds in ONE transaction; return its ``run_id`` (`record_runs`)."""
        return self.record_runs([(row, rounds)])[0]

    def record_runs(self, runs: Sequence[tuple[Mapping[str, Any], Iterable[Mapping[str, Any]]]]) -> list[int]:
        """Insert runs with their rounds in ONE transaction (the B rows of a batched run commit together);
        return their ``run_id`` s.

        A previous row with the same ``cell_key`` (a failed run being retried) is replaced, its rounds
        deleted with it, in the same transaction.

        Args:
            runs: ``(row, rounds)`` pairs. row: values for `RUN_COLUMNS` (missing ones are NULL;
                ``created_at`` defaults to now, UTC); lists (``token_ids``) are stored as JSON, NaN/inf as
                NULL. rounds: dicts with the `ROUND_COLUMNS` (``round_idx`` defaults to the position);
                ``accept_flags`` may be a string like ``'1101'`` or a sequence of bools.

        Raises:
            ValueError: ``cell_key`` or ``sweep_id`` missing, or an unknown column.
        """
        prepared = [(self._run_values(row), self._round_rows(rounds)) for row, rounds in runs]
        cols, marks = ", ".join(RUN_COLUMNS), ", ".join("?" for _ in RUN_COLUMNS)
        rcols = ", ".join(("run_id",) + ROUND_COLUMNS)
        rmarks = ", ".join("?" for _ in range(len(ROUND_COLUMNS) + 1))
        ids = []
        with self.transaction():
            for values, round_rows in prepared:
                old = self.conn.execute("SELECT run_id FROM runs WHERE cell_key = ?", (values["cell_key"],)).fetchone()
                if old is not None:
                    self.conn.execute("DELETE FROM rounds WHERE run_id = ?", (old[0],))
                    self.conn.execute("DELETE FROM runs WHERE run_id = ?", (old[0],))
                cur = self.conn.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})",
                                        tuple(values[c] for c in RUN_COLUMNS))
                ids.append(int(cur.lastrowid))
                if round_rows:
                    self.conn.executemany(f"INSERT INTO rounds ({rcols}) VALUES ({rmarks})",
                                          [(ids[-1],) + r for r in round_rows])
        return ids

    def _run_values(self, row: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(row) - set(RUN_COLUMNS)
        if unknown:
            raise ValueError(f"unknown runs column(s): {', '.join(sorted(unknown))}")
        if not row.get("cell_key") or not row.get("sweep_id"):
            raise ValueError("a run needs sweep_id and cell_key")
        values = {c: _clean(row.get(c)) for c in RUN_COLUMNS}
        if values["created_at"] is None:
            values["created_at"] = _now()
        if values["machine_id"] is None:
            values["machine_id"] = self.machine_id  # the machine that timed the run
        return values

    @staticmethod
    def _round_rows(rounds: Iterable[Mapping[str, Any]]) -> list[tuple]:
        out = []
        for i, r in enumerate(rounds):
            d = {c: r.get(c) for c in ROUND_COLUMNS}
            if d["round_idx"] is None:
                d["round_idx"] = i
            flags = d["accept_flags"]
            if flags is not None and not isinstance(flags, str):
                d["accept_flags"] = "".join("1" if f else "0" for f in flags)
            out.append(tuple(_clean(d[c]) for c in ROUND_COLUMNS))
        return out

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
        """Token ids of our successful single-sequence baseline run for this config_label and prompt (lowest
        repeat), or None."""
        row = self.conn.execute(
            "SELECT token_ids FROM runs WHERE sweep_id = ? AND config_label = ? AND prompt_id = ? "
            "AND method = 'baseline' AND error IS NULL AND batch_size IS NULL ORDER BY repeat LIMIT 1",
            (sweep_id, config_label, prompt_id),
        ).fetchone()
        return json.loads(row[0]) if row is not None and row[0] is not None else None

