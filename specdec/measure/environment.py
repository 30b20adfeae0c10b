"""The machine a measurement ran on: CPU, cores, memory, OS, library versions, device, git commit.

Recorded with every sweep (``sweeps.machine_json``, ``sweeps.git_commit``) and folded into the key of the
cost cache (`specdec.measure.cost_cache.cached_costs`), so numbers from another machine are never mixed in
silently. This module imports nothing from the rest of specdec but one leaf (`specdec.runtimes.llamacpp_record`),
so both the sweep and the cost measurement can use it; `host_id` tells machines apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from specdec.runtimes.llamacpp_record import ggml_env

__all__ = ["MACHINE_KEYS", "git_commit", "machine_changes", "machine_info"]


BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def host_id(boot_id_path: str = BOOT_ID_PATH) -> str:
    """A 12-hex-digit hash of this host's name (`platform.node`) and this boot's id (`BOOT_ID_PATH`, where
    readable): tells nodes apart without storing names, and tells apart two VMs that share a host name (every
    VM of this project's workplace is called ``vm``; two of them timed fp32 steps 1.5x apart) or one host
    before and after a reboot. Runs of one sitting share it; a sweep resumed after a reboot is, correctly, timed
    on another machine."""
    try:
        boot = Path(boot_id_path).read_text().strip()
    except OSError:
        boot = ""
    return hashlib.sha256(f"{platform.node()}|{boot}".encode()).hexdigest()[:12]


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the specdec checkout (``+dirty`` when tracked files changed), or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return None


def _version(module: str) -> str | None:
    try:
        return md.version(module)
    except (md.PackageNotFoundError, ValueError):
        return None


def machine_info(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """The machine and libraries: CPU model, logical cores, CPUs this process may use, torch threads, memory
    (GiB), OS, Python / torch / transformers / llama-cpp-python / specdec versions, device name, and the
    ggml environment switches (`specdec.runtimes.llamacpp_record.ggml_env`)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    info: dict[str, Any] = {
        "host": host_id(),  # a hash of host name and boot id: tells nodes and VMs apart (`host_id`)
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "torch_threads": threads or torch.get_num_threads(),
        "memory_gib": _memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "llama_cpp_python": _version("llama_cpp_python") or _version("llama-cpp-python"),
        "specdec": _version("specdec"),
        "device": device,
        "device_name": _cpu_model(),
        # Load before the sweep: timings are only honest on an otherwise idle machine.
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        # ggml's CPU matmul switches (llama.cpp runs): they change which kernels a verification forward takes
        "ggml_env": ggml_env(),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        info["device_name"] = torch.cuda.get_device_name(idx)
        info["cuda"] = torch.version.cuda
    return info


#: The fingerprint keys whose change makes timings incomparable (`machine_changes`).
MACHINE_KEYS = ("cpu_model", "cpu_count", "device_name", "torch", "transformers", "llama_cpp_python")


def machine_changes(stored_json: str | None, now: Mapping[str, Any]) -> list[str]:
    """Keys of `MACHINE_KEYS` whose value differs between the sweep's recorded machine and this one."""
    try:
        stored = json.loads(stored_json) if stored_json else {}
    except ValueError:
        return []
    return [k for k in MACHINE_KEYS if k in stored and stored.get(k) != now.get(k)]
