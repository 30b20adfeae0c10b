"""Timing what decides whether speculative decoding wins, with ONE measurement for every caller.

- **c** = draft step time / target step time (one token, warm cache).
- **verification cost curve** = target forward time for n tokens appended to a warm cache. The classic
  analysis assumes verifying K+1 tokens costs one step; on CPUs it often costs several (so the curve, not c
  alone, decides which K wins); v(n) = forward(n) / forward(1) in target steps.

`measure_forwards` is the measurement: prefill a warm context once, then for each token count n: forward n
tokens, synchronize, read the clock, `truncate` back to the context, `repeats` passes over every n
interleaved (1, 2, ..., max, 1, 2, ...), median and IQR per n; the draft's forwards score their last row
only, as drafting does, and are timed `DRAFT_REPEAT_FACTOR` times as often. Which token counts are timed is
the caller's plan: `sweep_ns` (the sweep and ``specdec costs``: the whole curve), `quick_ns` (``generate``'s
cost policy: a handful of shapes, seconds), `batch_ns` (a batch of B rows: B x (K + 1) tokens) and the
calibration block (`calibration_block`: at a prompt's own context, right after its run). The backends are
the ones that decode, so the numbers describe exactly the code that runs. Cached by
`specdec.measure.cost_cache`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specdec.core.costs import (
    DRAFT_CALIBRATION_NS,
    DRAFT_PREFILL_NS,
    DRAFT_REPEAT_FACTOR,
    CostCurve,
    measured_ns,
)
from specdec.runtimes.base import Backend
from specdec.runtimes.loading import LoadedPair

__all__ = [
    "QUICK_DRAFT_NS", "QUICK_NS", "batch_ns", "calibration_block", "context_ids", "cross_tokenizer_draft_costs",
    "forward_times", "interleaved_forward_times", "measure_costs", "measure_forwards", "quick_ns",
    "sweep_ns", "verification_steps",
]  # fmt: skip

#: ``generate``'s target forward sizes: a plain step, the verification of K = 1, 2, 4, 8, 16, 32, 48 and 64
#: drafts, and the sizes just below the steps of the kernels' staircase at 17, 33 and 49
#: (`specdec.core.costs.TILE_STEP`).
QUICK_NS = (1, 2, 3, 5, 9, 16, 17, 32, 33, 48, 49, 64, 65)
#: ``generate``'s draft forward sizes: its step, the catch-up after a round, its largest bucket on a compiled
#: backend, and the largest prefill-sized forward of `DRAFT_PREFILL_NS`, which sets the slope beyond.
QUICK_DRAFT_NS = (1, 2, 16, DRAFT_PREFILL_NS[-1])
#: The sweep's draft forwards of 1 .. this many tokens besides `DRAFT_PREFILL_NS`: the cost policy prices a
#: round's catch-up (the committed tokens the draft has not fed, 20-60 after a plain stretch) on that curve,
#: beyond it by its least-squares slope.
SWEEP_DRAFT_MAX_N = 16


def quick_ns(max_n: int) -> tuple[list[int], list[int]]:
    """``(target ns, draft ns)`` of ``generate``'s quick measurement for verifications of up to `max_n`
    tokens: the `QUICK_NS` up to `max_n` and `max_n` itself; the draft's `QUICK_DRAFT_NS`.

    Raises:
        ValueError: ``max_n < 1``.
    """
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    return sorted({n for n in QUICK_NS if n <= max_n} | {1, max_n}), list(QUICK_DRAFT_NS)


def sweep_ns(max_n: int, draft_max_n: int = SWEEP_DRAFT_MAX_N,
             draft_extra_ns: Sequence[int] = DRAFT_PREFILL_NS) -> tuple[list[int], list[int]]:
    """``(target ns, draft ns)`` of the whole curve: the target at `specdec.core.costs.measured_ns` (every n up
    to 17, both ends of each step of the kernels' staircase beyond, up to `max_n`), the draft at 1 ..
    `draft_max_n` and `draft_extra_ns` (its deferred prefill's size)."""
    return measured_ns(max_n), sorted(set(range(1, draft_max_n + 1)) | {int(n) for n in draft_extra_ns})


def batch_ns(rows: int, max_n: int) -> tuple[list[int], list[int]]:
    """``(target ns, draft ns)`` of a batch of `rows` rows: one plain step (n = 1), the batch's plain step
    (n = rows) and its verifications of K = 1, 2, 4, 8, 16 (n = rows x (K + 1)) up to `max_n`, and `max_n`;
    the draft's step of one row and of the batch (1 and `rows` tokens).

    A single sequence of n tokens stands for n rows of a batch (rows x (K + 1) tokens for a verification):
    the linear layers, which dominate on a CPU, do the same work for both; attention, which differs (one long
    sequence against each row's own cache), is the smaller part there."""
    target = sorted({1, max_n} | {rows * (k + 1) for k in (0, 1, 2, 4, 8, 16) if rows * (k + 1) <= max_n})
    return target, sorted({1, int(rows)})


# Text whose tokens fill the warm context: the content does not change the timing, only its length does.
_FILLER = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts a few tokens with a small "
    "model and verifies them with the large one in a single forward pass. "
)


def context_ids(tokenizer, vocab_size: int, n: int) -> list[int]:
    """A warm context for timing forwards: ``n + 32`` real token ids (a fixed filler text of code and
    prose, repeated), all below `vocab_size`; synthetic ids when `tokenizer` cannot encode. The content does
    not change a forward's time, only its length does (`measure_costs`, `calibration_block`)."""
    ids: list[int] = []
    if tokenizer is not None:
        try:
            ids = [int(t) for t in tokenizer.encode(_FILLER, add_special_tokens=False) if int(t) < vocab_size]
        except (AttributeError, TypeError, ValueError):  # no usable `encode`: synthetic ids
            ids = []
    if not ids:
        ids = [(7 + 31 * i) % max(vocab_size, 1) for i in range(64)]
    out = []
    while len(out) < n + 32:
        out.extend(ids)
    return out[: n + 32]


def _iqr(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


def forward_times(
    backend: Backend,
    context: list[int],
    ns: list[int],
    *,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
    warmup: bool = True,
    last: int | None = None,
) -> tuple[dict[int, float], dict[int, float]]:
    """Time ``backend.forward(n tokens)`` on a warm cache holding `context`.

    Args:
        backend: any `Backend`; its cache is reset, prefilled with `context`, and left empty afterwards.
        context: token ids for the warm cache (``len(context) + max(ns) <= backend.max_length``).
        ns: the token counts to time.
        repeats: timed forwards per n (after one untimed warm-up pass over all n when `warmup`); the
            passes interleave the n (1, 2, ..., max, 1, 2, ...), so a slow spell spreads over every n.
        clock: seconds. warmup: run the untimed pass first (off when the model has just run).
        last: score only the last `last` rows (the LM head on those alone), as the draft's catch-up does
            (`ModelDrafter.propose`: ``last=1``); None = every row, as verification does.

    Returns:
        ``(median_s, iqr_s)``: ``{n: median seconds}`` and ``{n: interquartile range, seconds}``.

    Raises:
        ValueError: ``repeats < 1`` or an n < 1. ContextOverflowError: context + max n exceeds the context.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not ns or min(ns) < 1:
        raise ValueError(f"token counts must be >= 1, got {ns}")
    base = len(context)
    extra = context[base - 1:] if base else [0]
    probe = [extra[0]] * max(ns)
    backend.reset()
    backend.forward(list(context), logits=False)
    backend.synchronize()
    samples: dict[int, list[float]] = {n: [] for n in ns}
    first = 0 if warmup else 1
    for rep in range(first, repeats + 1):  # pass 0 is the warm-up
        for n in ns:
            backend.synchronize()
            t0 = clock()
            if last is None:
                backend.forward(probe[:n])
            else:
                backend.forward(probe[:n], last=last)
            backend.synchronize()
            dt = clock() - t0
            backend.truncate(base)
            if rep > 0:
                samples[n].append(dt)
    backend.reset()
    med = {n: statistics.median(v) for n, v in samples.items()}
    iqr = {n: _iqr(v) for n, v in samples.items()}
    return med, iqr


def interleaved_forward_times(
    runs: Mapping[str, tuple[Backend, Sequence[int]]],
    ns: Sequence[int],
    *,
    repeats: int,
    warm_forwards: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, dict[int, list[float]]]:
    """Time ``forward(ids[:n])`` of several backends on warm caches, interleaved across backends, so that a
    drift of the machine's speed hits every backend alike (the candidate benchmarks compare them this way).

    Each backend is reset and prefilled with its `ids`, then runs `warm_forwards` untimed single-token
    forwards (each rolled back); then for each repetition, each n, each backend in turn: one forward of
    ``ids[:n]``, rolled back (`truncate`) to the prefilled length.

    Args:
        runs: label -> (backend, the token ids of its warm context; ``len(ids) >= max(ns)`` and
            ``len(ids) + max(ns) <= backend.max_length``).
        ns: the token counts to time (>= 1). repeats: timed forwards per n and backend (>= 1).
        warm_forwards: untimed single-token forwards after the prefill. clock: seconds.

    Returns:
        ``{label: {n: [seconds, one per repetition]}}``; each backend is left holding its prefilled context.

    Raises:
        ValueError: ``repeats < 1``, an n < 1, or an n longer than a backend's context ids.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not ns or min(ns) < 1:
        raise ValueError(f"token counts must be >= 1, got {list(ns)}")
    lengths = {}
    for label, (backend, ids) in runs.items():
        if max(ns) > len(ids):
            raise ValueError(f"{label}: a {max(ns)}-token forward needs at least {max(ns)} context ids, got {len(ids)}")
        backend.reset()
        backend.forward(list(ids), logits=False)
        lengths[label] = backend.cache_length
        for _ in range(warm_forwards):
            backend.forward(list(ids[:1]))
            backend.truncate(lengths[label])
    times: dict[str, dict[int, list[float]]] = {label: {n: [] for n in ns} for label in runs}
    for _ in range(repeats):
        for n in ns:
            for label, (backend, ids) in runs.items():
                t0 = clock()
                backend.forward(list(ids[:n]))
                times[label][n].append(clock() - t0)
                backend.truncate(lengths[label])
    return times


def verification_steps(target_forward_s: dict[int, float]) -> dict[int, float]:
    """v(n) = forward(n) / forward(1): the cost of scoring n tokens in target steps (v(1) = 1).

    Raises:
        ValueError: n = 1 missing or an invalid time (`specdec.core.costs.CostCurve`)."""
    return CostCurve(target_forward_s).relative()


def measure_forwards(
    pair: LoadedPair,
    target_ns: Sequence[int],
    draft_ns: Sequence[int] = (1,),
    *,
    repeats: int = 3,
    context_tokens: int = 64,
    context: Sequence[int] | None = None,
    warmup: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Time the target's forwards of `target_ns` tokens and the draft's of `draft_ns` on one warm context.

    Args:
        pair: the loaded models (their caches are reset afterwards); the draft is timed when it has one.
        target_ns, draft_ns: token counts (>= 1; both always include 1, a step). Draft counts that do
            not fit its context after the warm context are left out (n = 1 always stays).
        repeats: timed passes per n (>= 1); the draft gets ``DRAFT_REPEAT_FACTOR * repeats``.
        context_tokens: the warm context's length when `context` is None (filler text, `context_ids`),
            clipped so that ``context + max(target_ns)`` fits the smaller window.
        context: the warm context itself (e.g. a prompt and the first half of its output), cut from the left
            to fit.
        warmup: one untimed pass first (off when the models have just run).
        clock: seconds; injectable for tests.

    Returns:
        ``{"target_step_s", "draft_step_s" (None without a draft), "c", "target_forward_s": {n: s},
        "target_forward_spread_s": {n: IQR s}, "verify_steps": {n: v(n)}, "draft_forward_s": {n: s} | None,
        "draft_forward_spread_s", "draft_step_spread_s", "repeats", "draft_repeats", "context_tokens",
        "max_n", "ns"}`` (seconds), readable by `specdec.core.costs.CostCurve.from_costs`.

    Raises:
        ValueError: an n < 1, ``repeats`` or ``context_tokens`` < 1, an empty `context`, or a
            window too short for ``max(target_ns)`` tokens after one token of context.
    """
    ns = sorted({1} | {int(n) for n in target_ns})  # n = 1 is the plain step every price divides by
    if ns[0] < 1 or min(draft_ns, default=1) < 1:
        raise ValueError(f"token counts must be >= 1, got {list(target_ns)} / {list(draft_ns)}")
    if repeats < 1 or context_tokens < 1:
        raise ValueError("repeats and context_tokens must be >= 1")
    if context is not None and not context:
        raise ValueError("the measurement needs a non-empty context")
    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    room = min(m.backend.max_length for m in models) - ns[-1]
    if room < 1:
        raise ValueError(f"the models' context is too short to time a {ns[-1]}-token forward")
    if context is None:
        ctx = context_ids(pair.tokenizer, pair.vocab_size, min(context_tokens, room))[:min(context_tokens, room)]
    else:
        ctx = list(context)[-room:]
    fwd, iqr = forward_times(pair.target.backend, ctx, ns, repeats=repeats, clock=clock, warmup=warmup)
    out: dict[str, Any] = {
        "target_step_s": fwd[1], "draft_step_s": None, "c": None, "target_forward_s": fwd,
        "target_forward_spread_s": iqr, "verify_steps": verification_steps(fwd),
        "draft_forward_s": None, "draft_forward_spread_s": None, "draft_step_spread_s": None,
        "repeats": repeats, "draft_repeats": None, "context_tokens": len(ctx), "max_n": ns[-1], "ns": ns,
    }  # fmt: skip
    if pair.draft is not None:
        d_room = pair.draft.backend.max_length - len(ctx)
        d_ns = sorted({1} | {int(n) for n in draft_ns if int(n) <= d_room})
        reps = DRAFT_REPEAT_FACTOR * repeats
        d, d_iqr = forward_times(pair.draft.backend, ctx, d_ns, repeats=reps, clock=clock, warmup=warmup, last=1)
        t1 = out["target_step_s"]
        out.update(draft_step_s=d[1], draft_step_spread_s=d_iqr[1], draft_forward_s=d, draft_forward_spread_s=d_iqr,
                   draft_repeats=reps, c=d[1] / t1 if t1 else None)
    return out


def measure_costs(pair: LoadedPair, *, max_n: int = 17, repeats: int = 3, context_tokens: int = 64,
                  draft_max_n: int = 1, draft_extra_ns: Sequence[int] = (),
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The cost curve (`measure_forwards` on `sweep_ns`): the target at up to `max_n` tokens (17 covers
    verification at K = 16, 65 at K = 64), the draft at 1 .. `draft_max_n` and `draft_extra_ns`, at a filler
    context of `context_tokens` tokens. The sweep times its draft at 1 .. `SWEEP_DRAFT_MAX_N` and `DRAFT_PREFILL_NS`;
    ``specdec costs`` its step and `DRAFT_PREFILL_NS`.

    Raises:
        ValueError: as `measure_forwards`.
    """
    if max_n < 1 or draft_max_n < 1:
        raise ValueError("max_n and draft_max_n must be >= 1")
    t_ns, d_ns = sweep_ns(max_n, draft_max_n, draft_extra_ns)
    return measure_forwards(pair, t_ns, d_ns, repeats=repeats, context_tokens=context_tokens, clock=clock)


def calibration_block(pair: LoadedPair, context: list[int], *, max_n: int = 17, repeats: int = 2,
                      clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Time the target's forwards of `specdec.core.costs.measured_ns` (up to `max_n` tokens) and the draft's of
    `DRAFT_CALIBRATION_NS` (its step and its catch-ups) at `context`, now, without a warm-up pass (`measure_forwards`).

    The sweep runs this block right after a prompt's target-only run, at that prompt's own context (its
    tokens and the first half of its output), so the time model's costs are measured next to the runs they
    explain (a forward's cost depends on the context length and on the machine's state at the time).

    Raises:
        ValueError: an empty context, ``repeats < 1``, or a window shorter than ``max_n + 1``.
    """
    draft_ns = DRAFT_CALIBRATION_NS if pair.draft is not None else (1,)
    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    room = min(m.backend.max_length for m in models) - max(max_n, *draft_ns)
    if room < 1:
        raise ValueError(f"the models' context is too short to time a {max_n}-token forward")
    return measure_forwards(pair, measured_ns(max_n), draft_ns, repeats=repeats, context=list(context)[-room:],
                            warmup=False, clock=clock)


def cross_tokenizer_draft_costs(
    draft,
    target_step_s: float,
    *,
    repeats: int = 3,
    context_tokens: int = 64,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """The step time and cost c of a draft with another tokenizer than the target, timed on its OWN token ids.

    A cross-tokenizer draft (`specdec.drafters.xtok`) runs on its own vocabulary: its warm context is the filler
    text encoded with ITS tokenizer (`context_ids`), never target ids (which may lie outside its vocabulary
    or mean other text). Its step is one forward of 1 token scoring the last row, as `measure_costs` times a
    draft; c = that step / the target's step (the draft cost the time model and the cost policy price).
    One drafted token of it may spell more or less text than one target token: c is per draft token.

    Args:
        draft: the draft's `specdec.runtimes.loading.LoadedModel` (backend and tokenizer; its cache is reset).
        target_step_s: the target's 1-token step, seconds (`measure_costs`' ``target_step_s``), > 0.
        repeats: timed forwards, times `DRAFT_REPEAT_FACTOR` (after one untimed warm-up).
        context_tokens: tokens in the warm cache (clipped to the draft's context).
        clock: seconds; injectable for tests.

    Returns:
        ``{"draft_step_s": s, "draft_step_spread_s": IQR s, "c": draft_step_s / target_step_s,
        "context_tokens": int, "draft_repeats": int}``.

    Raises:
        ValueError: ``target_step_s <= 0``, ``repeats`` or ``context_tokens`` < 1, or a draft context under
            2 tokens.
    """
    from specdec.runtimes.compat import real_vocab_size

    if not target_step_s or target_step_s <= 0:
        raise ValueError(f"the target's step time must be > 0 s, got {target_step_s}")
    if repeats < 1 or context_tokens < 1:
        raise ValueError("repeats and context_tokens must be >= 1")
    room = draft.backend.max_length - 1
    if room < 1:
        raise ValueError("the draft's context is too short to time a step")
    n = min(context_tokens, room)
    vocab = min(real_vocab_size(draft.tokenizer), draft.backend.vocab_size)
    context = context_ids(draft.tokenizer, vocab, n)[:n]
    reps = DRAFT_REPEAT_FACTOR * repeats
    med, iqr = forward_times(draft.backend, context, [1], repeats=reps, clock=clock, last=1)
    return {"draft_step_s": med[1], "draft_step_spread_s": iqr[1], "c": med[1] / target_step_s,
            "context_tokens": n, "draft_repeats": reps}
