"""One method's paired speedup in two stores of the same prompts, side by side and per prompt type.

Each store's speedups are paired inside it (each run over its adjacent target-only runs,
`specdec.report.speedup.paired_reference`), so the per-prompt ratio of the two speedups compares two settings
of one method (e.g. the cost policy's largest K, ``--policy-k 16`` against the default) without dividing
timings of two sweeps: only paired speedups are divided. Both stores must come from one machine; the script
refuses otherwise. Prints per type and pooled: each store's geometric-mean speedup and the per-prompt ratio
B / A with its 95% t-interval over prompts (fewer than 5 prompts: labelled).

    python benchmarks/paired_across_stores.py results/mixed_cost_llamacpp_kmax16.db results/mixed_cost_llamacpp_kmax64.db \
        --method mixed
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from specdec.core import stats
from specdec.report.load import load_store, prepare_runs
from specdec.report.speedup import paired_reference


def per_prompt(db: str, method: str) -> tuple[pd.DataFrame, set[str]]:
    """Per prompt of `db`: its type and the geometric mean of `method`'s paired speedups; and the machines."""
    runs = prepare_runs(load_store(db).runs)
    ok = runs[runs["ok"]]
    ref, _ = paired_reference(ok)
    r = ok[ok["method"] == method].copy()
    r["speedup"] = [row.tokens_per_s / ref[int(row.run_id)] if int(row.run_id) in ref else np.nan
                    for row in r.itertuples()]
    out = r.dropna(subset=["speedup"]).groupby(["prompt_id", "prompt_type"])["speedup"].apply(
        lambda s: float(np.exp(np.log(s).mean()))).reset_index()
    return out, set(ok["machine_id"].astype(str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="the reference store (A)")
    ap.add_argument("b", help="the store compared (B)")
    ap.add_argument("--method", default="mixed")
    args = ap.parse_args()
    (a, ma), (b, mb) = per_prompt(args.a, args.method), per_prompt(args.b, args.method)
    if ma != mb:
        raise SystemExit(f"the stores were timed on different machines ({sorted(ma)} / {sorted(mb)}): no ratio")
    both = a.merge(b, on=["prompt_id", "prompt_type"], suffixes=("_a", "_b"))
    print(f"{args.method}: paired speedup over target-only in A ({args.a}) and B ({args.b}), machine {sorted(ma)}")
    print(f"{'type':<22}{'n':>3}{'A':>8}{'B':>8}{'B/A':>8}  95% interval of B/A")
    for ptype, t in [*both.groupby("prompt_type", sort=True), ("(all prompts)", both)]:
        ratio = t["speedup_b"] / t["speedup_a"]
        iv = stats.ratio_interval(ratio)
        label = f"[{iv.lo:.3f}, {iv.hi:.3f}]" if len(ratio) >= 2 else "-"
        print(f"{ptype:<22}{len(t):>3}{stats.geometric_mean(t['speedup_a']):>8.3f}"
              f"{stats.geometric_mean(t['speedup_b']):>8.3f}{iv.center:>8.3f}  {label}"
              + ("" if len(ratio) >= 5 else f" ({len(ratio)} prompts: too few)"))


if __name__ == "__main__":
    main()
