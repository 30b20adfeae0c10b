"""Small pure readers of what a results store records, shared by the bench (which writes the store) and the
report (which reads it without importing the bench's harness): shard completeness and machine labels.

Imports nothing but the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["machine_label", "missing_shards"]


def missing_shards(recorded: Sequence[str]) -> list[str]:
    """The shards (``"I/N"``) of a sweep that a store does not hold, from the ``shards`` values it records.

    Empty when the recorded shards disagree on N (or none has the form ``I/N``): nothing can be said then.
    ``["2/4", "3/4", "4/4"]`` for a store that holds ``["1/4"]``.
    """
    counts = {s.split("/")[1] for s in recorded if "/" in s}
    if len(counts) != 1:
        return []
    n = int(next(iter(counts)))
    have = {int(s.split("/")[0]) for s in recorded}
    return [f"{i}/{n}" for i in range(1, n + 1) if i not in have]


def machine_label(machine: Mapping[str, Any] | str | None) -> str:
    """A short human label: ``"<cpu model>, <n> CPUs, <mem> GiB (host <hash>)"`` (``"unknown machine"``).

    `machine` is a ``machines.machine_json`` / ``sweeps.machine_json`` value (JSON text or its dict)."""
    if isinstance(machine, str):
        try:
            machine = json.loads(machine)
        except ValueError:
            machine = None
    if not isinstance(machine, Mapping):
        return "unknown machine"
    parts = [str(machine.get("device_name") or machine.get("cpu_model") or "?")]
    if machine.get("cpus_usable") or machine.get("cpu_count"):
        parts.append(f"{machine.get('cpus_usable') or machine.get('cpu_count')} CPUs")
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']} GiB")
    host = f" (host {machine['host']})" if machine.get("host") else ""
    return ", ".join(parts) + host
