"""Is the measurement method trustworthy? Prints its four targets with PASS / FAIL (asserts nothing).

1. Trace replay reproduces the rounds of at least 99% of the fp32 timed greedy runs exactly (every mismatch
   listed).
2. Predicted / measured decode speedup: median within +/-10% over the timed runs (each printed).
3. A/A pairs (target-only timed as a method between two target-only runs): median |ratio - 1| <= 5% and the
   A/A interval contains 1.
4. The t-interval on log ratios covers >= 90% at n = 5, 8, 12 units, with a false-win rate <= 5% at a true
   speedup of 1 (simulated, `specdec.core.stats.coverage`).

    python -m study.targets.method --db results/method.db             # read a store
    python -m study.targets.method --run --db results/method.db       # run the small sweep first

``--run`` times a small paired sweep on the default pair (fp32 transformers, 2 threads, the primary prompt of
`--types`, 64 new tokens, K in {1, 2, 4} for the draft model, K = 4 for prompt lookup, the cost policy, one
A/A run per prompt; resumable with the same command). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

DEFAULT_TYPES = "repetitive,code,natural,dialogue,list_items,technical"


def _run(args) -> None:
    from specdec.bench.sweep import make_config, run_sweep

    cfg = make_config({"prompt_types": args.types, "ks": "1,2,4", "max_new_tokens": args.max_new_tokens,
                       "peers": False, "policies": "cost", "threads": args.threads, "name": "bench_method",
                       "methods": "baseline,aa,draft,ngram"})
    run_sweep(cfg, db=args.db, resume=args.resume, progress=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="results/method.db", help="SQLite results store")
    ap.add_argument("--sweep", default=None, help="sweep id or prefix (default: the newest)")
    ap.add_argument("--run", action="store_true", help="run the small sweep first")
    ap.add_argument("--resume", action="store_true", help="with --run: continue an interrupted sweep")
    ap.add_argument("--types", default=DEFAULT_TYPES, help="prompt types of --run")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.run:
        _run(args)

    from specdec.core import stats
    from specdec.report import analyze, load_store
    from specdec.report import tables as T
    from specdec.report.answer import summary

    an = analyze(load_store(args.db, args.sweep))
    runs = an.store.runs
    machine = (an.store.sweep or {}).get("machine_json") or "?"
    print(f"store {args.db}, sweep {an.store.sweep_id}; machine {machine}")
    pvm = an[T.PREDICTED]
    dtype = runs.set_index("run_id")["dtype"].to_dict() if len(runs) else {}
    fp32 = pvm[[dtype.get(r) in (None, "float32") for r in pvm["run_id"]]] if len(pvm) else pvm
    print("\n1. replay of the timed greedy runs (fp32):")
    sm = summary(fp32)
    if not sm.get("n"):
        print("   no traced timed runs in this store")
    else:
        share = sm["n_exact"] / sm["n"]
        for r in fp32[~fp32["replay_exact"]].itertuples():
            print(f"   mismatch: run {r.run_id} {r.prompt_id} {r.method} {r.policy} K={r.k}: {r.mismatch}")
        print(f"   {sm['n_exact']} of {sm['n']} exact ({share:.1%}): target >= 99%: "
              f"{'PASS' if share >= 0.99 else 'FAIL'}")
    print("\n2. predicted / measured decode speedup per timed run:")
    print(f"   {'run':>4} {'prompt':<18} {'method':<6} {'policy':<6} {'K':>3} {'pred':>6} {'meas':>6} {'ratio':>6}")
    for r in pvm.itertuples():
        print(f"   {r.run_id:>4} {r.prompt_id:<18} {r.method:<6} {r.policy:<6} {r.k:>3} {r.predicted:>6.2f} "
              f"{r.measured:>6.2f} {r.ratio:>6.3f}")
    if len(pvm):
        print("   per cell (median predicted / measured over its timed runs):")
        for (label, method, policy, k), g in pvm.groupby(["config_label", "method", "policy", "k"], sort=True):
            print(f"     {label:<20} {method:<6} {policy:<6} K={int(k):<3} {g['ratio'].median():.3f} "
                  f"({len(g)} runs)")
    if sm.get("n"):
        med = summary(pvm)["median_ratio"]
        print(f"   median {med:.3f}, {summary(pvm)['within_10pct']:.0%} within 10%: target median within +/-10%: "
              f"{'PASS' if abs(med - 1) <= 0.10 else 'FAIL'}")
    print("\n3. A/A (target-only between two target-only runs):")
    cells = an[T.CELLS]
    aa = cells[cells["method"] == "aa"] if len(cells) else cells
    ov = an[T.OVERALL]
    pooled = ov[ov["method"] == "aa"] if len(ov) else ov
    if aa.empty:
        print("   no A/A runs in this store")
    else:
        dev = np.abs(aa["speedup"].astype(float) - 1.0)
        for r in aa.itertuples():
            print(f"   {r.prompt_type:<20} {r.speedup:.3f}")
        med = float(np.median(dev))
        print(f"   median |ratio - 1| = {med:.1%}: target <= 5%: {'PASS' if med <= 0.05 else 'FAIL'}")
        for r in pooled.itertuples():
            covers = r.speedup_lo <= 1.0 <= r.speedup_hi
            print(f"   {r.config_label}: {r.speedup:.3f} [{r.speedup_lo:.3f}, {r.speedup_hi:.3f}] over "
                  f"{r.n_aligned} prompts ({r.verdict}): interval contains 1: {'PASS' if covers else 'FAIL'}")
    print("\n4. interval coverage (simulated, log-normal noise sd 0.1, 4000 studies each):")
    ok = True
    for n in (5, 8, 12):
        cov = stats.coverage(1.25, n)["coverage"]
        win = stats.coverage(1.0, n)["win_rate"]
        ok &= cov >= 0.90 and win <= 0.05
        print(f"   n = {n:>2}: coverage {cov:.1%}, false-win rate {win:.1%}")
    print(f"   target coverage >= 90% and false wins <= 5%: {'PASS' if ok else 'FAIL'}")


if __name__ == "__main__":
    sys.exit(main())
