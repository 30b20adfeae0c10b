"""Suffix drafter against prompt lookup, predicted per prompt type from a store's acceptance traces.

Under greedy decoding a model-free drafter's rounds follow from the target-only output alone
(`specdec.engine.traces.replay`), so every built-in prompt a store traced can be replayed for both drafters at
every K in the grid and priced with that prompt's own calibrated cost curve (`specdec.measure.pricing`), with no
timed run. Per (configuration, prompt type) each drafter gets the fixed K (its cap, for the suffix drafter)
with the best geometric-mean predicted speedup over the type's prompts; the script prints both speedups and
the per-prompt ratio suffix / prompt lookup at those Ks with a 95% t-interval over the type's prompts, and
the suffix drafter drafting from the most recent occurrence of its match (its default) against the first.

    python benchmarks/suffix_replay.py results/bf16_128.db results/llamacpp_all.db

Prints figures only; the timed comparison is `specdec sweep --methods baseline,ngram,suffix ...`.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from specdec.core import stats
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.traces import replay
from specdec.report.load import load_store, prepare_runs
from specdec.report.model import cost_infos
from specdec.report.tables import Inputs

#: prompt lookup, the suffix drafter (most recent occurrence, its default) and the suffix drafter drafting
#: from the automaton's first occurrence.
METHODS = ("ngram", "suffix", "suffix_first")
#: The Ks (caps, for the suffix drafter) replayed.
GRID = (1, 2, 3, 4, 6, 8, 12, 16)


def replay_grid(db: str) -> pd.DataFrame:
    """Per traced prompt, method in `METHODS` and K in the grid: the predicted decode speedup and tokens per
    target forward. Columns: config_label, prompt_id, prompt_type, method, k, predicted, per_forward."""
    st = load_store(db)
    # the report's own inputs: each prompt priced with its calibration, as the report's predictions are
    models = Inputs(prepare_runs(st.runs), st.rounds, cost_infos(st.costs), store=st).prompt_models()
    rows = []
    for m in models:
        if m.curve is None:
            continue
        for method in METHODS:
            for k in GRID:
                if method == "suffix_first":
                    rounds = replay(m.trace, k=k, drafter=SuffixDrafter(m.curve, occurrence="first"))
                else:
                    rounds = m.rounds(method, k)
                tokens = sum(r.num_emitted for r in rounds)
                rows.append({"config_label": m.key[0], "prompt_id": m.key[1], "prompt_type": m.prompt_type,
                             "method": method, "k": k,
                             "predicted": m.speedup("suffix" if method == "suffix_first" else method, rounds),
                             "per_forward": tokens / len(rounds) if rounds else math.nan})
    return pd.DataFrame(rows)


def compare(grid: pd.DataFrame) -> pd.DataFrame:
    """Per (configuration, prompt type): each method's best K and geometric-mean predicted speedup, and the
    per-prompt ratio suffix / prompt lookup at those Ks (geometric mean, 95% t-interval)."""
    out = []
    for (label, ptype), g in grid.groupby(["config_label", "prompt_type"], sort=True):
        best = {}
        for method in METHODS:
            gm = g[g["method"] == method].groupby("k")["predicted"].apply(stats.geometric_mean)
            best[method] = int(gm.idxmax())
        per = {method: g[(g["method"] == method) & (g["k"] == best[method])].set_index("prompt_id")
               for method in METHODS}
        ratio = (per["suffix"]["predicted"] / per["ngram"]["predicted"]).dropna()
        iv = stats.ratio_interval(ratio) if len(ratio) >= 2 else None
        first = (per["suffix"]["predicted"] / per["suffix_first"]["predicted"]).dropna()
        out.append({"config": label, "type": ptype, "n": len(ratio),
                    "ngram_k": best["ngram"], "ngram": stats.geometric_mean(per["ngram"]["predicted"]),
                    "ngram_tpf": float(np.mean(per["ngram"]["per_forward"])),
                    "suffix_k": best["suffix"], "suffix": stats.geometric_mean(per["suffix"]["predicted"]),
                    "suffix_tpf": float(np.mean(per["suffix"]["per_forward"])),
                    "first_k": best["suffix_first"],
                    "first": stats.geometric_mean(per["suffix_first"]["predicted"]),
                    "recent/first": stats.geometric_mean(first),
                    "ratio": stats.geometric_mean(ratio),
                    "lo": iv.lo if iv else math.nan, "hi": iv.hi if iv else math.nan})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="+", help="results stores with acceptance traces and calibration blocks")
    args = ap.parse_args(argv)
    for db in args.stores:
        table = compare(replay_grid(db))
        print(f"\n{db}: predicted decode speedup over target-only (greedy, from traces), best K per type")
        with pd.option_context("display.width", 160, "display.float_format", "{:.3f}".format):
            print(table.to_string(index=False))
        for label, g in table.groupby("config"):
            below = g[g["hi"] < 1.0]["type"].tolist()
            above = g[g["lo"] > 1.0]["type"].tolist()
            print(f"{label}: suffix measurably below prompt lookup on {below or 'no type'}; above on "
                  f"{len(above)} type(s) {above}")


if __name__ == "__main__":
    main()
