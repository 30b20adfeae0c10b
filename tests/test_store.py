"""The SQLite results store: schema, one-transaction runs, resume bookkeeping, costs, export round trips."""

from __future__ import annotations

import csv
import json
import sqlite3

import pytest

from specdec.bench import store as S
from specdec.bench.export import export_runs
from specdec.bench.store import Store, SweepExistsError, SweepNotFoundError

SCHEMA = {
    "sweeps": ["sweep_id", "name", "config_json", "created_at", "git_commit", "machine_json", "status"],
    "runs": [
        "run_id", "sweep_id", "cell_key", "config_label", "pair", "target", "draft", "target_backend",
        "draft_backend", "compiled", "device", "dtype", "threads", "prompt_id", "prompt_type", "chat_template",
        "prompt_tokens", "method", "policy", "k", "repeat", "seed", "temperature", "top_k", "top_p",
        "max_new_tokens", "new_tokens", "finish_reason", "token_ids", "matches_baseline", "num_rounds",
        "num_drafted", "num_accepted", "num_rejections", "prefill_s", "ttft_s", "decode_s", "total_s",
        "draft_s", "verify_s", "tokens_per_s", "error", "created_at", "machine_id", "first_divergence", "policy_note",
        "batch_size", "batch_id", "row", "batch_total_s", "batch_tokens_per_s", "matches_single", "predicted_speedup",
    ],
    "rounds": [
        "run_id", "round_idx", "k", "k_requested", "num_accepted", "accept_flags", "next_kind", "num_emitted",
        "draft_s", "verify_s", "other_s", "alpha_estimate", "forward_s", "n_forward", "draft_source",
    ],
    "costs": ["sweep_id", "config_label", "role", "n_tokens", "seconds", "repeats", "spread_s"],
    "meta": ["key", "value"],
    "machines": ["machine_id", "machine_json"],
    "machine_costs": ["sweep_id", "machine_id", "config_label", "role", "n_tokens", "seconds", "repeats",
                      "spread_s"],
    "shards": ["sweep_id", "shard", "machine_id", "started_at"],
    "traces": ["sweep_id", "config_label", "prompt_id", "machine_id", "run_id", "max_new_tokens", "draft_context",
               "prompt_ids", "target_ids", "draft_ids", "draft_top_prob", "target_margin", "target_tf_ids",
               "created_at", "sampling_json", "overlap", "chains"],
    "calibration": ["sweep_id", "config_label", "prompt_id", "machine_id", "after_run_id", "role", "n_tokens",
                    "context_tokens", "seconds", "repeats", "spread_s"],
    "roofline": ["sweep_id", "config_label", "machine_id", "target_weight_bytes", "draft_weight_bytes",
                 "bandwidth_gbps", "bandwidth_json", "runtime_json"],
    "synthetic": ["sweep_id", "machine_id", "created_at", "doc_json"],
}  # fmt: skip

CONFIG = {"target": "t", "draft": "d", "max_new_tokens": 8, "temperature": 0.0}


def _run(sid: str, prompt: str, method: str = "baseline", k=None, policy=None, repeat=0, **kw) -> dict:
    row = {
        "sweep_id": sid, "cell_key": S.cell_key(sid, "transformers-eager", prompt, method, k, policy, repeat),
        "config_label": "transformers-eager", "prompt_id": prompt, "prompt_type": "code", "method": method,
        "k": k, "policy": policy, "repeat": repeat, "new_tokens": 3, "token_ids": [5, 6, 7],
        "total_s": 0.5, "tokens_per_s": 6.0,
    }  # fmt: skip
    row.update(kw)
    return row


@pytest.fixture
def db(tmp_path):
    return tmp_path / "r.db"


