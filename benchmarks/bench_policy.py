"""Benchmark: adaptive K policies against the best fixed K (chosen after the fact) and the baseline.

Reads a sweep already in a results store (no model runs here, so it never competes with a timing) and prints,
per prompt type and speculative method, the policy's speedup over the target-only baseline, the best fixed K
and its speedup, and the policy's tokens/s relative to that best fixed K. It then checks the two targets of
the `cost` policy (issue 7) and prints PASS / FAIL for each; it asserts nothing and always exits 0.

    python benchmarks/bench_policy.py --db results/study.db                 # newest sweep in the store
    python benchmarks/bench_policy.py --db results/study.db --policy heuristic --within 0.10 --floor 0.95

Targets: ``vs best fixed >= 1 - within`` on every prompt type (default within 10%), and ``speedup >= floor``
on every prompt type (default: no more than 5% slower than the baseline). Both are printed twice: on raw
tokens/s, and on step-normalized speedups (each run scaled by its own measured target step time over its
baseline's: the comparison had the machine kept one speed; see `specdec.report.diagnostics.drift_runs`). Each ratio is a median over the
prompt type's prompts of per-prompt tokens/s ratios (`specdec.report.comparisons.adaptive_table`); with one
run per cell it carries the run-to-run noise of two single runs (a few percent on an idle CPU).
"""

from __future__ import annotations

import argparse
import math


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="results/study.db", help="SQLite results store")
    ap.add_argument("--sweep", default=None, help="sweep id or prefix (default: the newest)")
    ap.add_argument("--policy", default="cost", help="adaptive policy to check (cost, heuristic, confidence)")
    ap.add_argument("--within", type=float, default=0.10, help="allowed shortfall against the best fixed K")
    ap.add_argument("--floor", type=float, default=0.95, help="lowest acceptable speedup over the baseline")
    args = ap.parse_args()

    from specdec.report import analyze, load_store
    from specdec.report.vocab import ALL_PROMPTS

    an = analyze(load_store(args.db, args.sweep))
    ad = an.table("adaptive")
    if ad.empty or not (ad["policy"] == args.policy).any():
        print(f"no '{args.policy}' policy runs in sweep {an.store.sweep_id} of {args.db}")
        return
    ad = ad[ad["policy"] == args.policy]
    print(f"sweep {an.store.sweep_id} ({args.db}); policy '{args.policy}'")
    header = (f"{'config':<22} {'method':<6} {'prompt type':<20} {'K cap':>5} {'mean K':>6} {'speedup':>8} "
              f"{'best K':>6} {'best':>6} {'vs best':>8}  targets")
    print(header)
    print("-" * len(header))
    fails: dict[str, list[str]] = {"within": [], "floor": []}
    for r in ad.sort_values(["config_label", "method", "prompt_type"]).itertuples():
        marks = []
        within_ok = not math.isnan(r.vs_best_fixed) and r.vs_best_fixed >= 1 - args.within
        floor_ok = not math.isnan(r.speedup) and r.speedup >= args.floor
        if r.prompt_type != ALL_PROMPTS:
            if not within_ok:
                fails["within"].append(f"{r.method}/{r.prompt_type}")
            if not floor_ok:
                fails["floor"].append(f"{r.method}/{r.prompt_type}")
        marks.append("ok" if within_ok else "BELOW-BEST")
        marks.append("ok" if floor_ok else "SLOWER")
        best_k = "-" if math.isnan(r.best_fixed_k) else str(int(r.best_fixed_k))
        print(f"{r.config_label:<22} {r.method:<6} {r.prompt_type:<20} {r.k_cap:>5} {r.mean_k:>6.2f} "
              f"{r.speedup:>7.2f}x {best_k:>6} {r.best_fixed_speedup:>5.2f}x {r.vs_best_fixed:>7.2f}x  "
              f"{' '.join(marks)}")
    n_types = int((ad["prompt_type"] != ALL_PROMPTS).sum())
    print()
    _print_targets("raw tokens/s", fails, n_types, args)
    _normalized(an, args)


def _print_targets(basis: str, fails: dict[str, list[str]], n_cells: int, args) -> None:
    """One PASS / FAIL line per target; `fails` maps "within" / "floor" to the failing method/type cells."""
    for name, text in (("within", f"within {args.within:.0%} of the best fixed K on every prompt type"),
                       ("floor", f"no prompt type below {args.floor:.2f}x the baseline")):
        bad = fails[name]
        verdict = "PASS" if not bad else f"FAIL ({len(bad)} of {n_cells}: {', '.join(bad)})"
        print(f"target ({basis}): {args.policy} policy {text}: {verdict}")


def _normalized(an, args) -> None:
    """The same comparison on step-normalized speedups (`specdec.report.diagnostics.drift_runs`): each run's
    speedup scaled by its own target step time over its baseline's, so that runs taken while the machine
    ran at another speed compare as if it had not."""
    dr = an.table("drift_runs")
    if dr.empty:
        print("\n(no round traces: no step-normalized comparison)")
        return
    print("\nstep-normalized (machine drift removed with each run's own target step time; see the report's "
          "'Machine drift' section):")
    print(f"{'config':<22} {'method':<6} {'prompt type':<20} {'drift':>6} {'speedup':>8} {'best K':>6} {'best':>6} "
          f"{'vs best':>8}  targets")
    fails: dict[str, list[str]] = {"within": [], "floor": []}
    n_cells = 0
    spec = dr[dr["method"] != "baseline"]
    for (label, method, ptype), g in spec.groupby(["config_label", "method", "prompt_type"], sort=True):
        pol = g[g["policy"] == args.policy]
        fixed = g[g["policy"] == "fixed"].groupby("k")["normalized_speedup"].median()
        if pol.empty or fixed.empty:
            continue
        n_cells += 1
        ns = float(pol["normalized_speedup"].median())
        best_k = int(fixed.idxmax())
        ratio = ns / float(fixed.max())
        within_ok, floor_ok = ratio >= 1 - args.within, ns >= args.floor
        if not within_ok:
            fails["within"].append(f"{method}/{ptype}")
        if not floor_ok:
            fails["floor"].append(f"{method}/{ptype}")
        print(f"{label:<22} {method:<6} {ptype:<20} {float(pol['drift'].median()):>+6.0%} {ns:>7.2f}x {best_k:>6} "
              f"{float(fixed.max()):>5.2f}x {ratio:>7.2f}x  {'ok' if within_ok else 'BELOW-BEST'} "
              f"{'ok' if floor_ok else 'SLOWER'}")
    print()
    _print_targets("step-normalized", fails, n_cells, args)


if __name__ == "__main__":
    main()
