"""The costs `generate` and the Python API price K with: a few forward shapes, timed in seconds, cached.

The cost policy (`specdec.policies.cost.CostPolicy`) needs the draft's step time and the target's forward time
for the K + 1 tokens of a verification; between measured token counts it interpolates linearly
(`specdec.measure.costs.CostCurve`). So a handful of shapes suffices: the target at n = 1 (a plain step) and at
K + 1 for K = 1, 2, 4, 8, 16 (`QUICK_NS`, clipped to the K asked for, whose K + 1 is always timed), and the
draft's forwards of `QUICK_DRAFT_NS` tokens (its single step, a short catch-up, and the size of its deferred
prefill, which the policy pays for only when it pays back), each at a short warm context with few repeats
(`quick_measure`: one untimed pass, then two timed ones; the draft three times as often). On the 2-vCPU machine the default pair's measurement
takes seconds where the full 1..17-token curve of `specdec costs` took minutes.

`cached_quick_costs` keeps the result per machine (CPU model, core count, library versions), per model
files (`model_fingerprint`: a preset's GGUF sha256, a checkpoint's weight files by size and mtime), runtime,
dtype, quantization and threads, under ``<cache_dir>/costs/quick-<hash>.json``; ``refresh=True``
(``generate --remeasure-costs``) measures again and overwrites it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from specdec.measure.costs import DRAFT_PREFILL_NS, DRAFT_REPEAT_FACTOR

__all__ = ["QUICK_DRAFT_NS", "QUICK_NS", "cached_quick_costs", "model_fingerprint", "quick_measure", "quick_ns"]

#: Target forward sizes timed: a plain step and the verification of K = 1, 2, 4, 8, 16 drafts.
QUICK_NS = (1, 2, 3, 5, 9, 17)

#: Draft forward sizes timed: its step, the catch-up after a round, its largest bucket on a compiled
#: backend, and the largest prefill-sized forward of `specdec.measure.costs.DRAFT_PREFILL_NS`, which sets the slope
#: beyond.
QUICK_DRAFT_NS = (1, 2, 16, DRAFT_PREFILL_NS[-1])

_FORMAT = 2  # bump when what is measured changes: older cached files are then measured again


def quick_ns(max_n: int) -> list[int]:
    """The target token counts `quick_measure` times for verifications of up to ``max_n`` tokens: the
    `QUICK_NS` up to `max_n`, and `max_n` itself (sorted, from 1).

    Raises:
        ValueError: ``max_n < 1``.
    """
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n}")
    return sorted({n for n in QUICK_NS if n <= max_n} | {1, max_n})


def quick_measure(pair, *, max_n: int, repeats: int = 2, context_tokens: int = 32,
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Time the target's forwards of `quick_ns(max_n)` tokens and the draft's of `QUICK_DRAFT_NS` on a warm
    cache of `context_tokens` tokens (`specdec.bench.costs.forward_times`: one untimed pass, then `repeats` timed
    passes over the shapes interleaved; the draft gets ``DRAFT_REPEAT_FACTOR * repeats`` and scores its last
    row only, as drafting does).

    Args:
        pair: a `specdec.runtimes.loading.LoadedPair` (draft optional); its caches are reset afterwards.
        max_n: the largest verification, K + 1 tokens. repeats: timed passes (>= 1).
        context_tokens: warm-cache length (clipped to fit the smaller context window).
        clock: seconds; injectable for tests.

    Returns:
        ``{"target_step_s", "draft_step_s" (None without a draft), "c", "target_forward_s": {n: s},
        "draft_forward_s": {n: s} (None without a draft; the sizes that fit the draft's context),
        "target_forward_spread_s": {n: IQR s}, "repeats", "draft_repeats", "context_tokens", "max_n",
        "ns": [n, ...], "quick": True}`` (seconds), readable by `specdec.measure.costs.CostCurve.from_costs`.

    Raises:
        ValueError: ``max_n``, ``repeats`` or ``context_tokens`` < 1, or a context window too short for
            ``max_n`` tokens.
    """
    from specdec.bench.costs import forward_times

    if repeats < 1 or context_tokens < 1:
        raise ValueError("repeats and context_tokens must be >= 1")
    ns = quick_ns(max_n)
    ctx_len, context, t_fwd, t_iqr = time_target_forwards(pair, ns, max_n, repeats=repeats,
                                                          context_tokens=context_tokens, clock=clock)
    out: dict[str, Any] = {
        "target_step_s": t_fwd[1], "draft_step_s": None, "c": None, "target_forward_s": t_fwd,
        "target_forward_spread_s": t_iqr, "draft_forward_s": None, "repeats": repeats, "draft_repeats": None,
        "context_tokens": ctx_len, "max_n": max_n, "ns": ns, "quick": True,
    }  # fmt: skip
    if pair.draft is not None:
        reps = DRAFT_REPEAT_FACTOR * repeats
        room = pair.draft.backend.max_length - len(context)
        d_ns = [n for n in QUICK_DRAFT_NS if n == 1 or n <= room]
        d_fwd, _ = forward_times(pair.draft.backend, context, d_ns, repeats=reps, clock=clock, last=1)
        out.update(draft_step_s=d_fwd[1], draft_repeats=reps, draft_forward_s=d_fwd if len(d_fwd) > 1 else None,
                   c=d_fwd[1] / t_fwd[1] if t_fwd[1] > 0 else None)
    return out


