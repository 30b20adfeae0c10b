"""The table registry: every table of the report, registered once with its builder.

Each `ReportTable` names one table (its key in :attr:`specdec.report.analysis.Analysis.tables`), says in a
few words what it is (the sentence written to the report's gaps when it cannot be computed), and builds it
from the `Inputs` (prepared runs, rounds, measured costs and the tables registered before it). `analyze`
iterates `REGISTRY` in order; the report's sections (:mod:`specdec.report.render`) and figures
(:mod:`specdec.report.plots`) read tables through these handles (``analysis[BEST_K]``), never by a name
typed again, so a renamed or removed table fails at import time instead of reading as an empty frame.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specdec.report.answer import predicted_vs_measured, type_answer
from specdec.report.cells import best_k_table, cell_table
from specdec.report.comparisons import (
    adaptive_table,
    equality_table,
    peer_table,
    runtime_by_type_table,
    runtime_summary_table,
)
from specdec.report.diagnostics import (
    aa_table,
    baseline_stability_table,
    coverage_table,
    divergence_table,
    drift_cells,
    drift_runs,
    gaps_table,
    position_acceptance,
    roofline_table,
)
from specdec.report.drafters import drafter_ratio_table, drafter_table
from specdec.report.load import default_policy_of, parse_json
from specdec.report.model import (
    CostInfo,
    break_even_table,
    model_table,
    optimal_k_table,
    spec_ks_by_config,
    speedup_condition_table,
)
from specdec.report.native import native_table
from specdec.report.predicted import (
    machine_curves,
    prompt_models,
    stored_curves,
    trace_best_k,
    trace_grid,
)
from specdec.report.sampled import sampled_check
from specdec.report.synthetic import synthetic_table
from specdec.report.vocab import CELL_KEY

__all__ = ["REGISTRY", "Inputs", "ReportTable"]


@dataclass
class Inputs:
    """What the builders read: prepared runs (`specdec.report.load.prepare_runs`), the store's rounds,
    `CostInfo` per config_label, and the tables built so far (by name)."""

    runs: pd.DataFrame
    rounds: pd.DataFrame
    infos: dict[str, CostInfo]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    store: Any = None  # the `specdec.report.load.StoreData` (traces, calibration, costs, sweep config)
    _models: list | None = None

    def prompt_models(self) -> list:
        """The traced prompts' `specdec.report.predicted.PromptModel` (built once)."""
        if self._models is None:
            st = self.store
            if st is None or st.traces is None or st.traces.empty:
                self._models = []
            else:
                ngram = (int(self.sweep_setting("ngram_max", 3)), int(self.sweep_setting("ngram_min", 1)))
                self._models = prompt_models(self.runs, self.rounds, st.traces, st.calibration,
                                             stored_curves(self.infos), ngram,
                                             machine_costs=machine_curves(st.machine_costs))
        return self._models

    def default_policy(self) -> tuple[str, str]:
        """The default policy of the store's runs or trace grid (`specdec.report.load.default_policy_of`)."""
        return default_policy_of(self.runs, self.tables.get("trace_grid"))

    def sweep_setting(self, name: str, default: Any) -> Any:
        cfg = parse_json(((self.store.sweep or {}) if self.store is not None else {}).get("config_json")) or {}
        return cfg.get(name, default) if isinstance(cfg, dict) else default

    def __getitem__(self, table: ReportTable) -> pd.DataFrame:
        return self.tables[table.name]


def _grid(i: Inputs) -> pd.DataFrame:
    pols = [p for p in (i.sweep_setting("policies", ["cost"]) or []) if p == "cost"]
    # a stored None: each policy's own default (a sweep without --policy-k); older stores ran every policy at 16
    k = i.sweep_setting("policy_k", 16)
    return trace_grid(i.prompt_models(), pols, None if k is None else int(k))


def _cell_frame() -> pd.DataFrame:
    return pd.DataFrame(columns=[*CELL_KEY, "speedup"])


@dataclass(frozen=True)
class ReportTable:
    """One table of the report.

    Attributes:
        name: key in ``Analysis.tables``.
        what: what the table is, for "<what> could not be computed: <error>" in the report's gaps.
        build: the builder, ``Inputs -> DataFrame``.
        empty: the frame left in place when the builder fails.
    """

    name: str
    what: str
    build: Callable[[Inputs], pd.DataFrame]
    empty: Callable[[], pd.DataFrame] = pd.DataFrame


CELLS = ReportTable("cells", "the cell table", lambda i: cell_table(i.runs, i.rounds), _cell_frame)
OVERALL = ReportTable("overall", "the pooled cell table",
                      lambda i: cell_table(i.runs, i.rounds, pool_prompt_types=True), _cell_frame)
