"""The one cost cache: a `specdec.measure.timing.measure_forwards` measurement of a setup, kept per machine.

``generate`` (one prompt or a batch) prices K with measured costs; measuring takes seconds to minutes, so a
measurement is stored as JSON under ``<cache>/costs/<plan>-<hash>.json`` (default cache: `specdec.models.cache_dir`),
keyed by what changes the times: the models' files (`model_fingerprint`: a preset's GGUF sha256, a
checkpoint's weight files by size and mtime), runtimes, dtype, quantization, device and threads (the
caller's key), the plan of token counts (quick, whole curve or a batch of B rows), and the machine (CPU
model, core count, torch threads, library versions). A stored measurement is reused when it timed at least
the largest forward asked for; ``refresh=True`` (``generate --remeasure-costs``) measures again.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["PLANS", "cached_costs", "model_fingerprint"]

_FORMAT = 3  # bump when what is measured changes: older cached files are then measured again


def _plans() -> dict[str, Callable[..., tuple[list[int], list[int]]]]:
    from specdec.measure import timing

    return {"quick": lambda max_n, rows: timing.quick_ns(max_n), "curve": lambda max_n, rows: timing.sweep_ns(max_n),
            "batch": lambda max_n, rows: timing.batch_ns(rows, max_n)}


#: The measurement plans: ``quick`` (a handful of target shapes up to K + 1 and the draft's step, catch-up and
#: prefill sizes; ``generate``'s cost policy), ``curve`` (every target size 1 .. max_n and the draft's 1 .. 16
#: and prefill sizes; ``generate --pad-verify``, which pads to any measured shape), ``batch`` (a batch of B
#: rows: B x (K + 1) target tokens, the draft's step over 1 and B rows).
PLANS = ("quick", "curve", "batch")


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


def _seconds(value: Any, *, positive: bool) -> bool:
    """Whether a stored figure is a finite number (> 0 where `positive`, else >= 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


def _sound(costs: Any) -> bool:
    """Whether a stored measurement's figures are usable: every time, step and ratio a finite number (times and
    steps > 0, spreads >= 0; the draft's may be None). A damaged cache file fails this and is measured again."""
    if not isinstance(costs, dict) or not isinstance(costs.get("target_forward_s"), dict) \
            or not costs["target_forward_s"]:
        return False
    for name in ("target_forward_s", "verify_steps", "draft_forward_s",
                 "target_forward_spread_s", "draft_forward_spread_s"):
        curve = costs.get(name)
        if curve is None and name != "target_forward_s":
            continue
        if not isinstance(curve, dict) or not all(
                _seconds(v, positive=not name.endswith("spread_s")) for v in curve.values()):
            return False
    for name in ("target_step_s", "draft_step_s", "c", "draft_step_spread_s"):
        if costs.get(name) is not None and not _seconds(costs[name], positive=name != "draft_step_spread_s"):
            return False
    return True


#: A measurement is too noisy to keep when a forward of at least `NOISY_MIN_S` (shorter ones are a few
#: scheduler ticks, whose jitter says nothing about the machine) spreads (IQR over the repeats) by more than
#: this share of its time.
NOISY_SPREAD = 0.5
NOISY_MIN_S = 0.01


def _noisy(costs: Mapping[str, Any]) -> str | None:
    """Why a fresh measurement is too noisy to cache (None when it is not): a target forward of at least
    `NOISY_MIN_S` whose spread over the repeats exceeds `NOISY_SPREAD` of its time, as when other work shares
    the cores."""
    times, spreads = costs.get("target_forward_s") or {}, costs.get("target_forward_spread_s") or {}
    for n, t in times.items():
        spread = spreads.get(n)
        if spread is not None and t >= NOISY_MIN_S and spread > NOISY_SPREAD * t:
            return (f"the target's {n}-token forward varied by {spread * 1e3:.0f} ms around {t * 1e3:.0f} ms: "
                    "the machine is busy")
    return None


def cached_costs(
    pair: Any,
    key: Mapping[str, Any],
    *,
    plan: str = "quick",
    max_n: int,
    rows: int = 1,
    repeats: int = 2,
    context_tokens: int = 32,
    refresh: bool = False,
    cache: str | Path | None = None,
    measure: Callable[..., dict[str, Any]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], str]:
    """The costs of `pair` by `plan` up to `max_n` target tokens, from the cache or measured now.

    Args:
        pair: the loaded models (`specdec.runtimes.loading.LoadedPair`; its draft is timed when it has one).
        key: JSON-serialisable description of the setup (`model_fingerprint` of each model, runtimes, device,
            dtype, quantization, compile, threads); the plan, `rows`, the machine and the library versions are
            added here.
        plan: one of `PLANS`. max_n: the largest target forward (K + 1, or B x (K + 1) for a batch).
        rows: the batch's rows (plan ``batch``). repeats, context_tokens: as `measure_forwards`.
        refresh: measure again even when a stored measurement fits (and overwrite it).
        cache: directory instead of `specdec.models.cache_dir`. measure: injectable
            ``measure(pair, target_ns, draft_ns)`` (tests). progress: gets a line before a measurement.

    Returns:
        ``(costs, note)``: the costs (``target_forward_s`` keys may be strings after JSON) and a one-line note
        saying where they came from (``costs from <file> ...`` or ``costs measured in <s> s ...``).

    Raises:
        ValueError: an unknown plan, or models that cannot be timed at `max_n` tokens.
    """
    import torch

    from specdec.measure.environment import machine_info
    from specdec.measure.timing import measure_forwards
    from specdec.models import cache_dir

    if plan not in PLANS:
        raise ValueError(f"unknown cost plan {plan!r}; choose one of {', '.join(PLANS)}")
    target_ns, draft_ns = _plans()[plan](int(max_n), int(rows))
    machine = machine_info(key.get("device", "cpu"), key.get("threads"))
    full_key = {**key, "plan": plan, "rows": int(rows), "format": _FORMAT, "torch_threads": torch.get_num_threads(),
                **{k: machine.get(k) for k in ("cpu_model", "cpu_count", "torch", "transformers", "llama_cpp_python")}}
    digest = hashlib.sha256(json.dumps(full_key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = (Path(cache) if cache is not None else cache_dir()) / "costs" / f"{plan}-{digest}.json"
    if path.exists() and not refresh:
        try:
            stored = json.loads(path.read_text())
            costs = stored["costs"]
            if _sound(costs) and max(int(n) for n in costs["target_forward_s"]) >= max_n:
                return costs, (f"costs from {path} (measured {stored.get('measured_at', '?')}; "
                               "--remeasure-costs measures again)")
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or partial: measure again and overwrite
    if progress is not None:
        progress(f"measuring forward costs ({plan}: target up to {max_n} tokens{f', {rows} rows' if rows > 1 else ''}"
                 "; once per machine, models, dtype and threads) ...")
    t0 = time.perf_counter()
    if measure is not None:
        costs = measure(pair, target_ns, draft_ns)
    else:
        costs = measure_forwards(pair, target_ns, draft_ns, repeats=repeats, context_tokens=context_tokens)
    costs = {**costs, "plan": plan, "rows": int(rows)}
    note = f"costs measured in {time.perf_counter() - t0:.1f} s ({len(costs['target_forward_s'])} target shapes)"
    noisy = _noisy(costs)
    if noisy is not None:  # a busy machine's figures are used for this run only, never reused by later ones
        return costs, note + f" (not cached: {noisy}; the next run measures again)"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")  # written whole, then renamed: a reader never sees half a file
        tmp.write_text(json.dumps({"key": full_key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                   "costs": costs}, default=str))
        tmp.replace(path)
        note += f", cached in {path}"
    except OSError as exc:
        note += f" (not cached: {exc})"
    return costs, note
