"""The fast CPU configurations' targets (bf16 against fp32 transformers), read from sweep stores. Runs nothing
unless asked (``--measure``), asserts nothing; prints each target with PASS / FAIL / NOT MEASURED and the
figures behind it.

1. bf16 target step <= 0.45x the fp32 step; bf16 v(17) <= 1.6 (target steps). From the calibration blocks
   (target forwards of 1..17 tokens at each prompt's own context): medians over the prompts of each
   configuration. The fp32 and bf16 blocks come from different sweeps (processes) on the same machine kind,
   so the ratio is labelled as such (the target speaks of one process: ``--measure`` times both in one).
2. Per prompt type, the default policy (draft model, cost policy) in transformers bf16 >= 1.5x bf16
   target-only on >= 8 of the 12 types, and never below 0.97x: the paired speedup over all the type's prompts
   with its 95 % t-interval (the report's cell table). Types with fewer than all built-in prompts are flagged.
3. In bf16, >= 90 % of greedy speculative runs match target-only output exactly; every divergence listed with
   the target's top-2 margin at the diverging position (from the prompt's trace).
4. The default policy is never more than 3 % slower than target-only on any type, in fp32 and in bf16.
5. Where a store holds ``baseline_padded`` (target-only with each step padded to the cheapest measured shape),
   its paired speedup over plain target-only, and the default policy's speedup over it (the ratio of the two
   paired speedups per prompt, pooled with a t-interval): the fair comparison when padding makes target-only
   faster.
6. The default policy replayed from the acceptance traces with each prompt's calibration block and, for fp32,
   with another machine's stored cost curve (``--replay-curve results/archive/study.db``: the Intel machine of the
   published study): never below 0.97 per type (decode-only predictions).

    python -m study.targets.fast --db results/bf16_all.db --db results/method.db --replay-curve results/archive/study.db
    python -m study.targets.fast --db results/bf16_all.db --measure qwen2.5-coder:target   # + target 1 live

The "fastest way to generate on this CPU" table is `study.fastest`.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

#: The configurations and the method the targets speak of.
BF16 = "transformers-bf16"
FP32 = "transformers-eager"
DEFAULT = ("draft", "cost")


def _load(dbs: list[str]):
    from specdec.report import analyze, load_store

    return [(db, analyze(load_store(db))) for db in dbs]


def _steps(analyses) -> pd.DataFrame:
    """Per (store, config): median target forward seconds at n = 1, 2 and 17 over the prompts' calibration
    blocks, and v(17) = t(17) / t(1) (median over blocks)."""
    rows = []
    for db, an in analyses:
        cal = an.store.calibration
        if cal is None or cal.empty:
            continue
        tgt = cal[cal["role"] == "target"]
        for label, g in tgt.groupby("config_label"):
            per = g.pivot_table(index="prompt_id", columns="n_tokens", values="seconds", aggfunc="median")
            if 1 not in per.columns:
                continue
            row = {"store": db, "config": label, "n_prompts": len(per), "t1": float(per[1].median())}
            for n in (2, 17):
                if n in per.columns:
                    row[f"t{n}"] = float(per[n].median())
                    row[f"v{n}"] = float((per[n] / per[1]).median())
            rows.append(row)
    return pd.DataFrame(rows)


def _cells(analyses, method: str, policy: str) -> pd.DataFrame:
    from specdec.report import tables as T

    out = []
    for db, an in analyses:
        c = an[T.CELLS]
        if c.empty:
            continue
        c = c[(c["method"] == method) & (c["policy"] == policy) & (c["prompt_type"] != "(all prompts)")]
        out.append(c.assign(store=db))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def _verdict(ok: bool | None) -> str:
    return "NOT MEASURED" if ok is None else ("PASS" if ok else "FAIL")


def target_steps(analyses) -> None:
    print("1. bf16 step <= 0.45x fp32 step; bf16 v(17) <= 1.6 (calibration blocks, medians over prompts):")
    st = _steps(analyses)
    if st.empty:
        print("   no calibration blocks")
        return
    for r in st.itertuples():
        v2 = f"v(2) = {r.v2:.2f}" if hasattr(r, "v2") and np.isfinite(r.v2) else ""
        v17 = f"v(17) = {r.v17:.2f}" if hasattr(r, "v17") and np.isfinite(r.v17) else ""
        print(f"   {r.config:<22} {r.store}: t(1) = {r.t1 * 1e3:.0f} ms, {v2}, {v17} ({r.n_prompts} prompts)")
    b = st[st["config"] == BF16]
    f = st[st["config"] == FP32]
    ratio_ok = v17_ok = None
    if len(b) and len(f):
        ratio = float(b["t1"].median() / f["t1"].median())
        ratio_ok = ratio <= 0.45
        print(f"   bf16 / fp32 step = {ratio:.2f} (different sweeps on this machine kind; the target asks for one "
              f"process: --measure): {_verdict(ratio_ok)}")
    if len(b) and "v17" in b.columns:
        v17 = float(b["v17"].median())
        v17_ok = v17 <= 1.6
        print(f"   bf16 v(17) = {v17:.2f}: {_verdict(v17_ok)}")
    if ratio_ok is None:
        print(f"   bf16 / fp32 step: {_verdict(None)} (give a store with each)")


def target_policy(analyses) -> None:
    from specdec.bench.prompts import load_builtin

    n_builtin = pd.Series([p.type for p in load_builtin()]).value_counts().to_dict()
    print("\n2./4. default policy (draft model, cost policy) per prompt type, paired over the type's prompts:")
    cells = _cells(analyses, *DEFAULT)
    if cells.empty:
        print("   no default-policy cells")
        return
    for (db, label), g in cells.groupby(["store", "config_label"], sort=False):
        print(f"   {label} ({db}):")
        for r in g.sort_values("speedup", ascending=False).itertuples():
            lo = f"[{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]" if np.isfinite(r.speedup_lo) else "(no interval)"
            n_all = n_builtin.get(r.prompt_type, 0)
            flag = "" if r.n_aligned >= n_all else f"  (only {r.n_aligned} of {n_all} built-in prompts)"
            print(f"     {r.prompt_type:<18} {r.speedup:.2f}x {lo} {r.verdict}{flag}")
        all_prompts = all(r.n_aligned >= n_builtin.get(r.prompt_type, 0) for r in g.itertuples())
        n_types = g["prompt_type"].nunique()
        n15 = int((g["speedup"] >= 1.5).sum())
        worst = g.sort_values("speedup").iloc[0]
        measured = all_prompts and n_types == 12
        if label == BF16:
            print(f"     >= 1.5x on {n15} of {n_types} types (target >= 8 of 12): "
                  f"{_verdict((n15 >= 8) if measured else None)}")
        floor = 0.97
        print(f"     lowest {worst['speedup']:.2f}x ({worst['prompt_type']}): never below {floor}x: "
              f"{_verdict(bool(g['speedup'].min() >= floor) if measured else None)}"
              + ("" if measured else f" ({n_types} types{'' if all_prompts else ', not all prompts'})"))


def target_exactness(analyses) -> None:
    from specdec.report import tables as T
    from specdec.report.comparisons import exactness
    from specdec.report.vocab import SPEC_METHODS

    print("\n3. exactness of greedy speculative runs against the same configuration's target-only output:")
    for db, an in analyses:
        div = an[T.DIVERGENCE]
        for r in exactness(an[T.EQUALITY]).itertuples():  # the report's one count
            label, n, ok = r.config_label, r.n_checked, r.n_equal
            d = div[(div["config_label"] == label) & div["method"].isin(SPEC_METHODS)] if len(div) else div
            worst = float(d["target_margin"].max()) if len(d) and d["target_margin"].notna().any() else np.nan
            verdict = _verdict(ok / n >= 0.90) if label == BF16 else "(target is for bf16)"
            print(f"   {label:<22} {db}: {ok} of {n} exact ({ok / n:.0%}); largest margin at a divergence "
                  f"{worst:.3f}: {verdict}")
            if len(d):
                pos = d.groupby(["prompt_id", "first_divergence"]).agg(
                    runs=("run_id", "size"), margin=("target_margin", "first")).reset_index()
                for p in pos.itertuples():
                    print(f"     {p.prompt_id:<20} new token {int(p.first_divergence):>3}: {p.runs} run(s), "
                          f"target top-2 margin {p.margin:.3f}")


def target_padded_baseline(analyses) -> None:
    """baseline_padded against plain target-only, per prompt type and pooled, and the default policy against
    baseline_padded. Each ratio is paired inside its own store; with several stores of one configuration
    (e.g. results/bf16_all.db and results/bf16_padded.db) the default policy / padded ratio divides two such
    ratios of one prompt taken in different sweeps."""
    from specdec.core import stats
    from specdec.report.predicted import positive_geomean
    from specdec.report.speedup import paired_reference

    def fmt(x) -> str:
        ci = stats.ratio_interval(x.to_numpy()) if len(x) >= 2 else None
        return (f"{ci.center:.3f} [{ci.lo:.3f}, {ci.hi:.3f}] over {len(x)} prompts ({ci.verdict})" if ci
                else f"{x.iloc[0]:.3f} (one prompt)")

    print("\n5. target-only padded to the cheapest shape (baseline_padded):")
    found = False
    pers = []
    for db, an in analyses:
        runs = an.store.runs
        if runs is None or runs.empty:
            continue
        ok = runs[runs["error"].isna() & runs["tokens_per_s"].notna()]
        ref, _ = paired_reference(ok)
        ok = ok.assign(ratio=[r.tokens_per_s / ref[r.run_id] if r.run_id in ref else np.nan
                              for r in ok.itertuples()])
        pers.append(ok.groupby(["config_label", "prompt_type", "prompt_id", "method", "policy"], dropna=False)[
            "ratio"].apply(positive_geomean).reset_index().assign(store=db))
        if "baseline_padded" not in set(runs["method"]):
            continue
        found = True
        for label, g in ok.groupby("config_label"):
            per = g.groupby(["prompt_id", "method", "policy"], dropna=False)["ratio"].apply(
                positive_geomean).reset_index()
            pad = per[per["method"] == "baseline_padded"].set_index("prompt_id")["ratio"]
            if pad.empty:
                continue
            ci = stats.ratio_interval(pad.to_numpy()) if len(pad) >= 2 else None
            print(f"   {label}: baseline_padded / baseline = "
                  + (f"{ci.center:.3f} [{ci.lo:.3f}, {ci.hi:.3f}] over {len(pad)} prompts ({ci.verdict})"
                     if ci else f"{pad.iloc[0]:.3f} (one prompt)"))
            # exactness against either reference: reduced-precision kernels differ between a 1-row forward and
            # the multi-row forwards of verification, and a padded target-only step runs the multi-row ones
            toks = g.assign(ids=g["token_ids"].astype(str))
            ref_plain = toks[toks["method"] == "baseline"].groupby("prompt_id")["ids"].first()
            ref_pad = toks[toks["method"] == "baseline_padded"].groupby("prompt_id")["ids"].first()
            spec = toks[toks["method"].isin(["draft", "ngram"]) & toks["prompt_id"].isin(ref_pad.index)]
            if len(spec):
                n_plain = int(sum(r.ids == ref_plain.get(r.prompt_id) for r in spec.itertuples()))
                n_pad = int(sum(r.ids == ref_pad.get(r.prompt_id) for r in spec.itertuples()))
                n_same = int(sum(ref_plain.get(p) == ref_pad.get(p) for p in ref_pad.index))
                print(f"   {label}: greedy speculative runs equal to plain target-only output {n_plain} of "
                      f"{len(spec)}, to padded target-only output {n_pad} of {len(spec)}; plain and padded "
                      f"target-only agree on {n_same} of {len(ref_pad)} prompts")
            pol = per[(per["method"] == DEFAULT[0]) & (per["policy"] == DEFAULT[1])].set_index("prompt_id")["ratio"]
            common = pol.index.intersection(pad.index)
            if len(common) >= 2:
                ci2 = stats.ratio_interval((pol[common] / pad[common]).to_numpy())
                print(f"   {label}: default policy / baseline_padded = {ci2.center:.3f} [{ci2.lo:.3f}, "
                      f"{ci2.hi:.3f}] over {len(common)} prompts ({ci2.verdict})")
    if not found:
        print("   no baseline_padded runs in these stores")
        return
    per_all = pd.concat(pers, ignore_index=True)
    for label, g in per_all.groupby("config_label"):
        pad = g[g["method"] == "baseline_padded"].set_index("prompt_id")
        pol = g[(g["method"] == DEFAULT[0]) & (g["policy"] == DEFAULT[1])].set_index("prompt_id")["ratio"]
        if pad.empty or not pol.index.is_unique:
            continue
        print(f"   {label}, per prompt type: baseline_padded / baseline; default policy / baseline_padded "
              f"(across the stores given: {', '.join(sorted(set(g['store'])))})")
        for ptype, pt in [*pad.groupby("prompt_type"), ("all", pad)]:
            common = pol.index.intersection(pt.index)
            print(f"     {ptype:<18} {fmt(pt['ratio'])}; "
                  + (fmt(pol[common] / pt.loc[common, "ratio"]) if len(common) else "no default-policy runs"))


def _other_curve(db: str):
    """(label, CostCurve) of the fp32 transformers costs stored in `db` (e.g. results/archive/study.db, the Intel
    machine), or None."""
    from specdec.core.costs import CostCurve
    from specdec.report import load_store
    from specdec.report.model import cost_infos

    st = load_store(db)
    infos = cost_infos(st.costs)
    info = infos.get(FP32)
    if info is None or 1 not in info.target_s:
        return None
    machine = (st.sweep or {}).get("machine_json") or "?"
    return f"{db} ({machine[:80]})", CostCurve(info.target_s, info.draft_step_s)


def target_replay(analyses, other_db: str | None) -> None:
    """The default policy replayed from every traced prompt: with the prompt's own calibration block (this
    machine) and, for fp32, with another machine's stored curve (the same traces, priced as there)."""
    import copy

    from specdec.report.predicted import positive_geomean

    print("\n6. the default policy replayed from the acceptance traces (decode-only predicted speedup, per type):")
    other = _other_curve(other_db) if other_db else None
    if other_db and other is None:
        print(f"   {other_db}: no fp32 transformers cost curve")
    rows = []
    for _, an in analyses:
        for m in an.prompt_models:
            if m.curve is None or not m.trace.draft_ids:
                continue
            curves = [("this machine", m.curve)]
            if other is not None and m.key[0] == FP32:
                curves.append(("other machine", other[1]))
            for name, curve in curves:
                mm = copy.copy(m)
                mm.curve = curve
                rows.append({"config": m.key[0], "prompt_type": m.prompt_type, "curve": name,
                             "predicted": mm.speedup("draft", mm.rounds("draft", 16, "cost"))})
    if not rows:
        print("   no traced prompts with costs")
        return
    t = pd.DataFrame(rows)
    if other is not None:
        print(f"   other machine's curve: {other[0]}")
    for (label, curve), g in t.groupby(["config", "curve"]):
        per = g.groupby("prompt_type")["predicted"].apply(positive_geomean)
        low = per.idxmin()
        print(f"   {label}, {curve}'s curve: " + ", ".join(f"{k} {v:.2f}" for k, v in per.items())
              + f"; lowest {low} {per[low]:.2f}: never below 0.97: {_verdict(bool(per.min() >= 0.97))}")


