"""The fastest way to generate on this CPU, per prompt type, over several stores. Reads stores; runs nothing.

For every store given, every runtime configuration and prompt type: the target-only tokens/s (median of its
baseline runs), the speculative cell (draft model or prompt lookup, fixed K or the cost policy) with the
highest paired speedup, its end-to-end tokens/s and that speedup over that configuration's own target-only runs, and then the
fastest configuration overall per type. Prints a Markdown table (the README's) and a line per type saying
whether speculation is the fastest overall. Where a store holds ``baseline_padded`` (target-only with each
step padded to the cheapest measured shape), its tokens/s is shown in parentheses and competes for fastest.

    python -m study.fastest --db results/method.db --db results/fast.db

Tokens/s of different configurations were timed minutes apart (a sweep runs its configurations one after
another, and each store is its own sweep); only the speedups are paired. Greedy outputs that left the
target-only output (reduced precision) are counted per configuration.
"""

from __future__ import annotations

import argparse

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
    from study.report import fastest_rows, fastest_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", required=True, help="results store (repeatable)")
    args = ap.parse_args(argv)
    cells = pd.concat([_rows(db) for db in args.db], ignore_index=True)
    if cells.empty:
        print("no runs")
        return cells
    t = fastest_table(cells)  # the study report's table (study.report)
    headers, rows = fastest_rows(t)
    print("| " + " | ".join(headers) + " |")
    print("|---|" + "---|" * (len(headers) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    for label, g in cells.groupby("config_label"):
        print(f"{label}: {int(g['diverged'].iloc[0])} of {int(g['checked'].iloc[0])} greedy speculative runs left the "
              "target-only output")
    return t


if __name__ == "__main__":
    main()
