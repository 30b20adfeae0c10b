"""Adaptive K policies against the best fixed K (chosen after the fact) and target-only decoding.

Reads a sweep already in a results store (no model runs here, so it never competes with a timing) and prints,
per prompt type and speculative method, the policy's speedup over the target-only baseline, the best fixed K
and its speedup, and the policy's tokens/s relative to that best fixed K. It then checks the two targets of
an adaptive policy (the `cost` policy by default: within 10 % of the best fixed K on every type, never
more than 5 % slower than target-only) and prints PASS / FAIL for each; it asserts nothing and always exits 0.

    python -m study.targets.policy --db results/archive/study.db                 # newest sweep in the store
    python -m study.targets.policy --db results/archive/study.db --policy heuristic --within 0.10 --floor 0.95

Targets: ``vs best fixed >= 1 - within`` on every prompt type (default within 10%), and ``speedup >= floor``
on every prompt type (default: no more than 5% slower than the baseline). Both are printed twice: on raw
tokens/s, and (for stores with acceptance traces) on the trace-predicted decode speedups, where the policy and
every fixed K in 1..16 are replayed on the same traces and priced with the same calibration blocks. Each
end-to-end ratio is a median over the
prompt type's prompts of per-prompt tokens/s ratios (`specdec.report.comparisons.adaptive_table`); with one
run per cell it carries the run-to-run noise of two single runs (a few percent on an idle CPU).
"""

from __future__ import annotations

import argparse
import math


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="results/archive/study.db", help="SQLite results store")
    ap.add_argument("--sweep", default=None, help="sweep id or prefix (default: the newest)")
    ap.add_argument("--policy", default="cost", help="adaptive policy to check (cost, heuristic, confidence)")
    ap.add_argument("--within", type=float, default=0.10, help="allowed shortfall against the best fixed K")
    ap.add_argument("--floor", type=float, default=0.95, help="lowest acceptable speedup over the baseline")
    args = ap.parse_args()

    from specdec.report import analyze, load_store
    from specdec.report.vocab import ALL_PROMPTS, EACH_TYPE_BEST_K

    pooled = (ALL_PROMPTS, EACH_TYPE_BEST_K)  # the pooled rows; the others are one prompt type each

    an = analyze(load_store(args.db, args.sweep))
    ad = an.table("adaptive")
    if ad.empty or not (ad["policy"] == args.policy).any():
        print(f"no '{args.policy}' policy runs in sweep {an.store.sweep_id} of {args.db}")
        return
    ad = ad[ad["policy"] == args.policy]
    print(f"sweep {an.store.sweep_id} ({args.db}); policy '{args.policy}'")
    header = (f"{'config':<22} {'method':<6} {'prompt type':<34} {'K cap':>5} {'mean K':>6} {'speedup':>8} "
              f"{'best K':>6} {'best':>6} {'vs best':>8}  targets")
    print(header)
    print("-" * len(header))
    fails: dict[str, list[str]] = {"within": [], "floor": []}
    for r in ad.sort_values(["config_label", "method", "prompt_type"]).itertuples():
        marks = []
        within_ok = not math.isnan(r.vs_best_fixed) and r.vs_best_fixed >= 1 - args.within
        floor_ok = not math.isnan(r.speedup) and r.speedup >= args.floor
        if r.prompt_type not in pooled:
            if not within_ok:
                fails["within"].append(f"{r.method}/{r.prompt_type}")
            if not floor_ok:
                fails["floor"].append(f"{r.method}/{r.prompt_type}")
        marks.append("ok" if within_ok else "BELOW-BEST")
        marks.append("ok" if floor_ok else "SLOWER")
        best_k = "-" if math.isnan(r.best_fixed_k) else str(int(r.best_fixed_k))
        print(f"{r.config_label:<22} {r.method:<6} {r.prompt_type:<34} {r.k_cap:>5} {r.mean_k:>6.2f} "
              f"{r.speedup:>7.2f}x {best_k:>6} {r.best_fixed_speedup:>5.2f}x {r.vs_best_fixed:>7.2f}x  "
              f"{' '.join(marks)}")
    n_types = int((~ad["prompt_type"].isin(pooled)).sum())
    print()
    _print_targets("raw tokens/s", fails, n_types, args)
    _from_traces(an, args)


def _print_targets(basis: str, fails: dict[str, list[str]], n_cells: int, args) -> None:
    """One PASS / FAIL line per target; `fails` maps "within" / "floor" to the failing method/type cells."""
    for name, text in (("within", f"within {args.within:.0%} of the best fixed K on every prompt type"),
                       ("floor", f"no prompt type below {args.floor:.2f}x the baseline")):
        bad = fails[name]
        verdict = "PASS" if not bad else f"FAIL ({len(bad)} of {n_cells}: {', '.join(bad)})"
        print(f"target ({basis}): {args.policy} policy {text}: {verdict}")


def _from_traces(an, args) -> None:
    """The same comparison on the acceptance traces (stores with traces only): the policy's predicted decode
    speedup against the best fixed K in 1..16, both replayed on every prompt's trace and priced with its
    calibration block (`specdec.report.predicted`), so no machine drift enters either side."""
    best = an.table("trace_best_k")
    if best.empty or args.policy != "cost":
        print("\n(no acceptance traces with cost-policy predictions: no trace-based comparison)")
        return
    print("\nfrom the acceptance traces (decode-only, predicted; best fixed K over 1..16):")
    print(f"{'config':<22} {'method':<6} {'prompt type':<34} {'policy':>7} {'best K':>6} {'best':>6} {'vs best':>8}  targets")
    fails: dict[str, list[str]] = {"within": [], "floor": []}
    for r in best.itertuples():
        ratio = r.policy_predicted / r.predicted
        within_ok, floor_ok = ratio >= 1 - args.within, r.policy_predicted >= args.floor
        if not within_ok:
            fails["within"].append(f"{r.method}/{r.prompt_type}")
        if not floor_ok:
            fails["floor"].append(f"{r.method}/{r.prompt_type}")
        print(f"{r.config_label:<22} {r.method:<6} {r.prompt_type:<34} {r.policy_predicted:>6.2f}x {r.best_k:>6} "
              f"{r.predicted:>5.2f}x {ratio:>7.2f}x  {'ok' if within_ok else 'BELOW-BEST'} "
              f"{'ok' if floor_ok else 'SLOWER'}")
    print()
    _print_targets("trace-predicted", fails, len(best), args)


if __name__ == "__main__":
    main()