def test_schema_exactly_as_specified_and_rollback_journal(db):
    with Store(db) as st:
        for table, cols in SCHEMA.items():
            got = [r[1] for r in st.conn.execute(f"PRAGMA table_info({table})")]
            assert got == cols, table
        # the rollback journal: a committed run is in the .db file itself (see specdec.bench.store)
        assert st.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "delete"
        assert st.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "1"
        pk = {r[1]: r[5] for r in st.conn.execute("PRAGMA table_info(costs)") if r[5]}
        assert pk == {"sweep_id": 1, "config_label": 2, "role": 3, "n_tokens": 4}
        # rounds is clustered on its key: no rowid, no second index beside the table
        sql = st.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'rounds'").fetchone()[0]
        assert sql.rstrip().endswith("WITHOUT ROWID")
        assert not st.conn.execute("SELECT 1 FROM sqlite_master WHERE tbl_name = 'rounds' AND type = 'index'"
                                   ).fetchall()
    Store(db).close()  # reopening an existing store is fine


def test_other_schema_version_and_garbage_refused(tmp_path, db):
    with Store(db) as st:
        st.conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(S.StoreError, match="schema version 99"):
        Store(db)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(S.StoreError, match="not a specdec results database"):
        Store(junk)


def test_sweep_id_is_canonical_and_cell_key_format():
    a = S.sweep_id_for({"b": 1, "a": [1, 2]})
    assert a == S.sweep_id_for({"a": [1, 2], "b": 1}) and len(a) == 16
    assert a != S.sweep_id_for({"a": [1, 2], "b": 2})
    assert S.cell_key("s", "llamacpp", "code-01", "draft", 4, "fixed", 0) == "s|llamacpp|code-01|draft|4|fixed|0"
    assert S.cell_key("s", "x", "p", "baseline", None, None, 2) == "s|x|p|baseline|-|-|2"


def test_begin_sweep_refuses_silent_mixing(db):
    sid = S.sweep_id_for(CONFIG)
    with Store(db) as st:
        other = {**CONFIG, "max_new_tokens": 9}
        row = st.begin_sweep(sid, CONFIG, resume=False, name="first", machine={"cpu": "x"}, git_commit="abc")
        assert row["status"] == "running" and json.loads(row["config_json"]) == CONFIG
        with pytest.raises(SweepNotFoundError, match="holds no sweep"):
            st.begin_sweep(S.sweep_id_for(other), other, resume=True)
        st.begin_sweep(sid, CONFIG, resume=False)  # no runs yet: starting again is harmless
        st.record_run(_run(sid, "p1"))
        with pytest.raises(SweepExistsError, match="--resume"):
            st.begin_sweep(sid, CONFIG, resume=False)
        st.set_status(sid, "interrupted")
        assert st.begin_sweep(sid, CONFIG, resume=True)["status"] == "running"
        with pytest.raises(SweepNotFoundError) as exc:
            st.begin_sweep(S.sweep_id_for(other), other, resume=True)
        assert sid in str(exc.value) and "first" in str(exc.value) and "\n" not in str(exc.value)
        with pytest.raises(ValueError):
            st.set_status(sid, "finished")


def test_resume_in_an_empty_store_starts_the_sweep(db):
    """The documented shard command carries --resume; its first run, on a new store, starts the sweep
    instead of failing (it had failed with 'holds no sweep with this configuration')."""
    sid = S.sweep_id_for(CONFIG)
    with Store(db) as st:
        row = st.begin_sweep(sid, CONFIG, resume=True, name="shard")
        assert row["sweep_id"] == sid and row["status"] == "running" and row["name"] == "shard"
        st.record_run(_run(sid, "p1"))
        assert st.begin_sweep(sid, CONFIG, resume=True)["status"] == "running"
        assert st.count_runs(sid) == 1


