"""A results store is a user's only copy: faults around it are named in one line and never lose a run.

- an output path (``export``, ``merge``, ``report``, ``costs --out``) never overwrites a store, and an
  existing file only with ``--force``;
- a sweep killed with SIGKILL leaves every committed run in the ``.db`` file itself; a WAL store copied
  without its ``-wal`` file is named as such;
- a read-only store (file or directory) is named in one line before any model loads; readers still work;
- a damaged store is named in one line with the ``.recover`` command, and nothing is written to it;
- a model directory typed four ways is one sweep; ``--resume --dry-run`` refuses what ``--resume`` refuses;
- a writer killed at random moments loses nothing it committed and leaves no partial run.

No model is loaded: stores are written through `Store.record_run` with tiny rows; the sweep commands are
stopped by their checks before any model loads (the tiny checkpoints of tests/conftest.py are only read
as files).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import specdec
from specdec.bench.store import Store, StoreError

#: The specdec under test, first on the subprocesses' path.
_PYTHONPATH = os.pathsep.join([str(Path(specdec.__file__).parent.parent), os.environ.get("PYTHONPATH", "")])

ROUNDS = 4


def _row(sid: str, i: int) -> dict:
    return {"sweep_id": sid, "cell_key": f"{sid}|eager|p{i:05d}|draft|4|-|0", "config_label": "eager",
            "prompt_id": f"p{i:05d}", "method": "draft", "k": 4, "repeat": 0, "num_rounds": ROUNDS,
            "new_tokens": 20, "token_ids": list(range(20)), "total_s": 0.5}


def _rounds() -> list[dict]:
    return [{"k": 4, "num_accepted": 2, "accept_flags": "1100", "num_emitted": 3} for _ in range(ROUNDS)]


def _make_store(path: Path, n: int = 40, sid: str = "aaaa000011112222") -> str:
    with Store(path) as st:
        st.begin_sweep(sid, {"target": "t", "draft": "d"}, resume=False, name="faults")
        for i in range(n):
            st.record_run(_row(sid, i), _rounds())
        st.set_status(sid, "done")
    return sid


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``specdec ARGS`` in this process; (exit status, stdout, stderr)."""
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


# ------------------------------------------------------------------------------- outputs never destroy


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_export_onto_its_own_store_is_refused_and_the_store_kept(tmp_path, capsys, fmt):
    db = tmp_path / "s.db"
    _make_store(db, n=5)
    before = _digest(db)
    code, _, err = _cli(capsys, "export", "--db", db, "--out", db, "--format", fmt)
    assert code == 2
    line = _one_error_line(err)
    assert str(db) in line and "input" in line
    assert _digest(db) == before
    # the same file spelled another way is still the input
    code, _, err = _cli(capsys, "export", "--db", db, "--out", tmp_path / "." / "s.db", "--format", fmt)
    assert code == 2 and _digest(db) == before


def test_export_onto_another_store_or_an_existing_file_needs_care(tmp_path, capsys):
    db, other = tmp_path / "s.db", tmp_path / "other.db"
    _make_store(db, n=5)
    _make_store(other, n=3)
    kept = _digest(other)
    for force in ((), ("--force",)):  # not even --force overwrites a store
        code, _, err = _cli(capsys, "export", "--db", db, "--out", other, "--format", "csv", *force)
        assert code == 2 and "results store" in _one_error_line(err) and str(other) in err
        assert _digest(other) == kept
    csv = tmp_path / "runs.csv"
    csv.write_text("precious\n")
    code, _, err = _cli(capsys, "export", "--db", db, "--out", csv)
    assert code == 2 and "--force" in _one_error_line(err) and csv.read_text() == "precious\n"
    code, out, err = _cli(capsys, "export", "--db", db, "--out", csv, "--force")
    assert code == 0, err
    assert csv.read_text().count("\n") == 6 and "5 runs written" in out


