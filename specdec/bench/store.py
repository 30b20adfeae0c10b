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

import contextlib
import hashlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from specdec.bench import machines as _machines  # per-run machine record (specdec/bench/machines.py)

__all__ = [
    "ROUND_COLUMNS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "TABLES",
    "Store",
    "StoreError",
    "SweepExistsError",
    "SweepNotFoundError",
    "canonical_json",
    "cell_key",
    "columns",
    "sweep_id_for",
]

SCHEMA_VERSION = "1"

#: The schema, declared once: table -> ((column, SQL type and constraints), ...). `_SCHEMA` (the SQL),
#: `RUN_COLUMNS`, `ROUND_COLUMNS` and `columns` derive from it; docs/STORE.md documents every column.
TABLES: dict[str, tuple[tuple[str, str], ...]] = {
    "meta": (("key", "TEXT PRIMARY KEY"), ("value", "TEXT")),
    "sweeps": (
        ("sweep_id", "TEXT PRIMARY KEY"), ("name", "TEXT"), ("config_json", "TEXT NOT NULL"),
        ("created_at", "TEXT"), ("git_commit", "TEXT"), ("machine_json", "TEXT"), ("status", "TEXT"),
    ),
    "runs": (
        ("run_id", "INTEGER PRIMARY KEY"), ("sweep_id", "TEXT REFERENCES sweeps(sweep_id)"),
        ("cell_key", "TEXT NOT NULL UNIQUE"), ("config_label", "TEXT"),
        ("pair", "TEXT"), ("target", "TEXT"), ("draft", "TEXT"),
        ("target_backend", "TEXT"), ("draft_backend", "TEXT"), ("compiled", "INTEGER"),
        ("device", "TEXT"), ("dtype", "TEXT"), ("threads", "INTEGER"),
        ("prompt_id", "TEXT"), ("prompt_type", "TEXT"), ("chat_template", "INTEGER"), ("prompt_tokens", "INTEGER"),
        ("method", "TEXT"), ("policy", "TEXT"), ("k", "INTEGER"), ("repeat", "INTEGER"), ("seed", "INTEGER"),
        ("temperature", "REAL"), ("top_k", "INTEGER"), ("top_p", "REAL"), ("max_new_tokens", "INTEGER"),
        ("new_tokens", "INTEGER"), ("finish_reason", "TEXT"), ("token_ids", "TEXT"), ("matches_baseline", "INTEGER"),
        ("num_rounds", "INTEGER"), ("num_drafted", "INTEGER"), ("num_accepted", "INTEGER"),
        ("num_rejections", "INTEGER"),
        ("prefill_s", "REAL"), ("ttft_s", "REAL"), ("decode_s", "REAL"), ("total_s", "REAL"), ("draft_s", "REAL"),
        ("verify_s", "REAL"), ("tokens_per_s", "REAL"),
        ("error", "TEXT"), ("created_at", "TEXT"),
        # the machine that timed the run (`specdec.bench.machines`; added by ALTER TABLE to older stores)
        ("machine_id", "TEXT"),
        # greedy runs that differ from the baseline: the first output position where they differ
        ("first_divergence", "INTEGER"),
    ),
    "rounds": (
        ("run_id", "INTEGER REFERENCES runs(run_id)"), ("round_idx", "INTEGER"),
        ("k", "INTEGER"), ("k_requested", "INTEGER"), ("num_accepted", "INTEGER"), ("accept_flags", "TEXT"),
        ("next_kind", "TEXT"), ("num_emitted", "INTEGER"), ("draft_s", "REAL"), ("verify_s", "REAL"),
        ("other_s", "REAL"), ("alpha_estimate", "REAL"),
        # the target forward alone, inside verify_s; its token count when padded to a cheaper shape (added
        # by ALTER TABLE to older stores)
        ("forward_s", "REAL"), ("n_forward", "INTEGER"),
    ),
    "costs": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("role", "TEXT"), ("n_tokens", "INTEGER"),
        ("seconds", "REAL"), ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
    # Machines (`specdec.bench.machines`): each machine's fingerprint, its own cost curve, and which shard of
    # a sweep ran where (stores from before sharding get these tables when opened).
    "machines": (("machine_id", "TEXT PRIMARY KEY"), ("machine_json", "TEXT")),
    "machine_costs": (
        ("sweep_id", "TEXT"), ("machine_id", "TEXT"), ("config_label", "TEXT"), ("role", "TEXT"),
        ("n_tokens", "INTEGER"), ("seconds", "REAL"), ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
    "shards": (("sweep_id", "TEXT"), ("shard", "TEXT"), ("machine_id", "TEXT"), ("started_at", "TEXT")),
    # Acceptance traces (`specdec.traces`): per prompt, the target-only greedy output and, per output position,
    # the draft's teacher-forced greedy token and the target's own top-2 margin; every fixed K and policy of
    # both drafters is replayed from it (JSON lists; one row per sweep, config, prompt and machine).
    "traces": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("prompt_id", "TEXT"), ("machine_id", "TEXT"),
        ("run_id", "INTEGER"), ("max_new_tokens", "INTEGER"), ("draft_context", "INTEGER"),
        ("prompt_ids", "TEXT"), ("target_ids", "TEXT"), ("draft_ids", "TEXT"), ("draft_top_prob", "TEXT"),
        ("target_margin", "TEXT"), ("target_tf_ids", "TEXT"), ("created_at", "TEXT"),
    ),
    # Calibration blocks: target forwards of n = 1..17 tokens (and the draft step) timed at a prompt's own
    # context right after one of its target-only runs (`after_run_id`), median and IQR over `repeats`.
    "calibration": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("prompt_id", "TEXT"), ("machine_id", "TEXT"),
        ("after_run_id", "INTEGER"), ("role", "TEXT"), ("n_tokens", "INTEGER"), ("context_tokens", "INTEGER"),
        ("seconds", "REAL"), ("repeats", "INTEGER"), ("spread_s", "REAL"),
    ),
    # The roofline inputs per configuration and machine (`specdec.roofline`): bytes of weights a target step
    # and a draft step read, and the machine's memory bandwidth by a streaming copy (GB/s = 1e9 bytes/s).
    "roofline": (
        ("sweep_id", "TEXT"), ("config_label", "TEXT"), ("machine_id", "TEXT"), ("target_weight_bytes", "INTEGER"),
        ("draft_weight_bytes", "INTEGER"), ("bandwidth_gbps", "REAL"), ("bandwidth_json", "TEXT"),
    ),
}  # fmt: skip
#: Table-level constraints and indexes (not columns).
_CONSTRAINTS = {
    "rounds": "PRIMARY KEY (run_id, round_idx)",
    "costs": "PRIMARY KEY (sweep_id, config_label, role, n_tokens)",
    "machine_costs": "PRIMARY KEY (sweep_id, machine_id, config_label, role, n_tokens)",
    "shards": "PRIMARY KEY (sweep_id, shard, machine_id)",
    "traces": "PRIMARY KEY (sweep_id, config_label, prompt_id, machine_id)",
    "calibration": "PRIMARY KEY (sweep_id, config_label, prompt_id, machine_id, after_run_id, role, n_tokens)",
    "roofline": "PRIMARY KEY (sweep_id, config_label, machine_id)",
}
_INDEXES = ("CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep_id, config_label, prompt_id, method)",)


