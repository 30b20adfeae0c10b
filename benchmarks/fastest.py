"""Benchmark: the fastest way to generate on this CPU, per prompt type (issue 19). Reads stores; runs nothing.

For every store given, every runtime configuration and prompt type: the target-only tokens/s (median of its
baseline runs), the fastest speculative cell (draft model or prompt lookup, fixed K or the cost policy) with
its end-to-end tokens/s and its paired speedup over that configuration's own target-only runs, and then the
fastest configuration overall per type. Prints a Markdown table (the README's) and a line per type saying
whether speculation is the fastest overall. Where a store holds ``baseline_padded`` (target-only with each
step padded to the cheapest measured shape), its tokens/s is shown in parentheses and competes for fastest.

    python benchmarks/fastest.py --db results/method.db --db results/fast.db

Tokens/s of different configurations were timed minutes apart (a sweep runs its configurations one after
another, and each store is its own sweep); only the speedups are paired. Greedy outputs that left the
target-only output (reduced precision) are counted per configuration.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd


def _rows(db: str) -> pd.DataFrame:
    from specdec.report import analyze, load_store
    from specdec.report import tables as T
    from specdec.report.comparisons import exactness

    an = analyze(load_store(db))
    cells = an[T.CELLS]
    if cells.empty:
        return cells
    ex = exactness(an[T.EQUALITY]).set_index("config_label")  # the report's one count
    cells = cells.assign(store=db, diverged=cells["config_label"].map(ex["n_diverged"]).fillna(0).astype(int),
                         checked=cells["config_label"].map(ex["n_checked"]).fillna(0).astype(int))
    return cells


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", required=True, help="results store (repeatable)")
    args = ap.parse_args(argv)
    cells = pd.concat([_rows(db) for db in args.db], ignore_index=True)
    if cells.empty:
        print("no runs")
        return cells
    cells = cells[cells["prompt_type"] != "(all prompts)"]
    spec = cells[cells["method"].isin(["draft", "ngram"]) & np.isfinite(cells["tok_s"].astype(float))]
    base = cells[cells["method"] == "baseline"]
    rows = []
    for (label, ptype), b in base.groupby(["config_label", "prompt_type"]):
        s = spec[(spec["config_label"] == label) & (spec["prompt_type"] == ptype)]
        best = s.sort_values("tok_s", ascending=False).iloc[0] if len(s) else None
        what = "-" if best is None else (f"{best['method']} "
                                         + (f"K={int(best['k'])}" if best["policy"] == "fixed" else best["policy"]))
        pad = cells[(cells["method"] == "baseline_padded") & (cells["config_label"] == label)
                    & (cells["prompt_type"] == ptype)]
        rows.append({"prompt_type": ptype, "config": label, "target_only": float(b["tok_s"].iloc[0]),
                     "padded": float(pad["tok_s"].iloc[0]) if len(pad) else np.nan,
                     "best_spec": what, "spec_tok_s": np.nan if best is None else float(best["tok_s"]),
                     "speedup": np.nan if best is None else float(best["speedup"])})
    t = pd.DataFrame(rows)
    configs = sorted(t["config"].unique())
    print("| prompt type | " + " | ".join(f"{c}: target-only / best speculative (x paired)" for c in configs)
          + " | fastest |")
    print("|---|" + "---|" * len(configs) + "---|")
    for ptype, g in t.groupby("prompt_type", sort=True):
        parts, best_all = [], (0.0, "")
        for c in configs:
            r = g[g["config"] == c]
            if r.empty:
                parts.append("-")
                continue
            r = r.iloc[0]
            padded = f" (padded {r.padded:.1f})" if np.isfinite(r.padded) else ""
            parts.append(f"{r.target_only:.1f}{padded} / {r.spec_tok_s:.1f} ({r.best_spec}, {r.speedup:.2f}x)")
            for val, name in ((r.target_only, f"{c} target-only"), (r.padded, f"{c} target-only padded"),
                              (r.spec_tok_s, f"{c} {r.best_spec}")):
                if np.isfinite(val) and val > best_all[0]:
                    best_all = (val, name)
        print(f"| {ptype} | " + " | ".join(parts) + f" | {best_all[1]} ({best_all[0]:.1f} tok/s) |")
    print()
    for label, g in cells.groupby("config_label"):
        print(f"{label}: {int(g['diverged'].iloc[0])} of {int(g['checked'].iloc[0])} greedy speculative runs left the "
              "target-only output")
    return t


if __name__ == "__main__":
    main()