def time_target_forwards(pair, ns, max_n: int, *, repeats: int, context_tokens: int,
                         clock: Callable[[], float] = time.perf_counter):
    """The shared start of a quick cost measurement: a context of ``min(context_tokens, room)`` tokens, where
    room is what the target's and the draft's windows leave after a `max_n`-token forward, and the target's
    forward times over it for every n in `ns` (`specdec.bench.costs.forward_times`, warm cache).

    Returns:
        ``(context length asked for, context ids, {n: median seconds}, {n: IQR seconds})``.

    Raises:
        ValueError: a context window too short for `max_n` tokens.
    """
    from specdec.bench.costs import context_ids, forward_times

    models = [pair.target] + ([pair.draft] if pair.draft is not None else [])
    room = min(m.backend.max_length for m in models) - max_n
    if room < 1:
        raise ValueError(f"the models' context is too short to time a {max_n}-token forward")
    ctx_len = min(context_tokens, room)
    context = context_ids(pair.tokenizer, pair.vocab_size, ctx_len)[:ctx_len]
    t_fwd, t_iqr = forward_times(pair.target.backend, context, ns, repeats=repeats, clock=clock)
    return ctx_len, context, t_fwd, t_iqr


def model_fingerprint(spec: str | None) -> Any:
    """What identifies a model's weights for the cost cache: a preset member's GGUF sha256; a ``.gguf``
    file's or a checkpoint directory's weight files by name, size and mtime; a hub id as given; None for
    None. Never raises (an unreadable path is keyed by its name alone)."""
    if spec is None:
        return None
    try:
        from specdec.models import resolve

        r = resolve(spec)
        if r.kind == "chunked":
            return {"sha256": r.chunks.sha256}
        if r.kind in ("gguf", "dir"):
            paths = [r.path] if r.path.is_file() else sorted(
                p for p in r.path.iterdir() if p.suffix in (".safetensors", ".gguf", ".json"))
            return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]
    except (OSError, ValueError, ImportError, AttributeError):
        pass
    return str(spec)


def cached_quick_costs(
    pair,
    key: Mapping[str, Any],
    *,
    max_n: int,
    refresh: bool = False,
    cache: str | Path | None = None,
    measure: Callable[..., dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], str]:
    """`quick_measure` for `pair`, reusing an earlier measurement of the same setup on this machine.

    Args:
        pair: the loaded models. key: JSON-serialisable description of the setup: what changes the times
            (`model_fingerprint` of each model, runtimes, device, dtype, quantization, compile, threads);
            the machine's CPU model, core count, torch threads and library versions are added here.
        max_n: the largest verification timed (K + 1). A stored measurement is reused when it timed
            `max_n` or more tokens.
        refresh: measure again even when a stored measurement fits (and overwrite it).
        cache: directory instead of `specdec.models.cache_dir`; measure: injectable `quick_measure` (tests).

    Returns:
        ``(costs, note)``: the costs (``target_forward_s`` keys may be strings after JSON) and a one-line
        note saying where they came from (``costs from <file> ...`` or ``costs measured in <s> s ...``).
    """
    import torch

    from specdec.bench.costs import cost_cache

    return cost_cache({**key, "format": _FORMAT, "torch_threads": torch.get_num_threads()}, max_n=max_n,
                      cache=cache, prefix="quick-", refresh=refresh,
                      reuse_hint="--remeasure-costs measures again",
                      note_measured=lambda costs: f" ({len(costs['target_forward_s'])} target shapes)",
                      measure=lambda: (measure or quick_measure)(pair, max_n=max_n))