def columns(table: str) -> tuple[str, ...]:
    """Every column of `table` in the store, in table order (``run_id`` included for runs/rounds).

    Raises:
        KeyError: an unknown table (see `TABLES`).
    """
    return tuple(name for name, _ in TABLES[table])


def _create_statements() -> list[str]:
    out = []
    for table, cols in TABLES.items():
        parts = [f"{name} {decl}" for name, decl in cols]
        if table in _CONSTRAINTS:
            parts.append(_CONSTRAINTS[table])
        out.append(f"CREATE TABLE IF NOT EXISTS {table} (\n    " + ",\n    ".join(parts) + "\n)")
    return out + list(_INDEXES)


_SCHEMA = ";\n".join(_create_statements()) + ";\n"

#: Columns of ``runs`` that a caller fills (``run_id`` is assigned by SQLite).
RUN_COLUMNS: tuple[str, ...] = columns("runs")[1:]
#: Columns of ``rounds`` that a caller fills (``run_id`` is the run's).
ROUND_COLUMNS: tuple[str, ...] = columns("rounds")[1:]


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """ALTER TABLE ... ADD COLUMN every column of `TABLES` that an older store's table lacks (NULL in its old
    rows; call inside a transaction, after the CREATE TABLE IF NOT EXISTS statements)."""
    for table, cols in TABLES.items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        for name, decl in cols:
            if name not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl.split()[0]}")


