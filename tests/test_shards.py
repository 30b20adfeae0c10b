"""Sweeps on several machines: the shard split, per-run machines, merging shard stores, the CLI, and Ray.

Tiny checkpoints only (tests/conftest.py). Nothing asserts on wall time: runs are compared by their cells,
token ids and counts, never by their timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from conftest import SWEEP_PROMPTS, tiny_sweep_config
from typer.testing import CliRunner

from specdec.bench import sweep as S
from specdec.bench.machines import machine_id
from specdec.bench.merge import merge_stores
from specdec.bench.shard import Shard, assign_prompts, parse_shard, shard_plan, split_plan
from specdec.bench.store import Store, StoreError

PROMPTS = SWEEP_PROMPTS

#: Columns that differ between two executions of the same run (timings, insertion ids, where it ran).
VOLATILE = {"run_id", "created_at", "prefill_s", "ttft_s", "decode_s", "total_s", "draft_s", "verify_s",
            "tokens_per_s", "machine_id"}
ROUND_VOLATILE = {"run_id", "draft_s", "verify_s", "other_s", "forward_s"}


def _cfg(tiny_pair, draft_dir, prompt_file, **kw) -> S.SweepConfig:
    return tiny_sweep_config(tiny_pair, draft_dir, prompt_file, **{"max_new_tokens": 6, **kw})


def _quiet(_msg: str) -> None:
    pass


def _runs_by_cell(db: Path) -> dict[str, tuple[dict, list[dict]]]:
    """cell_key -> (the run without its volatile columns, its rounds without their timings)."""
    out = {}
    with Store(db) as st:
        for r in st.runs():
            rounds = [{k: v for k, v in x.items() if k not in ROUND_VOLATILE} for x in st.rounds_of(r["run_id"])]
            out[r["cell_key"]] = ({k: v for k, v in r.items() if k not in VOLATILE}, rounds)
    return out


# ------------------------------------------------------------------------------------------- the split


def test_parse_shard_accepts_i_of_n_and_refuses_the_rest():
    assert parse_shard(" 2 / 4 ") == Shard(2, 4) and str(Shard(2, 4)) == "2/4"
    assert parse_shard(None) is None and Shard(1, 1).tag == "shard-1-of-1"
    for bad in ("3/2", "0/0", "x", "1/0", "0/3", "-1/2", "1/2/3", ""):
        with pytest.raises(ValueError, match="--shard") as err:
            parse_shard(bad)
        assert "\n" not in str(err.value)


def _big_plan():
    cfg = S.make_config({"prompts_per_type": 3, "repeats": 2, "ks": "1,4", "secondary_ks": "2",
                         "peers": True, "policies": "cost"})
    prompts = S.select_prompts(cfg)
    return cfg, prompts, S.build_plan(cfg, prompts)


def _ident(c) -> tuple:
    return (c.config_label, c.prompt.id, c.method, c.k, c.policy, c.repeat)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 36])
def test_split_is_a_prompt_grouped_partition(n):
    _, prompts, plan = _big_plan()
    parts = split_plan(plan, prompts, n)
    assert len(parts) == n
    # union = plan, disjoint: every run in exactly one shard, each shard in plan order
    assert Counter(_ident(c) for p in parts for c in p) == Counter(_ident(c) for c in plan)
    assert sum(len(p) for p in parts) == len(plan)
    for p in parts:
        pos = [plan.index(c) for c in p]
        assert pos == sorted(pos)
    # a prompt's baseline and all its runs in one shard
    where: dict[str, set[int]] = {}
    for i, p in enumerate(parts):
        for c in p:
            where.setdefault(c.prompt.id, set()).add(i)
    assert all(len(s) == 1 for s in where.values()) and len(where) == len(prompts)
    for p in parts:
        ids = {c.prompt.id for c in p}
        assert ids == {c.prompt.id for c in p if c.method == "baseline"}
    # balanced: prompts (and primaries, which carry most runs) differ by at most one between shards
    n_prompts = [len({c.prompt.id for c in p}) for p in parts]
    n_primary = [len({c.prompt.id for c in p if c.primary}) for p in parts]
    assert max(n_prompts) - min(n_prompts) <= 1 and max(n_primary) - min(n_primary) <= 1
    # the same as shard_plan of each shard
    for i in range(n):
        if parts[i]:
            assert [_ident(c) for c in shard_plan(plan, prompts, Shard(i + 1, n))] == [_ident(c) for c in parts[i]]


def test_split_depends_on_the_prompts_only():
    _, prompts, _ = _big_plan()
    a = assign_prompts(prompts, 4)
    assert assign_prompts(list(reversed(prompts)), 4) == a  # not on the order of the prompt file
    other = S.build_plan(S.make_config({"prompts_per_type": 3, "ks": "2", "secondary_ks": "",
                                        "peers": False, "policies": "none"}), prompts)
    # a smaller grid (resume may grow it) keeps every prompt on its shard
    for i, part in enumerate(split_plan(other, prompts, 4)):
        assert all(a[c.prompt.id] == i + 1 for c in part)
    # the same in another process with another hash seed
    code = ("import json; from specdec.bench import sweep as S; from specdec.bench.shard import assign_prompts;"
            "cfg = S.make_config({'prompts_per_type': 3}); print(json.dumps(assign_prompts(S.select_prompts(cfg), 4)))")
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(Path(S.__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == a


def test_more_shards_than_prompts_is_a_clear_error():
    cfg = S.make_config({"prompt_types": "code,natural", "prompts_per_type": 1})
    prompts = S.select_prompts(cfg)
    plan = S.build_plan(cfg, prompts)
    assert len(shard_plan(plan, prompts, "2/2")) > 0
    with pytest.raises(ValueError, match=r"--shard 3/3: the sweep has only 2 prompts.*N <= 2"):
        shard_plan(plan, prompts, "3/3")


# ------------------------------------------------------------------------------- shards of a tiny sweep


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, tiny_pair, near_draft_dir, prompt_file):
    """The same tiny sweep run in one piece and as shards 1/2 and 2/2 (three stores)."""
    root = tmp_path_factory.mktemp("shards")
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    local = S.run_sweep(cfg, db=root / "local.db", progress=False, echo=_quiet)
    one = S.run_sweep(cfg, db=root / "s1.db", progress=False, echo=_quiet, shard="1/2")
    two = S.run_sweep(cfg, db=root / "s2.db", progress=False, echo=_quiet, shard="2/2")
    return SimpleNamespace(cfg=cfg, root=root, local=local, one=one, two=two)


def test_shards_share_the_sweep_identity_and_record_their_shard(sharded):
    root, local, one, two = sharded.root, sharded.local, sharded.one, sharded.two
    assert local.sweep_id == one.sweep_id == two.sweep_id
    assert one.status == two.status == local.status == "done"
    assert one.planned + two.planned == local.planned and one.planned and two.planned
    for name, shard in (("s1.db", "1/2"), ("s2.db", "2/2"), ("local.db", "1/1")):
        with Store(root / name) as st:
            rows = st.conn.execute("SELECT sweep_id, shard, machine_id FROM shards").fetchall()
            assert [(r[0], r[1]) for r in rows] == [(local.sweep_id, shard)]
            mids = {r["machine_id"] for r in st.runs()}
            sweep_machine = st.get_sweep(local.sweep_id)["machine_json"]
            assert mids == {rows[0][2]} == {machine_id(sweep_machine)}  # every run names its machine
            assert "host" in json.loads(sweep_machine)
            assert st.conn.execute("SELECT COUNT(*) FROM machine_costs").fetchone()[0] > 0


def test_merged_shards_equal_the_local_sweep(sharded, tmp_path):
    root, local, one = sharded.root, sharded.local, sharded.one
    notes: list[str] = []
    res = merge_stores(tmp_path / "m.db", [root / "s1.db", root / "s2.db"], echo=notes.append)
    assert res.added == local.planned and res.duplicates == 0 and res.status == "done"
    assert res.shards == ["1/2", "2/2"] and not res.missing_shards
    merged, ref = _runs_by_cell(tmp_path / "m.db"), _runs_by_cell(root / "local.db")
    assert merged.keys() == ref.keys() and len(ref) == local.planned
    for key in ref:
        assert merged[key] == ref[key], key
    with Store(tmp_path / "m.db") as st, Store(root / "local.db") as lt:
        assert st.get_sweep(local.sweep_id)["status"] == "done"
        # acceptance traces and calibration blocks travel with the runs, their run ids renumbered
        def traces(store):
            return {t["prompt_id"]: (t["target_ids"], t["draft_ids"]) for t in store.traces()}
        assert traces(st) == traces(lt) and len(traces(lt)) == len({k.split("|")[2] for k in ref})
        for t in st.traces():
            run = st.runs(run_id=t["run_id"])[0]
            assert run["method"] == "baseline" and run["prompt_id"] == t["prompt_id"]
            assert json.loads(run["token_ids"]) == t["target_ids"]
        cal = st.calibration()
        assert cal and all(st.runs(run_id=c["after_run_id"])[0]["prompt_id"] == c["prompt_id"] for c in cal)
        # each machine's own cost curve is kept, keyed by machine
        assert st.conn.execute("SELECT COUNT(DISTINCT machine_id) FROM machine_costs").fetchone()[0] == 1
    # merging again, or the same shard twice, never duplicates a run
    again = merge_stores(tmp_path / "m.db", [root / "s1.db", root / "s1.db"], echo=notes.append)
    assert again.added == 0 and again.duplicates == 2 * one.planned
    assert any("kept one of each" in n for n in notes)
    assert len(_runs_by_cell(tmp_path / "m.db")) == local.planned


def test_merge_of_one_shard_says_the_others_are_missing(sharded, tmp_path):
    root, two = sharded.root, sharded.two
    notes: list[str] = []
    res = merge_stores(tmp_path / "half.db", [root / "s2.db"], echo=notes.append)
    assert res.missing_shards == ["1/2"] and res.status == "interrupted" and res.added == two.planned
    assert any("1/2" in n and "not in the merge" in n for n in notes)
    # the report of a store that lacks shards says so (its pooled figures cover the held shards only)
    from specdec.report.load import load_store

    for path in (tmp_path / "half.db", root / "s2.db"):
        want = ("the store holds shard(s) 2/2 of this sweep, not 1/2: every table and pooled figure covers the "
                "held shards' prompts only (`specdec merge` adds the others)")
        assert [n for n in load_store(path).notes if "shard" in n] == [want]
    assert not [n for n in load_store(root / "local.db").notes if "shard" in n]


def test_missing_shards_from_the_recorded_ones():
    from specdec.bench.shard import missing_shards

    assert missing_shards(["1/4"]) == ["2/4", "3/4", "4/4"]
    assert missing_shards(["2/2", "1/2"]) == [] and missing_shards(["1/1"]) == []
    assert missing_shards(["1/2", "1/3"]) == [] and missing_shards([]) == []


def test_killed_shard_resumes_without_loss_or_duplicates(sharded, tmp_path, monkeypatch):
    cfg, root, two = sharded.cfg, sharded.root, sharded.two
    from specdec.bench import methods

    real = methods.speculative_generate
    calls = {"n": 0}

    def dying(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:  # in the middle of shard 2's timed runs (warm-ups count too)
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(methods, "speculative_generate", dying)
    stored: list[dict] = []
    db = tmp_path / "s2-killed.db"
    with pytest.raises(KeyboardInterrupt):
        S.run_sweep(cfg, db=db, progress=False, echo=_quiet, on_run=stored.append, shard="2/2")
    assert 0 < len(stored) < two.planned
    monkeypatch.setattr(methods, "speculative_generate", real)
    res = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=_quiet, shard="2/2")
    assert res.already_done == len(stored) and res.ran == two.planned - len(stored) and res.status == "done"
    merged = merge_stores(tmp_path / "m.db", [root / "s1.db", db], echo=_quiet)
    assert merged.duplicates == 0 and merged.status == "done"
    got, ref = _runs_by_cell(tmp_path / "m.db"), _runs_by_cell(root / "local.db")
    assert got == ref


# ---------------------------------------------------------------------------------- machines and merges


def _store(path: Path, config: dict, machine: dict, *, seconds: float, prompts=("p1",)) -> str:
    sid = __import__("specdec.bench.store", fromlist=["sweep_id_for"]).sweep_id_for(config)
    with Store(path) as st:
        st.begin_sweep(sid, config, resume=False, machine=machine)
        st.save_costs(sid, "transformers-eager", {"target_forward_s": {1: seconds, 2: 2 * seconds},
                                                  "draft_forward_s": {1: seconds / 4}, "repeats": 1})
        for p in prompts:
            key = f"{sid}|transformers-eager|{p}|baseline|-|-|0"
            st.record_run({"sweep_id": sid, "cell_key": key, "config_label": "transformers-eager",
                           "prompt_id": p, "method": "baseline", "repeat": 0, "token_ids": [1, 2],
                           "new_tokens": 2, "total_s": seconds, "tokens_per_s": 2 / seconds},
                          [{"k": 0, "num_accepted": 0, "num_emitted": 1}])
    return sid


MACHINE_A = {"host": "aaaa", "cpu_model": "Xeon", "cpu_count": 2, "cpus_usable": 2, "memory_gib": 16.0,
             "device": "cpu", "device_name": "Xeon", "torch": "2.9", "loadavg_1m": 0.1}
MACHINE_B = {**MACHINE_A, "host": "bbbb", "cpu_model": "EPYC", "device_name": "EPYC", "cpu_count": 64}
CONFIG = {"target": "t", "draft": "d", "max_new_tokens": 8, "temperature": 0.0}


def test_shard_resumed_into_a_store_with_other_shards_counts_its_own_runs(sharded, tmp_path):
    """A shard run into the merged store (how a shard is finished on another machine) reports its own plan
    stored, not the whole store's runs over the shard's plan (it had printed '489/117')."""
    import shutil

    db = tmp_path / "s1-then-2.db"
    shutil.copy(sharded.root / "s1.db", db)  # shard 1 done; shard 2 goes into the same store
    lines: list[str] = []
    res = S.run_sweep(sharded.cfg, db=db, resume=True, progress=False, echo=lines.append, shard="2/2")
    assert res.status == "done" and res.ran == sharded.two.planned
    n = sharded.two.planned
    assert sharded.one.planned > 0 and lines[-1].endswith(f"{n}/{n} planned runs stored successfully"), lines[-1]


def test_machine_id_is_the_hardware_not_the_load_or_versions():
    assert machine_id(MACHINE_A) == machine_id({**MACHINE_A, "loadavg_1m": 3.0, "torch": "9"})
    assert machine_id(MACHINE_A) != machine_id(MACHINE_B) and machine_id(json.dumps(MACHINE_A)) == machine_id(MACHINE_A)
    assert machine_id(None) is None and machine_id("not json") is None


def test_merge_keeps_each_machine_and_its_own_costs(tmp_path):
    sid = _store(tmp_path / "a.db", CONFIG, MACHINE_A, seconds=0.5, prompts=("p1", "p2"))
    _store(tmp_path / "b.db", CONFIG, MACHINE_B, seconds=0.1, prompts=("p3",))
    res = merge_stores(tmp_path / "m.db", [tmp_path / "a.db", tmp_path / "b.db"])
    assert res.added == 3 and sorted(res.machines) == sorted([machine_id(MACHINE_A), machine_id(MACHINE_B)])
    with Store(tmp_path / "m.db") as st:
        by_prompt = {r["prompt_id"]: r["machine_id"] for r in st.runs(sid)}
        assert by_prompt == {"p1": machine_id(MACHINE_A), "p2": machine_id(MACHINE_A), "p3": machine_id(MACHINE_B)}
        assert all(len(st.rounds_of(r["run_id"])) == 1 for r in st.runs(sid))
        for m, s in ((MACHINE_A, 0.5), (MACHINE_B, 0.1)):
            st.machine_id = machine_id(m)
            costs = st.load_costs(sid, "transformers-eager")
            assert costs["target_step_s"] == s and costs["c"] == pytest.approx(0.25)
        st.machine_id = machine_id({**MACHINE_A, "host": "cccc"})
        assert st.load_costs(sid, "transformers-eager") is None  # a third machine measures its own
        js = dict(st.conn.execute("SELECT machine_id, machine_json FROM machines").fetchall())
        assert json.loads(js[machine_id(MACHINE_B)])["cpu_model"] == "EPYC"


def test_merge_refuses_another_sweep_in_one_line(tmp_path):
    _store(tmp_path / "a.db", CONFIG, MACHINE_A, seconds=0.5)
    _store(tmp_path / "b.db", {**CONFIG, "max_new_tokens": 16}, MACHINE_B, seconds=0.1)
    with pytest.raises(StoreError, match=r"b\.db holds sweep.*max_new_tokens=16 vs 8") as err:
        merge_stores(tmp_path / "m.db", [tmp_path / "a.db", tmp_path / "b.db"])
    assert "\n" not in str(err.value) and not (tmp_path / "m.db").exists()
    with pytest.raises(StoreError, match="no such results database"):
        merge_stores(tmp_path / "m.db", [tmp_path / "missing.db"])


def test_old_store_without_machine_records_still_loads_and_merges(tmp_path):
    """A store written before per-run machines: no runs.machine_id, no machines/machine_costs/shards."""
    sid = _store(tmp_path / "old.db", CONFIG, MACHINE_A, seconds=0.5)
    import sqlite3

    con = sqlite3.connect(tmp_path / "old.db")
    con.execute("ALTER TABLE runs DROP COLUMN machine_id")
    for t in ("machines", "machine_costs", "shards"):
        con.execute(f"DROP TABLE {t}")
    con.commit()
    con.close()
    with Store(tmp_path / "old.db") as st:  # upgraded in place, additively
        assert [r["machine_id"] for r in st.runs(sid)] == [None]
        assert st.load_costs(sid, "transformers-eager")["target_step_s"] == 0.5
    res = merge_stores(tmp_path / "m.db", [tmp_path / "old.db"])
    assert res.added == 1 and res.machines == [machine_id(MACHINE_A)]
    with Store(tmp_path / "m.db") as st:
        assert [r["machine_id"] for r in st.runs(sid)] == [machine_id(MACHINE_A)]
        st.machine_id = machine_id(MACHINE_A)
        assert st.load_costs(sid, "transformers-eager")["target_step_s"] == 0.5


# ------------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from specdec.bench.commands import register

    app = typer.Typer()
    register(app)
    return app


def _one_error(output: str) -> None:
    assert len([ln for ln in output.splitlines() if ln.startswith("specdec: error:")]) == 1, output


def test_cli_merge(app, sharded, tmp_path):
    root, local = sharded.root, sharded.local
    runner = CliRunner()
    out = tmp_path / "m.db"
    res = runner.invoke(app, ["merge", "--out", str(out), str(root / "s1.db"), str(root / "s2.db")])
    assert res.exit_code == 0, res.output
    assert f"{local.planned} runs added" in res.output and "shards 1/2, 2/2" in res.output
    assert "machine " in res.output
    _store(tmp_path / "x.db", CONFIG, MACHINE_A, seconds=0.5)
    bad = runner.invoke(app, ["merge", "--out", str(tmp_path / "n.db"), str(root / "s1.db"), str(tmp_path / "x.db")])
    assert bad.exit_code == 2 and "only shards of one sweep merge" in bad.output
    _one_error(bad.output)


def test_cli_sweep_shard_and_executor_errors(app, tmp_path, monkeypatch):
    runner = CliRunner()
    db = tmp_path / "e.db"
    for args, text in (
        (["--shard", "3/2"], "need 1 <= I <= N"),
        (["--shard", "x"], "expected I/N"),
        (["--shard", "0/0"], "need 1 <= I <= N"),
        (["--executor", "slurm"], "choose one of local, ray"),
        (["--address", "1.2.3.4:6379"], "use it with --executor ray"),
    ):
        res = runner.invoke(app, ["sweep", "--db", str(db), *args])
        assert res.exit_code == 2 and text in res.output, res.output
        _one_error(res.output)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    res = runner.invoke(app, ["sweep", "--db", str(db), "--executor", "ray"])
    assert res.exit_code == 2 and "pip install -e '.[ray]'" in res.output
    _one_error(res.output)
    assert not db.exists()


def test_cli_sweep_shard_dry_run_and_run(app, tmp_path, tiny_pair, near_draft_dir, prompt_file):
    runner = CliRunner()
    args = ["sweep", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompts",
            str(prompt_file), "--ks", "1", "--secondary-ks", "1", "--max-new-tokens", "4", "--no-peers",
            "--policies", "none", "--no-progress", "--threads", "1"]
    full = runner.invoke(app, args + ["--dry-run", "--db", str(tmp_path / "d.db")])
    parts = [runner.invoke(app, args + ["--dry-run", "--shard", f"{i}/2", "--db", str(tmp_path / "d.db")])
             for i in (1, 2)]
    count = [int(next(ln for ln in r.output.splitlines() if "timed generations:" in ln).split()[0])
             for r in (full, *parts)]
    assert count[0] == count[1] + count[2] and count[1] and count[2]
    res = runner.invoke(app, args + ["--shard", "2/2", "--db", str(tmp_path / "s.db")])
    assert res.exit_code == 0, res.output
    with Store(tmp_path / "s.db") as st:
        assert st.conn.execute("SELECT shard FROM shards").fetchone()[0] == "2/2"
        assert len(st.runs()) == count[2]


# ------------------------------------------------------------------------------------------------- Ray


@pytest.fixture
def ray_cluster(monkeypatch):
    """A real two-node Ray cluster on 127.0.0.1 (one CPU each), shut down, every process, afterwards."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    # Loopback only: without this, ray.init() rewrites 127.0.0.1 into the host's network address
    # (ray._private.services.resolve_ip_for_localhost), where a loopback-bound GCS does not listen.
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_ray_two_nodes_two_shards_merge_equals_local(ray_cluster, tmp_path, tiny_pair, near_draft_dir,
                                                     prompt_file):
    import ray

    from specdec.bench.ray_executor import run_sweep_ray, shard_store_path

    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, prompt_types="repetitive", ks="1", secondary_ks="1",
               max_new_tokens=4, methods="baseline,draft", baseline_repeats=1)
    local = S.run_sweep(cfg, db=tmp_path / "local.db", progress=False, echo=_quiet)
    db = tmp_path / "ray.db"
    lines: list[str] = []
    kw = {"db": db, "address": ray_cluster.address, "progress": False, "echo": lines.append,
          "local_dir": str(tmp_path / "nodes")}
    # a first attempt stopped after one run per shard (as a killed task leaves it), then resumed
    first = run_sweep_ray(cfg, max_runs=1, **kw)
    assert [s.status for s in first.shards] == ["interrupted", "interrupted"] and first.status == "interrupted"
    assert len({s.node for s in first.shards}) == 2  # one shard per node
    assert not ray.is_initialized()
    with pytest.raises(StoreError, match="--resume"):
        run_sweep_ray(cfg, **kw)
    again = run_sweep_ray(cfg, resume=True, **kw)
    assert [s.status for s in again.shards] == ["done", "done"] and again.status == "done"
    assert sum(s.ran for s in again.shards) == local.planned - 2
    for s in ("1/2", "2/2"):
        assert shard_store_path(db, parse_shard(s)).is_file()
    assert _runs_by_cell(db) == _runs_by_cell(tmp_path / "local.db")
    with Store(db) as st:
        assert sorted(r[0] for r in st.conn.execute("SELECT shard FROM shards")) == ["1/2", "2/2"]
        assert st.get_sweep(local.sweep_id)["status"] == "done"