BEST_K = ReportTable("best_k", "best K", lambda i: best_k_table(i[CELLS]))
BREAK_EVEN = ReportTable("break_even", "break even",
                         lambda i: break_even_table(i.infos, spec_ks_by_config(i[CELLS])))
CONDITION = ReportTable("condition", "condition", lambda i: speedup_condition_table(i[CELLS], i.infos))
MODEL = ReportTable("model", "model", lambda i: model_table(i[CELLS], i.infos))
PEERS = ReportTable("peers", "peers", lambda i: peer_table(i.runs))
NATIVE = ReportTable("native", "specdec beside llama.cpp's native methods", lambda i: native_table(i.runs))
SYNTHETIC = ReportTable("synthetic", "the synthetic-acceptance table",
                        lambda i: synthetic_table(i.store.synthetic if i.store is not None else None))
EQUALITY = ReportTable("equality", "equality", lambda i: equality_table(i.runs))
ADAPTIVE = ReportTable("adaptive", "adaptive", lambda i: adaptive_table(i.runs, i[CELLS], i[OVERALL]))
POSITIONS = ReportTable("positions", "positions", lambda i: position_acceptance(i.runs, i.rounds))
GAPS = ReportTable("gaps", "gaps", lambda i: gaps_table(i.runs))
BASELINE_STABILITY = ReportTable("baseline_stability", "baseline stability",
                                 lambda i: baseline_stability_table(i.runs))
COVERAGE = ReportTable("coverage", "coverage", lambda i: coverage_table(i[CELLS]))
AA = ReportTable("aa", "the A/A noise floor", lambda i: aa_table(i.runs))
DRIFT_RUNS = ReportTable("drift_runs", "machine drift", lambda i: drift_runs(i.runs, i.rounds, i.infos))
DRIFT = ReportTable("drift", "machine drift by cell",
                    lambda i: drift_cells(i[DRIFT_RUNS]) if len(i[DRIFT_RUNS]) else pd.DataFrame())
OPTIMAL_K = ReportTable("optimal_k", "optimal K", lambda i: optimal_k_table(i[CELLS], i.infos, i[BEST_K]))
RUNTIMES = ReportTable("runtimes", "the runtime comparison",
                       lambda i: runtime_summary_table(i[CELLS], i[OVERALL], i.infos, i[MODEL]))
RUNTIMES_BY_TYPE = ReportTable("runtimes_by_type", "the runtime comparison by prompt type",
                               lambda i: runtime_by_type_table(i[BEST_K]))
TRACE_GRID = ReportTable("trace_grid", "the trace-predicted K grid", _grid)
TRACE_BEST_K = ReportTable("trace_best_k", "best K from the traces", lambda i: trace_best_k(i[TRACE_GRID]))
PREDICTED = ReportTable("predicted", "predicted vs measured",
                        lambda i: predicted_vs_measured(i.runs, i.rounds, i.prompt_models()))
ROOFLINE = ReportTable("roofline", "the roofline",
                       lambda i: roofline_table(i.runs, i.store.roofline if i.store is not None else None))
DRAFTER_TABLE = ReportTable("drafters", "the drafters by prompt type", lambda i: drafter_table(i.runs, i.rounds))
DRAFTER_RATIOS = ReportTable("drafter_ratios", "the paired drafter ratios", lambda i: drafter_ratio_table(i.runs))
ANSWER = ReportTable("answer", "the answer per prompt type",
                     lambda i: type_answer(i[TRACE_GRID], i[PREDICTED], i.default_policy()))
SAMPLED = ReportTable("sampled", "the sampled traces' check", lambda i: sampled_check(i.runs, i.prompt_models()))
DIVERGENCE = ReportTable("divergence", "divergences from target-only output",
                         lambda i: divergence_table(i.runs, i.store.traces if i.store is not None else None))

#: Every table, in build order (a builder reads only tables registered before it).
REGISTRY: tuple[ReportTable, ...] = (
    CELLS, OVERALL, BEST_K, BREAK_EVEN, CONDITION, MODEL, PEERS, NATIVE, SYNTHETIC, EQUALITY, ADAPTIVE, POSITIONS,
    GAPS, BASELINE_STABILITY, COVERAGE, AA, DRIFT_RUNS, DRIFT, OPTIMAL_K, RUNTIMES, RUNTIMES_BY_TYPE,
    TRACE_GRID, TRACE_BEST_K, PREDICTED, ANSWER, SAMPLED, DIVERGENCE, ROOFLINE, DRAFTER_TABLE, DRAFTER_RATIOS,
)
