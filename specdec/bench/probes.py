"""The sweep's probes: the measurements it makes beside the timed runs, never inside them.

A probe is a function ``probe(state, at)`` (`SweepState`, `At`) named in `PROBES` with the moment the
runner calls it:

- `CONFIGURATION`, once a configuration's costs are measured: `roofline` (weight bytes per step, the
  machine's memory bandwidth);
- `RUN`, after each timed run and before it is stored: `check_equal` (greedy output equal to our
  baseline's, the first divergence), which sets columns of the run's row;
- `FIRST_BASELINE`, after a prompt's first successful target-only run is stored: `trace` (its acceptance
  trace, greedy sweeps), `calibrate` (a calibration block at its context, whose costs the cost policy of
  the prompt's later runs decides with) and `corpus` (its output, drafted from by the other prompts' runs
  of a corpus-drafting method).

A probe with a `Probe.failure` text is context, not a result: its error is logged in one line and the sweep
goes on. `walk` runs the probes of one moment in `PROBES` order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specdec.bench.console import one_line
from specdec.bench.loaded import LoadedConfig
from specdec.bench.methods import METHODS, chain_drafter_names
from specdec.bench.plan import PlannedRun, calibration_passes, cost_max_n
from specdec.bench.state import SweepState
from specdec.core.costs import CostCurve
from specdec.engine.sampled_traces import record_sampled_trace, stored_trace
from specdec.engine.traces import first_divergence, record_trace, target_margins
from specdec.measure.timing import calibration_block

__all__ = [
    "CONFIGURATION",
    "FIRST_BASELINE",
    "PROBES",
    "RUN",
    "At",
    "Probe",
    "best_k",
    "calibrate",
    "check_equal",
    "corpus",
    "measure_missed",
    "roofline",
    "stored_outputs",
    "stored_prompt_costs",
    "trace",
    "walk",
]

CONFIGURATION = "configuration"  # once per loaded configuration, after its costs are measured
RUN = "run"  # after each timed run, before it is stored
FIRST_BASELINE = "first baseline"  # after a prompt's first successful target-only run is stored


@dataclass(frozen=True)
class At:
    """Where a probe runs: the loaded configuration and, at `RUN` and `FIRST_BASELINE`, the run (its planned
    cell, its ``runs`` row, and at `FIRST_BASELINE` its stored run id)."""

    loaded: LoadedConfig
    cell: PlannedRun | None = None
    row: dict | None = None
    run_id: int | None = None


@dataclass(frozen=True)
class Probe:
    """One probe: its `name`, the `moment` it runs at, its function, and `failure`: what the console says
    when it raises (None: the error propagates, as for a probe that sets a run's columns)."""

    name: str
    moment: str
    fn: Callable[[SweepState, At], None]
    failure: str | None = None


def roofline(s: SweepState, at: At) -> None:
    """Store the configuration's weight bytes per step, what its models run on (`pair_record`: weight types
    and repacking on llama.cpp, the ggml environment; the builds of the peers planned there) and (once per
    machine and store) the machine's memory bandwidth, measured by a streaming copy."""
    from specdec.measure.roofline import measure_bandwidth, weight_bytes
    from specdec.runtimes.llamacpp_record import pair_record

    pair, label = at.loaded.pair, at.loaded.label
    tb = weight_bytes(pair.target)
    db = weight_bytes(pair.draft) if pair.draft is not None else None
    known = s.store.bandwidth_gbps()
    bw = measure_bandwidth(threads=s.cfg.threads) if known is None else {"gbps": known,
                                                                         "method": "measured earlier"}
    s.store.save_roofline(s.sweep_id, label, tb, db, bw, runtime=_runtime_record(s, label, pair_record(pair)))
    s.log(f"[{label}] weights read per target step {tb / 1e9:.2f} GB; machine bandwidth "
          f"{bw['gbps']:.1f} GB/s (streaming copy)")


def _runtime_record(s: SweepState, label: str, record: dict) -> dict:
    """`record` with what the runtimes of the methods planned on configuration `label` say of themselves
    (`Method.runtime_record`: a peer's build; methods recorded as skipped left out)."""
    planned = {c.method for c in s.prepared.plan if c.config_label == label}
    for name in sorted(planned):
        m = METHODS[name]
        if m.runtime_record is not None and not m.skip_reason(s.cfg):
            record.update(m.runtime_record())
    return record


def check_equal(s: SweepState, at: At) -> None:
    """Under greedy decoding, set the row's ``matches_baseline`` (its ids equal our baseline's for its prompt:
    the stored one, or this run's own when it is that baseline) and ``first_divergence``."""
    loaded, cell, row = at.loaded, at.cell, at.row
    if not loaded.cfg.greedy or row.get("token_ids") is None:
        return
    pid = cell.prompt.id
    if loaded.baseline_ids.get(pid) is None:
        loaded.baseline_ids[pid] = s.store.baseline_tokens(s.sweep_id, loaded.label, pid)
    ref = loaded.baseline_ids[pid]
    if METHODS[cell.method].reference and ref is None:
        ref = row["token_ids"]
    row["matches_baseline"] = None if ref is None else int(row["token_ids"] == ref)
    row["first_divergence"] = None if ref is None else first_divergence(row["token_ids"], ref)


def trace(s: SweepState, at: At) -> None:
    """Store the prompt's acceptance trace once per prompt and configuration: greedy sweeps one teacher-forced
    draft forward over the baseline's output and the target's top-2 margins (`record_trace`); sampled sweeps
    the draft model's overlap and the planned model-free drafters' chains along the seeded baseline's output
    (`record_sampled_trace`)."""
    loaded, pid = at.loaded, at.cell.prompt.id
    cfg, pair = loaded.cfg, loaded.pair
    if not cfg.traces or s.store.has_trace(s.sweep_id, loaded.label, pid):
        return
    prompt, out = loaded.prompt_ids(at.cell.prompt), list(at.row["token_ids"] or [])
    draft = pair.draft.backend if pair.draft is not None else None
    ctx = draft.max_length if draft is not None else None
    if not cfg.greedy:
        tr = record_sampled_trace(pair.target.backend, prompt, out, cfg.max_new_tokens, cfg.sampling, draft=draft,
                                  drafters=_chain_drafters(loaded), k_max=cost_max_n(cfg) - 1,
                                  vocab_size=pair.vocab_size)
        s.store.save_trace(s.sweep_id, loaded.label, pid, at.run_id, tr, draft_context=ctx)
        return
    tr = record_trace(prompt, out, cfg.max_new_tokens, draft, vocab_size=pair.vocab_size)
    margins, tf_ids = target_margins(pair.target.backend, prompt, out, vocab_size=pair.vocab_size)
    s.store.save_trace(s.sweep_id, loaded.label, pid, at.run_id, tr, target_margin=margins,
                       target_tf_ids=tf_ids, draft_context=ctx)


def _chain_drafters(loaded: LoadedConfig) -> dict[str, Callable]:
    """Factories of the model-free drafters the configuration's methods replay from a sampled trace (their
    chains), priced drafters on the configuration's costs."""
    from specdec.catalogue.drafters import replay_drafter

    costs = CostCurve.from_costs(loaded.costs) if loaded.costs else None
    ngram = (loaded.cfg.ngram_max, loaded.cfg.ngram_min)
    return {n: (lambda n=n: replay_drafter(n, costs=costs, ngram=ngram)) for n in chain_drafter_names(loaded.cfg.methods)}


def calibrate(s: SweepState, at: At) -> None:
    """Time and store a calibration block (target forwards of 1 .. `cost_max_n` tokens and the draft step)
    at the prompt's own context (the prompt and half the baseline's output), `calibration_passes` passes;
    the cost policy of this prompt's later runs decides with these costs."""
    loaded, pid = at.loaded, at.cell.prompt.id
    cfg = loaded.cfg
    passes = calibration_passes(cfg, s.prepared.plan, loaded.label, pid)
    if passes <= 0:
        return
    prompt, out = loaded.prompt_ids(at.cell.prompt), list(at.row["token_ids"] or [])
    block = calibration_block(loaded.pair, prompt + out[: len(out) // 2], max_n=cost_max_n(cfg), repeats=passes)
    s.store.save_calibration(s.sweep_id, loaded.label, pid, at.run_id, block)
    loaded.prompt_costs[pid] = CostCurve.from_costs(block)


def corpus(s: SweepState, at: At) -> None:
    """Keep the prompt's first target-only output as corpus for the OTHER prompts' runs of a corpus-drafting
    method (`LoadedConfig.outputs`; the prompt's own runs never see it)."""
    if any(METHODS[m].uses_corpus for m in at.loaded.cfg.methods) and at.row.get("token_ids"):
        at.loaded.outputs.setdefault(at.cell.prompt.id, list(at.row["token_ids"]))


def stored_outputs(loaded: LoadedConfig, s: SweepState) -> None:
    """On ``--resume``, for a sweep with a corpus-drafting method: the first target-only output of every
    prompt the store holds for this configuration (`corpus`), so the corpus holds the outputs stored so far."""
    import json

    if not any(METHODS[m].uses_corpus for m in loaded.cfg.methods):
        return
    first: dict[str, tuple[int, list[int]]] = {}
    for r in s.store.runs(s.sweep_id, config_label=loaded.label):
        m = METHODS.get(r["method"])
        if m is None or not m.reference or r["error"] is not None or r["token_ids"] is None or r["batch_id"]:
            continue
        ids = json.loads(r["token_ids"]) if isinstance(r["token_ids"], str) else list(r["token_ids"])
        if r["prompt_id"] not in first or r["repeat"] < first[r["prompt_id"]][0]:
            first[r["prompt_id"]] = (r["repeat"], ids)
    for pid, (_, ids) in first.items():
        loaded.outputs.setdefault(pid, ids)


def stored_prompt_costs(loaded: LoadedConfig, s: SweepState) -> None:
    """On ``--resume``: the calibration blocks this machine stored earlier for this configuration, so that
    the cost policy of a resumed prompt decides with the same costs as its earlier runs (and its replay)."""
    blocks: dict[str, list[dict]] = {}
    for c in s.store.calibration(s.sweep_id):
        if c["config_label"] == loaded.label and c["machine_id"] == (s.store.machine_id or ""):
            blocks.setdefault(c["prompt_id"], []).append(c)
    for pid, rows in blocks.items():
        if any(r["role"] == "target" and int(r["n_tokens"]) == 1 for r in rows):
            loaded.prompt_costs.setdefault(pid, CostCurve.from_calibration(rows))


def _stored_trace(loaded: LoadedConfig, s: SweepState, prompt_id: str):
    """This machine's stored acceptance trace of `prompt_id` in this configuration (`stored_trace`: an
    `AcceptanceTrace` or a `SampledTrace`) with its draft context, or (None, None)."""
    for t in s.store.traces(s.sweep_id):
        if (t["config_label"], t["prompt_id"], t["machine_id"]) == (loaded.label, prompt_id, s.store.machine_id or ""):
            return stored_trace(t), t["draft_context"]
    return None, None


def best_k(loaded: LoadedConfig, s: SweepState, cell: PlannedRun) -> int:
    """The fixed K in 1..``cell.k`` that `cell`'s prompt's acceptance trace, priced with its calibration block
    (`specdec.measure.pricing.TraceModel.best_fixed_k`, overheads left out; a sampled sweep's trace in
    expectation), predicts fastest for ``cell.method``; computed once per (prompt, method) from
    what the store holds, so a resumed sweep chooses the same K.

    Raises:
        ValueError: the prompt has no stored trace or calibration block on this machine (one line).
    """
    from specdec.measure.pricing import TraceModel

    key = (cell.prompt.id, cell.method)
    replayed = METHODS[cell.method].replay_as or cell.method
    if key not in loaded.best_ks:
        trace, ctx = _stored_trace(loaded, s, cell.prompt.id)
        curve = loaded.prompt_costs.get(cell.prompt.id)
        if trace is None or curve is None:
            raise ValueError(f"no acceptance trace and calibration block of {cell.prompt.id} to choose K from")
        model = TraceModel(trace, curve, ngram=(loaded.cfg.ngram_max, loaded.cfg.ngram_min), draft_context=ctx,
                           padded=loaded.rc.pad_verify)
        loaded.best_ks[key] = model.best_fixed_k(replayed, range(1, int(cell.k) + 1))
        k, pred = loaded.best_ks[key]
        s.log(f"[{loaded.label}] {cell.prompt.id}: {cell.method} at K = {k}, the trace's best "
              f"(predicted {pred:.2f}x decode speedup)")
    return loaded.best_ks[key][0]


def measure_missed(loaded: LoadedConfig, s: SweepState, prompt) -> bool:
    """On ``--resume``: a prompt whose first target-only run is stored but whose trace or calibration block is
    not (the sweep stopped between the two) gets them now, from that stored run (`FIRST_BASELINE` probes).

    Returns:
        True when a stored target-only run of this machine was found and its probes walked.
    """
    import json

    rows = [r for r in s.store.runs(s.sweep_id, config_label=loaded.label, prompt_id=prompt.id, batch_id=None)
            if METHODS[r["method"]].reference and r["error"] is None and r["token_ids"] is not None
            and (r.get("machine_id") or "") == (s.store.machine_id or "")]
    if not rows:
        return False
    row = dict(min(rows, key=lambda r: r["repeat"]))
    row["token_ids"] = json.loads(row["token_ids"]) if isinstance(row["token_ids"], str) else row["token_ids"]
    cell = PlannedRun(loaded.label, prompt, row["method"], None, None, row["repeat"])
    walk(FIRST_BASELINE, s, At(loaded, cell, row, row["run_id"]))
    return True


PROBES: tuple[Probe, ...] = (
    Probe("roofline", CONFIGURATION, roofline, "roofline inputs not measured"),
    Probe("equality", RUN, check_equal),
    Probe("trace", FIRST_BASELINE, trace, "acceptance trace not recorded"),
    Probe("calibration", FIRST_BASELINE, calibrate, "calibration block not timed"),
    Probe("corpus", FIRST_BASELINE, corpus),
)


def walk(moment: str, s: SweepState, at: At, probes: Sequence[Probe] = PROBES) -> None:
    """Run the probes of `moment`, in order. A probe with a `Probe.failure` text that raises is logged in one
    line (``[config_label] prompt_id: <failure>: <error>``) and the next probe runs."""
    for probe in probes:
        if probe.moment != moment:
            continue
        if probe.failure is None:
            probe.fn(s, at)
            continue
        try:
            probe.fn(s, at)
        except Exception as exc:  # noqa: BLE001 - a probe is context for the timed runs, never a reason to stop
            head = f"[{at.loaded.label}]" + (f" {at.cell.prompt.id}:" if at.cell is not None else "")
            s.log(f"{head} {probe.failure}: {one_line(exc)}")