def test_record_run_one_transaction_and_retry_replaces(db):
    sid = S.sweep_id_for(CONFIG)
    with Store(db) as st:
        st.begin_sweep(sid, CONFIG, resume=False)
        rounds = [
            {"k": 2, "k_requested": 2, "num_accepted": 1, "accept_flags": (True, False), "next_kind": "recovered",
             "num_emitted": 2, "draft_s": 0.1, "verify_s": 0.2, "other_s": 0.0, "alpha_estimate": None},
            {"k": 2, "k_requested": 2, "num_accepted": 2, "accept_flags": "11", "next_kind": "bonus",
             "num_emitted": 1, "draft_s": 0.1, "verify_s": 0.2, "other_s": 0.0, "alpha_estimate": 0.5},
        ]  # fmt: skip
        failed = _run(sid, "p1", "draft", 2, "fixed", error="RuntimeError: boom", token_ids=None,
                      tokens_per_s=float("nan"))
        st.record_run(failed)
        assert st.done_cells(sid) == set()  # failed runs are not done: resume retries them
        assert st.runs(sid)[0]["tokens_per_s"] is None  # NaN stored as NULL
        run_id = st.record_run(_run(sid, "p1", "draft", 2, "fixed", num_rounds=2), rounds)
        rows = st.runs(sid)
        assert len(rows) == 1 and rows[0]["error"] is None and rows[0]["run_id"] == run_id
        assert json.loads(rows[0]["token_ids"]) == [5, 6, 7]
        got = st.rounds_of(run_id)
        assert [r["accept_flags"] for r in got] == ["10", "11"] and [r["round_idx"] for r in got] == [0, 1]
        assert st.done_cells(sid) == {failed["cell_key"]}
        # A run whose rounds cannot be written leaves nothing behind (one transaction).
        bad_rounds = [dict(rounds[0], round_idx=0), dict(rounds[1], round_idx=0)]  # duplicate primary key
        with pytest.raises(sqlite3.IntegrityError):
            st.record_run(_run(sid, "p2", "draft", 2, "fixed"), bad_rounds)
        assert len(st.runs(sid)) == 1
        assert st.conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0] == 2
        with pytest.raises(ValueError, match="unknown runs column"):
            st.record_run({**_run(sid, "p3"), "speedup": 2.0})


def test_baseline_tokens_and_counts(db):
    sid = "s1"
    with Store(db) as st:
        st.begin_sweep(sid, CONFIG, resume=False)
        assert st.baseline_tokens(sid, "transformers-eager", "p1") is None
        st.record_run(_run(sid, "p1", repeat=1, token_ids=[1, 2]))
        st.record_run(_run(sid, "p1", repeat=0, token_ids=[1, 3]))
        st.record_run(_run(sid, "p2", error="X: y", token_ids=None))
        assert st.baseline_tokens(sid, "transformers-eager", "p1") == [1, 3]
        assert st.baseline_tokens(sid, "transformers-eager", "p2") is None
        assert st.count_runs(sid) == 3 and st.count_runs(sid, errors=True) == 1


def test_costs_round_trip(db):
    costs = {
        "target_step_s": 0.5, "draft_step_s": 0.2, "c": 0.4, "repeats": 3, "draft_repeats": 9,
        "target_forward_s": {n: 0.5 + 0.1 * (n - 1) for n in range(1, 18)},
        "target_forward_spread_s": {n: 0.01 for n in range(1, 18)},
        "draft_forward_s": {1: 0.2}, "draft_forward_spread_s": {1: 0.002},
    }  # fmt: skip
    with Store(db) as st:
        assert st.load_costs("s", "transformers-eager") is None
        st.save_costs("s", "transformers-eager", costs)
        st.save_costs("s", "transformers-eager", costs)  # replaces, no duplicate-key error
        got = st.load_costs("s", "transformers-eager")
        n_rows = st.conn.execute("SELECT COUNT(*) FROM costs").fetchone()[0]
    assert n_rows == 18
    assert got["target_forward_s"] == costs["target_forward_s"] and got["draft_step_s"] == 0.2
    assert got["c"] == pytest.approx(0.4) and got["repeats"] == 3 and got["target_step_s"] == 0.5
    assert got["draft_repeats"] == 9


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_export_round_trips_row_count(tmp_path, db, fmt):
    with Store(db) as st:
        st.begin_sweep("s1", CONFIG, resume=False, name="one")
        st.begin_sweep("s2", {**CONFIG, "x": 1}, resume=False, name="two")
        for i in range(3):
            st.record_run(_run("s1", f"p{i}"))
        st.record_run(_run("s2", "p0", error="E: f", token_ids=None, tokens_per_s=None, total_s=None))
    out = tmp_path / f"runs.{fmt}"
    assert export_runs(db, fmt, out) == 4
    if fmt == "csv":
        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
    elif fmt == "jsonl":
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        rows = pq.read_table(out).to_pylist()
    assert len(rows) == 4
    assert {r["sweep_name"] for r in rows} == {"one", "two"}
    assert "sweep_config_json" in rows[0] and "cell_key" in rows[0]
    assert export_runs(db, fmt, tmp_path / f"only.{fmt}", sweep_id="s1") == 3
    with pytest.raises(S.StoreError, match="no sweep"):
        export_runs(db, fmt, tmp_path / f"x.{fmt}", sweep_id="nope")


