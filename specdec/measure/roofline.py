"""A roofline per run: how close a decoding step comes to the machine's memory bandwidth.

A decoding step of an LLM on a CPU reads every weight once for one token, so its time is bounded below by
``weight bytes / memory bandwidth``. gpt-fast (``generate.py``) reports the achieved bandwidth of a run as
``model size x tokens/s``; this module gives the same figure per target step and puts it next to the
machine's bandwidth, measured once with a streaming copy (STREAM's "copy" kernel, McCalpin 1995):

- `weight_bytes`: bytes of the target's weights a step reads: every parameter and buffer of a transformers
  model at its stored dtype (tied weights once; torchao int8 tensors by their int8 data, scales and zero
  points; oneDNN-prepacked linears by their packed weight), or the GGUF file's size for llama.cpp. As in
  gpt-fast, the embedding table counts whole although a step reads one row of it (the output projection,
  tied or not, is read whole).
- `measure_bandwidth`: best-of-N GB/s of ``dst.copy_(src)`` over buffers far larger than the last-level
  cache, counting the bytes read plus the bytes written.
- `achieved_gbps`, `bandwidth_share`, `roofline`: the figures a run reports.
- `shape_roofline`: the same question per verification width n (a forward of n tokens, the cost of K = n - 1):
  the compute throughput a forward of n tokens reaches (GOP/s), and the verification cost v(n) = t(n) / t(1)
  that kernels running every width at the best throughput measured would give. Where the measured v(n) sits
  above that line, the kernels for that shape waste time; where the line itself is above what a drafter
  needs, only a kernel faster than the best one measured (or more compute) can help.

Units: bytes; seconds; **GB/s = 1e9 bytes per second** (decimal, as STREAM and gpt-fast print them).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = ["achieved_gbps", "bandwidth_share", "format_roofline", "format_shape_roofline", "measure_bandwidth",
           "roofline", "shape_roofline", "weight_bytes"]


def _tensor_bytes(t: torch.Tensor, seen: set) -> int:
    """Bytes of `t`'s data, counting each distinct buffer once (`seen` holds the keys already counted).

    A tensor subclass that wraps others (torchao's ``Int8Tensor``: ``qdata`` int8, ``scale``,
    ``zero_point``) is counted by its inner tensors (``__tensor_flatten__``), not by its logical dtype."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None and type(t) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, name), seen) for name in names)
    if t.layout != torch.strided:  # opaque layouts (mkldnn): no data_ptr; count the logical size
        key = ("opaque", id(t))
    else:
        key = (t.device.type, t.data_ptr(), t.numel(), t.dtype)
    if key in seen:
        return 0
    seen.add(key)
    return t.numel() * t.element_size()


def _module_bytes(model: torch.nn.Module) -> int:
    seen: set = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        total += _tensor_bytes(t, seen)
    # oneDNN-prepacked linears (specdec.runtimes.kernels.PackedLinear) hold their weight outside the
    # parameters; with the dense copy kept ("hybrid"), a single-row step reads the dense one (counted above)
    for m in model.modules():
        packed = getattr(m, "packed_weight", None)
        if isinstance(packed, torch.Tensor) and getattr(m, "weight", None) is None:
            total += _tensor_bytes(packed, seen)
    return total


def weight_bytes(model_or_backend: Any) -> int:
    """Bytes of weights one decoding step of this model reads.

    Args:
        model_or_backend: a `specdec.runtimes.loading.LoadedModel`, a backend (`HFBackend`, `CompiledHFBackend`,
            `LlamaCppBackend`), a ``torch.nn.Module``, or the path of a ``.gguf`` file.

    Returns:
        Bytes (int): for transformers models the sum of every distinct parameter and buffer at its stored
        dtype (bf16 = 2 bytes per element; torchao int8 weights = their int8 data plus scales and zero
        points; prepacked oneDNN weights at their packed size); for llama.cpp the GGUF file's size.

    Raises:
        TypeError: an object that is none of these. FileNotFoundError: a missing GGUF path.
    """
    obj = model_or_backend
    if hasattr(obj, "runtime") and hasattr(obj, "backend"):  # a LoadedModel
        obj = obj.hf_model if getattr(obj, "hf_model", None) is not None else obj.backend
    if isinstance(obj, (str, os.PathLike)):
        path = Path(obj)
        if path.suffix.lower() != ".gguf":
            raise TypeError(f"weight_bytes takes a .gguf path, a model or a backend, got the path {path}")
        return path.stat().st_size
    if getattr(obj, "model_path", None) is not None and str(obj.model_path).lower().endswith(".gguf"):
        return Path(obj.model_path).stat().st_size  # llama.cpp maps the file's tensors and reads them all
    if isinstance(obj, torch.nn.Module):
        return _module_bytes(obj)
    if isinstance(getattr(obj, "model", None), torch.nn.Module):  # HFBackend / CompiledHFBackend
        return _module_bytes(obj.model)
    raise TypeError(f"cannot tell the weight bytes of a {type(obj).__name__}: give a model, a backend, a "
                    "LoadedModel or a .gguf path")


