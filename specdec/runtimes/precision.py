"""Reduced precision for the transformers runtime: bfloat16 where the CPU has kernels for it, int8 weights.

- **bfloat16** runs fast on a CPU only with native bf16 dot products: x86 ``avx512_bf16`` or AMX
  (``amx_bf16``), Arm's ``bf16`` (BFDOT/BFMMLA). Elsewhere PyTorch falls back to converting every operand,
  slower than float32, so asking for it there is refused with one line naming the missing instruction sets.
- **int8** is weight-only quantization (per-channel int8 weights, activations in the model's dtype) through
  torchao's ``Int8WeightOnlyConfig`` (the PyTorch team's quantization library; gpt-fast's int8 mode), applied
  to every linear layer after loading (GPT-2's ``Conv1D`` projections included). The step of a memory-bound decoder reads about a quarter of the fp32
  bytes (half of bf16), which is what makes a quantized copy of the target a cheap draft of itself.

Neither changes the algorithm: speculative output is compared with target-only decoding of the *same*
configuration, and reduced precision can flip near-ties between the kernels that score 1 and K+1 tokens,
which the run records.

**The default dtype** (`default_dtype`, what ``dtype="auto"`` means): the fastest of the exact-by-design
transformers paths the machine runs natively - bfloat16 on a CPU with native bf16 kernels (there a bf16
target step measured 0.38-0.49x of fp32's, and verifying 17 tokens costs 1.2-1.4 single steps instead of
2-3), float32 on every other CPU and on CUDA.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from pathlib import Path

import torch

__all__ = [
    "QUANTS", "apply_quant", "check_dtype_supported", "cpu_flags", "default_dtype", "draft_quant_arg",
    "missing_bf16_support", "resolve_dtype",
]

#: Weight quantizations `apply_quant` knows (None = keep the checkpoint's weights).
QUANTS = ("int8",)

_X86_BF16 = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo`` "flags" / "Features" lines; empty elsewhere)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def missing_bf16_support(flags: Iterable[str], machine: str | None = None) -> str | None:
    """None when the CPU has native bf16 kernels, else the instruction sets it lacks (for the error line).

    Args:
        flags: `cpu_flags()`. machine: ``platform.machine()`` (default: this machine's).
    """
    flags = set(flags)
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64"):
        return None if "bf16" in flags else "bf16 (Arm BFDOT/BFMMLA)"
    if machine in ("x86_64", "amd64", "i686", "x86"):
        return None if any(f in flags for f in _X86_BF16) else " and ".join(_X86_BF16)
    return None  # unknown architecture: no claim either way


def default_dtype(device: str = "cpu", *, flags: Iterable[str] | None = None, machine: str | None = None) -> str:
    """The dtype a run uses when none is asked for (``"auto"``): the one rule every command and the Python
    API follow.

    ``"bfloat16"`` on a CPU that has native bf16 kernels (x86 ``avx512_bf16``/``amx_bf16``, Arm ``bf16``:
    `missing_bf16_support` is None for a known architecture), ``"float32"`` on any other CPU, on an
    architecture `missing_bf16_support` knows nothing about, and on CUDA and other devices.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:0"``, ... flags: `cpu_flags()` (default: this machine's).
        machine: ``platform.machine()`` (default: this machine's).
    """
    if not str(device).startswith("cpu"):
        return "float32"
    machine = (machine or platform.machine()).lower()
    if machine not in ("aarch64", "arm64", "x86_64", "amd64", "i686", "x86"):
        return "float32"
    missing = missing_bf16_support(cpu_flags() if flags is None else flags, machine)
    return "bfloat16" if missing is None else "float32"


def resolve_dtype(dtype: str | None, device: str = "cpu", **kw) -> str:
    """`dtype` as a concrete name: ``"auto"`` or None -> `default_dtype(device)` (`kw`: its `flags`,
    `machine`); any other name unchanged (validated where it is used)."""
    if dtype is None or str(dtype).strip().lower() == "auto":
        return default_dtype(device, **kw)
    return dtype


def check_dtype_supported(dtype: str, device: str, *, flags: Iterable[str] | None = None,
                          machine: str | None = None) -> None:
    """Refuse bfloat16 on a CPU without native bf16 kernels.

    Raises:
        ValueError: one line naming the missing instruction sets and what to use instead.
    """
    if dtype != "bfloat16" or not device.startswith("cpu"):
        return
    missing = missing_bf16_support(cpu_flags() if flags is None else flags, machine)
    if missing:
        raise ValueError(f"--dtype bfloat16 needs native bf16 kernels, and this CPU lacks {missing}; "
                         "use --dtype float32 (or --quant int8 for smaller weights)")


def apply_quant(model: torch.nn.Module, quant: str | None) -> torch.nn.Module:
    """Quantize `model`'s linear layers in place: ``"int8"`` = int8 weight-only (torchao); None = unchanged.

    Returns:
        The same module object.

    Raises:
        ValueError: an unknown quantization, or torchao is not installed (one line with the install command).
    """
    if quant is None:
        return model
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANTS)}")
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as exc:  # pragma: no cover - torchao is part of the [all] install
        raise ValueError(f"--quant int8 needs torchao: pip install -e '.[quant]' ({exc})") from None
    _conv1d_to_linear(model)
    quantize_(model, Int8WeightOnlyConfig())
    return model


def _conv1d_to_linear(model: torch.nn.Module) -> None:
    """GPT-2's projections are transformers ``Conv1D`` modules (a linear layer with a transposed ``[in, out]``
    weight) that torchao does not see as ``nn.Linear``: swap each for the equivalent ``nn.Linear``."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                n_in, n_out = child.weight.shape
                lin = torch.nn.Linear(n_in, n_out, bias=child.bias is not None, device=child.weight.device,
                                      dtype=child.weight.dtype)
                with torch.no_grad():
                    lin.weight.copy_(child.weight.T)
                    if child.bias is not None:
                        lin.bias.copy_(child.bias)
                setattr(parent, name, lin)


def draft_quant_arg(value: str | None) -> str | None:
    """The CLI's ``--draft-quant`` as `specdec.runtimes.loading.load_pair` takes it: not given -> ``"same"`` (the
    target's quantization), ``none`` -> None (full weights), else the name."""
    if value is None:
        return "same"
    return None if value.lower() == "none" else value
