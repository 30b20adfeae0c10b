"""Export every run of a results store, joined with its sweep's row, to CSV, JSON Lines or Parquet
(``specdec export``)."""

from __future__ import annotations

import contextlib
import csv
import json
import os
from pathlib import Path

from specdec.bench.store import Store, StoreError, columns
from specdec.paths import check_output

__all__ = ["EXPORT_FORMATS", "export_runs"]

#: Columns the sweep's row contributes to each exported run (prefixed with ``sweep_``).
_SWEEP_EXPORT = columns("sweeps")[1:]

EXPORT_FORMATS = ("csv", "jsonl", "parquet")


def _export_rows(store: Store, sweep_id: str | None) -> list[dict]:
    sweep_cols = ", ".join(f"s.{c} AS sweep_{c}" for c in _SWEEP_EXPORT)
    sql = f"SELECT r.*, {sweep_cols} FROM runs r LEFT JOIN sweeps s ON s.sweep_id = r.sweep_id"
    params: tuple = ()
    if sweep_id is not None:
        sql += " WHERE r.sweep_id = ?"
        params = (sweep_id,)
    sql += " ORDER BY r.run_id"
    return [dict(r) for r in store.conn.execute(sql, params).fetchall()]


def export_runs(db: str | Path, fmt: str, out: str | Path, *, sweep_id: str | None = None,
                force: bool = False) -> int:
    """Write every run (or one sweep's), joined with its sweep's row, to `out`; return the row count.

    Columns: all ``runs`` columns (``token_ids`` stays a JSON string) plus ``sweep_name``,
    ``sweep_config_json``, ``sweep_created_at``, ``sweep_git_commit``, ``sweep_machine_json``,
    ``sweep_status``.

    Args:
        db: an existing results database.
        fmt: ``"csv"``, ``"jsonl"`` (one object per line) or ``"parquet"`` (needs pyarrow).
        out: output file (parent directories are created); written to a temporary file beside it and
            renamed, so a failed export leaves any earlier file as it was.
        sweep_id: only this sweep's runs.
        force: overwrite an existing `out` (never a SQLite store, never `db`: `specdec.paths`).

    Raises:
        StoreError: `db` does not exist, is not a results database or is damaged; unknown `sweep_id`.
        ValueError: unknown format, parquet without pyarrow installed, or `out` refused by
            `specdec.paths.check_output` (it is `db`, a store, or exists without `force`).
    """
    fmt = fmt.lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if not Path(db).is_file():
        raise StoreError(f"{db}: no such results database")
    out = check_output(out, inputs=[db], force=force)
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                "parquet export needs pyarrow: pip install 'specdec[parquet]' (or use --format csv/jsonl)"
            ) from None
    with Store(db, readonly=True) as store:
        if sweep_id is not None and store.get_sweep(sweep_id) is None:
            raise StoreError(f"{db}: no sweep {sweep_id!r}; sweeps there: {store.describe_sweeps()}")
        rows = _export_rows(store, sweep_id)
        decl = {r[1]: (r[2] or "TEXT").upper() for r in store.conn.execute("PRAGMA table_info(runs)")}
    columns = list(decl) + [f"sweep_{c}" for c in _SWEEP_EXPORT]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        if fmt == "csv":
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                writer = csv.DictWriter(fh, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
        elif fmt == "jsonl":
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
        else:
            # An explicit schema from the SQLite declarations, so an all-NULL column still gets its type.
            types = {"INTEGER": pa.int64(), "REAL": pa.float64(), "TEXT": pa.string()}
            schema = pa.schema([(c, types.get(decl.get(c, "TEXT"), pa.string())) for c in columns])
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(tmp))
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return len(rows)
