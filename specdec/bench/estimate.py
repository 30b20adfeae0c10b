"""Rough durations of a plan, from measured costs and an ASSUMED acceptance (``--dry-run`` and the line
printed before a configuration runs). Not measurements: every caller labels them as rough estimates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from specdec.bench.methods import METHODS
from specdec.bench.plan import PlannedRun
from specdec.core.costs import DRAFT_CALIBRATION_NS, DRAFT_REPEAT_FACTOR, CostCurve, measured_ns
from specdec.core.theory import expected_tokens_per_round

__all__ = [
    "CHAIN_RUN_SHARE",
    "REFERENCE_COSTS",
    "REFERENCE_COSTS_BF16",
    "REFERENCE_COSTS_LLAMACPP",
    "cost_measurement_s",
    "estimate_generation_s",
    "estimate_plan_s",
    "format_duration",
    "instrumentation_s",
    "reference_costs",
]


#: Target forward seconds for n = 1..17 tokens, measured by the default study's sweep on the development
#: machine (2-vCPU Xeon VM, 2 threads, fp32 Qwen2.5-Coder-1.5B, warm cache; results/archive/study.db, costs table).
_REFERENCE_TARGET_S = (0.2748, 0.2882, 0.2858, 0.5378, 0.5576, 0.5634, 0.7652, 0.7621, 0.7643, 0.9167, 0.9138,
                       0.9075, 1.0635, 1.0771, 1.0724, 0.7681, 0.7822)


#: The reference CPU costs used to size the defaults and for `--dry-run` when a store has none: the default
#: pair (Qwen2.5-Coder 0.5B -> 1.5B, fp32, 2 threads) as measured on the development machine: draft
#: 0.0994 s/token, target 0.2748 s/token (c = 0.36), the forward curve `_REFERENCE_TARGET_S` (v(5) = 2.03,
#: v(17) = 2.85; MKL's small-row kernels make it a staircase, not a line).
REFERENCE_COSTS = CostCurve(dict(enumerate(_REFERENCE_TARGET_S, start=1)), 0.0994)

#: bf16 transformers, the default pair, 2 threads, on the 2-vCPU AMD EPYC with avx512_bf16: the medians over
#: the 63 prompts' calibration blocks of results/bf16_all.db (target forwards of 1..17 tokens, seconds; a
#: 2-token forward is cheaper than a 1-token one there) and the draft step.
REFERENCE_COSTS_BF16 = CostCurve(dict(enumerate(
    (0.1431, 0.1214, 0.1215, 0.1255, 0.1303, 0.1344, 0.1392, 0.1415, 0.1465, 0.149, 0.1522, 0.1543, 0.1602,
     0.1633, 0.1688, 0.1705, 0.1735), start=1)), 0.0501)

#: llama.cpp (GGUF Q4_K_M), the default pair, 2 threads, on the same AMD EPYC: medians over the calibration
#: blocks of fast.db (6 prompts; in commit c3696a3).
REFERENCE_COSTS_LLAMACPP = CostCurve(dict(enumerate(
    (0.0327, 0.0719, 0.0902, 0.1041, 0.1209, 0.1355, 0.1518, 0.1359, 0.1358, 0.1372, 0.1401, 0.14, 0.1424,
     0.1424, 0.1442, 0.1443, 0.2078), start=1)), 0.0149)


def reference_costs(target_backend: str, draft_backend: str, dtype: str) -> tuple[CostCurve, str]:
    """The reference costs ``--dry-run`` prices a configuration with when its store has none, and their
    label: the target curve of the target's runtime and dtype, the draft step of the draft's.

    Args:
        target_backend, draft_backend: ``"transformers"`` or ``"llamacpp"``.
        dtype: the transformers dtype (``"float32"``, ``"bfloat16"``; ``"float16"`` is priced as bf16).

    Returns:
        ``(CostCurve, label)``; every curve was measured on the default pair (2 threads) on one of this
        project's machines, named in the label: an estimate for another model or machine is rougher still.
    """
    def pick(backend: str) -> tuple[CostCurve, str]:
        if backend == "llamacpp":
            return REFERENCE_COSTS_LLAMACPP, "llama.cpp Q4_K_M, AMD EPYC"
        if dtype in ("bfloat16", "float16"):
            return REFERENCE_COSTS_BF16, "bf16, AMD EPYC"
        return REFERENCE_COSTS, "fp32, Intel Xeon"

    target, t_label = pick(target_backend)
    draft, d_label = pick(draft_backend)
    if t_label == d_label:
        label = f"{t_label}: draft {draft.draft_step_s:.3f} / target {target.target_step_s:.3f} s per token"
    else:
        label = (f"target {t_label} {target.target_step_s:.3f} s, draft {d_label} {draft.draft_step_s:.3f} s "
                 "per token")
    return target.with_draft_step(draft.draft_step_s), label


def estimate_generation_s(
    method: str,
    k: int | None,
    policy: str | None,
    costs: CostCurve,
    new_tokens: int,
    *,
    prompt_tokens: int = 100,
    alpha: float = 0.5,
    rows: int = 1,
) -> float:
    """A rough duration (seconds) of one generation of `rows` prompts decoded together (1: one sequence),
    from the costs and a GUESSED acceptance `alpha`.

    Model (Leviathan et al. 2023 with the measured forward curve): prefill = one target forward over the
    prompts (plus c times that for a draft model); target-only = ``new_tokens`` steps of `rows` tokens; a
    fixed-K round costs ``K`` draft steps (draft cost 0 for prompt lookup; over `rows` rows, a draft forward
    of `rows` tokens) plus one target forward of ``rows (K + 1)`` tokens, and yields
    ``(1 - alpha^(K+1)) / (1 - alpha)`` tokens per row. An adaptive policy is assumed to run at the best
    fixed K <= its K. Not a measurement: the sweep prints it labelled as a rough estimate.
    """
    step = costs.forward_s(rows)
    prefill = costs.forward_s(max(1, rows * (prompt_tokens - 1)))
    m = METHODS[method]
    if not m.takes_k:
        return prefill + new_tokens * step
    uses_model = m.drafts_with_model
    if uses_model:
        prefill *= 1.0 + (costs.draft_step_s or 0.0) / costs.target_step_s

    def fixed(kk: int) -> float:
        if rows == 1:
            per_round = costs.round_s(kk, draft=uses_model)
        else:
            per_round = costs.forward_s(rows * (kk + 1)) + (kk * costs.draft_forward(rows) if uses_model else 0.0)
        return prefill + new_tokens / float(expected_tokens_per_round(alpha, kk)) * per_round

    kk = int(k or 1)
    if policy not in (None, "fixed"):
        return min(fixed(j) for j in range(1, kk + 1))
    return fixed(kk)


def estimate_plan_s(
    cells: Iterable[PlannedRun],
    costs_by_config: Mapping[str, CostCurve],
    *,
    max_new_tokens: int,
    warmup_tokens: int,
    prompt_tokens: Mapping[str, int] | None = None,
    alpha: float = 0.5,
    warmed: Iterable[tuple] = (),
) -> tuple[float, float]:
    """``(timed_s, warmup_s)``: the rough duration of `cells` and of their warm-ups (one per group not in
    `warmed`), by `estimate_generation_s` (a batched run's rows at its longest prompt). Cells whose config has
    no costs are left out.

    `prompt_tokens` maps prompt ids to their token counts (default 100 each).
    """
    timed = warm = 0.0
    seen = set(warmed)
    pt = prompt_tokens or {}
    for c in cells:
        costs = costs_by_config.get(c.config_label)
        if costs is None:
            continue
        if METHODS[c.method].skip_reason():
            continue  # recorded as skipped, costs nothing
        n_prompt = max(pt.get(p.id, 100) for p in c.rows or (c.prompt,))
        timed += estimate_generation_s(c.method, c.k, c.policy, costs, max_new_tokens,
                                       prompt_tokens=n_prompt, alpha=alpha, rows=c.batch_size)
        if c.group not in seen:
            seen.add(c.group)
            warm += estimate_generation_s(c.method, c.k, c.policy, costs, min(warmup_tokens, max_new_tokens),
                                          prompt_tokens=n_prompt, alpha=alpha, rows=c.batch_size)
    return timed, warm


def cost_measurement_s(costs: CostCurve, max_n: int, repeats: int, extra_ns: Iterable[int] = ()) -> float:
    """Rough seconds `measure_costs` takes: (repeats + 1 warm-up) passes over forwards of `measured_ns(max_n)`
    tokens and of `extra_ns` tokens (the forwards that price a batch's K, `specdec.bench.grid.batch_cost_ns`)."""
    return (repeats + 1) * (sum(costs.forward_s(n) for n in measured_ns(max_n))
                            + sum(costs.forward_s(n) for n in extra_ns))


#: A sampled trace's chain forwards per model-free drafter, as a share of a target-only run of the same
#: tokens: 0.02, 0.10 and 0.40 on three prompts of the default pair (bf16, T = 0.7, 128 tokens; docs/RESULTS.md,
#: "Known gaps"), rounded up from their mean.
CHAIN_RUN_SHARE = 0.2


def instrumentation_s(costs: CostCurve, *, max_n: int, calibration_repeats: int, traces: bool,
                      prompt_tokens: int = 100, new_tokens: int = 128, chain_drafters: int = 0) -> float:
    """Rough seconds one prompt's acceptance trace and calibration block add (`specdec.bench.runner`):
    the trace is one target and one draft forward over prompt + output (the draft at c times the target's
    cost), and under sampling `CHAIN_RUN_SHARE` of a target-only run per model-free drafter whose chains it
    records (`chain_drafters`); the block `calibration_repeats` passes over forwards of `measured_ns(max_n)`
    tokens plus 3x as many passes over the draft's forwards of `DRAFT_CALIBRATION_NS` tokens (priced as the draft step
    times the target's v(n))."""
    out = 0.0
    if traces:
        n = max(1, prompt_tokens + new_tokens - 1)
        c = (costs.draft_step_s or 0.0) / costs.target_step_s
        out += costs.forward_s(n) * (1.0 + c)
        out += chain_drafters * CHAIN_RUN_SHARE * new_tokens * costs.target_step_s
    if calibration_repeats > 0:
        draft = (costs.draft_step_s or 0.0) * sum(costs.v(n) for n in DRAFT_CALIBRATION_NS)
        out += calibration_repeats * (sum(costs.forward_s(n) for n in measured_ns(max_n))
                                      + DRAFT_REPEAT_FACTOR * draft)
    return out


def format_duration(seconds: float) -> str:
    """``"2h 05m"``, ``"14m 30s"`` or ``"42s"``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"