class StoreError(ValueError):
    """A results-store problem meant for the user (one-line message)."""


class SweepExistsError(StoreError):
    """The sweep already has runs in this database and ``--resume`` was not given."""


class SweepNotFoundError(StoreError):
    """``--resume`` was given but this database holds no sweep with this configuration."""


class StoreBusyError(StoreError):
    """Another process kept this results store locked for longer than we were willing to wait (case C23)."""

    def __init__(self, path: Path | str, waited_s: float, holder: str = "") -> None:
        who = f" ({holder})" if holder else ""
        super().__init__(f"{path}: another process{who} is writing this results store (waited {waited_s:.0f} s); "
                         "wait for it to finish, or use another --db")


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


@contextmanager
def writer_lock(db: str | Path, *, wait_s: float = 10.0, poll_s: float = 0.2) -> Iterator[None]:
    """Hold the one-writer lock of a results store: an OS advisory lock (``flock``) on ``<db>.lock``, which
    also records the holder's pid. A sweep holds it from start to end, so a second sweep on the same store
    waits up to `wait_s` seconds and then stops with `StoreBusyError` instead of interleaving its runs
    (readers such as ``specdec report`` never take it). Released when the process ends, even if killed.

    Raises:
        StoreBusyError: the lock was held for all of `wait_s`.
    """
    import fcntl  # POSIX; the store's users run on Linux and macOS

    path = Path(f"{db}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - t0 >= wait_s:
                    f.seek(0)
                    holder = f.read().strip()
                    raise StoreBusyError(db, time.monotonic() - t0, holder) from None
                time.sleep(poll_s)
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


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
        busy_wait_s: how long to keep retrying while another process holds the database locked.

    Raises:
        StoreError: the file is not a SQLite database, or was written by another schema version.
        StoreBusyError: another process kept it locked for `busy_wait_s` seconds.
    """

    def __init__(self, path: str | Path, *, busy_wait_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
                    raise StoreError(f"{self.path}: not a specdec results database ({exc})") from None
                if time.monotonic() - t0 >= busy_wait_s:
                    raise StoreBusyError(self.path, time.monotonic() - t0) from None
                time.sleep(0.2)

    def _open(self) -> None:
        try:
            self.conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=self._busy_timeout_s)
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
                _add_missing_columns(self.conn)  # stores written before a column existed
        except sqlite3.OperationalError:
            raise  # the caller tells a busy store from a broken one
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
            values["machine_id"] = self.machine_id  # the machine that timed the run
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

    # ------------------------------------------------------------------------- traces and calibration

    def save_trace(self, sweep_id: str, config_label: str, prompt_id: str, run_id: int | None,
                   trace: Any, *, target_margin: Sequence[float] | None = None,
                   target_tf_ids: Sequence[int] | None = None, draft_context: int | None = None) -> None:
        """Store (replace) the acceptance trace of one prompt on this machine (`specdec.traces.AcceptanceTrace`).

        Args:
            run_id: the target-only run the trace was taken from. target_margin: ``[T]`` the target's
                top-1 minus top-2 probability at each output position (teacher forced); target_tf_ids: ``[T]``
                the target's teacher-forced argmax (it can differ from the incremental run's token at a
                near-tie). draft_context: the draft model's context length (it clamps K in a replay).
        """
        def js(x):
            return None if x is None else json.dumps(list(x))

        with self.transaction():
            self.conn.execute(
                "INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sweep_id, config_label, prompt_id, self.machine_id or "", run_id, trace.max_new_tokens,
                 draft_context, js(trace.prompt_ids), js(trace.target_ids), js(trace.draft_ids),
                 js(trace.draft_top_prob), js(target_margin), js(target_tf_ids), _now()))

    def traces(self, sweep_id: str | None = None) -> list[dict]:
        """Rows of ``traces`` (JSON columns decoded to lists), optionally of one sweep."""
        sql = "SELECT * FROM traces" + (" WHERE sweep_id = ?" if sweep_id else "") + " ORDER BY rowid"
        out = []
        for r in self.conn.execute(sql, (sweep_id,) if sweep_id else ()).fetchall():
            d = dict(r)
            for c in ("prompt_ids", "target_ids", "draft_ids", "draft_top_prob", "target_margin", "target_tf_ids"):
                d[c] = None if d[c] is None else json.loads(d[c])
            out.append(d)
        return out

    def has_trace(self, sweep_id: str, config_label: str, prompt_id: str) -> bool:
        """Whether this machine already stored the trace of this prompt."""
        return self.conn.execute(
            "SELECT 1 FROM traces WHERE sweep_id = ? AND config_label = ? AND prompt_id = ? AND machine_id = ?",
            (sweep_id, config_label, prompt_id, self.machine_id or "")).fetchone() is not None

    def save_calibration(self, sweep_id: str, config_label: str, prompt_id: str, after_run_id: int | None,
                         block: Mapping[str, Any]) -> None:
        """Store one calibration block (`specdec.bench.costs.calibration_block`'s dict: ``context_tokens``,
        ``repeats``, ``target_forward_s`` / ``target_forward_spread_s`` ``{n: s}``, optional ``draft_step_s`` /
        ``draft_step_spread_s`` and ``draft_forward_s`` / ``draft_forward_spread_s`` ``{n: s}``) timed right
        after run `after_run_id`. Rows: role ``target`` per n; role ``draft`` per n of ``draft_forward_s``,
        or n = 1 alone (the step) for a block without it."""
        ctx, reps = block.get("context_tokens"), block.get("repeats")
        rows = [(sweep_id, config_label, prompt_id, self.machine_id or "", after_run_id, "target", int(n), ctx,
                 _clean(float(s)), reps, _clean(block.get("target_forward_spread_s", {}).get(n)))
                for n, s in block["target_forward_s"].items()]
        if block.get("draft_forward_s"):
            spread = block.get("draft_forward_spread_s") or {}
            rows += [(sweep_id, config_label, prompt_id, self.machine_id or "", after_run_id, "draft", int(n), ctx,
                      _clean(float(s)), block.get("draft_repeats", reps), _clean(spread.get(n)))
                     for n, s in block["draft_forward_s"].items()]
        elif block.get("draft_step_s") is not None:
            rows.append((sweep_id, config_label, prompt_id, self.machine_id or "", after_run_id, "draft", 1, ctx,
                         _clean(float(block["draft_step_s"])), block.get("draft_repeats", reps),
                         _clean(block.get("draft_step_spread_s"))))
        with self.transaction():
            self.conn.executemany("INSERT OR REPLACE INTO calibration VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                  rows)

    def calibration(self, sweep_id: str | None = None) -> list[dict]:
        """Rows of ``calibration`` (one per block, role and n), optionally of one sweep."""
        sql = "SELECT * FROM calibration" + (" WHERE sweep_id = ?" if sweep_id else "") + " ORDER BY rowid"
        return [dict(r) for r in self.conn.execute(sql, (sweep_id,) if sweep_id else ()).fetchall()]

    def save_roofline(self, sweep_id: str, config_label: str, target_weight_bytes: int | None,
                      draft_weight_bytes: int | None, bandwidth: Mapping[str, Any] | None) -> None:
        """Store (replace) the roofline inputs of one configuration on this machine (`specdec.roofline`)."""
        with self.transaction():
            self.conn.execute(
                "INSERT OR REPLACE INTO roofline VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sweep_id, config_label, self.machine_id or "", target_weight_bytes, draft_weight_bytes,
                 _clean(bandwidth.get("gbps")) if bandwidth else None,
                 json.dumps(dict(bandwidth), sort_keys=True) if bandwidth else None))

    def bandwidth_gbps(self) -> float | None:
        """This machine's bandwidth as any sweep of this store measured it (None if never)."""
        row = self.conn.execute("SELECT bandwidth_gbps FROM roofline WHERE machine_id = ? AND bandwidth_gbps IS "
                                "NOT NULL LIMIT 1", (self.machine_id or "",)).fetchone()
        return None if row is None else float(row[0])

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
            if self.machine_id is not None:  # each machine's own curve
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
        rows = _machines.machine_cost_rows(self.conn, sweep_id, config_label, self.machine_id)
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
