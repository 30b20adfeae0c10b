"""Run a sweep's shards as Ray tasks, one per node (``specdec sweep --executor ray [--address ADDR]``).

Ray (https://docs.ray.io; the engine Spec-Bench's and vLLM's tooling use) schedules; specdec does not.
The plan is split by prompt (`specdec.bench.shard`) into one shard per node (or ``shards`` shards). Shard i
is pinned to node i mod #nodes (`NodeAffinitySchedulingStrategy`, hard) and asks for **all the CPUs of that
node** (``num_cpus`` = the node's CPU count, plus its GPUs when it has any), so no other Ray task runs beside
a timed run (two timed runs never share a machine); shards beyond the node count wait for
their node. Each task runs `specdec.bench.sweep.run_sweep` with ``shard=i/N`` into a SQLite store on the
node's LOCAL disk (SQLite over a network file system is unsafe), then returns the file's bytes; the driver
writes them next to the output as ``<db stem>.shard-I-of-N<suffix>`` and merges every shard store into
`db` with `specdec.bench.merge.merge_stores`. One progress bar (tqdm) on the driver counts the runs of all
shards, fed by a small progress actor.

Failures: a shard whose task fails (an error, a lost node, a cancelled task) is reported and left out of the
merge; the other shards are stored and merged. Rerunning the same command with ``resume=True``
(``--resume``) sends each shard the store the driver holds for it (and the task also picks up a store left
on its node by a killed attempt, whichever has more finished runs), so finished runs are skipped, never
duplicated, and only the missing ones run.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.bench.shard import Shard, split_plan

__all__ = [
    "RAY_INSTALL_HINT",
    "RaySweepResult",
    "ShardOutcome",
    "require_ray",
    "run_sweep_ray",
    "shard_store_path",
]

RAY_INSTALL_HINT = "--executor ray needs Ray, an optional extra: pip install -e '.[ray]'"


def require_ray():
    """Import and return ``ray``.

    Raises:
        ValueError: Ray is not installed (one line: how to install it).
    """
    try:
        import ray
    except ImportError:
        raise ValueError(RAY_INSTALL_HINT) from None
    return ray


def shard_store_path(db: str | Path, shard: Shard) -> Path:
    """Where the driver keeps shard `shard`'s store: ``<db dir>/<db stem>.shard-I-of-N<db suffix>``."""
    db = Path(db)
    return db.with_name(f"{db.stem}.{shard.tag}{db.suffix or '.db'}")


@dataclass
class ShardOutcome:
    """One shard's task: ``status`` is the shard sweep's (``done``/``interrupted``) or ``failed``."""

    shard: str
    node: str | None
    status: str
    ran: int = 0
    failed_runs: int = 0
    error: str | None = None
    path: str | None = None


@dataclass
class RaySweepResult:
    """What `run_sweep_ray` did: per-shard outcomes and the merge (`specdec.bench.merge.MergeResult`)."""

    sweep_id: str
    db: str
    shards: list[ShardOutcome] = field(default_factory=list)
    merge: Any = None

    @property
    def status(self) -> str:
        """``done`` when every shard finished and the merge holds them all, else ``interrupted``."""
        ok = all(s.status == "done" for s in self.shards)
        return "done" if ok and self.merge is not None and self.merge.status == "done" else "interrupted"


def _successful_runs(path: Path) -> int:
    try:
        con = sqlite3.connect(str(path))
        try:
            return int(con.execute("SELECT COUNT(*) FROM runs WHERE error IS NULL").fetchone()[0])
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return -1