def test_report_and_costs_and_merge_outputs_never_replace_a_store(tmp_path, capsys):
    db, other = tmp_path / "s.db", tmp_path / "other.db"
    _make_store(db, n=5)
    _make_store(other, n=3, sid="bbbb000011112222")
    kept = {p: _digest(p) for p in (db, other)}
    # report --out is a directory: a store (its own or another) is refused, before the store is read
    for out in (db, other):
        code, _, err = _cli(capsys, "report", "--db", db, "--out", out)
        assert code == 2 and str(out) in _one_error_line(err)
    # costs --out names the JSON it writes: refused before any timing starts
    code, _, err = _cli(capsys, "costs", "--arch", "gpt2", "--out", other)
    assert code == 2 and "results store" in _one_error_line(err)
    # merge --out must be a store (added to) or a new file: never another kind of file
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    code, _, err = _cli(capsys, "merge", "--out", notes, db)
    assert code == 2 and str(notes) in _one_error_line(err) and notes.read_text() == "keep me\n"
    assert {p: _digest(p) for p in (db, other)} == kept


# ------------------------------------------------------------------------ committed runs in the .db itself


_WRITER = textwrap.dedent("""
    import os, sys, time
    from specdec.bench.store import Store
    sys.path.insert(0, sys.argv[3])
    from test_store_faults import _row, _rounds
    db, start = sys.argv[1], int(sys.argv[2])
    st = Store(db)
    sid = "aaaa000011112222"
    st.begin_sweep(sid, {"target": "t", "draft": "d"}, resume=True, name="faults")
    i = start
    while True:
        st.record_run(_row(sid, i), _rounds())
        print(i, flush=True)  # acknowledged: committed
        time.sleep(float(os.environ.get("WRITER_PAUSE_S", "0")))  # a run's generation time
        i += 1
        if len(sys.argv) > 4 and i - start >= int(sys.argv[4]):
            time.sleep(600)  # wait to be killed, every run committed
""")


def _writer(db: Path, start: int, stop_after: int | None = None, pause_s: float = 0.0) -> subprocess.Popen:
    args = [sys.executable, "-c", _WRITER, str(db), str(start), str(Path(__file__).parent)]
    if stop_after is not None:
        args.append(str(stop_after))
    env = dict(os.environ, PYTHONPATH=_PYTHONPATH, WRITER_PAUSE_S=str(pause_s))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_killed_writers_committed_runs_are_in_the_db_file_alone(tmp_path):
    """A sweep killed with SIGKILL: the .db copied alone (no -wal, no journal) holds every committed run."""
    db = tmp_path / "s.db"
    proc = _writer(db, 0, stop_after=12)
    acked = [int(proc.stdout.readline()) for _ in range(12)]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    copy = tmp_path / "copy" / "s.db"
    copy.parent.mkdir()
    shutil.copyfile(db, copy)  # the file alone, as a user copies or mails it
    con = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        assert "runs" in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}, "no runs table"
        assert sorted(int(r[0][1:]) for r in con.execute("SELECT prompt_id FROM runs")) == acked
    finally:
        con.close()


def test_a_wal_store_copied_without_its_wal_is_named(tmp_path, capsys):
    """A store written in WAL mode keeps its runs in the -wal file until a checkpoint; the .db copied
    alone has no tables. merge / export / the sweep say the -wal file is missing (not "holds no sweep")."""
    db = tmp_path / "old.db"
    from specdec.bench.store_schema import _SCHEMA

    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.executescript(_SCHEMA)
    con.execute("INSERT INTO sweeps (sweep_id, config_json, status) VALUES ('s', '{}', 'done')")
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)  # while the writer still holds the -wal: the runs are not in the .db
    con.close()
    assert not Path(f"{copy}-wal").exists()
    for args in (("merge", "--out", tmp_path / "m.db", copy), ("export", "--db", copy, "--out", tmp_path / "r.csv")):
        code, _, err = _cli(capsys, *args)
        assert code == 2, err
        line = _one_error_line(err)
        assert str(copy) in line and "copy.db-wal is missing" in line and "no tables" in line
    # a writer (sweep --resume) is refused too, instead of starting afresh in the copy
    with pytest.raises(StoreError, match="copy.db-wal is missing"):
        Store(copy)
    assert not (tmp_path / "m.db").exists()


