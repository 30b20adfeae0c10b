"""Merge shard stores of one sweep into one results store (``specdec merge --out DB SHARD.db ...``).

Shards (``specdec sweep --shard I/N``, or the Ray executor's per-node stores) share the sweep identity
(``sweep_id``, `specdec.bench.sweep.meaning`); merging them gives the store a single machine would have
written, plus the machine of every run:

- the sources must hold the same sweep(s) as each other and as `out` when it exists; another sweep is
  refused with one line naming the file and the settings that differ;
- runs are unioned by ``cell_key`` (cell x repeat): a run present in several sources is kept once, the
  first successful one in the order the sources are given (a successful run replaces a failed one), and
  the number of such duplicates is reported;
- each run keeps its ``machine_id`` (runs from stores that predate it get the machine of their source's
  ``sweeps.machine_json``), ``machines``, ``machine_costs`` (each machine's own cost curve) and ``shards``
  are unioned; ``costs`` keeps the first source's curve per config_label (older readers see one machine);
- the merged ``sweeps.status`` is ``done`` when every source is done, else ``interrupted``;
- a sweep's batched runs are rows of ``runs`` and merge with them; the former batch harness's tables
  (its published stores) follow the same rules: the sources hold the same batch sweep(s), ``batch_runs``
  are unioned by ``cell_key`` (`specdec.bench.store_batch.BatchTables.merge_from`),
  ``batch_calibration`` per machine, and ``batch_sweeps.status`` is merged like ``sweeps.status``. An
  existing `out` holding no sweep of one kind is not compared for that kind: a merge that lacks the batched
  runs gets them added.

Sources are opened read-only (`specdec.bench.store.Store` with ``readonly=True``: nothing is written to a
shard, which may be read-only, damaged or a user's only copy); `out` is checked before anything is read
(not a source, a results store or a new file, writable: one line otherwise). Runs are
written with `Store.record_run` (rounds included) in the sources' run order, so insertion order, which
the report uses to find the baseline nearest in time, is kept within each shard (a prompt never spans
shards).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specdec.bench import machines as M
from specdec.bench.shard import missing_shards
from specdec.bench.store import RUN_COLUMNS, Store, StoreError
from specdec.bench.store_access import check_writable
from specdec.bench.store_batch import BatchTables
from specdec.paths import is_sqlite_file, same_file

__all__ = ["MergeResult", "merge_stores"]


@dataclass
class MergeResult:
    """What `merge_stores` did.

    Attributes:
        out: the merged store. sweep_ids: the sweep(s) merged.
        added: runs written now; duplicates: runs seen again in a later source (kept once);
        replaced: failed runs replaced by a successful one from a later source.
        machines: machine ids in the merged store. shards: ``"I/N"`` values recorded in it.
        missing_shards: shard numbers absent when the recorded shards say there are N.
        status: ``done`` when every merged sweep of either kind is done, else ``interrupted``.
        batch_sweep_ids: the batch sweep(s) merged; batch_added, batch_duplicates, batch_replaced: as
        added, duplicates and replaced, for batched runs.
    """

    out: str
    sweep_ids: list[str]
    added: int = 0
    duplicates: int = 0
    replaced: int = 0
    batch_sweep_ids: list[str] = field(default_factory=list)
    batch_added: int = 0
    batch_duplicates: int = 0
    batch_replaced: int = 0
    machines: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)
    missing_shards: list[str] = field(default_factory=list)
    status: str = "done"


def _flat(config: dict, prefix: str = "") -> dict:
    """`config` with nested objects spread into dotted keys (a batch sweep's ``settings.batches``)."""
    out = {}
    for k, v in config.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _config_diff(a: str | None, b: str | None) -> str:
    """The settings whose values differ between two ``config_json`` strings (``key=A vs B`` ...)."""
    try:
        ca, cb = _flat(json.loads(a or "{}")), _flat(json.loads(b or "{}"))
    except (ValueError, AttributeError):
        return "unreadable configuration"
    keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
    if not keys:
        return "same settings"
    shown = []
    for k in keys[:3]:
        va, vb = ca.get(k), cb.get(k)
        if isinstance(va, list) and isinstance(vb, list):  # e.g. prompts: name what differs, not the prefix
            only_a = [json.dumps(x) for x in va if x not in vb]
            only_b = [json.dumps(x) for x in vb if x not in va]
            shown.append(f"{k}: {len(only_a)} only in the first ({', '.join(only_a)[:60] or '-'}), "
                         f"{len(only_b)} only in the second ({', '.join(only_b)[:60] or '-'})")
        else:
            shown.append(f"{k}={json.dumps(va)[:40]} vs {json.dumps(vb)[:40]}")
    more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
    return ", ".join(shown) + more


#: The kinds of sweep a store holds, each with its table of sweeps and its name in messages.
_KINDS = (("sweeps", "sweep(s)"), ("batch_sweeps", "batch sweep(s)"))


def _sweeps_of(path: Path) -> dict[str, dict[str, dict]]:
    """``{"sweeps": {id: row}, "batch_sweeps": {id: row}}``: the sweeps of each kind that `path` holds."""
    if path.is_dir():
        raise StoreError(f"{path}: is a directory, not a results store; name the store's file")
    if not path.is_file():
        raise StoreError(f"{path}: no such results database")
    with Store(path, readonly=True) as st:
        return {table: {r["sweep_id"]: dict(r) for r in st.conn.execute(
            f"SELECT * FROM {table} ORDER BY created_at, sweep_id")} for table, _ in _KINDS}


def _check_one_sweep(paths: list[Path], found: dict[Path, dict], out: Path) -> None:
    """Refuse sources (and an existing `out`) that do not hold the same sweeps of each kind: one line naming
    the file, the kind and the settings that differ. An `out` holding no sweep of a kind is not compared for
    that kind (a merge made before that kind was carried gets it added)."""
    ref_path = paths[0]
    if not any(found[ref_path].values()):
        raise StoreError(f"{ref_path}: holds no sweep (neither a sweep nor a batch sweep): nothing to merge")
    existing = _sweeps_of(out) if out.is_file() else None
    for table, noun in _KINDS:
        ref = found[ref_path][table]
        checks = [(p, found[p][table]) for p in paths]
        if existing is not None and existing[table]:
            checks.append((out, existing[table]))
        for p, sw in checks:
            if set(sw) == set(ref):
                continue
            extra = sorted(set(sw) - set(ref)) or sorted(set(ref) - set(sw))
            a, b = next(iter(sw.values()), None), next(iter(ref.values()), None)
            why = _config_diff(a["config_json"] if a else None, b["config_json"] if b else None)
            raise StoreError(
                f"merge: {p} holds {noun} {', '.join(sorted(sw)) or 'none'} but {ref_path} holds "
                f"{', '.join(sorted(ref)) or 'none'} (settings {p.name} vs {ref_path.name}: {why}; differing id "
                f"{extra[0]}): only shards of one sweep merge, with the same sweeps of every kind"
            )


def merge_stores(
    out: str | Path, sources: Sequence[str | Path], *, echo: Callable[[str], None] | None = None
) -> MergeResult:
    """Union the runs (single-sequence and batched), rounds, costs, calibration and machine records of shard
    stores `sources` into `out`.

    Args:
        out: the merged store (created if missing; an existing one must hold the same sweeps and is added to,
            so merging again after a shard was resumed is safe). Must not be one of `sources`.
        sources: shard stores (SQLite files written by `specdec sweep`, or the former batch harness), at least one.
        echo: receives one-line notes (duplicates, missing shards); default: none.

    Returns:
        A `MergeResult`.

    Raises:
        StoreError (a ValueError): no sources, a source missing, not a results store or damaged, a source
            holding no sweep of either kind, `out` among the sources, `out` an existing file that is not a
            results store, `out` (or its directory) read-only, or sweep identities (of either kind) that
            differ (one line naming the file and the differing settings).
    """
    say = echo or (lambda _m: None)
    out = Path(out)
    paths = [Path(p) for p in sources]
    if not paths:
        raise StoreError("merge: give at least one shard store")
    if out.exists() and any(same_file(p, out) for p in paths if p.exists()):
        raise StoreError(f"merge: --out {out} is also a source; write the merge to a new file")
    if out.exists() and (not out.is_file() or (out.stat().st_size > 0 and not is_sqlite_file(out))):
        raise StoreError(f"merge: --out {out} exists and is not a results store: it is never overwritten; "
                         f"name a new file or an existing merge")
    check_writable(out)  # a read-only --out: one line before any source is read
    if out.is_file() and out.stat().st_size > 0:
        _sweeps_of(out)  # another program's SQLite database (or a damaged store): one line, before the sources
    found = {p: _sweeps_of(p) for p in paths}
    _check_one_sweep(paths, found, out)
    ref = found[paths[0]]
    result = MergeResult(str(out), sorted(ref["sweeps"]), batch_sweep_ids=sorted(ref["batch_sweeps"]))
    statuses: dict[str, list[str]] = {table: [] for table, _ in _KINDS}
    with Store(out) as dst:
        dst.conn.execute("PRAGMA synchronous=OFF")  # the merge is rebuilt from its sources if it dies
        for table, _ in _KINDS:
            for srow in ref[table].values():
                if not dst.conn.execute(f"SELECT 1 FROM {table} WHERE sweep_id = ?", (srow["sweep_id"],)).fetchone():
                    with dst.transaction():
                        _insert(dst.conn, table, srow)
        for p in paths:
            _merge_one(dst, p, found[p], result, say)
            for table, _ in _KINDS:
                statuses[table] += [s["status"] for s in found[p][table].values()]
        result.machines = [r[0] for r in dst.conn.execute("SELECT machine_id FROM machines ORDER BY 1")]
        result.shards = sorted({r[0] for r in dst.conn.execute("SELECT shard FROM shards")})
        result.missing_shards = missing_shards(result.shards)
        if result.missing_shards:
            say(f"note: shard(s) {', '.join(result.missing_shards)} are not in the merge yet")
            statuses["sweeps"].append("interrupted")
        with dst.transaction():
            for table, _ in _KINDS:
                status = "done" if all(s == "done" for s in statuses[table]) else "interrupted"
                dst.conn.execute(f"UPDATE {table} SET status = ?", (status,))
        dst.conn.execute("PRAGMA synchronous=FULL")
    result.status = "done" if all(s == "done" for v in statuses.values() for s in v) else "interrupted"
    if result.duplicates or result.batch_duplicates:
        say(f"{result.duplicates} run(s) and {result.batch_duplicates} batched run(s) were already in the merge "
            f"(same cell and repeat in another store): kept one of each (the first successful, in the order the "
            f"stores were given)")
    return result


def _merge_one(dst: Store, path: Path, held: dict[str, dict], result: MergeResult, say) -> None:
    """Copy one source's machines, shards, costs, runs and batched runs into `dst`."""
    sweeps = held["sweeps"]
    with Store(path, readonly=True) as src:
        with dst.transaction() as conn:
            for mid, mjson in src.conn.execute("SELECT machine_id, machine_json FROM machines"):
                conn.execute("INSERT OR IGNORE INTO machines VALUES (?, ?)", (mid, mjson))
            # runs from before per-run machines: the machine of their sweep's row
            legacy = {sid: M.register_machine(conn, s["machine_json"]) for sid, s in sweeps.items()}
            batch_legacy = {sid: M.register_machine(conn, s["machine_json"])
                            for sid, s in held["batch_sweeps"].items()}
            held_tables = {r[0] for r in src.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table in ("shards", "machine_costs", "costs", "roofline", "synthetic"):
                for row in src.conn.execute(f"SELECT * FROM {table}") if table in held_tables else ():
                    _insert(conn, table, dict(row))
            if not src.conn.execute("SELECT 1 FROM machine_costs LIMIT 1").fetchone():
                # an old store: its costs were measured on its sweep's machine
                for row in src.conn.execute("SELECT * FROM costs"):
                    mid = legacy.get(row["sweep_id"])
                    if mid is not None:
                        _insert(conn, "machine_costs", {**dict(row), "machine_id": mid})
        _merge_runs(dst, src, path, legacy, result)
        added, duplicates, replaced = BatchTables(dst).merge_from(BatchTables(src), batch_legacy)
        result.batch_added += added
        result.batch_duplicates += duplicates
        result.batch_replaced += replaced


def _merge_runs(dst: Store, src: Store, path: Path, legacy: dict, result: MergeResult) -> None:
    """Union `src`'s single-sequence runs (rounds, traces and calibration blocks with them) into `dst` by
    ``cell_key`` (see the module); a run without a machine gets its sweep's (`legacy`)."""
    have = {r[0]: r[1] for r in dst.conn.execute("SELECT cell_key, error IS NULL FROM runs")}
    new_ids = dict(dst.conn.execute("SELECT cell_key, run_id FROM runs").fetchall())
    old_key = {}
    for run in src.runs():
        old_key[run["run_id"]] = run["cell_key"]
        key = run["cell_key"]
        ok = run["error"] is None
        if key in have:
            if have[key] or not ok:
                result.duplicates += 1
                continue
            result.replaced += 1
        row = {c: run.get(c) for c in RUN_COLUMNS}
        if row["machine_id"] is None:
            row["machine_id"] = legacy.get(run["sweep_id"])
        rounds = src.rounds_of(run["run_id"])
        try:
            dst.record_run(row, rounds)
        except sqlite3.DatabaseError as exc:  # pragma: no cover - disk full and the like
            raise StoreError(f"merge: writing {key} from {path} failed: {exc}") from None
        new_ids[key] = dst.conn.execute("SELECT run_id FROM runs WHERE cell_key = ?", (key,)).fetchone()[0]
        have[key] = ok
        result.added += 1
    _copy_traces(dst, src, lambda rid: new_ids.get(old_key.get(rid)))


def _insert(conn: sqlite3.Connection, table: str, row: dict) -> None:
    """``INSERT OR IGNORE`` `row` into `table` by column name (a source read read-only may predate a column:
    it is NULL in the merge)."""
    names = ", ".join(row)
    conn.execute(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({', '.join('?' * len(row))})",
                 tuple(row.values()))


def _copy_traces(dst: Store, src: Store, run_id_of) -> None:
    """Copy the source's acceptance traces and calibration blocks, their run ids renumbered to `dst`'s."""
    with dst.transaction() as conn:
        for table, col in (("traces", "run_id"), ("calibration", "after_run_id")):
            cols = [r[1] for r in src.conn.execute(f"PRAGMA table_info({table})")]
            for row in src.conn.execute(f"SELECT * FROM {table}"):
                d = dict(zip(cols, tuple(row), strict=True))
                d[col] = run_id_of(d[col])
                names = ", ".join(d)
                conn.execute(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({', '.join('?' * len(d))})",
                             tuple(d.values()))
