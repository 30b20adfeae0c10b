"""Export every run of a results store, of every kind, joined with its sweep's row, to CSV, JSON Lines or
Parquet (``specdec export``).

A store holds two kinds of run: single-sequence runs and batched runs. ``specdec sweep`` writes both to
``runs`` (a batched run of B prompts as B rows, ``batch_size`` > 1); the former batch harness wrote one row
per batched run to ``batch_runs`` (its published stores). All go into ONE table, told apart by its first
column ``kind`` (``single``, or ``batch`` for a row of a batched run of either table): the columns are
``kind``, every ``runs`` column, the columns only a ``batch_runs`` row has (`BATCH_ONLY`: ``group_name``,
``batch_idx``, ``seq``, ``prompt_ids``, ...; NULL on ``runs`` rows) and the sweep's row (``sweep_*``, from
``sweeps`` or ``batch_sweeps``). The columns do not depend on what the store holds, so exports of different
stores concatenate. ``run_id`` is numbered per table: ``(kind, run_id)`` names a row of ``batch_runs``,
``run_id`` alone one of ``runs``. After the ``runs`` columns come the run's acceptance record in the serving
engines' shape (`ACCEPTANCE`: ``num_drafts``, ``mean_acceptance_length`` and, as JSON lists,
``acceptance_histogram`` and ``accepted_per_position``; `specdec.core.metrics.acceptance_record`), built from its
rounds (NULL for a run without stored rounds: peers, batched rows, failed runs).
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from pathlib import Path
from typing import Self

from specdec.bench.store import Store, StoreError, columns
from specdec.bench.store_schema import BATCH_TABLES, TABLES
from specdec.core.metrics import RoundRecord, acceptance_record
from specdec.paths import check_output

__all__ = ["ACCEPTANCE", "BATCH_ONLY", "EXPORT_FORMATS", "ExportedRuns", "export_columns", "export_runs"]

#: Columns the sweep's row contributes to each exported run (prefixed with ``sweep_``).
_SWEEP_EXPORT = columns("sweeps")[1:]
#: Columns of ``batch_runs`` that ``runs`` lacks, exported after the ``runs`` columns.
BATCH_ONLY: tuple[str, ...] = tuple(c for c in columns("batch_runs") if c not in columns("runs"))
#: The acceptance record's columns (`specdec.core.metrics.acceptance_record`) and their declared types.
ACCEPTANCE = {"num_drafts": "INTEGER", "mean_acceptance_length": "REAL", "acceptance_histogram": "TEXT",
              "accepted_per_position": "TEXT"}
#: Each table of runs and its sweeps table, by the kind of its rows, in export order.
_KINDS = {"single": ("runs", "sweeps"), "batch": ("batch_runs", "batch_sweeps")}

EXPORT_FORMATS = ("csv", "jsonl", "parquet")


class ExportedRuns(int):
    """The number of runs written (an int), with ``by_kind``: ``{"single": n, "batch": m}``."""

    by_kind: dict[str, int]

    def __new__(cls, by_kind: dict[str, int]) -> Self:
        self = super().__new__(cls, sum(by_kind.values()))
        self.by_kind = dict(by_kind)
        return self


def export_columns() -> list[str]:
    """The exported columns, in order (the same for every store): ``kind``, the ``runs`` columns,
    `BATCH_ONLY`, ``sweep_*``."""
    return ["kind", *columns("runs"), *ACCEPTANCE, *BATCH_ONLY, *(f"sweep_{c}" for c in _SWEEP_EXPORT)]


def _declared_types() -> dict[str, str]:
    """Column -> SQLite declared type (INTEGER, REAL, TEXT) over both kinds' tables."""
    decl = {"kind": "TEXT", **ACCEPTANCE}
    for table in ("runs", "batch_runs"):
        for name, spec in {**TABLES, **BATCH_TABLES}[table]:
            decl.setdefault(name, spec.split()[0].upper())
    for name, spec in TABLES["sweeps"][1:]:
        decl[f"sweep_{name}"] = spec.split()[0].upper()
    return decl


def _kind_rows(store: Store, kind: str, sweep_id: str | None) -> list[dict]:
    """The rows of one table of runs (`_KINDS`) joined with their sweep's row (a column the store's tables lack
    is NULL), each with its kind."""
    runs, sweeps = _KINDS[kind]
    have = {r[1] for r in store.conn.execute(f"PRAGMA table_info({sweeps})")}
    sweep_cols = ", ".join(f"s.{c} AS sweep_{c}" if c in have else f"NULL AS sweep_{c}" for c in _SWEEP_EXPORT)
    sql = f"SELECT r.*, {sweep_cols} FROM {runs} r LEFT JOIN {sweeps} s ON s.sweep_id = r.sweep_id"
    params: tuple = ()
    if sweep_id is not None:
        sql += " WHERE r.sweep_id = ?"
        params = (sweep_id,)
    sql += " ORDER BY r.run_id"
    rows = [dict(r) for r in store.conn.execute(sql, params).fetchall()]
    if runs == "runs":
        _add_acceptance(store, rows)
    return [{"kind": "batch" if (r.get("batch_size") or 1) > 1 else kind, **r} for r in rows]


