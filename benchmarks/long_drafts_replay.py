"""The cost policy's largest K, 16 against 64, predicted from a store's greedy acceptance traces.

Every traced prompt of the store is replayed (`specdec.measure.pricing.TraceModel.rounds`) under the cost policy
of each drafter at K <= 16 and at K <= 64, and both are priced on one curve per prompt: its own calibration
blocks (target forwards of 1..17 tokens at the prompt's context, as the report prices it) extended past 17 tokens
by a curve measured to 65 (``specdec costs --max-n 65 --json``), scaled to the prompt's own single step (a stored
curve ends at 17 tokens, beyond which the one rule extends it by its slope and no long draft would ever pay).
Prints, per prompt type and pooled, the geometric mean of each predicted decode speedup over target-only and
the per-prompt ratio K <= 64 / K <= 16, with 95% t-intervals over prompts (fewer than 5 prompts: labelled).

    specdec costs --max-n 65 --json | tail -1 > /tmp/costs65.json
    python benchmarks/long_drafts_replay.py results/main_job_per_type.db --costs /tmp/costs65.json

Prints figures only (predictions); the timed comparison is a sweep (``--policy-k 16`` against the default).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from specdec.core import stats
from specdec.core.costs import CostCurve
from specdec.report.load import load_store, prepare_runs
from specdec.report.model import cost_infos
from specdec.report.tables import Inputs

#: The largest K compared: the sweep's default before each policy took its own, and the cost policy's own.
KS = (16, 64)


def extended(curve: CostCurve, long: CostCurve) -> CostCurve:
    """`curve` with `long`'s target forwards past its measured range, scaled by the ratio of the two single steps."""
    scale = curve.forward_s(1) / long.forward_s(1)
    top = max(curve.target_forward_s)
    fwd = {**{n: s * scale for n, s in long.target_forward_s.items() if n > top}, **curve.target_forward_s}
    return CostCurve(fwd, curve.draft_step_s, curve.draft_forward_s)


def replay_ks(db: str, long: CostCurve, methods: tuple[str, ...]) -> pd.DataFrame:
    """Per traced prompt and method: the predicted decode speedup of the cost policy at each K in `KS`."""
    st = load_store(db)
    models = Inputs(prepare_runs(st.runs), st.rounds, cost_infos(st.costs), store=st).prompt_models()
    rows = []
    for m in models:
        if m.curve is None or m.sampled:
            continue
        m.curve = extended(m.curve, long)
        for method in methods:
            try:
                preds = {k: m.speedup(method, m.rounds(method, k, "cost")) for k in KS}
            except ValueError:  # a draft-model method on a trace without draft tokens
                continue
            rows.append({"prompt_id": m.key[1], "prompt_type": m.prompt_type, "method": method,
                         **{f"k{k}": v for k, v in preds.items()}})
    return pd.DataFrame(rows)


def _interval(ratio: pd.Series) -> str:
    if len(ratio) < 2:
        return "-"
    iv = stats.ratio_interval(ratio)
    return f"[{iv.lo:.3f}, {iv.hi:.3f}]" + ("" if len(ratio) >= 5 else f" ({len(ratio)} prompts: too few)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="a store with greedy traces and calibration blocks")
    ap.add_argument("--costs", required=True, help="`specdec costs --max-n 65 --json` output (its last line)")
    ap.add_argument("--methods", default="mixed,suffix,ngram,draft", help="drafters to replay")
    a = ap.parse_args()
    long = CostCurve.from_costs(json.loads(Path(a.costs).read_text().strip().splitlines()[-1]))
    grid = replay_ks(a.db, long, tuple(a.methods.split(",")))
    for method, g in grid.groupby("method", sort=False):
        print(f"\n{method}: cost policy, predicted decode speedup over target-only (geometric mean)")
        print(f"{'type':<22}{'n':>3}{'K<=16':>9}{'K<=64':>9}{'64/16':>9}  95% interval")
        for ptype, t in [*g.groupby("prompt_type", sort=True), ("(all prompts)", g)]:
            ratio = t["k64"] / t["k16"]
            print(f"{ptype:<22}{len(t):>3}{stats.geometric_mean(t['k16']):>9.3f}{stats.geometric_mean(t['k64']):>9.3f}"
                  f"{stats.geometric_mean(ratio):>9.3f}  {_interval(ratio)}")


if __name__ == "__main__":
    main()