def test_export_errors(tmp_path, db, monkeypatch):
    with pytest.raises(S.StoreError, match="no such results database"):
        export_runs(tmp_path / "missing.db", "csv", tmp_path / "o.csv")
    Store(db).close()
    with pytest.raises(ValueError, match="unknown export format"):
        export_runs(db, "xlsx", tmp_path / "o.xlsx")
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *a, **kw):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ValueError, match="needs pyarrow"):
        export_runs(db, "parquet", tmp_path / "o.parquet")


def test_schema_declared_once_matches_the_published_store(tmp_path):
    """`TABLES` is the one declaration: the SQL, RUN_COLUMNS/ROUND_COLUMNS and `columns` come from it, and a
    store written by an earlier specdec (results/archive/study.db) has exactly these columns and types."""
    from pathlib import Path

    assert {t: list(S.columns(t)) for t in S.TABLES} == SCHEMA
    assert S.RUN_COLUMNS == S.columns("runs")[1:] and S.ROUND_COLUMNS == S.columns("rounds")[1:]
    published = Path(__file__).resolve().parents[1] / "results" / "archive" / "study.db"
    if not published.is_file():
        pytest.skip("the published study store is not in this checkout")
    conn = sqlite3.connect(f"file:{published}?mode=ro&immutable=1", uri=True)
    try:
        # (runs.machine_id, the machine tables, rounds.forward_s, runs.first_divergence, traces and calibration
        # came later: opening an older store adds them, and the published stores were opened so - a checkout
        # does not change on first use)
        # roofline.runtime_json, runs.policy_note, rounds.draft_source, the batch axis's runs columns and the
        # sampled traces' columns and the synthetic table
        # came after the published store was last written: opening it adds them
        later = {("roofline", "runtime_json"), ("runs", "policy_note"), ("rounds", "draft_source")} | {
            ("traces", c) for c in ("sampling_json", "overlap", "chains")} | {
            ("runs", c) for c in ("batch_size", "batch_id", "row", "batch_total_s", "batch_tokens_per_s",
                                  "matches_single", "predicted_speedup")} | {
            ("synthetic", c) for c in SCHEMA["synthetic"]}
        for table, cols in S.TABLES.items():
            got = [(r[1], r[2]) for r in conn.execute(f"PRAGMA table_info({table})")]
            assert [g for g in got if (table, g[0]) not in later] == [
                (name, decl.split()[0]) for name, decl in cols if (table, name) not in later], table
    finally:
        conn.close()


