"""The batch sweep's part of a results store: its sweeps, timed batched runs and batched calibration
(tables `specdec.bench.store_schema.BATCH_TABLES`), read and written through an open
`specdec.bench.store.Store`, so a batch sweep gets the store's safety: the checks made on opening, every
write in ONE transaction (a killed sweep loses at most the run in flight), and a resume that skips the
cells already stored. `BatchTables.merge_from` unions another store's batched runs into these
(``specdec merge``, `specdec.bench.merge`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from specdec.bench import machines as _machines
from specdec.bench.store_access import SweepExistsError, SweepNotFoundError
from specdec.bench.store_schema import _clean, _now, canonical_json, columns

__all__ = ["BatchTables", "batch_cell_key"]

#: Columns of ``batch_runs`` a caller fills (``run_id`` is assigned by SQLite).
BATCH_RUN_COLUMNS: tuple[str, ...] = columns("batch_runs")[1:]


def batch_cell_key(sweep_id: str, config_label: str, group: str, batch_size: int, batch_idx: int, seq: int,
                   method: str, policy: str | None) -> str:
    """The unique key of one timed batched run:
    ``sweep_id|config_label|group|B|batch|seq|method|policy`` (``-`` for no policy)."""
    return "|".join(str(p) for p in (sweep_id, config_label, group, batch_size, batch_idx, seq, method,
                                     policy if policy is not None else "-"))


class BatchTables:
    """The batch tables of an open `specdec.bench.store.Store` (``store.conn``, ``store.transaction``).

    Args:
        store: the open store (read-only stores can be read, not written).
    """

    def __init__(self, store) -> None:
        self.store = store
        self.machine_id: str | None = None

    @property
    def conn(self):
        return self.store.conn

    def check_resume(self, sweep_id: str, *, resume: bool) -> None:
        """Refuse what `begin` refuses, without writing.

        Raises:
            SweepExistsError: not `resume` and the batch sweep already has runs.
            SweepNotFoundError: `resume`, the store holds other batch sweeps and none with id `sweep_id`.
        """
        row = self.conn.execute("SELECT 1 FROM batch_sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()
        n = self.count_runs(sweep_id)
        if resume and row is None and self.conn.execute("SELECT 1 FROM batch_sweeps LIMIT 1").fetchone():
            ids = ", ".join(r[0] for r in self.conn.execute("SELECT sweep_id FROM batch_sweeps"))
            raise SweepNotFoundError(f"--resume: {self.store.path} holds no batch sweep with these settings (id "
                                     f"{sweep_id}; batch sweeps there: {ids}); rerun with the same settings, or "
                                     "drop --resume to start a new one")
        if n and not resume:
            raise SweepExistsError(f"{self.store.path} already holds {n} runs of this batch sweep (id {sweep_id}); "
                                   "pass --resume to continue it, or --db NEW.db to start afresh")

    def begin(self, sweep_id: str, config: Mapping[str, Any], *, resume: bool,
              machine: Mapping[str, Any] | None = None, git_commit: str | None = None) -> None:
        """Create or reopen the batch sweep `sweep_id` (status ``running``) and register this machine
        (``self.machine_id``); raises what `check_resume` raises."""
        with self.store.transaction():
            self.machine_id = _machines.register_machine(self.conn, machine)
            self.check_resume(sweep_id, resume=resume)
            self.conn.execute(
                "INSERT OR IGNORE INTO batch_sweeps (sweep_id, config_json, created_at, git_commit, machine_json, "
                "status) VALUES (?, ?, ?, ?, ?, 'running')",
                (sweep_id, canonical_json(config), _now(), git_commit,
                 json.dumps(machine, sort_keys=True, default=str) if machine is not None else None))
            self.conn.execute("UPDATE batch_sweeps SET status = 'running' WHERE sweep_id = ?", (sweep_id,))

    def set_status(self, sweep_id: str, status: str) -> None:
        """``running``, ``done`` or ``interrupted``.

        Raises:
            ValueError: another status.
        """
        if status not in ("running", "done", "interrupted"):
            raise ValueError(f"unknown sweep status {status!r}")
        with self.store.transaction():
            self.conn.execute("UPDATE batch_sweeps SET status = ? WHERE sweep_id = ?", (status, sweep_id))

    def count_runs(self, sweep_id: str) -> int:
        """Runs (failed ones included) of the batch sweep."""
        return int(self.conn.execute("SELECT COUNT(*) FROM batch_runs WHERE sweep_id = ?", (sweep_id,)).fetchone()[0])

    def done_cells(self, sweep_id: str) -> set[str]:
        """``cell_key`` of every successful run of the batch sweep (failed runs are retried on resume)."""
        rows = self.conn.execute("SELECT cell_key FROM batch_runs WHERE sweep_id = ? AND error IS NULL",
                                 (sweep_id,)).fetchall()
        return {r[0] for r in rows}

    def record_run(self, row: Mapping[str, Any]) -> int:
        """Insert (or replace a failed) run in ONE transaction; return its ``run_id``.

        Raises:
            ValueError: a column not in ``batch_runs``.
        """
        bad = sorted(set(row) - set(BATCH_RUN_COLUMNS))
        if bad:
            raise ValueError(f"unknown batch_runs column(s): {', '.join(bad)}")
        data = {c: _clean(row.get(c)) for c in BATCH_RUN_COLUMNS}
        data["created_at"] = data["created_at"] or _now()
        data["machine_id"] = data["machine_id"] or self.machine_id
        with self.store.transaction():
            self.conn.execute("DELETE FROM batch_runs WHERE cell_key = ? AND error IS NOT NULL", (data["cell_key"],))
            cur = self.conn.execute(
                f"INSERT INTO batch_runs ({', '.join(data)}) VALUES ({', '.join('?' * len(data))})",
                tuple(data.values()))
            return int(cur.lastrowid)

    def runs(self, sweep_id: str | None = None, **where: Any) -> list[dict]:
        """``batch_runs`` rows as dicts (``prompt_ids`` and ``token_ids`` decoded), in run order."""
        clauses, params = [], []
        if sweep_id is not None:
            clauses.append("sweep_id = ?")
            params.append(sweep_id)
        for k, v in where.items():
            if k not in BATCH_RUN_COLUMNS:
                raise ValueError(f"unknown batch_runs column {k!r}")
            clauses.append(f"{k} = ?")
            params.append(v)
        sql = "SELECT * FROM batch_runs" + (" WHERE " + " AND ".join(clauses) if clauses else "") + " ORDER BY run_id"
        out = []
        for r in self.conn.execute(sql, params).fetchall():
            d = dict(r)
            for c in ("prompt_ids", "token_ids"):
                d[c] = None if d[c] is None else json.loads(d[c])
            out.append(d)
        return out

    def save_calibration(self, sweep_id: str, config_label: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Store (replace) calibration points of this machine, each with ``role``, ``batch_size``,
        ``n_tokens``, ``context_tokens``, ``seconds``, ``repeats``, ``spread_s``; one transaction."""
        with self.store.transaction():
            for r in rows:
                self.conn.execute(
                    "INSERT OR REPLACE INTO batch_calibration VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (sweep_id, config_label, self.machine_id or "", r["role"], int(r["batch_size"]),
                     int(r["n_tokens"]), r.get("context_tokens"), float(r["seconds"]), r.get("repeats"),
                     r.get("spread_s")))

    def calibration(self, sweep_id: str, config_label: str) -> list[dict]:
        """This machine's calibration points of the configuration (empty when none)."""
        rows = self.conn.execute(
            "SELECT * FROM batch_calibration WHERE sweep_id = ? AND config_label = ? AND machine_id = ? "
            "ORDER BY role, batch_size, n_tokens", (sweep_id, config_label, self.machine_id or "")).fetchall()
        return [dict(r) for r in rows]

    def merge_from(self, src: BatchTables, legacy: Mapping[str, str | None]) -> tuple[int, int, int]:
        """Union the batched runs and calibration of `src` (another store's tables, read only) into these,
        by the rules of `specdec.bench.merge` for single-sequence runs: a run is keyed by ``cell_key``; one
        already here is kept (a duplicate) unless it failed and `src`'s succeeded (replaced); the others are
        added in `src`'s run order. A run without ``machine_id`` gets its batch sweep's (`legacy`: sweep id ->
        machine id). Calibration points are kept as first merged (per machine). One transaction.

        Returns:
            ``(added, duplicates, replaced)``.
        """
        have = {key: bool(ok) for key, ok in self.conn.execute("SELECT cell_key, error IS NULL FROM batch_runs")}
        added = duplicates = replaced = 0
        with self.store.transaction():
            for row in src.conn.execute("SELECT * FROM batch_runs ORDER BY run_id"):
                # by name: an older store may lack a column (NULL here)
                data = {c: v for c, v in dict(row).items() if c in BATCH_RUN_COLUMNS}
                key, ok = data["cell_key"], data.get("error") is None
                if key in have:
                    if have[key] or not ok:
                        duplicates += 1
                        continue
                    replaced += 1
                    self.conn.execute("DELETE FROM batch_runs WHERE cell_key = ?", (key,))
                if data.get("machine_id") is None:
                    data["machine_id"] = legacy.get(data.get("sweep_id"))
                self.conn.execute(f"INSERT INTO batch_runs ({', '.join(data)}) VALUES ({', '.join('?' * len(data))})",
                                  tuple(data.values()))
                have[key] = ok
                added += 1
            for row in src.conn.execute("SELECT * FROM batch_calibration"):
                point = dict(row)
                self.conn.execute(f"INSERT OR IGNORE INTO batch_calibration ({', '.join(point)}) VALUES "
                                  f"({', '.join('?' * len(point))})", tuple(point.values()))
        return added, duplicates, replaced
