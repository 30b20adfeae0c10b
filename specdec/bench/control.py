"""How one sweep process is controlled: one writer per results store, SIGTERM stopping it like Ctrl-C
(with the shell's exit status for it), the shard of the plan it runs, and how ``--resume`` applies along a
temperature axis."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from specdec.bench.plan import Prepared, prepare
from specdec.bench.shard import Shard, shard_plan
from specdec.bench.store import Store, writer_lock

__all__ = [
    "LOCK_WAIT_S",
    "SIGTERM_REASON",
    "axis_resume",
    "for_shard",
    "interrupt_exit_status",
    "sigterm_as_interrupt",
    "sweep_guard",
]

#: Seconds a sweep waits for another sweep writing the same store before it stops (``--wait-for-store``).
LOCK_WAIT_S = 10.0
SIGTERM_REASON = "SIGTERM"  # the KeyboardInterrupt's argument when a SIGTERM raised it (exit status 143)


def interrupt_exit_status(exc: KeyboardInterrupt) -> int:
    """The shell's exit status for a sweep stopped by `exc`: 143 (128 + 15) when SIGTERM raised it (see
    `sigterm_as_interrupt`), 130 (128 + 2) for Ctrl-C."""
    return 128 + signal.SIGTERM if exc.args == (SIGTERM_REASON,) else 128 + signal.SIGINT


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a sweep runs in the main thread, SIGTERM raises KeyboardInterrupt, so a sweep stopped by
    `kill`, a SLURM time limit or a job scheduler is marked ``interrupted`` like one stopped by Ctrl-C
    (finished runs are kept either way; a background job of a non-interactive shell ignores SIGINT, so
    SIGTERM is how it is stopped). The previous handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(_signum, _frame):
        raise KeyboardInterrupt(SIGTERM_REASON)

    old = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def sweep_guard(db: str | Path, wait_s: float) -> Iterator[None]:
    """Hold `db`'s one-writer lock (`specdec.bench.store.writer_lock`: a second sweep on the same store waits
    up to `wait_s` seconds, then stops with ``StoreBusyError``) with SIGTERM raised as an interrupt."""
    with writer_lock(db, wait_s=wait_s), sigterm_as_interrupt():
        yield


def for_shard(prepared: Prepared, shard: Shard | str | None) -> Prepared:
    """`prepared` with only shard `shard`'s runs in its plan (`specdec.bench.shard.shard_plan`; None: all).
    The identity, and so the sweep id, is unchanged: the shards of one sweep merge into one store."""
    if shard is None:
        return prepared
    return dataclasses.replace(prepared, plan=shard_plan(prepared.plan, prepared.prompts, shard))


def axis_resume(axis, db_path: Path, resume: bool) -> list[bool]:
    """``--resume`` for each sweep of a temperature axis (`specdec.bench.config.axis_configs`), in order: a
    sweep the store does not hold yet starts (False) once another sweep of the axis is there, so one command
    starts or continues the whole axis; otherwise `resume` (a store holding none of them still refuses a
    mistyped ``--resume``)."""
    if not resume or len(axis) == 1 or not db_path.is_file():
        return [resume] * len(axis)
    ids = [prepare(c).sweep_id for c in axis]
    with Store(db_path, readonly=True) as store:
        held = {sid for sid in ids if store.get_sweep(sid) is not None}
    return [sid in held or not held for sid in ids]
