"""What the acceptance traces predict (the timed runs check it: `specdec.report.answer.predicted_vs_measured`).

The algorithm is kept apart from the hardware. The **algorithm** is the acceptance trace of a prompt
(`specdec.engine.traces`): the rounds of every fixed K in 1..16 and of every policy, for every drafter of the
grid (`specdec.catalogue.drafters.grid_drafters`: the draft model, prompt lookup, the suffix and mixed drafters),
replayed exactly from one target-only run. The **hardware** is the prompt's calibration block (target forwards of
n = 1..17 tokens and the draft step, timed at the prompt's own context right after its first baseline run;
`specdec.measure.timing.calibration_block`) plus the per-round overheads measured in the prompt's own runs.

**Time model** (decode only: prefill is left out on both sides, like for like). For a replayed round that
drafted k tokens (the realized k: a prompt-lookup round may draft fewer than K, or none):

    round_s(k) = draft_s(k) + F(k + 1) + o_spec        target-only step = F(1) + o_base

with F the calibration block's median forward time (`specdec.core.costs.CostCurve`, one rule beyond the measured
range; for a configuration that pads verification, e.g. `transformers-padded`, which `padded_configs` reads
from the store, the cost of the cheapest measured shape >= k + 1: `CostCurve.padded_value`), draft_s(k) for the draft model = its catch-up forward over the round's pending tokens
(`specdec.engine.traces.draft_pending`: 1, 2 after an all-accepted round, more after plain rounds) + (k - 1) draft
steps (`CostCurve.draft_round_s`; 0 when k = 0), and for prompt lookup the median drafting time of the
prompt's prompt-lookup rounds (0 when there were none); the mixed drafter's rounds are priced by the drafter that
drafted each (`specdec.engine.traces.ReplayRound.by_model`: its suffix and plain rounds as prompt lookup's, its
draft-model rounds as the draft model's, their catch-up counting the tokens its other rounds committed), o_spec = the median over the
prompt's timed speculative rounds of verify_s - forward_s + other_s (verification, sampling, rollback) and
o_base = the median over its baseline rounds of verify_s - forward_s (a prompt without speculative rounds of
its own takes the median o_spec of those that have them). The **predicted decode speedup** is
(T x (F(1) + o_base)) / sum(round_s), T = the output's tokens.

The draft's catch-up curve d(n) comes from the calibration block's draft forwards of n tokens when it has
them (sweeps that time the draft's catch-up); an older block times the draft step alone, and then d(n) is
estimated from the timed draft-model rounds of the configuration's prompts (`catchup_from_rounds`: the
median drafting time of rounds that fed n tokens, less their K - 1 steps, in draft steps). Without
either, every catch-up is priced at one step (the model before it was measured: 3-14% optimistic at fixed
K in fp32 and on llama.cpp here, `docs/RESULTS.md`).

The **measured decode speedup** of a timed run is its decode tokens/s (new tokens / decode_s) over the
geometric mean of its adjacent baselines' (`specdec.report.speedup.paired_reference` on the decode rate).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pandas as pd

from specdec.catalogue.drafters import drafter, free_drafters, grid_drafters, model_drafters
from specdec.catalogue.policies import resolve_policy
from specdec.core import stats
from specdec.core.costs import CostCurve
from specdec.core.metrics import RATES
from specdec.measure.pricing import TraceModel
from specdec.report.load import ensure_prepared, is_missing
from specdec.report.model import CostInfo, cost_infos
from specdec.report.vocab import BASELINE, SPEC_METHODS

# The replay (specdec.engine.traces, specdec.drafters) imports torch: it is imported where a trace is replayed, so that
# importing the report does not load the engine.

__all__ = [
    "GRID",
    "PromptModel",
    "catchup_from_rounds",
    "catchup_summary",
    "machine_curves",
    "padded_configs",
    "positive_geomean",
    "prompt_models",
    "stored_curves",
    "trace_best_k",
    "trace_grid",
    "type_ks_flags",
]

#: The K grid predicted from every trace (free: no timed run needed).
GRID = tuple(range(1, 17))
_DRAFTERS = grid_drafters()  # the draft model, prompt lookup, the suffix and mixed drafters: replayed from one trace


class PromptModel(TraceModel):
    """One prompt's trace and costs (one config_label, machine): replays and their predicted times, by the
    time model of `specdec.measure.pricing.TraceModel` with the overheads measured in the store.

    Attributes:
        key: (config_label, prompt_id, machine_id). prompt_type: its type. trace: the `AcceptanceTrace` (a
            sampled sweep's: the `specdec.engine.sampled_traces.SampledTrace`, priced in expectation).
        curve: the calibration block's `CostCurve` (None without a block or stored costs).
        o_base, o_spec, ngram_draft_s: per-round overheads in seconds (see the module docstring).
        ngram: the sweep's prompt-lookup n-gram sizes. draft_context: the draft model's context length.
        padded: the configuration pads verification to the cheapest measured shape.
        catchup: where the draft's catch-up curve (`CostCurve.draft_forward_s`) came from: ``"calibration"``,
            ``"timed rounds"`` (`catchup_from_rounds`) or None (every catch-up priced at one draft step).

    The cost policy is replayed with `curve` too: it is what the prompt's runs decided with (the runner hands
    the prompt's calibration block to them once it is measured).
    """

    def __init__(self, key, prompt_type, trace, curve, o_base, o_spec, ngram_draft_s, ngram, draft_context,
                 padded=False, catchup=None):
        super().__init__(trace, curve, o_base=o_base, o_spec=o_spec, ngram_draft_s=ngram_draft_s, ngram=ngram,
                         draft_context=draft_context, padded=padded)
        self.key, self.prompt_type, self.catchup = key, prompt_type, catchup


def _median(xs) -> float:
    xs = [float(x) for x in xs if x is not None and np.isfinite(float(x))]
    return float(np.median(xs)) if xs else 0.0


def _curve(cal: pd.DataFrame, stored: CostCurve | None) -> CostCurve | None:
    """The calibration blocks' median curve (`CostCurve.from_calibration`: all blocks of one prompt, target
    forwards, the draft step and, when timed, the draft's forwards of n > 1 tokens), else the configuration's
    stored one."""
    rows = cal.to_dict("records") if len(cal) else []
    if any(r["role"] == "target" and r["n_tokens"] == 1 for r in rows):
        return CostCurve.from_calibration(rows)
    return stored


def catchup_from_rounds(rounds: pd.DataFrame, *, min_rounds: int = 1) -> dict[int, float] | None:
    """The draft's forward time for n pending tokens in draft steps, d(n) / d(1), from timed draft rounds.

    For each run (rounds in order) `specdec.engine.traces.draft_pending` gives the tokens each round's catch-up
    fed; a drafting round's catch-up took ``draft_s - (k - 1) x step_s`` (step_s: the draft step of the
    run's prompt). The ratio for n > 1 is the median of that over ``step_s`` across the rounds that fed n
    tokens. Rounds feed 2 tokens after every all-accepted round (hundreds per store), larger counts only after
    a cost policy's plain stretches (a few per prompt), so `prompt_models` pools the rounds of all prompts of
    one configuration and machine. Measured here (AMD EPYC, 2 threads): fp32 d(2) 1.75-1.8 and d(25-45)
    2.0-2.5 steps; llama.cpp 2.0 and 8-9; bf16 1.0.

    Args:
        rounds: rows of draft-model runs (``run_id``, ``round_idx``, ``k``, ``num_accepted``, ``draft_s`` in
            seconds, ``step_s``: the prompt's draft step in seconds).
        min_rounds: rounds needed to keep a count n.

    Returns:
        ``{1: 1.0, n: d(n) / d(1), ...}`` with at least one n > 1, or None when no round fed more than one
        token.
    """
    from specdec.engine.traces import draft_pending

    if rounds is None or rounds.empty:
        return None
    rows = []
    for _, g in rounds.sort_values(["run_id", "round_idx"]).groupby("run_id", sort=False):
        recs = list(g[["k", "num_accepted", "draft_s", "step_s"]].itertuples(index=False))
        for r, p in zip(recs, draft_pending(recs)):
            if p > 1 and r.k > 0 and np.isfinite(r.draft_s) and np.isfinite(r.step_s) and r.step_s > 0:
                rows.append((int(p), max(float(r.draft_s) / r.step_s - (int(r.k) - 1), 1e-6)))
    if not rows:
        return None
    med = pd.DataFrame(rows, columns=["pending", "ratio"]).groupby("pending")["ratio"].agg(["median", "size"])
    out = {1: 1.0}
    out.update({int(n): float(m) for n, m, size in med.itertuples() if size >= min_rounds})
    return out if len(out) > 1 else None


def stored_curves(infos: dict[str, CostInfo]) -> dict[str, CostCurve]:
    """``config_label -> CostCurve`` (target forwards and draft step, seconds) from `cost_infos` output; a
    configuration without a target single step has no curve."""
    return {label: CostCurve(info.target_s, info.draft_step_s) for label, info in infos.items()
            if 1 in info.target_s}


def machine_curves(machine_costs: pd.DataFrame | None) -> dict[tuple[str, str], CostCurve]:
    """Each machine's own start-up cost curve: ``(config_label, machine_id) -> CostCurve`` from the store's
    ``machine_costs`` rows (role, n_tokens, seconds in s), by `stored_curves` per machine. Empty for stores
    written before per-machine costs."""
    if machine_costs is None or machine_costs.empty:
        return {}
    return {(label, str(mid)): curve for mid, g in machine_costs.groupby("machine_id", sort=True)
            for label, curve in stored_curves(cost_infos(g)).items()}


def prompt_models(runs: pd.DataFrame, rounds: pd.DataFrame, traces: pd.DataFrame, calibration: pd.DataFrame,
                  costs: dict[str, CostCurve] | None = None, ngram: tuple[int, int] = (3, 1), *,
                  machine_costs: dict[tuple[str, str], CostCurve] | None = None) -> list[PromptModel]:
    """A `PromptModel` per stored trace.

    A prompt is priced with its own calibration blocks; without one, with the start-up curve of the machine
    that timed it (`machine_costs`), and only where that machine has none (stores from before per-machine
    curves), with the configuration's stored one (`costs`, which a resumed sweep overwrites with its newest
    machine's): a prediction never prices one machine's runs with another machine's costs when the store can
    avoid it.
    A prompt whose calibration block timed the draft step alone gets its catch-up curve from the timed
    draft-model rounds of every prompt of its configuration and machine (`catchup_from_rounds`, in draft
    steps, scaled by the prompt's own step).

    Args:
        runs, rounds: the store's (prepared or raw) runs and rounds. traces, calibration: the store's tables.
        costs: config_label -> the configuration's stored cost curve (last fallback when a prompt has no block).
        ngram: the sweep's (ngram_max, ngram_min).
        machine_costs: (config_label, machine_id) -> that machine's own curve (`machine_curves`).
    """
    from specdec.engine.sampled_traces import stored_trace

    if traces is None or traces.empty:
        return []
    df = ensure_prepared(runs)
    padded = padded_configs(runs, rounds)
    ok = df[df["ok"]]
    r = rounds.copy() if rounds is not None else pd.DataFrame()
    for c in ("verify_s", "forward_s", "other_s", "draft_s", "k", "num_accepted", "round_idx"):
        if c in r.columns:
            r[c] = pd.to_numeric(r[c], errors="coerce")
    timed_rounds = len(r) and "forward_s" in r.columns
    with_order = {"round_idx", "num_accepted"} <= set(r.columns)
    staged, pooled = [], {}
    for t in traces.itertuples(index=False):
        mid = t.machine_id or ""
        sel = ok[(ok["config_label"] == t.config_label) & (ok["prompt_id"] == t.prompt_id)]
        if "machine_id" in sel.columns and mid:
            sel = sel[sel["machine_id"].astype(object).fillna("") == mid]
        if sel.empty:
            continue
        cal = calibration[(calibration["config_label"] == t.config_label)
                          & (calibration["prompt_id"] == t.prompt_id)
                          & (calibration["machine_id"].astype(object).fillna("") == mid)] \
            if calibration is not None and len(calibration) else pd.DataFrame()
        own = (machine_costs or {}).get((t.config_label, mid))
        curve = _curve(cal, own if own is not None else (costs or {}).get(t.config_label))
        rr = r[r["run_id"].isin(sel["run_id"])] if timed_rounds else pd.DataFrame()
        if len(rr) and with_order and curve is not None and curve.draft_step_s:
            d = rr[rr["run_id"].isin(set(sel[sel["method"].isin(model_drafters())]["run_id"]))]
            pooled.setdefault((t.config_label, mid), []).append(d.assign(step_s=curve.draft_step_s))
        staged.append((t, mid, sel, curve, rr))
    ratios = {key: catchup_from_rounds(pd.concat(parts, ignore_index=True)) for key, parts in pooled.items()}
    shared = _shared_overheads(staged)
    out = []
    for t, mid, sel, curve, rr in staged:
        catchup = "calibration" if curve is not None and curve.draft_forward_s is not None else None
        ratio = ratios.get((t.config_label, mid))
        if curve is not None and catchup is None and curve.draft_step_s and ratio:
            curve = curve.with_draft_forward({n: curve.draft_step_s * x for n, x in ratio.items()})
            catchup = "timed rounds"
        o_base, o_spec, ng = _overheads(sel, rr)
        o_spec = shared[(t.config_label, mid)][0] if o_spec is None else o_spec
        ng = shared[(t.config_label, mid)][1] if ng is None else ng
        ctx = None if is_missing(t.draft_context) else int(t.draft_context)
        out.append(PromptModel((t.config_label, t.prompt_id, mid), str(sel["prompt_type"].iloc[0]),
                               stored_trace(t._asdict()), curve, o_base, o_spec, ng, ngram, ctx,
                               padded=t.config_label in padded, catchup=catchup))
    return out


def _overheads(sel: pd.DataFrame, rr: pd.DataFrame) -> tuple[float, float | None, float | None]:
    """One prompt's per-round overheads in seconds from its timed rounds `rr` (its runs `sel`): the
    target-only rounds' (o_base, 0 without rounds), the speculative rounds' (o_spec) and the free drafters'
    draft seconds (ngram_draft_s); the last two None where the prompt has no such rounds."""
    if not len(rr):
        return 0.0, None, None
    base_ids = set(sel[sel["method"] == BASELINE]["run_id"])
    b = rr[rr["run_id"].isin(base_ids)]
    s = rr[(~rr["run_id"].isin(base_ids)) & (rr["k"] > 0)]
    ng = rr[rr["run_id"].isin(set(sel[sel["method"].isin(free_drafters())]["run_id"]))]["draft_s"]
    return (_median(b["verify_s"] - b["forward_s"]),
            _median(s["verify_s"] - s["forward_s"] + s["other_s"].fillna(0.0)) if len(s) else None,
            _median(ng) if len(ng) else None)


def _shared_overheads(staged) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (config_label, machine_id): the median over its prompts of (o_spec, ngram_draft_s), for a prompt
    priced without speculative rounds of its own (a prompt the sweep priced only): 0 where no prompt has
    them."""
    acc: dict[tuple[str, str], tuple[list, list]] = {}
    for t, mid, sel, _, rr in staged:
        _, o_spec, ng = _overheads(sel, rr)
        spec, free = acc.setdefault((t.config_label, mid), ([], []))
        spec.extend([o_spec] if o_spec is not None else [])
        free.extend([ng] if ng is not None else [])
    out = {key: (_median(spec), _median(free)) for key, (spec, free) in acc.items()}
    return defaultdict(lambda: (0.0, 0.0), out)


def padded_configs(runs: pd.DataFrame, rounds: pd.DataFrame | None) -> set[str]:
    """The config_labels that pad verification (`RuntimeConfig.pad_verify`), as the store records it: a round of
    one of our speculative methods (`SPEC_METHODS`) with ``rounds.n_forward`` set (the engine records the
    forward's token count exactly when it pads, `specdec.core.metrics.RoundRecord.n_forward`). A configuration
    without such a round (no speculative run timed, or no round trace) reads as unpadded.

    Args:
        runs: the store's (prepared or raw) runs. rounds: its rounds (``run_id``, ``n_forward``); None or
            without ``n_forward``: no configuration pads.
    """
    if rounds is None or rounds.empty or "n_forward" not in rounds.columns:
        return set()
    df = ensure_prepared(runs)
    spec = df[df["method"].isin(SPEC_METHODS)]
    ids = rounds.loc[pd.to_numeric(rounds["n_forward"], errors="coerce").notna(), "run_id"]
    return set(spec.loc[spec["run_id"].isin(set(ids)), "config_label"].astype(str))


def catchup_summary(models: Sequence[PromptModel]) -> dict:
    """Where the prompts' draft catch-up curves came from and what they say: ``{"calibration": n,
    "timed rounds": n, "none": n, "d2": median d(2) / d(1) over the prompts with a curve (NaN without)}``,
    draft-model traces only."""
    out = {"calibration": 0, "timed rounds": 0, "none": 0}
    ratios = []
    for m in models:
        if getattr(m.trace, "draft_ids", None) is None or m.curve is None or not m.curve.draft_step_s:
            continue
        out[m.catchup or "none"] += 1
        if m.curve.draft_forward_s is not None:
            ratios.append(m.curve.draft_forward(2) / m.curve.draft_step_s)
    out["d2"] = float(np.median(ratios)) if ratios else np.nan
    return out


def trace_grid(models: Sequence[PromptModel], policies: Sequence[str] = ("cost",), policy_k: int | None = None
               ) -> pd.DataFrame:
    """Predicted decode speedup per prompt for K in `GRID` and the `policies`, every drafter of the grid (`specdec.catalogue.drafters.grid_drafters`),
    each policy at `policy_k` (None: its own default K, `specdec.catalogue.policies`).

    Columns: config_label, prompt_id, prompt_type, method, policy, k, predicted (decode speedup),
    block_efficiency (tokens per target forward), mean_k (drafted tokens per round with K > 0).
    """
    rows = []
    for m in models:
        if m.sampled:
            rows += _expected_rows(m, policies, policy_k)
            continue
        for method in _DRAFTERS:
            if drafter(method).needs_model and not m.trace.draft_ids:
                continue
            cases = [("fixed", k) for k in GRID] + [(p, _policy_k(p, policy_k)) for p in policies]
            for policy, k in cases:
                try:
                    rounds = m.rounds(method, k, policy)
                except ValueError:
                    continue
                counts = {"num_emitted": sum(r.num_emitted for r in rounds), "num_rounds": len(rounds),
                          "num_drafted": sum(r.k for r in rounds),
                          "num_speculative_rounds": sum(1 for r in rounds if r.k > 0)}
                rows.append({"config_label": m.key[0], "prompt_id": m.key[1], "prompt_type": m.prompt_type,
                             "method": method, "policy": policy, "k": k, "predicted": m.speedup(method, rounds),
                             # no rounds / no drafting round: 0, as a plot of the grid shows it
                             "block_efficiency": RATES["block_efficiency"].of(counts) if rounds else 0.0,
                             "mean_k": RATES["mean_k"].of(counts) if counts["num_speculative_rounds"] else 0.0})
    return pd.DataFrame(rows)


def _policy_k(policy: str, policy_k: int | None) -> int:
    """`policy_k`, or the policy's own default K when None (`specdec.catalogue.policies.resolve_policy`)."""
    return resolve_policy(policy, policy_k)[1]


def _expected_rows(m: PromptModel, policies: Sequence[str], policy_k: int | None) -> list[dict]:
    """`trace_grid`'s rows of a sampled trace: every drafter it recorded at fixed K in `GRID`, in expectation
    (`TraceModel.expected`), and under each of `policies`, averaged over simulated runs
    (`TraceModel.expected_policy`; a policy that needs costs is left out without them)."""
    rows = []
    for method in _DRAFTERS:
        if not m.records(method):
            continue
        key = {"config_label": m.key[0], "prompt_id": m.key[1], "prompt_type": m.prompt_type, "method": method}
        for k in GRID:
            run, speedup = m.expected(method, k)
            rows.append({**key, "policy": "fixed", "k": k, "predicted": speedup,
                         "block_efficiency": run.block_efficiency,
                         "mean_k": run.drafted / run.drafting_rounds if run.drafting_rounds else 0.0})
        for policy in policies:
            k = _policy_k(policy, policy_k)
            try:
                bpf, mean_k, speedup = m.expected_policy(method, policy, k)
            except ValueError:
                continue
            rows.append({**key, "policy": policy, "k": k, "predicted": speedup, "block_efficiency": bpf,
                         "mean_k": mean_k})
    return rows


def positive_geomean(x: pd.Series) -> float:
    """`specdec.core.stats.geometric_mean` of the finite, positive values of `x` (NaN when there are none)."""
    v = x.astype(float)
    return stats.geometric_mean(v[np.isfinite(v) & (v > 0)])


def trace_best_k(grid: pd.DataFrame) -> pd.DataFrame:
    """Per (config_label, prompt_type, method): the fixed K in `GRID` with the highest geometric-mean
    predicted decode speedup over the type's prompts, that speedup, and the cost policy's prediction."""
    cols = ["config_label", "prompt_type", "method", "best_k", "predicted", "predicted_k4", "policy_predicted",
            "n_prompts"]
    if grid.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (label, ptype, method), g in grid.groupby(["config_label", "prompt_type", "method"], sort=True):
        fx = g[g["policy"] == "fixed"].groupby("k")["predicted"].apply(positive_geomean)
        if fx.dropna().empty:
            continue
        best = int(fx.idxmax())
        pol = g[g["policy"] == "cost"]["predicted"]
        rows.append({"config_label": label, "prompt_type": ptype, "method": method, "best_k": best,
                     "predicted": float(fx[best]), "predicted_k4": float(fx.get(4, np.nan)),
                     "policy_predicted": positive_geomean(pol) if len(pol) else np.nan,
                     "n_prompts": int(g["prompt_id"].nunique())})
    return pd.DataFrame(rows, columns=cols)


def type_ks_flags(best: pd.DataFrame) -> dict[str, str]:
    """Per config_label, the `trace_best_k` table as a ``specdec sweep --type-ks`` value
    (``method:type=K,...``), so the traces' best K per type can be timed on every prompt of the type."""
    out: dict[str, str] = {}
    for label, g in best.groupby("config_label", sort=True):
        out[str(label)] = ",".join(f"{r.method}:{r.prompt_type}={int(r.best_k)}" for r in g.itertuples())
    return out
