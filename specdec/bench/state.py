"""What one `specdec.bench.runner.run_sweep` call carries from its first run to its last: `SweepState`, and
what it hands back: `SweepResult`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdec.bench.config import SweepConfig
from specdec.bench.plan import Prepared
from specdec.bench.store import Store

__all__ = ["SweepResult", "SweepState"]


@dataclass
class SweepResult:
    """What `run_sweep` did.

    Attributes:
        sweep_id, db: the sweep and its database.
        planned: runs in the plan; already_done: of those, finished before this call (resume).
        ran: runs executed now (successful + failed); failed: of those, recorded with an error;
        skipped: recorded as skipped (error starting with ``skipped:``).
        status: ``done`` (every planned run attempted) or ``interrupted``.
        failed_configs: config_label -> one-line load error, for configurations that could not be loaded.
    """

    sweep_id: str
    db: str
    planned: int
    already_done: int
    ran: int = 0
    failed: int = 0
    skipped: int = 0
    status: str = "running"
    failed_configs: dict[str, str] = field(default_factory=dict)


@dataclass
class SweepState:
    """Everything the runs of one sweep share, passed from configuration to configuration.

    Attributes:
        cfg: the sweep's settings. prepared: its plan, prompts and identity (`specdec.bench.plan.prepare`).
        store: the open results store. loader: `specdec.runtimes.loading.load_pair`-compatible.
        result: the running tally (`SweepResult`), returned at the end.
        echo: where console lines go (None: print, or above the progress bar once there is one).
        bar: the progress bar (tqdm; None before the runs to do are known).
        max_runs: stop after this many runs (None: run the plan). on_run: called with each stored row.
        baseline_tps: tokens/s of this machine's stored target-only runs per (config_label, prompt_id), for
            the console's "x vs baseline".
    """

    cfg: SweepConfig
    prepared: Prepared
    store: Store
    loader: Callable[..., Any]
    result: SweepResult
    echo: Callable[[str], None] | None = None
    bar: Any = None
    max_runs: int | None = None
    on_run: Callable[[dict], None] | None = None
    baseline_tps: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    @property
    def sweep_id(self) -> str:
        return self.prepared.sweep_id

    def log(self, msg: str) -> None:
        """One console line: above the progress bar when there is one and no `echo`, else to `echo` (print)."""
        if self.bar is not None and self.echo is None:
            self.bar.write(msg)
        else:
            (self.echo or print)(msg)

    def advance(self, n: int = 1) -> None:
        """Move the progress bar by `n` runs (done, failed or left out)."""
        if self.bar is not None:
            self.bar.update(n)

    def stop_now(self) -> bool:
        """Whether `max_runs` runs have been made in this call."""
        return self.max_runs is not None and self.result.ran >= self.max_runs
