"""The report's section on measurement method: paired A/A, acceptance traces, predicted vs measured, and the
greedy runs that left the target-only output (`specdec.report.predicted`)."""

from __future__ import annotations

import numpy as np

from specdec.report import tables as T
from specdec.report.analysis import Analysis
from specdec.report.answer import summary
from specdec.report.comparisons import exactness
from specdec.report.document import Bullets, Section, ci, f, i, key_columns, pct, s, table_of, yn
from specdec.report.predicted import catchup_summary, positive_geomean, type_ks_flags
from specdec.report.vocab import ALL_PROMPTS, SPEC_METHODS

__all__ = ["aa_line", "roofline_section", "traces_section"]


def aa_line(a: Analysis) -> list[str]:
    """One line per configuration on the paired A/A runs (target-only timed as a method between two
    baselines): the interval of their ratio and the median |ratio - 1| over prompts."""
    ov = a[T.OVERALL]
    out = []
    if ov.empty or "method" not in ov.columns:
        return out
    for r in ov[ov["method"] == "aa"].itertuples():
        cells = a[T.CELLS]
        per = cells[(cells["method"] == "aa") & (cells["config_label"] == r.config_label)]
        dev = np.abs(per["speedup"].astype(float) - 1.0)
        out.append(f"Paired A/A on {r.config_label}: target-only timed as a method between two target-only runs "
                   f"at {f(r.speedup, 3)}x {ci(r.speedup_lo, r.speedup_hi, 3)} of them over "
                   f"{i(r.n_aligned)} prompts ({r.verdict}); median |ratio - 1| over prompt types "
                   f"{pct(float(np.median(dev)) if len(dev) else np.nan)}: a speedup closer to 1 than that is "
                   "noise on this machine.")
    return out


def traces_section(a: Analysis) -> Section:
    """Acceptance traces, the K grid they predict, predicted vs measured, divergences."""
    sec = Section("Acceptance traces: every K predicted, checked against the timed runs", "traces")
    grid, best, pvm, div = a[T.TRACE_GRID], a[T.TRACE_BEST_K], a[T.PREDICTED], a[T.DIVERGENCE]
    lines = aa_line(a)
    sampled = a[T.SAMPLED]
    if len(sampled):
        sec.blocks += _sampled_blocks(sampled)
    if grid.empty and pvm.empty:
        lines.append("No greedy acceptance traces in this store (sweeps recorded without traces, or sampled "
                     "sweeps): the K grid is only what was timed.")
        sec.blocks.append(Bullets(lines))
        return sec
    sec.blocks.append(
        "Under greedy decoding the target's output does not depend on K or on the drafter, so one target-only "
        "run and one teacher-forced draft forward give the rounds of every K and policy (replayed exactly; "
        "specdec/engine/traces.py). Hardware enters through each prompt's calibration block (target forwards of "
        "1..17 tokens and the draft's step and catch-up forwards at its own context, timed right after its "
        "first baseline) and the per-round overheads measured in its own runs; a draft-model round costs its "
        "catch-up forward over the tokens the draft has not cached (2 after an all-accepted round), K - 1 "
        "draft steps and one target forward of K + 1 tokens. 'predicted' and 'measured' are both decode-only speedups "
        "(prefill left out on both sides); measured = the run's decode tokens/s over its two adjacent "
        "baselines'. Prompt-lookup predictions use the drafted length each round actually had.")
    sec.blocks.append(Bullets(lines + _summary_lines(a, pvm)))
    if len(best):
        sec.blocks += _best_k_blocks(a, best)
    if len(grid):
        sec.blocks += _grid_blocks(grid)
    if len(pvm):
        t = table_of(pvm, [("run", lambda r: i(r["run_id"])), *key_columns("prompt", "method", "policy", "K"),
                           ("replay exact", lambda r: yn(r["replay_exact"])),
                           ("predicted", lambda r: f(r["predicted"])), ("measured", lambda r: f(r["measured"])),
                           ("pred / meas", lambda r: f(r["ratio"], 3)),
                           ("adjacent baselines", lambda r: i(r["n_adjacent"])),
                           ("first mismatch", lambda r: s(r["mismatch"]) if r["mismatch"] else "")])
        t.caption = "Every timed greedy draft/ngram run on a traced prompt."
        t.collapsed = True
        sec.blocks.append(t)
    sec.blocks += _divergence_blocks(a, div)
    return sec