def _has_sweep(path: Path, sweep_id: str) -> bool:
    if not path.is_file():
        return False
    con = sqlite3.connect(str(path))
    try:
        return con.execute("SELECT 1 FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone() is not None
    except sqlite3.DatabaseError:
        return False
    finally:
        con.close()


def _store_bytes(path: Path) -> bytes:
    """The whole store as one file's bytes (the WAL checkpointed into it first)."""
    con = sqlite3.connect(str(path))
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    return path.read_bytes()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    for side in ("-wal", "-shm"):  # a stale WAL next to a replaced file would corrupt it
        Path(str(path) + side).unlink(missing_ok=True)
    os.replace(tmp, path)


def _shard_task(cfg, shard: Shard, sweep_id: str, driver_copy: bytes | None, resume: bool, progress,
                max_runs: int | None, local_dir: str | None) -> dict:
    """Body of one Ray task: run shard `shard` of `cfg` into a node-local store and return its bytes.

    Returns:
        ``{"shard", "node", "status", "ran", "failed", "data" (bytes)}``.
    """
    from specdec.bench.sweep import run_sweep

    root = Path(local_dir or tempfile.gettempdir()) / "specdec-ray" / sweep_id
    root.mkdir(parents=True, exist_ok=True)
    local = root / f"{shard.tag}.db"
    if resume and driver_copy is not None:
        theirs = root / f"{shard.tag}.driver.db"
        _write_atomic(theirs, driver_copy)
        if not local.is_file() or _successful_runs(theirs) >= _successful_runs(local):
            for side in ("-wal", "-shm"):
                Path(str(local) + side).unlink(missing_ok=True)
            os.replace(theirs, local)
        else:
            theirs.unlink(missing_ok=True)
    elif not resume and local.is_file() and not _has_sweep(local, sweep_id):
        local.unlink()
    import ray

    node = ray.get_runtime_context().get_node_id()
    if progress is not None:
        progress.start.remote(str(shard))

    def on_run(_row: dict) -> None:
        if progress is not None:
            progress.add.remote(str(shard), 1)

    def echo(msg: str) -> None:
        print(f"[shard {shard}] {msg}", flush=True)

    res = run_sweep(cfg, db=local, resume=resume and _has_sweep(local, sweep_id), progress=False, echo=echo,
                    max_runs=max_runs, on_run=on_run, shard=shard)
    data = _store_bytes(local)
    if res.status == "done":
        local.unlink(missing_ok=True)  # the driver has it; a killed attempt's store is kept for --resume
    return {"shard": str(shard), "node": node, "status": res.status, "ran": res.ran, "failed": res.failed,
            "data": data}


def _alive_nodes(ray) -> list[dict]:
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    return sorted(nodes, key=lambda n: n["NodeID"])


def run_sweep_ray(
    cfg,
    *,
    db: str | Path,
    resume: bool = False,
    address: str | None = None,
    shards: int | None = None,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
    max_runs: int | None = None,
    local_dir: str | None = None,
    ship_code: bool = True,
) -> RaySweepResult:
    """Run sweep `cfg` on a Ray cluster, one shard per node, and merge the shard stores into `db`.

    Args:
        cfg: the sweep (`specdec.bench.sweep.make_config`); every node must be able to load its models.
        db: the merged store on the driver; shard stores go next to it (`shard_store_path`).
        resume: continue: each shard resumes from its store (driver copy or node-local leftover).
        address: the Ray cluster (``ray.init(address=...)``; None: ``RAY_ADDRESS`` or a local Ray).
            Ignored when Ray is already initialised in this process.
        shards: number of shards (default: the number of alive nodes with CPUs).
        progress: one tqdm bar (stderr) over the runs of all shards.
        echo: receives the driver's summary lines (default: print).
        max_runs: per shard, stop after this many runs (partial runs; resume later).
        local_dir: the node-local directory for shard stores (default: the node's temp dir).
        ship_code: send the driver's ``specdec`` package to the tasks (Ray ``runtime_env`` ``py_modules``, set
            when this call starts the Ray connection), so every node runs the driver's specdec code; False:
            the nodes' installed specdec.

    Returns:
        A `RaySweepResult` (its ``status`` is ``interrupted`` when a shard failed or stopped early).

    Raises:
        ValueError: Ray missing (install hint), bad settings (before any task starts), shard stores of this
            sweep already present without `resume`, or no node with CPUs.
    """
    from specdec.bench.sweep import prepare

    ray = require_ray()
    say = echo or print
    prepared = prepare(cfg)  # every setting checked before the cluster is touched
    prompts, sid, plan = prepared.prompts, prepared.sweep_id, prepared.plan
    db = Path(db)
    started = False
    if not ray.is_initialized():
        # Every node runs the driver's specdec: Ray ships the package (models and libraries must be there).
        import specdec

        env = {"py_modules": [str(Path(specdec.__file__).parent)]} if ship_code else None
        ray.init(address=address, log_to_driver=True, include_dashboard=False, runtime_env=env)
        started = True
    try:
        nodes = _alive_nodes(ray)
        if not nodes:
            raise ValueError("the Ray cluster has no alive node with CPUs")
        n = shards or len(nodes)
        parts = split_plan(plan, prompts, n)
        todo = [Shard(i + 1, n) for i in range(n) if parts[i]]
        if len(todo) < n:
            say(f"{n - len(todo)} shard(s) hold no prompt (only {len({c.prompt.id for c in plan})} prompts)")
        if not resume:
            _refuse_started(db, todo, sid)
        say(f"sweep {sid}: {len(plan)} timed generations in {len(todo)} shard(s) on {len(nodes)} Ray node(s), "
            f"one shard per node at a time, each holding all its node's CPUs")
        actor = ray.remote(num_cpus=0)(_Progress).remote()
        refs = _submit(ray, todo, nodes, cfg, sid, db, resume, actor, max_runs, local_dir)
        out = RaySweepResult(sid, str(db))
        _collect(ray, refs, actor, db, out, total=sum(len(parts[s.index - 1]) for s in todo), progress=progress)
        stores = [p for p in (shard_store_path(db, Shard(i + 1, n)) for i in range(n)) if p.is_file()]
        if stores:
            out.merge = _merge_into(db, stores, say)
        out.shards.sort(key=lambda o: int(o.shard.split("/")[0]))
        return out
    finally:
        if started:
            ray.shutdown()


def _refuse_started(db: Path, todo: list[Shard], sid: str) -> None:
    """Without --resume: refuse a merged store or a shard store that already holds runs of this sweep.

    Raises:
        StoreError: one line naming the first such store.
    """
    from specdec.bench.store import StoreError

    clash = [str(shard_store_path(db, s)) for s in todo if _has_sweep(shard_store_path(db, s), sid)]
    if _has_sweep(db, sid):
        clash.insert(0, str(db))
    if clash:
        raise StoreError(f"{clash[0]} already holds runs of this sweep (id {sid}); pass --resume to "
                         f"continue it, or --db NEW.db to start afresh")


class _Progress:
    """Runs done per shard, as the shard tasks report them (a Ray actor: `run_sweep_ray`)."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}

    def start(self, shard: str) -> None:
        self.done.setdefault(shard, 0)

    def add(self, shard: str, k: int) -> None:
        self.done[shard] = self.done.get(shard, 0) + k

    def snapshot(self) -> dict[str, int]:
        return dict(self.done)


def _submit(ray, todo: list[Shard], nodes: list[dict], cfg, sid: str, db: Path, resume: bool, actor,
            max_runs: int | None, local_dir: str | None) -> dict[Any, Shard]:
    """Start one task per shard, pinned to its node and holding all of the node's CPUs (and GPUs); with
    `resume` it gets the driver's copy of its store. Returns task ref -> shard."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(_shard_task)
    refs: dict[Any, Shard] = {}
    for s in todo:
        node = nodes[(s.index - 1) % len(nodes)]
        res = node.get("Resources", {})
        copy = shard_store_path(db, s)
        data = copy.read_bytes() if resume and copy.is_file() else None
        opts: dict[str, Any] = {
            "num_cpus": res.get("CPU", 1),
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            "max_retries": 0,
        }
        if res.get("GPU"):
            opts["num_gpus"] = res["GPU"]
        ref = task.options(**opts).remote(cfg, s, sid, data, resume, actor, max_runs, local_dir)
        refs[ref] = s
    return refs


def _collect(ray, refs: dict[Any, Shard], actor, db: Path, out: RaySweepResult, *, total: int,
             progress: bool) -> None:
    """Wait for the shard tasks, one progress bar over all their runs; keep each finished shard's store
    beside `db` and record every shard's outcome in `out` (a failed or lost shard is reported, not raised)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="run", disable=not progress, file=sys.stderr, dynamic_ncols=True,
               desc=f"sweep ({len(refs)} shards)")
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            with_done = sum(ray.get(actor.snapshot.remote()).values())
            bar.update(max(0, with_done - bar.n))
            for ref in ready:
                s = refs[ref]
                try:
                    r = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a failed/lost shard is reported, the rest merge
                    line = str(exc).strip().splitlines()
                    msg = next((x for x in reversed(line) if x.strip()), type(exc).__name__)[:300]
                    out.shards.append(ShardOutcome(str(s), None, "failed", error=msg))
                    bar.write(f"shard {s} failed: {msg}")
                    continue
                path = shard_store_path(db, s)
                _write_atomic(path, r["data"])
                out.shards.append(ShardOutcome(str(s), r["node"], r["status"], r["ran"], r["failed"],
                                               path=str(path)))
                bar.write(f"shard {s} {r['status']} on node {r['node'][:8]}: {r['ran']} runs now "
                          f"({r['failed']} failed); store {path}")
    finally:
        bar.close()


def _merge_into(db: Path, stores: list[Path], say):
    """Merge the shard `stores` into `db` (an existing `db` is kept and added to) through a temporary copy
    renamed into place; returns the `specdec.bench.merge.MergeResult`."""
    from specdec.bench.merge import merge_stores

    merged = db.with_name(db.name + ".merging")
    for side in ("", "-wal", "-shm"):
        Path(str(merged) + side).unlink(missing_ok=True)
    if db.is_file():  # an earlier merge (or the user's store): kept, and added to
        src, dst = sqlite3.connect(str(db)), sqlite3.connect(str(merged))
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
    result = merge_stores(merged, stores, echo=lambda m: None if "already in" in m else say(m))
    for side in ("-wal", "-shm"):
        Path(str(db) + side).unlink(missing_ok=True)
    os.replace(merged, db)
    Path(str(merged) + "-wal").unlink(missing_ok=True)
    Path(str(merged) + "-shm").unlink(missing_ok=True)
    return result