def measure_bandwidth(size_mib: float = 512, repeats: int = 5, threads: int | None = None) -> dict[str, Any]:
    """The machine's memory bandwidth by a streaming copy: best of `repeats` timed ``dst.copy_(src)``.

    Each copy reads ``size_mib`` MiB and writes as many (STREAM's "copy" counts both, so does this); one
    untimed copy comes first (page faults, thread start-up). The default 512 MiB per buffer is far beyond
    any CPU's last-level cache, so the figure is DRAM bandwidth; a few MiB would measure the caches instead.

    Args:
        size_mib: size of each buffer in MiB (> 0; 1 MiB = 2**20 bytes); two are allocated.
        repeats: timed copies (>= 1).
        threads: torch intra-op threads during the measurement (restored after); None = the current setting.

    Returns:
        ``{"gbps": best GB/s, "median_gbps": median GB/s, "bytes_per_copy": bytes read + written per copy,
        "best_s": seconds of the fastest copy, "size_mib", "repeats", "threads", "method"}``; GB/s = 1e9
        bytes per second.

    Raises:
        ValueError: size_mib <= 0, repeats < 1 or threads < 1.
    """
    if not (isinstance(size_mib, (int, float)) and math.isfinite(size_mib) and size_mib > 0):
        raise ValueError(f"size_mib must be a positive number of MiB, got {size_mib!r}")
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if threads is not None and int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    n = max(1, int(size_mib * 2**20) // 4)  # float32 elements per buffer
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    try:
        src = torch.ones(n, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)  # untimed: touches every page of dst
        times = []
        for _ in range(int(repeats)):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    moved = 2 * n * 4  # bytes read + bytes written
    best = max(min(times), 1e-12)  # a copy faster than the clock's resolution: no division by zero
    median = max(statistics.median(times), 1e-12)
    return {
        "gbps": moved / best / 1e9, "median_gbps": moved / median / 1e9, "bytes_per_copy": moved,
        "best_s": min(times), "size_mib": float(size_mib), "repeats": int(repeats), "threads": used,
        "method": "torch Tensor.copy_ float32, read + write bytes (STREAM copy), best of repeats",
    }  # fmt: skip


def achieved_gbps(weight_bytes: int, step_s: float) -> float:
    """The bandwidth a decoding step achieves if it reads its weights once: ``weight_bytes / step_s / 1e9``.

    Args:
        weight_bytes: bytes read per step (`weight_bytes`). step_s: seconds of one step (e.g. the cost
            curve's ``target_step_s``).

    Returns:
        GB/s (1e9 bytes per second).

    Raises:
        ValueError: weight_bytes < 0, or step_s not finite and > 0.
    """
    if weight_bytes < 0:
        raise ValueError(f"weight_bytes must be >= 0, got {weight_bytes}")
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be finite and > 0 seconds, got {step_s}")
    return weight_bytes / step_s / 1e9


def bandwidth_share(achieved: float, machine_gbps: float) -> float:
    """How much of the machine's bandwidth a step uses: ``achieved / machine_gbps`` (dimensionless).

    Compared with a copy's read + write rate; a read-only stream (a step) may run a little faster than a
    copy, so a share slightly above 1 is possible on a perfectly memory-bound step.

    Raises:
        ValueError: machine_gbps not finite and > 0, or achieved negative / not finite.
    """
    if not (math.isfinite(machine_gbps) and machine_gbps > 0):
        raise ValueError(f"machine_gbps must be finite and > 0, got {machine_gbps}")
    if not (math.isfinite(achieved) and achieved >= 0):
        raise ValueError(f"achieved GB/s must be finite and >= 0, got {achieved}")
    return achieved / machine_gbps


def roofline(weight_bytes: int, step_s: float, bandwidth: dict[str, Any] | float) -> dict[str, Any]:
    """The roofline figures of one model on one machine, as ``specdec costs --json`` reports them.

    Args:
        weight_bytes: bytes read per step. step_s: seconds of one step. bandwidth: `measure_bandwidth`'s
            dict or its ``gbps`` figure.

    Returns:
        ``{"weight_bytes", "step_s", "achieved_gbps", "bandwidth_gbps", "bandwidth_share",
        "bound_step_s"}``: bound_step_s = weight_bytes / bandwidth, the fastest step the bandwidth allows.
    """
    machine = float(bandwidth["gbps"] if isinstance(bandwidth, dict) else bandwidth)
    got = achieved_gbps(weight_bytes, step_s)
    return {
        "weight_bytes": int(weight_bytes), "step_s": float(step_s), "achieved_gbps": got,
        "bandwidth_gbps": machine, "bandwidth_share": bandwidth_share(got, machine),
        "bound_step_s": weight_bytes / (machine * 1e9),
    }  # fmt: skip


def format_roofline(rows: Iterable[dict[str, Any]]) -> str:
    """A text table of `roofline` dicts with a ``label`` each: MB/step, ms/step, GB/s, share."""
    lines = [f"{'model':<40} {'MB/step':>9} {'ms/step':>9} {'GB/s':>7} {'machine':>8} {'share':>6}"]
    for r in rows:
        lines.append(f"{str(r.get('label', ''))[:40]:<40} {r['weight_bytes'] / 1e6:9.1f} {r['step_s'] * 1e3:9.2f} "
                     f"{r['achieved_gbps']:7.2f} {r['bandwidth_gbps']:8.2f} {r['bandwidth_share']:6.2f}")
    return "\n".join(lines)


def shape_roofline(step_s: dict[int, float], flops_per_token: float, weight_bytes: int | None = None,
                   bandwidth_gbps: float | None = None) -> dict[str, Any]:
    """The roofline per verification width: achieved compute throughput and the attainable v(n).

    A forward of n tokens reads the weights once and computes ``n x flops_per_token``; on a roofline its time
    is at least ``max(t_mem, n x F / P)``. Here t_mem is the measured single step t(1) (a step reads all the
    weights; what bandwidth it reaches is the `roofline` question) and P the highest throughput any measured
    width reached (``max_n n x F / t(n)``: what these kernels demonstrably do on this machine). So the
    attainable cost is ``v_roof(n) = max(1, n x F / (P x t(1)))``, and widths up to ``n_knee = P x t(1) / F``
    verify for one step with such kernels. A measured v(n) far above v_roof(n) is a kernel that runs that
    shape badly (a per-row path below a tile size); v_roof(n) itself is the floor for kernels no faster than
    the best measured one.

    Args:
        step_s: width n (>= 1) -> seconds of one forward of n tokens on a warm cache; must include n = 1.
        flops_per_token: FLOPs of one token's forward (e.g. `specdec.runtimes.gguf.gguf_matmul_flops`).
        weight_bytes: bytes of weights a forward reads (optional: adds achieved GB/s per width).
        bandwidth_gbps: the machine's bandwidth in GB/s (optional, with weight_bytes: adds the step the
            bandwidth allows, ``bound_step_s``).

    Returns:
        ``{"flops_per_token", "peak_gops", "peak_n", "t1_s", "n_knee", "bound_step_s" (or None),
        "rows": [{"n", "t_s", "v", "gops", "gbps" (or None), "v_roof"} per width, ascending]}``;
        GOP/s = 1e9 operations per second, GB/s = 1e9 bytes per second.

    Raises:
        ValueError: no n = 1, a width < 1, a time not finite and > 0, or flops_per_token <= 0.
    """
    if not (isinstance(flops_per_token, (int, float)) and math.isfinite(flops_per_token) and flops_per_token > 0):
        raise ValueError(f"flops_per_token must be a positive number, got {flops_per_token!r}")
    if 1 not in step_s:
        raise ValueError("step_s must include the single step n = 1 (v(n) is relative to it)")
    for n, t in step_s.items():
        if int(n) != n or n < 1:
            raise ValueError(f"widths must be integers >= 1, got {n!r}")
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise ValueError(f"the forward of {n} tokens must take a finite time > 0 seconds, got {t!r}")
    t1 = float(step_s[1])
    gops = {int(n): n * flops_per_token / t / 1e9 for n, t in step_s.items()}
    peak_n = max(gops, key=lambda n: (gops[n], -n))
    peak = gops[peak_n]
    rows = []
    for n in sorted(gops):
        t = float(step_s[n])
        rows.append({
            "n": n, "t_s": t, "v": t / t1, "gops": gops[n],
            "gbps": achieved_gbps(weight_bytes, t) if weight_bytes is not None else None,
            "v_roof": max(1.0, n * flops_per_token / (peak * 1e9 * t1)),
        })  # fmt: skip
    bound = (weight_bytes / (bandwidth_gbps * 1e9) if weight_bytes is not None and bandwidth_gbps else None)
    return {"flops_per_token": float(flops_per_token), "peak_gops": peak, "peak_n": peak_n, "t1_s": t1,
            "n_knee": peak * 1e9 * t1 / flops_per_token, "bound_step_s": bound, "rows": rows}


def format_shape_roofline(label: str, r: dict[str, Any]) -> str:
    """A text table of one `shape_roofline` result: per width ms, v(n), GOP/s, GB/s and the attainable v(n)."""
    lines = [f"{label}: {r['flops_per_token'] / 1e9:.2f} GFLOP/token, peak {r['peak_gops']:.0f} GOP/s at n = "
             f"{r['peak_n']}, t(1) {r['t1_s'] * 1e3:.1f} ms, knee n = {r['n_knee']:.1f}"
             + (f", bandwidth bound {r['bound_step_s'] * 1e3:.1f} ms" if r["bound_step_s"] else ""),
             f"{'n':>3} {'ms':>8} {'v(n)':>6} {'GOP/s':>7} {'GB/s':>6} {'v_roof':>6}"]
    for row in r["rows"]:
        gbps = f"{row['gbps']:6.1f}" if row["gbps"] is not None else f"{'-':>6}"
        lines.append(f"{row['n']:3d} {row['t_s'] * 1e3:8.2f} {row['v']:6.2f} {row['gops']:7.0f} {gbps} "
                     f"{row['v_roof']:6.2f}")
    return "\n".join(lines)