def _sampled_blocks(check) -> list:
    """The sampled traces' check (`specdec.report.sampled`): pooled per drafter, then every run."""
    from specdec.report.sampled import sampled_summary

    lines = [f"{r.config_label}, {r.method}: predicted / measured block efficiency {f(r.ratio, 3)} "
             f"{ci(r.lo, r.hi, 3)} over {i(r.n)} prompts ({i(r.n_runs)} runs)" for r in sampled_summary(check).itertuples()]
    t = table_of(check, [("run", lambda r: i(r["run_id"])), *key_columns("prompt", "method", "K"),
                         ("temperature", lambda r: f(r["temperature"], 2)),
                         ("predicted", lambda r: f(r["predicted"], 3)), ("measured", lambda r: f(r["measured"], 3)),
                         ("pred / meas", lambda r: f(r["ratio"], 3))])
    t.caption = ("Every timed sampled run on a prompt with a sampled trace: the block efficiency (tokens per "
                 "target forward) its trace's expected run predicts (a K policy's: the mean of its simulated "
                 "runs), and the run's own (one draw).")
    t.collapsed = True
    intro = ("Sampled sweeps: each prompt's sampled trace (the draft model's overlap sum_x min(p, q) and the "
             "model-free drafters' acceptance probabilities along the seeded target-only output) gives every "
             "fixed K's expected block efficiency (specdec/engine/sampled_traces.py); checked here against the "
             "timed sampled runs.")
    return [intro, Bullets(lines), t]


def _summary_lines(a: Analysis, pvm) -> list[str]:
    """How many timed runs the replay reproduced, predicted / measured, how the draft's catch-up was priced."""
    lines = []
    sm = summary(pvm)
    if sm.get("n"):
        lines.append(f"Replay: {sm['n_exact']} of {sm['n']} timed greedy runs have exactly the replayed rounds "
                     f"({pct(sm['n_exact'] / sm['n'])})"
                     + ("." if sm["n_exact"] == sm["n"] else "; the others are listed below."))
        iv = sm["interval"]
        lines.append(f"Predicted / measured decode speedup: median {f(sm['median_ratio'], 3)} over {sm['n']} "
                     f"timed runs, {pct(sm['within_10pct'])} within 10%"
                     + (f"; geometric mean {f(iv.center, 3)} {ci(iv.lo, iv.hi, 3)}." if iv is not None else "."))
    cu = catchup_summary(a.prompt_models)
    if cu["calibration"] + cu["timed rounds"] + cu["none"]:
        lines.append(f"Draft catch-up priced from the calibration block on {cu['calibration']} prompts, from the "
                     f"configuration's timed draft rounds on {cu['timed rounds']} (blocks that timed the draft step "
                     f"alone), at one draft step on {cu['none']}; a 2-token catch-up costs "
                     f"{f(cu['d2'], 2)} draft steps (median over prompts).")
    return lines


def _best_k_blocks(a: Analysis, best) -> list:
    """The traces' best fixed K per prompt type beside the best timed K, and the --type-ks flags to time it."""
    cells = a[T.CELLS]
    timed_best = a[T.BEST_K]

    def timed(r, col):
        m = timed_best[(timed_best["config_label"] == r["config_label"])
                       & (timed_best["prompt_type"] == r["prompt_type"]) & (timed_best["method"] == r["method"])]
        return m.iloc[0][col] if len(m) else np.nan

    def measured_at(r):
        m = cells[(cells["config_label"] == r["config_label"]) & (cells["prompt_type"] == r["prompt_type"])
                  & (cells["method"] == r["method"]) & (cells["policy"] == "fixed")
                  & (cells["k"] == r["best_k"])]
        return m.iloc[0]["speedup"] if len(m) else np.nan

    t = table_of(best, [*key_columns("config", "prompt type", "method"),
                        ("best K (traces)", lambda r: i(r["best_k"])),
                        ("predicted at it", lambda r: f(r["predicted"])),
                        ("predicted K=4", lambda r: f(r["predicted_k4"])),
                        ("cost policy predicted", lambda r: f(r["policy_predicted"])),
                        ("best timed K", lambda r: i(timed(r, "best_k"))),
                        ("measured at best timed K", lambda r: f(timed(r, "speedup"))),
                        ("measured at trace's best K", lambda r: f(measured_at(r))),
                        ("prompts", lambda r: i(r["n_prompts"]))])
    t.caption = ("Best fixed K per prompt type from the traces (K = 1..16; geometric mean of the predicted "
                 "decode speedups over the type's prompts), next to the best K among the timed ones "
                 "(end-to-end, paired). '-' where that K was not timed.")
    return [t, Bullets([f"To time these K on every prompt of each type ({label}): specdec sweep ... "
                        f"--type-ks {flags}" for label, flags in type_ks_flags(best).items()])]


