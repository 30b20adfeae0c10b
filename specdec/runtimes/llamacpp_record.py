"""What a loaded pair ran on, as recorded beside its cost curve: per model the runtime and, on llama.cpp, the
GGUF file, its tensor weight types (bytes per ggml type), the requantization type if any, and whether weight
repacking ran; and the ggml environment switches that change which CPU matmul kernels run.

Two llama.cpp runs of "the same model" can differ in the kernels their verification forward takes (a
repacked GEMM or per-row dot products), which sets the shape of the cost curve v(n); this record makes a
stored curve say which it was. `specdec costs` prints and returns it (``--json``: ``"runtime"``) and a sweep
stores it per configuration and machine (``roofline.runtime_json``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["GGML_ENV_VARS", "amx_note", "ggml_env", "model_record", "pair_record", "record_lines"]

#: Environment variables read by ggml's CPU backend that choose the matmul kernels (the tiled-matmul path
#: and forcing it); unset ones are recorded as None.
GGML_ENV_VARS = ("GGML_CPU_TILED_MM", "GGML_CPU_TILED_MM_FORCE")


def ggml_env() -> dict[str, str | None]:
    """The value of each `GGML_ENV_VARS` variable in this process (None when unset)."""
    return {name: os.environ.get(name) for name in GGML_ENV_VARS}


def model_record(model: Any) -> dict[str, Any] | None:
    """What one `specdec.runtimes.loading.LoadedModel` runs on (None for None).

    Returns:
        ``{"runtime": "transformers", "dtype": ...}``, or on llama.cpp ``{"runtime": "llamacpp", "file":
        name, "gguf_type": requantization type or None (the file as shipped), "weight_types": {ggml type:
        bytes}, "repack": bool, "repack_note": one line}``. Weight types that cannot be read (a file gone)
        are recorded as None rather than failing the measurement.
    """
    if model is None:
        return None
    if getattr(model, "runtime", None) != "llamacpp":
        return {"runtime": getattr(model, "runtime", "transformers"), "dtype": getattr(model, "dtype", None)}
    from specdec.runtimes.gguf import gguf_weight_types

    backend = model.backend
    path = getattr(backend, "model_path", None)
    try:
        types = gguf_weight_types(path) if path else None
    except (OSError, ValueError, ImportError):  # a file gone, damaged, or no `gguf` package
        types = None
    return {
        "runtime": "llamacpp", "file": Path(path).name if path else None,
        "gguf_type": getattr(model, "gguf_type", None), "weight_types": types,
        "repack": getattr(backend, "extra_buffers", None), "repack_note": getattr(backend, "extra_buffers_note", None),
    }  # fmt: skip


def pair_record(pair: Any) -> dict[str, Any]:
    """`model_record` of a loaded pair's target and draft, with `ggml_env` when either runs on llama.cpp."""
    out: dict[str, Any] = {"target": model_record(pair.target), "draft": model_record(getattr(pair, "draft", None))}
    if any(m is not None and m["runtime"] == "llamacpp" for m in (out["target"], out["draft"])):
        out["ggml_env"] = ggml_env()
    return out


def amx_note(record: dict[str, Any], flags=None) -> str | None:
    """One line when a llama.cpp model of `record` (`pair_record`) runs without weight repacking because the
    CPU reports AMX (`specdec.runtimes.llamacpp.repack_default`), else None: its verification forward then
    takes ggml's per-row kernels, so v(n) is steeper than the same file on a CPU without AMX.

    Args:
        flags: CPU flag names (default: this machine's).
    """
    from specdec.runtimes.llamacpp import repack_default

    off = [role for role in ("target", "draft")
           if (m := record.get(role)) and m["runtime"] == "llamacpp" and m.get("repack") is False]
    on, why = repack_default(flags)
    if not off or on:
        return None
    return (f"note: {why}; the llama.cpp {' and '.join(off)} run(s) without repacked GEMM kernels, so the "
            "verification cost curve is steeper than on a CPU without AMX")


def record_lines(record: dict[str, Any], flags=None) -> list[str]:
    """Plain-text lines for `specdec costs`: per llama.cpp model its file, top weight types (MB) and repacking;
    the ggml environment; the AMX note (`amx_note`) when it applies."""
    lines = []
    for role in ("target", "draft"):
        m = record.get(role)
        if not m or m["runtime"] != "llamacpp":
            continue
        types = ", ".join(f"{t} {b / 1e6:.0f} MB" for t, b in list((m.get("weight_types") or {}).items())[:3])
        req = f" (requantized to {m['gguf_type']})" if m.get("gguf_type") else ""
        lines.append(f"{role} on llama.cpp: {m['file']}{req}; weights {types or 'unknown'}; "
                     f"repacking {'on' if m.get('repack') else 'off'}")
    if "ggml_env" in record:
        lines.append("ggml environment: " + ", ".join(f"{k}={'unset' if v is None else v}"
                                                      for k, v in record["ggml_env"].items()))
    note = amx_note(record, flags)
    if note:
        lines.append(note)
    return lines
