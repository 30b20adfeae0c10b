"""Report sections that compare: the analytical model against the measurement (speedup condition,
predicted vs measured, optimal K), ours against the peers, adaptive policies against the best fixed K, and
the runtimes side by side.
"""

from __future__ import annotations

import pandas as pd

from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.document import Section, Table, ci, f, i, key_columns, num, pct, s, table_of, yn
from specdec.report.vocab import ADAPTIVE_POLICIES, ALL_PROMPTS, EACH_TYPE_BEST_K, PEER_METHODS

__all__ = [
    "adaptive_section", "condition_section", "model_section", "native_tables", "peer_section", "peer_tables",
    "runtime_section", "synthetic_tables",
]


def _costs_note(sec: Section, a: Analysis) -> None:
    """Name the machine behind the sweep-level costs where several machines timed the store
    (`specdec.report.load.StoreData.costs_note`)."""
    note = a.store.costs_note() if a.store is not None else None
    if note:
        sec.blocks.append(note)


def condition_section(a: Analysis) -> Section:
    sec = Section("The speedup condition", "condition")
    sec.blocks.append(
        "Speculation pays when the measured per-token acceptance alpha-hat exceeds the break-even alpha of "
        "its K, computed from the measured c and verification cost v(K+1). 'yes' marks a prompt type whose "
        "alpha-hat clears it.")
    be = a[T.BREAK_EVEN]
    _costs_note(sec, a)
    if be.empty:
        sec.blocks.append("Not available: needs the costs table (draft and target step times) and fixed-K "
                          "speculative cells.")
        return sec
    t = table_of(be, [
        *key_columns("config", "method", "K"), ("c", lambda r: f(r["c"], 3)), ("v(K+1)", lambda r: f(r["v_k1"], 3)),
        ("break-even alpha (ideal, v=1)", lambda r: f(r["break_even_ideal"], 3)),
        ("break-even alpha (refined, measured v)", lambda r: f(r["break_even_refined"], 3)),
        ("v extrapolated", lambda r: yn(r["v_extrapolated"])),
    ])
    t.caption = "Minimum per-token acceptance at which each K breaks even ('never': no alpha <= 1 does)."
    sec.blocks.append(t)
    cond = a[T.CONDITION]
    if cond.empty:
        return sec
    for (label, pair, method), g in cond.groupby(["config_label", "pair", "method"], sort=True):
        ks = sorted(set(g["k"].astype(int)))
        thresholds = {int(r.k): r.break_even for r in g.itertuples()}
        headers = ["prompt type"] + [f"K={k} (needs {f(thresholds[k], 2)})" for k in ks]
        rows = []
        for ptype, h in g.groupby("prompt_type", sort=True):
            by_k = {int(r.k): r for r in h.itertuples()}
            row = [str(ptype)]
            for k in ks:
                r = by_k.get(k)
                row.append("-" if r is None else
                           f"{f(r.alpha_hat, 2)} {'yes' if r.clears else 'no'} ({s(r.verdict)})")
            rows.append(row)
        model = g["model"].iloc[0]
        sec.blocks.append(Table(headers, rows, caption=(
            f"{label} / {pair} / {method}: measured alpha-hat, whether it clears the {model} break-even alpha, "
            "and the measured verdict.")))
    agree = cond["agrees"].dropna()
    if len(agree):
        sec.blocks.append(f"Where the measurement gave a verdict (win or loss), the break-even test agrees "
                          f"with it in {int(agree.sum())} of {len(agree)} cells.")
    return sec


