"""The sampled traces' check: per timed sampled run, the block efficiency its prompt's sampled trace predicts
(`specdec.measure.pricing.TraceModel.expected`) beside the one it measured.

A sampled run is one draw, so one run's block efficiency scatters around the expectation; the pooled ratio
(a prompt's runs pooled first, then the geometric mean over prompts with its 95% t-interval) is the check of
the replay's assumption (`docs/METHOD.md`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from specdec.report.load import ensure_prepared, is_missing

__all__ = ["sampled_check", "sampled_summary"]

COLUMNS = ["run_id", "config_label", "prompt_id", "prompt_type", "method", "policy", "k", "temperature",
           "predicted", "measured", "ratio"]


def sampled_check(runs: pd.DataFrame, models: Sequence) -> pd.DataFrame:
    """Per timed sampled run of a drafter a sampled trace replays (`DrafterEntry.sampled_replay`) on a prompt
    with a sampled trace (`models`: `specdec.report.predicted.prompt_models`): predicted and measured block
    efficiency (tokens per target forward) and their ratio. A fixed-K run is predicted by the trace's
    expected run (exact), a K policy's run by the mean of its simulated runs
    (`specdec.measure.pricing.TraceModel.expected_policy`), its ``method`` then ``"<drafter> <policy>"`` so
    that each pools apart (``policy``: the run's K policy, ``"fixed"`` for a fixed K). Columns: `COLUMNS`."""
    from specdec.catalogue.drafters import DRAFTERS

    by_key = {m.key: m for m in models if m.sampled}
    if not by_key or runs is None or runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    df = ensure_prepared(runs)
    rows = []
    for r in df[df["ok"]].itertuples(index=False):
        entry = DRAFTERS.get(r.method)
        if entry is None or entry.sampled_replay is None:
            continue
        mid = "" if is_missing(getattr(r, "machine_id", None)) else str(r.machine_id)
        m = by_key.get((r.config_label, r.prompt_id, mid))
        if m is None or is_missing(r.num_rounds) or not r.num_rounds:
            continue
        fixed = r.policy in ("fixed", "-", None)
        try:
            pred = (m.expected(r.method, int(r.k))[0].block_efficiency if fixed
                    else m.expected_policy(r.method, r.policy, int(r.k))[0])
        except ValueError:
            continue
        meas = float(r.new_tokens) / float(r.num_rounds)
        rows.append({"run_id": int(r.run_id), "config_label": r.config_label, "prompt_id": r.prompt_id,
                     "prompt_type": r.prompt_type, "method": r.method if fixed else f"{r.method} {r.policy}",
                     "policy": "fixed" if fixed else str(r.policy), "k": int(r.k),
                     "temperature": float(r.temperature), "predicted": pred, "measured": meas,
                     "ratio": pred / meas})
    return pd.DataFrame(rows, columns=COLUMNS)


def sampled_summary(check: pd.DataFrame) -> pd.DataFrame:
    """`sampled_check` pooled per configuration and drafter and over all (``"all"``): n prompts, n_runs and the
    geometric mean over prompts of predicted / measured block efficiency with its 95% t-interval
    (`pooled_ratios`)."""
    from specdec.report.answer import pooled_ratios

    return pooled_ratios(check)