def _add_acceptance(store: Store, rows: list[dict]) -> None:
    """Each run's `ACCEPTANCE` columns, from its stored rounds (runs without rounds keep them NULL)."""
    rounds: dict[int, list[RoundRecord]] = {}
    incomplete: set[int] = set()  # a round without its counts (a damaged row): no record for that run
    for run_id, k, acc, kind, emitted in store.conn.execute(
            "SELECT run_id, k, num_accepted, next_kind, num_emitted FROM rounds ORDER BY run_id, round_idx"):
        if None in (k, acc, emitted):
            incomplete.add(run_id)
            continue
        rounds.setdefault(run_id, []).append(RoundRecord(int(k), int(acc), (), kind, int(emitted)))
    for r in rows:
        if r["run_id"] in rounds and r["run_id"] not in incomplete:
            rec = acceptance_record(rounds[r["run_id"]])
            r.update(num_drafts=rec["num_drafts"], mean_acceptance_length=rec["mean_acceptance_length"],
                     acceptance_histogram=json.dumps(rec["acceptance_histogram"]),
                     accepted_per_position=json.dumps(rec["accepted_per_position"]))


def _sweep_ids(store: Store) -> dict[str, list[str]]:
    return {kind: [r[0] for r in store.conn.execute(f"SELECT sweep_id FROM {sweeps} ORDER BY sweep_id")]
            for kind, (_, sweeps) in _KINDS.items()}


def export_runs(db: str | Path, fmt: str, out: str | Path, *, sweep_id: str | None = None,
                force: bool = False) -> ExportedRuns:
    """Write every run of every kind (or one sweep's), joined with its sweep's row, to `out`; return the
    number of rows written (`ExportedRuns`: an int with its count per kind).

    Columns: `export_columns` (see the module; ``token_ids`` and ``prompt_ids`` stay JSON strings).
    The rows of ``runs`` come first, then those of ``batch_runs``, each in run order.

    Args:
        db: an existing results database.
        fmt: ``"csv"``, ``"jsonl"`` (one object per line) or ``"parquet"`` (needs pyarrow).
        out: output file (parent directories are created); written to a temporary file beside it and
            renamed, so a failed export leaves any earlier file as it was.
        sweep_id: only this sweep's runs (a single-sequence or a batch sweep).
        force: overwrite an existing `out` (never a SQLite store, never `db`: `specdec.paths`).

    Raises:
        StoreError: `db` does not exist, is a directory, is not a results database or is damaged; unknown
            `sweep_id`; no run to export (a header-only file would pass for a result: nothing is written).
        ValueError: unknown format, parquet without pyarrow installed, or `out` refused by
            `specdec.paths.check_output` (it is `db`, a store, or exists without `force`).
    """
    fmt = fmt.lower()
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if Path(db).is_dir():
        raise StoreError(f"{db}: is a directory, not a results store; name the store's file")
    if not Path(db).is_file():
        raise StoreError(f"{db}: no such results database")
    out = check_output(out, inputs=[db], force=force)
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ValueError(
                "parquet export needs pyarrow: pip install 'specdec[parquet]' (or use --format csv/jsonl)"
            ) from None
    with Store(db, readonly=True) as store:
        ids = _sweep_ids(store)
        if sweep_id is not None and not any(sweep_id in v for v in ids.values()):
            raise StoreError(f"{db}: no sweep {sweep_id!r}; sweeps there: {store.describe_sweeps()}; batch sweeps "
                             f"there: {', '.join(ids['batch']) or 'none'}")
        found = [r for table in _KINDS for r in _kind_rows(store, table, sweep_id)]
    if not found:
        what = f"sweep {sweep_id} has" if sweep_id is not None else f"{db} holds"
        raise StoreError(f"{what} no runs (single-sequence or batched) yet: nothing to export, no file written")
    cols = export_columns()
    _write(out, fmt, cols, [{c: r.get(c) for c in cols} for r in found])
    return ExportedRuns({kind: sum(r["kind"] == kind for r in found) for kind in _KINDS})


def _write(out: Path, fmt: str, cols: list[str], rows: list[dict]) -> None:
    """Write `rows` to `out` through a temporary sibling renamed into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        if fmt == "csv":
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                writer = csv.DictWriter(fh, fieldnames=cols)
                writer.writeheader()
                writer.writerows(rows)
        elif fmt == "jsonl":
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            # An explicit schema from the SQLite declarations, so an all-NULL column still gets its type.
            types = {"INTEGER": pa.int64(), "REAL": pa.float64(), "TEXT": pa.string()}
            decl = _declared_types()
            schema = pa.schema([(c, types.get(decl.get(c, "TEXT"), pa.string())) for c in cols])
            pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(tmp))
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
