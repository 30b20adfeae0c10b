"""The sampled traces' check: per timed sampled run, the block efficiency its prompt's sampled trace predicts
(`specdec.engine.sampled_traces.expected_run`) beside the one it measured.

A sampled run is one draw, so one run's block efficiency scatters around the expectation; the pooled ratio over
runs (geometric mean, 95% t-interval) is the check of the replay's assumption (`docs/METHOD.md`).
"""

from __future__ import annotations

import json

import pandas as pd

from specdec.report.load import ensure_prepared, is_missing

__all__ = ["sampled_check", "sampled_summary"]

COLUMNS = ["run_id", "config_label", "prompt_id", "prompt_type", "method", "k", "temperature", "predicted",
           "measured", "ratio"]


def _decode(x):
    return json.loads(x) if isinstance(x, str) else x


def _sampled_traces(traces: pd.DataFrame) -> dict:
    """(config_label, prompt_id, machine_id) -> the `SampledTrace` of each sampled ``traces`` row."""
    from specdec.core.sampling import SamplingParams
    from specdec.engine.sampled_traces import SampledTrace

    out = {}
    if traces is None or traces.empty or "sampling_json" not in traces.columns:
        return out
    for t in traces[traces["sampling_json"].notna()].itertuples(index=False):
        sp, overlap, chains = _decode(t.sampling_json), _decode(t.overlap), _decode(t.chains) or {}
        out[(t.config_label, t.prompt_id, t.machine_id or "")] = SampledTrace(
            tuple(_decode(t.prompt_ids)), tuple(_decode(t.target_ids)), int(t.max_new_tokens),
            SamplingParams(float(sp["temperature"]), int(sp["top_k"]), float(sp["top_p"])),
            None if is_missing(overlap) else tuple(overlap),
            {k: tuple(tuple(c) for c in v) for k, v in chains.items()})
    return out


def sampled_check(runs: pd.DataFrame, traces: pd.DataFrame) -> pd.DataFrame:
    """Per timed sampled fixed-K run of a drafter a sampled trace replays (`DrafterEntry.sampled_replay`) on
    a prompt with a sampled trace: predicted and measured block efficiency (tokens per target forward) and
    their ratio. Columns: `COLUMNS`."""
    from specdec.catalogue.drafters import DRAFTERS
    from specdec.engine.sampled_traces import DRAFT_MODEL, expected_run

    sampled = _sampled_traces(traces)
    if not sampled or runs is None or runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = ensure_prepared(runs)
    rows = []
    for r in df[df["ok"]].itertuples(index=False):
        entry = DRAFTERS.get(r.method)
        if entry is None or entry.sampled_replay is None or (r.policy or "fixed") != "fixed":
            continue
        mid = "" if is_missing(getattr(r, "machine_id", None)) else str(r.machine_id)
        trace = sampled.get((r.config_label, r.prompt_id, mid))
        if trace is None or is_missing(r.num_rounds) or not r.num_rounds:
            continue
        pred = expected_run(trace, DRAFT_MODEL if entry.sampled_replay == "overlap" else r.method, int(r.k))
        meas = float(r.new_tokens) / float(r.num_rounds)
        rows.append({"run_id": int(r.run_id), "config_label": r.config_label, "prompt_id": r.prompt_id,
                     "prompt_type": r.prompt_type, "method": r.method, "k": int(r.k),
                     "temperature": float(r.temperature), "predicted": pred.block_efficiency, "measured": meas,
                     "ratio": pred.block_efficiency / meas})
    return pd.DataFrame(rows, columns=COLUMNS)


def sampled_summary(check: pd.DataFrame) -> pd.DataFrame:
    """`sampled_check` pooled per configuration and drafter and over all (``"all"``): n runs and the geometric
    mean of predicted / measured block efficiency with its 95% t-interval (`pooled_ratios`)."""
    from specdec.report.answer import pooled_ratios

    return pooled_ratios(check)
