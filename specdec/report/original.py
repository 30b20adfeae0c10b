"""The report section "The original pairs": GPT-2 -> GPT-2-medium / -large predicted on this machine.

Built from a ``specdec costs --arch ... --out FILE`` measurement (random weights: timing only) and the
original study's published acceptance (`specdec.original_study`); ``specdec report --arch-costs FILE`` adds
it. Every number is labelled measured (costs) or predicted (speedups) or published (the original's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdec.original_study import ORIGINAL, comparison, predict
from specdec.report.document import Bullets, Section, Table, f

__all__ = ["load_arch_costs", "original_pairs_section"]

_NS = (2, 3, 5, 9, 17)


def load_arch_costs(path: str | Path) -> dict[str, Any]:
    """Read a ``specdec costs --arch --out`` JSON file (n keys back to int).

    Raises:
        FileNotFoundError: no such file. ValueError: not such a measurement.
    """
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "archs" not in data or "pairs" not in data:
        raise ValueError(f"{path}: not a 'specdec costs --arch' measurement (no 'archs'/'pairs')")
    for a in data["archs"].values():
        a["verify_steps"] = {int(n): v for n, v in a["verify_steps"].items()}
    for p in data["pairs"]:
        p["verify_steps"] = {int(n): v for n, v in p["verify_steps"].items()}
    return data


def original_pairs_section(arch_costs: dict[str, Any], original: dict[str, Any] = ORIGINAL) -> Section:
    """The section, as the report's document model (rendered to HTML and Markdown like every other).

    Raises:
        ValueError: as `specdec.original_study.predict` (a cost curve too short for K = 16).
    """
    rows = predict(arch_costs, original)
    sec = Section("The original pairs (predicted from measured costs)", "original")
    machine = arch_costs.get("machine") or {}
    sec.blocks.append(
        f"The original study ran GPT-2 -> GPT-2-medium and GPT-2 -> GPT-2-large on an {original['hardware']}. "
        "Their weights cannot be downloaded here, so this section PREDICTS their speedups on this machine: "
        f"costs MEASURED here on models of the exact architectures with {arch_costs.get('weights')} "
        f"({arch_costs.get('dtype')}, {arch_costs.get('device')}, {arch_costs.get('threads')} threads, "
        f"{machine.get('cpu_model', 'machine not recorded')}), acceptance TAKEN FROM the original's README "
        "(used as the per-token alpha; it does not say at which K it was measured), combined by the refined "
        "model E[tokens] / (K c + v(K+1)).")
    sec.blocks.append(Table(
        ["model (random weights)", "params", "step ms", *[f"v({n})" for n in _NS]],
        [[name, f"{a['params'] / 1e6:.0f}M", f(a["step_s"] * 1e3, 1), *[f(a["verify_steps"].get(n)) for n in _NS]]
         for name, a in arch_costs["archs"].items()],
        caption="Measured: single-step time and v(n) = forward(n) / forward(1), warm cache. v(n) need not rise "
                "with n on a CPU: its kernels for 2-3 rows can be slower than for 5 or more (the default pair's "
                "real weights show the same staircase); the predictions use the curve as measured."))
    sec.blocks.append(Table(["draft -> target", "c (measured)"],
                            [[f"{p['draft']} -> {p['target']}", f(p["c"], 3)] for p in arch_costs["pairs"]]))
    by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault((r["pair"], r["prompt_type"]), []).append(r)
    sec.blocks.append(Table(
        ["pair", "prompt type", "alpha (original)", *[f"K={k}" for k in original["ks"]], "best K predicted",
         "best K original", "speedup original"],
        [[pair, ptype, f(cells[0]["alpha"], 3), *[f"{f(r['predicted'])}x" for r in cells], str(cells[0]["best_k"]),
          "-" if cells[0]["original_best_k"] is None else str(cells[0]["original_best_k"]),
          "-" if cells[0]["original_speedup"] is None else f"{f(cells[0]['original_speedup'], 3)}x"]
         for (pair, ptype), cells in by_cell.items()],
        caption="Predicted speedup per prompt type and K (this machine's measured costs, the original's "
                "published acceptance); the last two columns and the alpha column are the original's published "
                "figures."))
    sec.blocks.append(Bullets(comparison(rows, original)))
    return sec
