"""Which machine timed a run: a per-run machine record in the results store, for sharded sweeps.

Before sharding, one sweep ran on one machine, so ``sweeps.machine_json`` described every run. A sweep
split over N machines (``--shard I/N``, ``--executor ray``) and merged back (`specdec.bench.merge`) needs
the machine per run and the cost curve per machine, because every speedup and every cost-model prediction
must come from one machine (docs/METHOD.md). Additions to schema version 1 (additive, so older stores
still load and older code still reads newer stores):

- ``machines (machine_id PK, machine_json)``: each machine seen, its full `machine_info` description;
- ``runs.machine_id``: the machine that timed the run (added with ``ALTER TABLE`` when a store from
  before this column is opened; NULL on old rows, meaning "the machine in ``sweeps.machine_json``");
- ``machine_costs``: the ``costs`` columns plus ``machine_id`` in the key: each machine's own cost curve.
  ``costs`` keeps being written as before (the curve of the last machine that measured it in this file);
- ``shards (sweep_id, shard, machine_id, started_at)``: which shard(s) of the sweep a store holds, and
  where each ran (``shard`` is ``"I/N"``; ``"1/1"`` for an unsharded sweep).

``machine_id`` is ``sha256[:16]`` of the canonical JSON of the hardware fields of the description
(`FINGERPRINT_KEYS`): the host (a hash of its name and boot id, never the name), CPU model, logical and usable CPUs,
memory, device and device name. Library versions and the load average are recorded but not in the id.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from specdec.store_info import machine_label  # re-exported: the bench's machine API

__all__ = [
    "FINGERPRINT_KEYS",
    "machine_cost_rows",
    "machine_id",
    "machine_label",
    "record_shard",
    "register_machine",
]

#: Fields of `specdec.bench.sweep.machine_info` that identify a machine (absent ones are skipped).
FINGERPRINT_KEYS = ("host", "cpu_model", "cpu_count", "cpus_usable", "memory_gib", "device", "device_name")



#: Where Linux keeps the id of the current boot (a new one at every boot of every machine or VM).


def machine_id(machine: Mapping[str, Any] | str | None) -> str | None:
    """``sha256[:16]`` of the `FINGERPRINT_KEYS` of a machine description (a dict or its JSON); None for
    None / unparsable JSON."""
    if machine is None:
        return None
    if isinstance(machine, str):
        try:
            machine = json.loads(machine)
        except ValueError:
            return None
    if not isinstance(machine, Mapping):
        return None
    fp = {k: machine.get(k) for k in FINGERPRINT_KEYS if k in machine}
    text = json.dumps(fp, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def register_machine(conn, machine: Mapping[str, Any] | str | None) -> str | None:
    """Insert the machine into ``machines`` (kept as first recorded) and return its `machine_id`."""
    mid = machine_id(machine)
    if mid is None:
        return None
    text = machine if isinstance(machine, str) else json.dumps(machine, sort_keys=True, default=str)
    conn.execute("INSERT OR IGNORE INTO machines (machine_id, machine_json) VALUES (?, ?)", (mid, text))
    return mid


def record_shard(store, sweep_id: str, shard: Any = None) -> None:
    """Record in `store` that it holds shard `shard` (``"I/N"``; None = ``"1/1"``) of `sweep_id`, run on the
    store's current machine (`store.machine_id`, set by `Store.begin_sweep`). Idempotent."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    with store.transaction() as conn:
        conn.execute(
            "INSERT OR IGNORE INTO shards (sweep_id, shard, machine_id, started_at) VALUES (?, ?, ?, ?)",
            (sweep_id, str(shard) if shard is not None else "1/1", getattr(store, "machine_id", None), now),
        )


def machine_cost_rows(conn, sweep_id: str, config_label: str, mid: str | None,
                      roles: tuple[str, ...] = ("target", "draft")) -> list | None:
    """``(role, n_tokens, seconds, repeats, spread_s)`` rows of `roles` of machine `mid`'s own cost curve, ``[]``
    when other machines measured this sweep and config_label but `mid` did not (so it must measure its own),
    or None when the store has no per-machine costs for it (a store from before them: use ``costs``)."""
    if mid is None:
        return None
    among = f"role IN ({', '.join('?' * len(roles))})"
    have = conn.execute(f"SELECT COUNT(*) FROM machine_costs WHERE sweep_id = ? AND config_label = ? AND {among}",
                        (sweep_id, config_label, *roles)).fetchone()[0]
    if not have:
        return None
    return conn.execute(
        "SELECT role, n_tokens, seconds, repeats, spread_s FROM machine_costs WHERE sweep_id = ? AND "
        f"config_label = ? AND machine_id = ? AND {among} ORDER BY role, n_tokens",
        (sweep_id, config_label, mid, *roles),
    ).fetchall()
