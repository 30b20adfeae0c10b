"""Every table of the report, computed from one results store: `analyze` and its result `Analysis`.

The pipeline: :mod:`~specdec.report.load` reads the store and normalises the runs; the builders registered
in :mod:`~specdec.report.tables` compute the tables (:mod:`~specdec.report.cells`,
:mod:`~specdec.report.model`, :mod:`~specdec.report.comparisons`, :mod:`~specdec.report.diagnostics`, with
the speedup statistics of :mod:`~specdec.report.speedup`); this module runs them in order and collects what
is missing. Words (cell, pooled row, run key) are defined in :mod:`~specdec.report.vocab`.

Conventions used by every table:

* Every rate is derived from raw counts summed over runs (definitions in :mod:`specdec.core.metrics`); every
  prediction comes from :mod:`specdec.core.theory`.
* Runs whose ``error`` is set are failed runs: excluded from every figure and listed in the gaps.
* Missing data never raises: a table that cannot be computed is empty and a sentence saying what is
  missing goes to :attr:`Analysis.missing`.

Units: tokens/s, seconds (``*_s``), milliseconds (``*_ms``); shares are fractions of ``total_s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from specdec.catalogue.drafters import DRAFT_MODEL
from specdec.report.load import StoreData, default_policy_of, parse_json, prepare_runs
from specdec.report.model import CostInfo, cost_infos
from specdec.report.tables import REGISTRY, Inputs, ReportTable
from specdec.report.vocab import ADAPTIVE_POLICIES, BASELINE, OUR_DRAFTERS, PEER_METHODS

__all__ = ["Analysis", "analyze"]


@dataclass
class Analysis:
    """Everything the report shows.

    Attributes:
        store: the `StoreData` analysed.
        tables: name -> DataFrame, one per `specdec.report.tables.REGISTRY` entry.
        costs: `CostInfo` per config_label.
        missing: sentences naming what is absent from the store (and so from the report).
        prompt_models: the traced prompts' `specdec.report.predicted.PromptModel` (what the trace tables
            were built from; empty without traces), for callers that replay them with other costs.
    """

    store: StoreData
    tables: dict[str, pd.DataFrame]
    costs: dict[str, CostInfo]
    missing: list[str]
    prompt_models: list = field(default_factory=list)

    def table(self, which: ReportTable | str) -> pd.DataFrame:
        """The table registered as `which` (a `ReportTable` handle or its name); an empty frame when absent."""
        name = which.name if isinstance(which, ReportTable) else which
        return self.tables.get(name, pd.DataFrame())

    __getitem__ = table

    @property
    def sweep_config(self) -> dict | None:
        """The sweep's configuration parsed from ``config_json`` (None when absent or not JSON)."""
        return parse_json(self.store.sweep.get("config_json") if self.store.sweep else None)

    @property
    def default_policy(self) -> tuple[str, str]:
        """The default policy of the store's runs or trace grid, as (drafter, policy)
        (`specdec.report.load.default_policy_of`)."""
        return default_policy_of(self.store.runs, self.tables.get("trace_grid"))

    @property
    def machine(self) -> dict | None:
        """The machine description parsed from ``machine_json`` (None when absent or not JSON)."""
        return parse_json(self.store.sweep.get("machine_json") if self.store.sweep else None)


def _cost_notes(runs: pd.DataFrame, store: StoreData, infos: dict[str, CostInfo]) -> list[str]:
    """Sentences for configs whose costs (and so the model's predictions) are missing."""
    if len(runs) and store.costs.empty:
        return [("no costs measured: c, the verification cost curve, break-even alpha and model "
                 "predictions are missing")]
    notes = []
    for label in sorted(set(runs["config_label"])):
        info = infos.get(label)
        if info is None:
            notes.append(f"no costs for config '{label}': no break-even alpha or model prediction")
        elif info.v is None:
            notes.append(f"config '{label}': no target single-step time; verification cost curve unknown")
        elif info.c is None and (runs[(runs["config_label"] == label)]["method"] == DRAFT_MODEL).any():
            notes.append(f"config '{label}': no draft step time, so c is unknown and draft-model "
                         "predictions are skipped (prompt lookup uses c = 0)")
    return notes


def _data_notes(runs: pd.DataFrame, store: StoreData, infos: dict[str, CostInfo]) -> list[str]:
    """Sentences naming what the store's runs lack (before any table is built)."""
    notes = []
    if store.sweep_id is not None and runs.empty:
        notes.append(f"sweep {store.sweep_id} has no runs: no speedups, acceptance or timings")
    ok = runs[runs["ok"]]
    if len(runs) and ok.empty:
        notes.append("every run failed or was skipped: no successful measurement to analyse")
    for label in sorted(set(runs["config_label"])):
        if not ((ok["config_label"] == label) & (ok["method"] == BASELINE)).any():
            notes.append(f"no successful baseline run for config '{label}': its speedups are unknown")
    notes += _cost_notes(runs, store, infos)
    if len(ok) and store.rounds.empty:
        notes.append("no per-round trace (rounds): acceptance by draft position is missing")
    if len(ok) and not ok["method"].isin(OUR_DRAFTERS).any():
        notes.append("no speculative runs of ours: only baseline or peer rows")
    if len(ok) and not ok["method"].isin(PEER_METHODS).any():
        notes.append(f"no peer runs ({', '.join(PEER_METHODS)})")
    if len(ok) and not ok["policy"].isin(ADAPTIVE_POLICIES).any():
        notes.append(f"no adaptive-policy runs ({' / '.join(ADAPTIVE_POLICIES)})")
    if len(ok) and ok["temperature"].nunique() > 1:
        notes.append("the sweep mixes temperatures; cells pool them (speedups compare like with like "
                     "only under one sampling setting)")
    return notes


def analyze(store: StoreData) -> Analysis:
    """Compute every registered table of the report from `store`; never raises on missing or partial data.

    A builder that fails on unexpected data leaves its table's empty frame and adds a sentence to
    ``missing``.
    """
    missing = list(store.notes)
    runs = prepare_runs(store.runs)
    try:
        infos = cost_infos(store.costs)
    except Exception as exc:  # noqa: BLE001 - a report of what is there beats no report
        missing.append(f"costs could not be computed: {type(exc).__name__}: {exc}")
        infos = {}
    missing += _data_notes(runs, store, infos)
    inputs = Inputs(runs, store.rounds, infos, store=store)
    for spec in REGISTRY:
        try:
            table = spec.build(inputs)
        except Exception as exc:  # noqa: BLE001 - one table that fails never stops the report
            missing.append(f"{spec.what} could not be computed: {type(exc).__name__}: {exc}")
            table = None
        inputs.tables[spec.name] = table if table is not None else spec.empty()
    try:
        models = inputs.prompt_models()  # built once for the trace tables above; cached
    except Exception:  # noqa: BLE001 - the trace tables already reported why they could not be built
        models = []
    return Analysis(store, inputs.tables, infos, missing, models)