def measure_steps(target: str, threads: int, passes: int, context_tokens: int = 64) -> None:
    """Target 1 in one process: the fp32 and the bf16 target both loaded, forwards of 1, 2 and 17 tokens
    timed on a warm `context_tokens` cache in `passes` interleaved passes (fp32 pass, bf16 pass, ...), so a
    slow spell of the machine hits both; medians over the passes."""
    import statistics

    from specdec.measure.timing import context_ids, forward_times
    from specdec.runtimes.loading import load_pair

    ns = [1, 2, 17]
    pairs = {dt: load_pair(target, None, dtype=dt, threads=threads) for dt in ("float32", "bfloat16")}
    ctx = context_ids(pairs["float32"].tokenizer, pairs["float32"].vocab_size, context_tokens)
    samples: dict[str, dict[int, list[float]]] = {dt: {n: [] for n in ns} for dt in pairs}
    for p in range(passes):
        for dt, pair in pairs.items():
            med, _ = forward_times(pair.target.backend, ctx, ns, repeats=1, warmup=p == 0)
            for n in ns:
                samples[dt][n].append(med[n])
    t = {dt: {n: statistics.median(v) for n, v in by.items()} for dt, by in samples.items()}
    f32, b16 = t["float32"], t["bfloat16"]
    print(f"1. (one process, {passes} interleaved passes, {threads} threads, {context_tokens}-token context)")
    for dt, v in t.items():
        print(f"   {dt:<9} t(1) = {v[1] * 1e3:.1f} ms, t(2) = {v[2] * 1e3:.1f} ms, v(17) = {v[17] / v[1]:.2f}")
    ratio = b16[1] / f32[1]
    best = min(b16[1], b16[2]) / f32[1]
    print(f"   bf16 / fp32 single step = {ratio:.3f}: target <= 0.45: {_verdict(ratio <= 0.45)}; the cheaper of "
          f"bf16's 1- and 2-token forwards / fp32 step = {best:.3f}")
    print(f"   bf16 v(17) = {b16[17] / b16[1]:.2f}: target <= 1.6: {_verdict(b16[17] / b16[1] <= 1.6)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", required=True, help="results store (repeatable)")
    ap.add_argument("--replay-curve", default=None,
                    help="a store whose fp32 cost curve (another machine's) prices the fp32 traces too")
    ap.add_argument("--measure", default=None, metavar="TARGET",
                    help="also time fp32 and bf16 forwards of this target in one process (target 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=7)
    args = ap.parse_args(argv)
    if args.measure:
        measure_steps(args.measure, args.threads, args.passes)
    analyses = _load(args.db)
    for db, an in analyses:
        machines = an.store.machine_runs()
        if len(machines) > 1:
            print(f"store {db}, sweep {an.store.sweep_id}; {len(machines)} machines (each ratio within one):")
            for mid, label, n, _ in machines:
                print(f"   machine {mid}: {label}, {n} runs")
        else:
            machine = (an.store.sweep or {}).get("machine_json") or "?"
            print(f"store {db}, sweep {an.store.sweep_id}; machine {machine}")
    print()
    target_steps(analyses)
    target_policy(analyses)
    target_exactness(analyses)
    target_padded_baseline(analyses)
    target_replay(analyses, args.replay_curve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
