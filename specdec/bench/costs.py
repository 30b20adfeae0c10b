"""Measure the costs that decide whether speculative decoding wins: c and the verification cost curve.

- **c** = draft step time / target step time (one token, warm cache).
- **verification cost curve** = target forward time for n = 1 .. max_n tokens appended to a warm cache.
  The classic analysis assumes verifying K+1 tokens costs one step; on CPUs it often costs several
  (so the curve, not c alone, decides which K wins); v(n) = forward(n) / forward(1) in target steps.

Method: prefill a fixed `context_tokens`-token context once, then for each n: forward n tokens, synchronize,
read the clock, `truncate` back to the context, `repeats` times; report the median and the IQR. One untimed
pass over every n comes first (warm-up). The backends are the same ones the sweep times, so the numbers
describe exactly the code that runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specdec.bench.environment import machine_info
from specdec.measure.costs import DRAFT_CALIBRATION_NS, DRAFT_REPEAT_FACTOR, CostCurve
from specdec.runtimes.base import Backend
from specdec.runtimes.loading import LoadedPair

__all__ = [
    "cached_costs", "calibration_block", "context_ids", "cross_tokenizer_draft_costs", "forward_times",
    "interleaved_forward_times", "measure_costs", "verification_steps",
]

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
        ValueError: n = 1 missing or an invalid time (`specdec.measure.costs.CostCurve`)."""
    return CostCurve(target_forward_s).relative()