def test_an_older_store_gains_the_new_columns_and_keeps_its_rows(tmp_path):
    """A store written before a column existed (here: rounds without forward_s and later ones, runs without
    first_divergence, no traces table) opens, gains them as NULL, and keeps every row."""
    path = tmp_path / "old.db"
    with Store(path) as st:
        st.begin_sweep("s1", CONFIG, resume=False)
        st.record_run(_run("s1", "p"), [{"k": 0, "num_accepted": 0, "accept_flags": "", "next_kind": "bonus",
                                         "num_emitted": 1, "verify_s": 0.1, "forward_s": 0.09}])
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE traces")
    conn.execute("ALTER TABLE rounds DROP COLUMN draft_source")
    conn.execute("ALTER TABLE rounds DROP COLUMN n_forward")
    conn.execute("ALTER TABLE rounds DROP COLUMN forward_s")
    conn.execute("ALTER TABLE runs DROP COLUMN first_divergence")
    conn.commit()
    conn.close()
    with Store(path) as st:
        assert [r["forward_s"] for r in st.rounds_of(1)] == [None]
        assert st.runs("s1")[0]["first_divergence"] is None and st.traces() == []
        assert [r[1] for r in st.conn.execute("PRAGMA table_info(rounds)")] == SCHEMA["rounds"]


def test_report_column_lists_are_the_store_schema():
    """The report reads the store through its column lists (specdec/report/load.py); they must be the
    schema's, in table order, or a renamed column would silently read as NULL."""
    from specdec.report import load as analysis

    assert list(analysis.RUN_COLUMNS) == list(S.columns("runs"))
    assert list(analysis.ROUND_COLUMNS) == list(S.columns("rounds"))
    assert list(analysis.COST_COLUMNS) == list(S.columns("costs"))
    assert list(analysis.SWEEP_COLUMNS) == list(S.columns("sweeps"))


def test_c23_opening_a_locked_store_waits_then_says_busy(tmp_path):
    """A store another connection holds exclusively: opening retries for the bounded wait, then says the store
    is busy (not "not a specdec results database"); once released, it opens."""
    import sqlite3
    import time

    from specdec.bench.store import StoreBusyError

    path = tmp_path / "locked.db"
    Store(path).close()
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA journal_mode=DELETE")
    other.execute("BEGIN EXCLUSIVE")
    t0 = time.monotonic()
    with pytest.raises(StoreBusyError, match="another process is writing this results store"):
        Store(path, busy_wait_s=0.5)
    assert 0.5 <= time.monotonic() - t0 < 10
    other.execute("ROLLBACK")
    other.close()
    Store(path).close()


def test_export_carries_each_runs_acceptance_record(tmp_path, db):
    """The exported acceptance columns are `acceptance_record` of the run's stored rounds (vLLM's shape), NULL
    for a run without rounds."""
    from specdec.core.metrics import RoundRecord, acceptance_record

    rounds = [RoundRecord(4, 2, (True, True, False), "recovered", 3), RoundRecord(0, 0, (), "bonus", 1),
              RoundRecord(4, 4, (True,) * 4, "bonus", 5)]
    with Store(db) as st:
        st.begin_sweep("s1", CONFIG, resume=False, name="one")
        st.record_run(_run("s1", "p0"), [{"round_idx": i, "k": r.k, "num_accepted": r.num_accepted,
                                          "next_kind": r.next_kind, "num_emitted": r.num_emitted}
                                         for i, r in enumerate(rounds)])
        st.record_run(_run("s1", "p1"))
    out = tmp_path / "runs.jsonl"
    export_runs(db, "jsonl", out)
    got = {r["prompt_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    want = acceptance_record(rounds)
    assert want["num_drafts"] == 2 and want["mean_acceptance_length"] == pytest.approx(4.0)
    row = got["p0"]
    assert row["num_drafts"] == 2 and row["mean_acceptance_length"] == pytest.approx(4.0)
    assert json.loads(row["acceptance_histogram"]) == [0, 0, 1, 0, 1]
    assert json.loads(row["accepted_per_position"]) == [2, 2, 1, 1]
    assert got["p1"]["num_drafts"] is None and got["p1"]["acceptance_histogram"] is None