def _grid_blocks(grid) -> list:
    """The traces' K grid per prompt type and over all prompts."""
    fx = grid[grid["policy"] == "fixed"]
    per_type = (fx.groupby(["config_label", "prompt_type", "method", "k"])["predicted"].apply(positive_geomean)
                .unstack("k").reset_index())
    ks = [k for k in per_type.columns if isinstance(k, (int, np.integer))]
    t = table_of(per_type, [*key_columns("config", "prompt type", "method"),
                            *[(f"K={k}", lambda r, k=k: f(r[k])) for k in ks]])
    t.caption = ("The K grid per prompt type from the traces: predicted decode speedup at each fixed K "
                 "(geometric mean over the type's traced prompts); the timed confirmations are in the table "
                 "above ('measured at trace's best K') and in 'predicted vs measured' below.")
    piv = fx.groupby(["config_label", "method", "k"])["predicted"].apply(positive_geomean).reset_index()
    t2 = table_of(piv, [("config", lambda r: s(r["config_label"])), *key_columns("method", "K"),
                        ("predicted decode speedup (all prompts)", lambda r: f(r["predicted"]))])
    t2.caption = f"The whole K grid from the traces, geometric mean over {ALL_PROMPTS.strip('()')}."
    t2.collapsed = True
    return [t, t2]


def _divergence_blocks(a: Analysis, div) -> list:
    """Per configuration, the greedy speculative runs that left the target-only output, and where."""
    out = []
    ex = exactness(a[T.EQUALITY])
    if len(ex):
        div_lines = []
        for r in ex.itertuples():
            d = div[(div["config_label"] == r.config_label) & div["method"].isin(SPEC_METHODS)] if len(div) else div
            top = d["target_margin"].max() if len(d) else float("nan")
            lines_div = (f"{r.config_label}: {r.n_diverged} of {r.n_checked} greedy speculative runs left the "
                         "target-only output"
                         + (f" ({pct(r.n_diverged / r.n_checked)}); the largest target top-2 margin at a first "
                            f"difference was {f(top, 4)}" if r.n_diverged else ""))
            div_lines.append(lines_div + ".")
        out.append(Bullets(div_lines))
    if len(div):
        t = table_of(div, [("run", lambda r: i(r["run_id"])), *key_columns("config", "prompt", "method", "K"),
                           ("first differing token", lambda r: i(r["first_divergence"])),
                           ("target top-2 margin there", lambda r: f(r["target_margin"], 4))])
        t.caption = ("Greedy runs whose output left the target-only output, and the target's top-1 minus top-2 "
                     "probability at the first differing position (teacher forced): a small margin is a "
                     "near-tie flipped by batched numerics, a large one a bug.")
        out.append(t)
    return out


def roofline_section(a: Analysis) -> Section:
    """Per configuration, how close decoding runs to the machine's memory bandwidth."""
    sec = Section("Roofline: bytes read per second against the memory bandwidth", "roofline")
    rl = a[T.ROOFLINE]
    if rl.empty:
        sec.blocks.append("No roofline inputs in this store (sweeps recorded without weight bytes and bandwidth).")
        return sec
    sec.blocks.append(
        "A decoding step reads every weight once, so weight bytes / memory bandwidth bounds its time from below "
        "(specdec/measure/roofline.py; gpt-fast reports the same 'achieved bandwidth'). achieved GB/s = (target weight "
        "bytes x target forwards + draft weight bytes x draft steps) / decode seconds; the bandwidth is a "
        "streaming copy measured once per machine (read + written bytes, GB = 1e9 bytes). Speculative "
        "decoding reads the target's weights once per round instead of once per token, so its tokens/s can "
        "pass the target-only roofline while its own bytes/s stay under the bandwidth.")
    base = rl[rl["method"] == "baseline"]
    lines = [f"{r.config_label}, target-only ({r.prompt_type}): {f(r.decode_tok_s, 2)} tokens/s, "
             f"{f(r.target_gb, 2)} GB per step, {f(r.achieved_gbps, 1)} GB/s = {pct(r.share)} of "
             f"{f(r.bandwidth_gbps, 1)} GB/s" for r in base.groupby("config_label").head(1).itertuples()]
    if lines:
        sec.blocks.append(Bullets(lines))
    t = table_of(rl, [*key_columns("config", "prompt type", "method", "policy", "K"),
                      ("runs", lambda r: i(r["n_runs"])), ("decode tok/s", lambda r: f(r["decode_tok_s"])),
                      ("GB/s", lambda r: f(r["achieved_gbps"], 1)), ("share of bandwidth", lambda r: pct(r["share"]))])
    t.caption = "Per cell, medians over its runs."
    t.collapsed = True
    sec.blocks.append(t)
    return sec