def model_section(a: Analysis) -> Section:
    sec = Section("The analytical model against the measurement", "model")
    m = a[T.MODEL]
    if m.empty:
        sec.blocks.append("Not available: needs costs (c, v) and fixed-K speculative cells with acceptance counts.")
    else:
        _costs_note(sec, a)
        eff = m["efficiency"].dropna()
        if len(eff):
            sec.blocks.append(
                f"Efficiency (measured / refined prediction) over {len(eff)} cells: median {f(eff.median())}, "
                f"range {f(eff.min())} to {f(eff.max())}.")
        t = table_of(m, [
            *key_columns("config", "pair", "prompt type", "method", "K"),
            ("alpha-hat", lambda r: f(r["alpha_hat"], 3)), ("c", lambda r: f(r["c"], 3)),
            ("v(K+1)", lambda r: f(r["v_k1"], 3)), ("E[tokens/round] model", lambda r: f(r["expected_tokens"])),
            ("block eff. measured", lambda r: f(r["block_efficiency"])), ("ideal", lambda r: f(r["ideal"])),
            ("refined", lambda r: f(r["refined"])), ("measured", lambda r: f(r["speedup"])),
            ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])), ("efficiency", lambda r: f(r["efficiency"])),
        ])
        t.caption = "Predicted vs measured speedup per fixed-K cell (expected tokens and block efficiency include the bonus token)."
        t.md, t.collapsed = False, True
        sec.blocks.append(t)
    opt = a[T.OPTIMAL_K]
    if len(opt):
        t = table_of(opt, [
            *key_columns("config", "pair", "prompt type", "method"),
            ("alpha (pooled)", lambda r: f(r["alpha_pooled"], 3)), ("model", lambda r: s(r["model"])),
            ("predicted best K", lambda r: i(r["predicted_k"])),
            ("predicted speedup", lambda r: f(r["predicted_speedup"])), ("measured best K", lambda r: i(r["best_k"])),
            ("measured speedup", lambda r: f(r["speedup"])), ("agree", lambda r: yn(r["agree"])),
        ])
        t.caption = "The model's optimal K (over the K values tried) against the measured best K."
        sec.blocks.append(t)
    return sec


def peer_tables(p: pd.DataFrame) -> list[Table]:
    """The pooled and the per-type tables of a `specdec.report.comparisons.peer_table` frame `p` (ratio of our
    tokens/s to the peer's, its interval, verdict, prompts, tokens/s and output-equality rates)."""
    spec = [("config", lambda r: s(r["config_label"])), ("target", lambda r: s(r["target"])),
            ("prompt type", lambda r: s(r["prompt_type"])), ("ours", lambda r: s(r["ours"])),
            ("peer", lambda r: s(r["peer"])), ("ours / peer tok/s", lambda r: f(r["ratio"])),
            ("95% CI", lambda r: ci(r["ratio_lo"], r["ratio_hi"])), ("verdict (ours)", lambda r: s(r["verdict"])),
            ("prompts", lambda r: i(r["n_prompts"])), ("ours tok/s", lambda r: f(r["ours_tok_s"], 1)),
            ("peer tok/s", lambda r: f(r["peer_tok_s"], 1)), ("ours equal", lambda r: pct(r["ours_match"])),
            ("peer equal", lambda r: pct(r["peer_match"]))]
    pooled = table_of(p[p["prompt_type"] == ALL_PROMPTS], spec)
    pooled.caption = ("Pooled over prompt types. Ratio > 1: ours is faster ('win'). 'equal': share of runs whose "
                      "tokens equal our baseline's (greedy).")
    by_type = table_of(p[p["prompt_type"] != ALL_PROMPTS], spec)
    by_type.caption = "By prompt type."
    by_type.md, by_type.collapsed = False, True
    return [pooled, by_type]


