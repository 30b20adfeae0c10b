"""Store commands carry every kind of run: single-sequence runs (``specdec sweep``) and the batched runs of
the former batch harness's tables (its published stores) are exported, merged and reported, alone or side
by side, or a command refuses in one line naming what it did not carry; it never reports a silent zero.

No model is loaded: stores are written through `Store.record_run` and, for the harness's tables, plain SQL
with tiny rows, and a published batch store (results/batch_bf16_final_rules.db) is read from a copy.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from specdec.bench import machines
from specdec.bench.export import export_runs
from specdec.bench.merge import merge_stores
from specdec.bench.store import Store, StoreError, canonical_json

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "results" / "batch_bf16_final_rules.db"  # 252 batched runs of one batch sweep, no single run
PUBLISHED_RUNS = 252
SID = "aaaa000011112222"
BSID = "bbbb000011112222"
MACHINE = {"host": "h1", "cpu_model": "test cpu", "cpu_count": 2}
OTHER_MACHINE = {"host": "h2", "cpu_model": "test cpu", "cpu_count": 2}
#: One cell's run order (a batched target-only run between every two others).
CELL = [("baseline", None), ("draft", "fixed"), ("baseline", None), ("ngram", "cost"), ("baseline", None)]


def _cli(capsys, *args) -> tuple[int, str, str]:
    from specdec.entrypoints.cli import main

    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("specdec: error: "), err
    return lines[0]


def _published(tmp_path: Path, name: str = "batch.db") -> Path:
    if not PUBLISHED.is_file():
        pytest.skip(f"{PUBLISHED} is not in this checkout")
    dst = tmp_path / name
    shutil.copy(PUBLISHED, dst)
    return dst


def _add_single(path: Path, n: int = 3, sid: str = SID, prompts: range | None = None,
                machine: dict | None = None) -> None:
    """Add a single-sequence sweep `sid` with runs of prompts `prompts` (default 0..n-1) to `path`."""
    with Store(path) as st:
        st.begin_sweep(sid, {"target": "t", "draft": "d"}, resume=True, name="single", machine=machine)
        for i in prompts if prompts is not None else range(n):
            st.record_run({"sweep_id": sid, "cell_key": f"{sid}|eager|p{i:03d}|draft|4|-|0", "config_label": "eager",
                           "prompt_id": f"p{i:03d}", "method": "draft", "k": 4, "repeat": 0, "new_tokens": 8,
                           "token_ids": list(range(8)), "total_s": 0.5, "tokens_per_s": 16.0},
                          [{"k": 4, "num_accepted": 2, "accept_flags": "1100", "num_emitted": 3}])
        st.set_status(sid, "done")


def _insert(conn, table: str, row: dict) -> None:
    conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))


def _add_batch(path: Path, batches: range = range(2), sid: str = BSID, machine: dict | None = None,
               fail: set[tuple[int, int]] = frozenset(), status: str = "done", new_tokens: int = 16) -> None:
    """Add a batch sweep `sid` of the former harness to `path`: per batch index one cell of `CELL` at B = 2
    (seq 0..4); the runs `(batch, seq)` in `fail` are recorded failed; one calibration point per machine."""
    machine = machine or MACHINE
    with Store(path) as st, st.transaction() as conn:
        mid = machines.register_machine(conn, machine)
        config = {"target": "t", "settings": {"batch_sizes": [2], "max_new_tokens": new_tokens}}
        conn.execute("INSERT OR IGNORE INTO batch_sweeps (sweep_id, config_json, machine_json, status) VALUES "
                     "(?, ?, ?, ?)", (sid, canonical_json(config), json.dumps(machine, sort_keys=True), status))
        for b in batches:
            for seq, (method, policy) in enumerate(CELL):
                failed = (b, seq) in fail
                key = "|".join(map(str, (sid, "eager", "code", 2, b, seq, method, policy or "-")))
                _insert(conn, "batch_runs", {
                    "sweep_id": sid, "cell_key": key, "config_label": "eager", "group_name": "code", "batch_size": 2,
                    "batch_idx": b, "seq": seq, "prompt_ids": json.dumps(["code-01", "code-02"]), "method": method,
                    "policy": policy, "k": None if method == "baseline" else 3,
                    "new_tokens": None if failed else 16, "total_s": None if failed else 1.0,
                    "tokens_per_s": None if failed else 16.0 + seq, "error": "E: boom" if failed else None,
                    "machine_id": mid})
        _insert(conn, "batch_calibration", {"sweep_id": sid, "config_label": "eager", "machine_id": mid,
                                            "role": "target", "batch_size": 2, "n_tokens": 1, "seconds": 0.1})


def _count(path: Path, sql: str):
    con = sqlite3.connect(path)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def _read(path: Path, fmt: str) -> list[dict]:
    if fmt == "csv":
        with open(path, newline="") as fh:
            return list(csv.DictReader(fh))
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    pq = pytest.importorskip("pyarrow.parquet")
    return pq.read_table(path).to_pylist()


# --------------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_export_carries_a_published_batch_store(tmp_path, capsys, fmt):
    db = _published(tmp_path)
    out = tmp_path / f"runs.{fmt}"
    code, stdout, err = _cli(capsys, "export", "--db", db, "--out", out)
    assert code == 0, err
    assert f"{PUBLISHED_RUNS} runs written" in stdout and f"{PUBLISHED_RUNS} batched" in stdout
    rows = _read(out, fmt)
    assert len(rows) == PUBLISHED_RUNS and {r["kind"] for r in rows} == {"batch"}
    assert {str(r["batch_size"]) for r in rows} >= {"1", "2"}
    assert all(r["group_name"] and r["cell_key"].startswith(r["sweep_id"]) for r in rows)
    first = rows[0]
    assert json.loads(first["sweep_config_json"])  # the batch sweep's plan, joined
    assert str(first["seq"]) == "0" and json.loads(first["prompt_ids"])


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_export_carries_both_kinds_side_by_side(tmp_path, fmt):
    db = tmp_path / "both.db"
    _add_single(db, n=3)
    _add_batch(db, batches=range(2), fail={(1, 3)})
    n = export_runs(db, fmt, tmp_path / f"runs.{fmt}")
    assert n == 3 + 10 and n.by_kind == {"single": 3, "batch": 10}
    rows = _read(tmp_path / f"runs.{fmt}", fmt)
    single = [r for r in rows if r["kind"] == "single"]
    batch = [r for r in rows if r["kind"] == "batch"]
    assert len(single) == 3 and len(batch) == 10
    assert all(r["batch_size"] in (None, "") for r in single) and {str(r["batch_size"]) for r in batch} == {"2"}
    assert {r["sweep_name"] for r in single} == {"single"}
    assert [str(r["seq"]) for r in batch[:5]] == ["0", "1", "2", "3", "4"]
    assert sum(1 for r in batch if r["error"]) == 1
    # one sweep of either kind
    assert export_runs(db, fmt, tmp_path / f"b.{fmt}", sweep_id=BSID).by_kind == {"single": 0, "batch": 10}
    assert export_runs(db, fmt, tmp_path / f"s.{fmt}", sweep_id=SID).by_kind == {"single": 3, "batch": 0}
    with pytest.raises(StoreError, match=f"no sweep 'nope'.*batch sweeps there: {BSID}"):
        export_runs(db, fmt, tmp_path / f"x.{fmt}", sweep_id="nope")


def test_export_never_writes_a_silent_zero(tmp_path, capsys):
    db = tmp_path / "empty.db"
    Store(db).close()
    out = tmp_path / "runs.csv"
    code, _, err = _cli(capsys, "export", "--db", db, "--out", out)
    assert code == 2 and "no runs" in _one_error_line(err) and not out.exists()
    # a directory given as the store is named as one
    code, _, err = _cli(capsys, "export", "--db", tmp_path, "--out", out)
    assert code == 2 and "is a directory" in _one_error_line(err) and not out.exists()


# ---------------------------------------------------------------------------------------------- merge


def test_merge_carries_a_published_batch_store(tmp_path, capsys):
    db = _published(tmp_path)
    out = tmp_path / "merged.db"
    code, stdout, err = _cli(capsys, "merge", "--out", out, db)
    assert code == 0, err
    assert f"{PUBLISHED_RUNS} batched runs added" in stdout
    assert _count(out, "SELECT COUNT(*) FROM batch_runs") == PUBLISHED_RUNS
    assert _count(out, "SELECT COUNT(*) FROM batch_calibration") == _count(db, "SELECT COUNT(*) FROM batch_calibration")
    assert _count(out, "SELECT status FROM batch_sweeps") == _count(db, "SELECT status FROM batch_sweeps")
    con_a, con_b = sqlite3.connect(db), sqlite3.connect(out)
    try:
        sql = "SELECT * FROM batch_runs ORDER BY run_id"
        assert con_a.execute(sql).fetchall() == con_b.execute(sql).fetchall()  # the same rows, in run order
    finally:
        con_a.close()
        con_b.close()
    # merging the same store again adds nothing and counts the duplicates
    code, stdout, err = _cli(capsys, "merge", "--out", out, db)
    assert code == 0 and f"0 batched runs added ({PUBLISHED_RUNS} duplicate(s) kept once)" in stdout, stdout + err
    assert _count(out, "SELECT COUNT(*) FROM batch_runs") == PUBLISHED_RUNS


def test_merge_unions_both_kinds_by_the_single_sequence_rules(tmp_path):
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "m.db"
    _add_single(a, prompts=range(3), machine=MACHINE)
    _add_single(b, prompts=range(2, 5), machine=OTHER_MACHINE)
    _add_batch(a, batches=range(2), fail={(1, 1)}, status="interrupted")
    _add_batch(b, batches=range(1, 3), machine=OTHER_MACHINE)
    res = merge_stores(out, [a, b])
    assert res.sweep_ids == [SID] and res.batch_sweep_ids == [BSID]
    assert (res.added, res.duplicates) == (5, 1)
    # batch 1 is in both: its 4 successful runs are kept once, its failed run in a is replaced by b's success
    # (written again: added counts it, as it does a replaced single-sequence run)
    assert (res.batch_added, res.batch_duplicates, res.batch_replaced) == (16, 4, 1)
    assert _count(out, "SELECT COUNT(*) FROM batch_runs") == 15
    assert _count(out, "SELECT COUNT(*) FROM batch_runs WHERE error IS NOT NULL") == 0
    assert _count(out, "SELECT COUNT(DISTINCT machine_id) FROM batch_runs") == 2
    assert _count(out, "SELECT COUNT(*) FROM batch_calibration") == 2  # one point per machine
    assert res.status == "interrupted"  # a's batch sweep was interrupted
    assert _count(out, "SELECT status FROM batch_sweeps") == "interrupted"


def test_merge_refuses_another_batch_sweep_in_one_line(tmp_path, capsys):
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "m.db"
    _add_batch(a)
    _add_batch(b, sid="cccc000011112222", new_tokens=32)
    code, _, err = _cli(capsys, "merge", "--out", out, a, b)
    line = _one_error_line(err)
    assert code == 2 and "batch sweep" in line and str(b) in line and "cccc000011112222" in line
    assert "settings.max_new_tokens=32 vs 16" in line  # the nested setting that differs, by name
    # a store with the single-sequence sweep only beside one with the batch sweep too: refused, not dropped
    c, d = tmp_path / "c.db", tmp_path / "d.db"
    _add_single(c)
    _add_single(d)
    _add_batch(d)
    code, _, err = _cli(capsys, "merge", "--out", tmp_path / "m2.db", c, d)
    line = _one_error_line(err)
    assert code == 2 and BSID in line and "batch sweep" in line and not (tmp_path / "m2.db").exists()


def test_merge_into_an_earlier_merge_without_its_batched_runs_adds_them(tmp_path):
    """A merge made before batched runs were carried holds the single sweep alone: merging the sources
    again into it adds their batched runs."""
    a, out = tmp_path / "a.db", tmp_path / "m.db"
    _add_single(a)
    _add_single(out)
    _add_batch(a)
    res = merge_stores(out, [a])
    assert res.batch_added == 10 and res.duplicates == 3 and res.added == 0
    assert _count(out, "SELECT COUNT(*) FROM batch_runs") == 10


# --------------------------------------------------------------------------------------------- report


def test_report_names_the_batched_runs_it_carries(tmp_path, capsys):
    db = _published(tmp_path)
    code, stdout, err = _cli(capsys, "report", "--db", db, "--out", tmp_path / "rep")
    assert code == 0, err
    assert f"{PUBLISHED_RUNS} batched runs" in stdout.splitlines()[0]
    assert "Speedup against batch size" in (tmp_path / "rep" / "report.md").read_text()
    # --sweep naming the batch sweep: one line saying how its runs are reported, not "sweeps: none"
    bsid = _count(db, "SELECT sweep_id FROM batch_sweeps")
    code, _, err = _cli(capsys, "report", "--db", db, "--out", tmp_path / "rep2", "--sweep", bsid[:6])
    line = _one_error_line(err)
    assert code == 2 and "batch sweep" in line and bsid in line and "without --sweep" in line


# ------------------------------------------------------------------ paths checked before any model loads


def _sweep_args(tiny_pair, prompt_file, db) -> list:
    return ["sweep", "--target", tiny_pair.target_dir, "--draft", tiny_pair.draft_dir, "--prompts", prompt_file,
            "--ks", "1", "--secondary-ks", "", "--max-new-tokens", "4", "--no-peers", "--policies", "none",
            "--no-progress", "--configs", "transformers-eager", "--db", db]


def test_another_programs_database_is_never_written_by_a_sweep(tiny_pair, prompt_file, tmp_path, capsys):
    """An existing SQLite file that is not a results store (another program's data) given as --db: one
    line before any model loads, and the file is left byte for byte as it was."""
    other = tmp_path / "notes.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE notes (id INTEGER, body TEXT)")
    con.execute("INSERT INTO notes VALUES (1, 'precious')")
    con.commit()
    con.close()
    before = other.read_bytes()
    for args in (_sweep_args(tiny_pair, prompt_file, other), [*_sweep_args(tiny_pair, prompt_file, other),
                                                              "--batch-sizes", "1,2"],
                 ["merge", "--out", other, other.with_name("absent.db")]):
        code, out, err = _cli(capsys, *args)
        line = _one_error_line(err)
        assert code == 2 and str(other) in line and "not a specdec results database" in line, line
        assert "loading" not in out + err
        assert other.read_bytes() == before