def measure_costs(
    pair: LoadedPair,
    *,
    max_n: int = 17,
    repeats: int = 3,
    context_tokens: int = 64,
    draft_max_n: int = 1,
    draft_extra_ns: Sequence[int] = (),
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Measure the draft and target step times and the target's forward-time curve on a warm cache.

    Args:
        pair: the loaded models (their backends are reset afterwards).
        max_n: the target is timed for n = 1 .. max_n tokens (17 covers verification at K = 16).
        repeats: timed target forwards per n; the median is reported, the IQR as the spread. The draft is
            timed ``DRAFT_REPEAT_FACTOR * repeats`` times per n.
        context_tokens: tokens in the warm cache before each timed forward (clipped so that
            ``context + max_n`` fits the smaller model's context window).
        draft_max_n: the draft is timed for n = 1 .. draft_max_n (1 = its single step; ignored without a
            draft, as `draft_extra_ns` is).
        draft_extra_ns: longer draft forwards timed too (tokens, e.g. `specdec.measure.costs.DRAFT_PREFILL_NS`: the
            size of the draft's deferred prefill), those that fit the context.
        clock: seconds; injectable for tests.

    Returns:
        ``{"target_step_s": s, "draft_step_s": s | None, "c": draft/target | None,
        "target_forward_s": {n: s}, "target_forward_spread_s": {n: s}, "verify_steps": {n: v(n)},
        "draft_forward_s": {n: s} | None, "draft_forward_spread_s": {n: s} | None,
        "repeats": int, "draft_repeats": int | None, "context_tokens": int, "max_n": int}``; all times in
        seconds.

    Raises:
        ValueError: `max_n`, `repeats` or `context_tokens` < 1, or the models' context is too short
            for ``max_n`` tokens after a 1-token context.
    """
    if max_n < 1 or repeats < 1 or context_tokens < 1 or draft_max_n < 1:
        raise ValueError("max_n, repeats, context_tokens and draft_max_n must all be >= 1")
    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    window = min(m.backend.max_length for m in models)
    room = window - max(max_n, draft_max_n if pair.draft is not None else 1)
    if room < 1:
        raise ValueError(f"the models' context is too short to time a {max_n}-token forward")
    ctx_len = min(context_tokens, room)
    draft_ns = list(range(1, draft_max_n + 1)) + sorted(
        {int(n) for n in draft_extra_ns if draft_max_n < int(n) <= window - ctx_len})
    context = context_ids(pair.tokenizer, pair.vocab_size, ctx_len)[:ctx_len]
    t_fwd, t_iqr = forward_times(pair.target.backend, context, list(range(1, max_n + 1)), repeats=repeats,
                                 clock=clock)
    out: dict[str, Any] = {
        "target_step_s": t_fwd[1],
        "draft_step_s": None,
        "c": None,
        "target_forward_s": t_fwd,
        "target_forward_spread_s": t_iqr,
        "verify_steps": verification_steps(t_fwd),
        "draft_forward_s": None,
        "draft_forward_spread_s": None,
        "repeats": repeats,
        "draft_repeats": None,
        "context_tokens": ctx_len,
        "max_n": max_n,
    }
    if pair.draft is not None:
        draft_repeats = DRAFT_REPEAT_FACTOR * repeats
        d_fwd, d_iqr = forward_times(pair.draft.backend, context, draft_ns, last=1, repeats=draft_repeats,
                                     clock=clock)
        out["draft_repeats"] = draft_repeats
        out["draft_step_s"] = d_fwd[1]
        out["c"] = d_fwd[1] / t_fwd[1] if t_fwd[1] > 0 else None
        out["draft_forward_s"] = d_fwd
        out["draft_forward_spread_s"] = d_iqr
    return out


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


def calibration_block(
    pair: LoadedPair,
    context: list[int],
    *,
    max_n: int = 17,
    repeats: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Time the target's forwards of n = 1..`max_n` tokens and the draft's forwards of
    `DRAFT_CALIBRATION_NS` tokens (its step and its catch-up) at `context`, now.

    The sweep runs this block right after a prompt's target-only run, at that prompt's own context (its
    tokens and the first half of its output), so the time model's costs are measured next to the runs they
    explain instead of once per sweep at a filler context (a forward's cost depends on the context length and
    on the machine's state at the time). The forward is timed alone (no sampling, no verification). No warm-up pass: the models have
    just run. The context is cut from the left so that ``context + max_n`` fits both models.

    Args:
        pair: the loaded models (their caches are reset afterwards). context: ``[P]`` token ids.
        max_n: largest forward (K + 1 of the largest K). repeats: interleaved passes (>= 1).
        clock: seconds; injectable for tests.

    Returns:
        ``{"context_tokens": int, "repeats": int, "target_forward_s": {n: s}, "target_forward_spread_s":
        {n: IQR s}, "draft_step_s": s | None, "draft_step_spread_s": s | None, "draft_forward_s": {n: s} |
        None, "draft_forward_spread_s": {n: IQR s} | None, "draft_repeats": int | None}`` (seconds; the
        draft's n = 1 entry is its step).

    Raises:
        ValueError: empty context, ``repeats < 1``, or a context window shorter than ``max_n + 1``.
    """
    if not context:
        raise ValueError("the calibration block needs a non-empty context")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    draft_ns = list(DRAFT_CALIBRATION_NS) if pair.draft is not None else []
    room = min(m.backend.max_length for m in models) - max([max_n, *draft_ns])
    if room < 1:
        raise ValueError(f"the models' context is too short to time a {max_n}-token forward")
    ctx = list(context)[-room:]
    fwd, iqr = forward_times(pair.target.backend, ctx, list(range(1, max_n + 1)), repeats=repeats, clock=clock,
                             warmup=False)
    out: dict[str, Any] = {"context_tokens": len(ctx), "repeats": repeats, "target_forward_s": fwd,
                           "target_forward_spread_s": iqr, "draft_step_s": None, "draft_step_spread_s": None,
                           "draft_forward_s": None, "draft_forward_spread_s": None, "draft_repeats": None}
    if pair.draft is not None:
        reps = DRAFT_REPEAT_FACTOR * repeats
        d, d_iqr = forward_times(pair.draft.backend, ctx, draft_ns, repeats=reps, clock=clock, warmup=False,
                                 last=1)  # the catch-up scores its last row only
        out.update(draft_step_s=d[1], draft_step_spread_s=d_iqr[1], draft_forward_s=d,
                   draft_forward_spread_s=d_iqr, draft_repeats=reps)
    return out


def cached_costs(
    pair: LoadedPair,
    key: dict[str, Any],
    *,
    max_n: int,
    repeats: int = 3,
    cache: str | None = None,
    measure: Callable[..., dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], str]:
    """`measure_costs` for `pair`, reusing an earlier measurement of the same setup on this machine.

    The measurement is stored as JSON under ``<cache>/costs/<hash of key + machine>.json`` (default cache:
    `specdec.models.cache_dir`); it is reused when it covers ``max_n`` target tokens. The key should name
    everything that changes the times (model specs, runtimes, dtype, device, threads, compile); the CPU
    model, core count and library versions are added here. Delete the file to measure again (a machine
    whose speed drifts keeps its first figures).

    Args:
        pair: the loaded models. key: JSON-serialisable description of the setup. max_n: target tokens
            timed (K + 1 for a maximum K). repeats: as `measure_costs` (the draft gets 3x as many).
        cache: directory instead of the default; measure: injectable `measure_costs` (tests).

    Returns:
        ``(costs, note)``: costs as `measure_costs` returns them (``target_forward_s`` keys may be strings
        after a round trip through JSON), and a one-line note saying where they came from.
    """
    return cost_cache(key, max_n=max_n, cache=cache, reuse_hint="delete it to re-measure",
                      measure=lambda: (measure or measure_costs)(pair, max_n=max_n, repeats=repeats))


def cost_cache(key: dict[str, Any], *, max_n: int, measure: Callable[[], dict[str, Any]], cache=None,
               prefix: str = "", refresh: bool = False, reuse_hint: str = "",
               note_measured: Callable[[dict[str, Any]], str] = lambda costs: "") -> tuple[dict[str, Any], str]:
    """The JSON cost cache both `cached_costs` and `specdec.measure.quick_costs.cached_quick_costs` use: the costs
    stored under ``<cache>/costs/<prefix><hash of key + machine>.json`` (default cache:
    `specdec.models.cache_dir`) when they cover ``max_n`` target tokens and `refresh` is off, else
    ``measure()``'s, written atomically (a temporary file renamed). The CPU model, core count and library
    versions are added to `key`, so another machine or library never reuses them.

    Returns:
        ``(costs, note)``: the costs (``target_forward_s`` keys may be strings after JSON) and a one-line note
        saying where they came from (``costs from <file> (measured ...; <reuse_hint>)`` or ``costs measured in
        <s> s<note_measured(costs)>, cached in <file>``).
    """
    import hashlib
    import json
    import time
    from pathlib import Path

    from specdec.models import cache_dir

    machine = machine_info(key.get("device", "cpu"), key.get("threads"))
    full_key = {**key, **{k: machine.get(k) for k in ("cpu_model", "cpu_count", "torch", "transformers",
                                                       "llama_cpp_python")}}
    digest = hashlib.sha256(json.dumps(full_key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = (Path(cache) if cache is not None else cache_dir()) / "costs" / f"{prefix}{digest}.json"
    if path.exists() and not refresh:
        try:
            stored = json.loads(path.read_text())
            costs = stored["costs"]
            if max(int(n) for n in costs["target_forward_s"]) >= max_n:
                return costs, f"costs from {path} (measured {stored.get('measured_at', '?')}; {reuse_hint})"
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or partial: measure again and overwrite
    t0 = time.perf_counter()
    costs = measure()
    note = f"costs measured in {time.perf_counter() - t0:.1f} s{note_measured(costs)}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": full_key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                   "costs": costs}, default=str))
        tmp.replace(path)
        note += f", cached in {path}"
    except OSError as exc:
        note += f" (not cached: {exc})"
    return costs, note