def native_tables(n: pd.DataFrame) -> list[Table]:
    """The table of a `specdec.report.native.native_table` frame `n`: per prompt type and pooled, the fastest
    native speculative method and the fastest of ours, each over its own target-only, and ours over native."""
    t = table_of(n, [
        ("config", lambda r: s(r["config_label"])), ("prompt type", lambda r: s(r["prompt_type"])),
        ("prompts", lambda r: i(r["n_prompts"])),
        ("target-only tok/s: ours / native", lambda r: f"{f(r['target_tok_s'], 1)} / {f(r['native_target_tok_s'], 1)}"),
        ("fastest native", lambda r: s(r["best_native"])), ("tok/s", lambda r: f(r["native_tok_s"], 1)),
        ("vs native target-only", lambda r: f"{f(r['native_ratio'])} {ci(r['native_lo'], r['native_hi'])}"),
        ("fastest ours", lambda r: s(r["best_ours"])), ("tok/s ", lambda r: f(r["ours_tok_s"], 1)),
        ("vs our target-only", lambda r: f"{f(r['ours_ratio'])} {ci(r['ours_lo'], r['ours_hi'])}"),
        ("ours / native", lambda r: f"{f(r['ours_vs_native'])} {ci(r['vs_lo'], r['vs_hi'])}"),
        ("verdict (ours)", lambda r: s(r["vs_verdict"])),
    ])  # fmt: skip
    t.caption = ("specdec beside llama.cpp's own speculative decoding (llama-server on the same GGUF files, threads "
                 "and prompts), per prompt type. 'Fastest' is chosen after the fact among the configurations "
                 "measured (highest geometric-mean tokens/s over the type's prompts); each ratio is paired per "
                 "prompt through the target-only runs around it, with its 95% interval over prompts (a verdict "
                 "needs 5).")
    return [t]


def synthetic_tables(t: pd.DataFrame) -> list[Table]:
    """The table of a `specdec.report.synthetic.synthetic_table` frame `t`: both loops at set acceptance rates,
    measured speedup over each loop's own target-only beside the analytical model's prediction."""
    out = table_of(t, [
        ("loop", lambda r: s(r["loop"])), ("alpha", lambda r: f(r["alpha"], 2) if r["k"] else "-"),
        ("K", lambda r: i(r["k"])), ("decode tok/s", lambda r: f(r["tok_s"], 2)),
        ("tokens/round (model)", lambda r: f"{f(r['tokens_per_round'], 2)} ({f(r['expected_tokens_per_round'], 2)})"),
        ("speedup", lambda r: f"{f(r['speedup'])} {ci(r['lo'], r['hi'])}" if r["k"] else "1 (own target-only)"),
        ("predicted", lambda r: f(r["predicted"])), ("measured / predicted", lambda r: f(r["measured_over_predicted"])),
        ("at drawn", lambda r: f(r["at_drawn"])), ("round ms", lambda r: f(r["round_ms"], 1)),
        ("beyond forwards ms", lambda r: f(r["beyond_ms"], 1)),
    ])  # fmt: skip
    machines = "; ".join(f"{m} (measured {w})" for m, w in dict.fromkeys(zip(t["machine"], t["measured_at"],
                                                                             strict=True)))
    out.caption = (
        "Both loops at set acceptance (draft model drafting exactly K; draft position i accepted with probability "
        "alpha given the earlier ones): decode speedup over the loop's own target-only, paired per repetition "
        "(95% interval over repetitions of one prompt, not over prompts), beside E(alpha, K) t(1) / round(K) on "
        "the cost curve measured with it; 'at drawn' prices the tokens per round the runs drew; 'beyond forwards' "
        f"is a round's wall time minus the curve's price of its forwards. {machines}.")
    return [out]


def peer_section(a: Analysis) -> Section:
    sec = Section("Our implementation against the peers", "peers")
    if len(n := a[T.NATIVE]):
        sec.blocks.extend(native_tables(n))
    if len(syn := a[T.SYNTHETIC]):
        sec.blocks.extend(synthetic_tables(syn))
    p = a[T.PEERS]
    if p.empty:
        sec.blocks.append(f"No peer measured alongside ours in this sweep ({', '.join(PEER_METHODS)}).")
    else:
        sec.blocks.extend(peer_tables(p))
    eq = a[T.EQUALITY]
    if len(eq):
        t = table_of(eq, [*key_columns("config", "method", "policy", "K"),
                       ("runs checked", lambda r: i(r["n_checked"])), ("equal", lambda r: i(r["n_equal"])),
                       ("equal rate", lambda r: pct(r["equal_rate"]))])
        t.caption = "Output equality with our baseline (matches_baseline, recorded under greedy decoding)."
        sec.blocks.append(t)
    return sec