def _pid_holding(path: Path) -> int | None:
    """The pid of a process with `path` open (Linux /proc), or None."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) == str(path):
                    return int(d.name)
        except OSError:
            continue
    return None


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs Linux /proc to find the worker")
def test_ray_shard_killed_mid_way_resumes_without_loss_or_duplicates(ray_cluster, tmp_path, tiny_pair,
                                                                    near_draft_dir, prompt_file):
    import signal
    import sqlite3
    import threading
    import time

    from specdec.bench.ray_executor import run_sweep_ray

    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, prompt_types="repetitive", ks="1,2", max_new_tokens=48,
               repeats=2, baseline_repeats=2)
    local = S.run_sweep(cfg, db=tmp_path / "local.db", progress=False, echo=_quiet)
    db = tmp_path / "ray.db"
    kw = {"db": db, "address": ray_cluster.address, "progress": False, "echo": _quiet,
          "local_dir": str(tmp_path / "nodes")}
    victim = tmp_path / "nodes" / "specdec-ray" / local.sweep_id / "shard-2-of-2.db"
    killed: dict[str, int] = {}

    def kill_after_first_run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if victim.is_file():
                try:
                    con = sqlite3.connect(f"file:{victim}?mode=ro", uri=True, timeout=1)
                    n = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
                    con.close()
                except sqlite3.DatabaseError:
                    n = 0
                if n >= 1:
                    pid = _pid_holding(victim)
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                        killed["runs"] = n
                        return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_after_first_run)
    killer.start()
    first = run_sweep_ray(cfg, **kw)
    killer.join()
    assert killed, "the shard-2 worker was never caught mid-way"
    by = {s.shard: s for s in first.shards}
    assert by["1/2"].status == "done" and by["2/2"].status == "failed" and first.status == "interrupted"
    with Store(db) as st:  # shard 1 is merged already; shard 2's runs are on its node's disk only
        assert 0 < len(st.runs()) < local.planned
    with Store(victim) as st:
        on_node = {r["cell_key"] for r in st.runs()}
    assert len(on_node) >= killed["runs"]
    again = run_sweep_ray(cfg, resume=True, **kw)
    assert again.status == "done"
    # shard 1 had nothing left; shard 2 ran only what its node-local store did not hold
    assert {s.shard: s.ran for s in again.shards} == {"1/2": 0, "2/2": local.planned - by["1/2"].ran - len(on_node)}
    assert _runs_by_cell(db) == _runs_by_cell(tmp_path / "local.db")


def test_host_id_tells_apart_two_boots_of_one_host_name(tmp_path):
    """Two VMs of this workplace share the host name 'vm' (and one ran fp32 steps 1.5x slower than the other):
    the host id hashes the boot id too, so their runs are two machines; one boot keeps one id."""
    from specdec.measure.environment import host_id

    a, b = tmp_path / "boot_a", tmp_path / "boot_b"
    a.write_text("1111-aaaa\n")
    b.write_text("2222-bbbb\n")
    assert host_id(str(a)) == host_id(str(a)) != host_id(str(b))
    assert len(host_id(str(a))) == 12 and host_id(str(tmp_path / "none")) != host_id(str(a))
