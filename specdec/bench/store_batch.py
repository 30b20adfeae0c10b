"""The tables of the former batch harness (``batch_sweeps``, ``batch_runs``, ``batch_calibration``:
`specdec.bench.store_schema.BATCH_TABLES`) in an open `specdec.bench.store.Store`: what its published stores
(results/batch_*.db) need to stay mergeable (`BatchTables.merge_from`, ``specdec merge``); the report and
``specdec export`` read them with SQL. Nothing writes new batch runs there: a sweep's batch axis is in
``runs`` (``batch_size`` > 1).
"""

from __future__ import annotations

from collections.abc import Mapping

from specdec.bench.store_schema import columns

__all__ = ["BatchTables"]

#: Columns of ``batch_runs`` a caller fills (``run_id`` is assigned by SQLite).
BATCH_RUN_COLUMNS: tuple[str, ...] = columns("batch_runs")[1:]


class BatchTables:
    """The batch tables of an open `specdec.bench.store.Store` (``store.conn``, ``store.transaction``).

    Args:
        store: the open store (a read-only store can be a merge's source).
    """

    def __init__(self, store) -> None:
        self.store = store

    @property
    def conn(self):
        return self.store.conn

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