def adaptive_section(a: Analysis) -> Section:
    sec = Section("Adaptive K policies", "adaptive")
    ad = a[T.ADAPTIVE]
    if ad.empty:
        sec.blocks.append(f"No adaptive-policy run ({', '.join(ADAPTIVE_POLICIES)}) in this sweep.")
        return sec
    t = table_of(ad, [
        *key_columns("config", "pair", "prompt type", "method", "policy"),
        ("K cap", lambda r: i(r["k_cap"])), ("mean K", lambda r: f(r["mean_k"])),
        ("speedup", lambda r: f(r["speedup"])), ("95% CI", lambda r: ci(r["speedup_lo"], r["speedup_hi"])),
        ("verdict", lambda r: s(r["verdict"])), ("best fixed K", lambda r: i(r["best_fixed_k"])),
        ("best fixed speedup", lambda r: f(r["best_fixed_speedup"])),
        ("adaptive / best fixed", lambda r: f(r["vs_best_fixed"])),
        ("95% CI ", lambda r: ci(r["vs_best_lo"], r["vs_best_hi"])),
        ("vs best fixed", lambda r: s(r["vs_best_verdict"])),
    ])
    t.caption = ("Adaptive policies vs the baseline (speedup) and vs the best fixed K chosen after the fact "
                 "(ratio of tokens/s per prompt; > 1: the policy beats the best fixed K). Pooled rows: "
                 f"'{ALL_PROMPTS}' against the one K best over all prompts; '{EACH_TYPE_BEST_K}' against each "
                 "prompt type's own best fixed K (the per-type rows' K), prompt by prompt, with those runs' pooled "
                 "speedup as the best fixed speedup.")
    sec.blocks.append(t)
    return sec


def runtime_section(a: Analysis) -> Section:
    sec = Section("Runtimes side by side", "runtimes")
    rt = a[T.RUNTIMES]
    if rt.empty:
        sec.blocks.append("No runtime configuration with data.")
        return sec
    if len(rt) == 1:
        sec.blocks.append("This sweep measured one runtime configuration.")
    _costs_note(sec, a)
    t = table_of(rt, [
        ("config", lambda r: s(r["config_label"])), ("target step ms", lambda r: f(r["target_step_ms"], 2)),
        ("draft step ms", lambda r: f(r["draft_step_ms"], 2)), ("c", lambda r: f(r["c"], 3)),
        ("v(2)", lambda r: f(r["v(2)"])), ("v(5)", lambda r: f(r["v(5)"])), ("v(9)", lambda r: f(r["v(9)"])),
        ("v(17)", lambda r: f(r["v(17)"])), ("baseline tok/s", lambda r: f(r["baseline_tok_s"], 1)),
        ("best (all prompts)", lambda r: f"{s(r['best_method'])} K={i(r['best_k'])}" if num(r["best_k"]) else "-"),
        ("speedup", lambda r: f(r["best_speedup"])), ("verdict", lambda r: s(r["best_verdict"])),
        ("median efficiency", lambda r: f(r["median_efficiency"])),
    ])
    t.caption = "Costs, baseline throughput, best pooled K and the runtime's median efficiency per config."
    sec.blocks.append(t)
    bt = a[T.RUNTIMES_BY_TYPE]
    if len(bt):
        cols = list(bt.columns)
        sec.blocks.append(Table(["prompt type", *cols[1:]], [[s(v) for v in row] for row in bt.itertuples(index=False)],
                                caption="Best K, speedup and verdict per prompt type and runtime."))
    return sec