def test_a_wal_store_is_switched_to_the_rollback_journal_and_keeps_its_runs(tmp_path):
    db = tmp_path / "old.db"
    sid = _make_store(db, n=3)
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    with Store(db) as st:
        assert st.conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert st.count_runs(sid) == 3


# ------------------------------------------------------------------------------- read-only and damaged


def _unprivileged() -> list[str]:
    """A command prefix under which file permissions hold (root without CAP_DAC_OVERRIDE)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: cannot make a file read-only for this process")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all"]


def _run(*args, prefix=()) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=_PYTHONPATH)
    return subprocess.run([*prefix, sys.executable, "-m", "specdec", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=300, check=False)


def _sweep_args(tiny_pair, prompt_file, db) -> list:
    return ["sweep", "--target", tiny_pair.target_dir, "--draft", tiny_pair.draft_dir, "--prompts", prompt_file,
            "--ks", "1", "--secondary-ks", "", "--max-new-tokens", "4", "--no-peers", "--policies", "none",
            "--no-progress", "--db", db]


@pytest.mark.parametrize("what", ["file", "directory"])
def test_a_read_only_store_is_named_before_any_model_loads(tiny_pair, prompt_file, tmp_path, what):
    prefix = _unprivileged()
    d = tmp_path / "ro"
    d.mkdir()
    db = d / "s.db"
    _make_store(db, n=4)
    other = tmp_path / "shard.db"
    _make_store(other, n=2)
    before = _digest(db)
    target = db if what == "file" else d
    mode = target.stat().st_mode
    target.chmod(0o444 if what == "file" else 0o555)
    try:
        for args in (_sweep_args(tiny_pair, prompt_file, db) + ["--resume"], ["merge", "--out", db, other]):
            p = _run(*args, prefix=prefix)
            assert p.returncode == 2, p.stdout + p.stderr
            line = _one_error_line(p.stderr)
            assert str(db) in line and "read-only" in line, line
            assert "loading" not in p.stdout + p.stderr
        # readers still work on it
        p = _run("export", "--db", db, "--out", tmp_path / "runs.csv", prefix=prefix)
        assert p.returncode == 0 and "4 runs written" in p.stdout, p.stdout + p.stderr
        p = _run(*_sweep_args(tiny_pair, prompt_file, db), "--dry-run", prefix=prefix)
        assert p.returncode == 0 and "timed generations" in p.stdout, p.stdout + p.stderr
    finally:
        target.chmod(mode)
    assert _digest(db) == before


def _damage(db: Path, seed: int = 0) -> None:
    """Random bytes over one whole page in the middle of `db` (its header left intact)."""
    size = db.stat().st_size
    page = 4096
    offset = (size // page // 2) * page
    with open(db, "r+b") as f:
        f.seek(offset)
        f.write(random.Random(seed).randbytes(page))


def test_a_damaged_store_is_named_with_recover_and_left_alone(tiny_pair, prompt_file, tmp_path, capsys):
    db = tmp_path / "s.db"
    _make_store(db, n=200)
    _damage(db)
    before = _digest(db)
    for args in (["merge", "--out", tmp_path / "m.db", db], ["export", "--db", db, "--out", tmp_path / "r.csv"],
                 _sweep_args(tiny_pair, prompt_file, db) + ["--resume", "--dry-run"],
                 _sweep_args(tiny_pair, prompt_file, db) + ["--resume"]):
        code, out, err = _cli(capsys, *args)
        assert code == 2, out + err
        line = _one_error_line(err)
        assert str(db) in line and f'sqlite3 {db} ".recover"' in line, line
        assert _digest(db) == before  # nothing written to it
    assert not (tmp_path / "r.csv").exists()


# ---------------------------------------------------------------------------------------------- identity


def test_one_model_directory_typed_four_ways_is_one_sweep(tiny_pair, prompt_file, tmp_path, capsys,
                                                          monkeypatch):
    parent = tiny_pair.target_dir.parent
    monkeypatch.chdir(parent)
    name = tiny_pair.target_dir.name
    ids = set()
    for spelling in (name, f"{name}/", f"./{name}", str(tiny_pair.target_dir.resolve())):
        args = _sweep_args(tiny_pair, prompt_file, tmp_path / "none.db") + ["--dry-run"]
        args[args.index("--target") + 1] = spelling
        code, out, err = _cli(capsys, *args)
        assert code == 0, err
        ids.add(out.split()[1].rstrip(":"))
    assert len(ids) == 1, ids
    # other weights in a directory are another model; presets and hub ids keep their names
    from specdec.bench.store import model_identity

    assert model_identity(str(tiny_pair.draft_dir)) != model_identity(str(tiny_pair.target_dir))
    assert model_identity("gpt2-medium") == "gpt2-medium"
    assert model_identity("qwen2.5-coder:target") == "qwen2.5-coder:target"
    assert model_identity(None) is None


def test_resume_dry_run_refuses_what_resume_refuses(tiny_pair, prompt_file, tmp_path, capsys):
    db = tmp_path / "s.db"
    _make_store(db, n=2)  # another sweep
    args = _sweep_args(tiny_pair, prompt_file, db) + ["--resume"]
    code, _, err_run = _cli(capsys, *args)
    assert code == 2 and "holds no sweep with this configuration" in _one_error_line(err_run)
    code, out, err = _cli(capsys, *args, "--dry-run")
    assert code == 2, out
    assert _one_error_line(err) == _one_error_line(err_run)


# ------------------------------------------------------------------------------------------ power loss


def test_a_writer_killed_at_random_moments_loses_nothing_committed(tmp_path):
    """A writer recording runs is SIGKILLed at seeded random moments, several times over the same store:
    after each kill the store opens, every run has all its rounds, and every acknowledged run is there."""
    db = tmp_path / "s.db"
    rng = random.Random(1234)
    acked: set[int] = set()
    start = 0
    for _ in range(5):
        proc = _writer(db, start)
        first = proc.stdout.readline()  # started and committing
        assert first.strip(), proc.stderr.read()
        acked.add(int(first))
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        acked |= {int(x) for x in out.split()}
        with Store(db) as st:  # a hot journal left by the kill is rolled back here
            runs = st.runs()
            have = {int(r["prompt_id"][1:]) for r in runs}
            assert acked <= have, sorted(acked - have)[:5]
            for r in runs:
                assert len(st.rounds_of(r["run_id"])) == ROUNDS == r["num_rounds"]
            assert st.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        start = max(have) + 1
    assert len(acked) >= 5


def test_readers_work_while_a_writer_records(tmp_path):
    """The report can be run while a sweep writes: read-only opens and the report's loader, repeated
    while a writer commits runs (one every 20 ms, far more often than a sweep), never fail and see a
    growing, complete store."""
    from specdec.report.load import load_store

    db = tmp_path / "s.db"
    proc = _writer(db, 0, pause_s=0.02)
    try:
        assert proc.stdout.readline().strip()
        seen = []
        for _ in range(15):
            with Store(db, readonly=True) as st:
                runs = st.runs()
                assert all(len(st.rounds_of(r["run_id"])) == ROUNDS for r in runs)
            seen.append(len(runs))
            assert len(load_store(db).runs) >= len(runs)
        assert seen == sorted(seen) and seen[-1] > seen[0]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)


def test_a_wal_store_in_a_read_only_directory_is_still_read(tmp_path):
    """The published stores are in WAL mode: read from a read-only directory (no -shm can be created),
    export and the report's loader read them; nothing appears beside them."""
    prefix = _unprivileged()
    d = tmp_path / "ro"
    d.mkdir()
    db = d / "s.db"
    _make_store(db, n=3)
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    d.chmod(0o555)
    try:
        p = _run("export", "--db", db, "--out", tmp_path / "runs.csv", prefix=prefix)
        assert p.returncode == 0 and "3 runs written" in p.stdout, p.stdout + p.stderr
        code = "from specdec.report.load import load_store; import sys; print(len(load_store(sys.argv[1]).runs))"
        p = subprocess.run([*prefix, sys.executable, "-c", code, str(db)], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=_PYTHONPATH), timeout=300, check=False)
        assert p.returncode == 0 and p.stdout.split()[-1] == "3", p.stdout + p.stderr
    finally:
        d.chmod(0o755)
    assert sorted(x.name for x in d.iterdir()) == ["s.db"]
