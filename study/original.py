"""The original study's pairs (GPT-2 -> GPT-2-medium / GPT-2-large on an RTX 2070), re-derived from costs.

The original project reported, per prompt type, an acceptance figure and for some types a speedup and the
best K (its README). Its weights cannot be downloaded here, but what decides a speedup besides acceptance -
the draft step and the verification cost curve - depends only on the architecture and the hardware. This
module combines the two: the original's per-type acceptance with costs measured here on randomly initialized
models of the exact architectures (``specdec costs --arch gpt2,gpt2-medium,gpt2-large --out FILE``,
`specdec.measure.archs.measure_arch_costs`), through the analytical model (`specdec.core.theory.refined_speedup`), and
lays the prediction beside the original's own figures: `predict` and `comparison` compute, and
`original_pairs_section` renders them as the report section "The original pairs" (the study report's
``--arch-costs FILE``, `study.report`).

Everything here is a PREDICTION from measured costs and published acceptance figures, never a measured
speedup. The original does not say which K its acceptance figures were taken at, nor whether they are
accepted / drafted or a per-token rate; they are used as the per-token alpha of the model. If they are
acceptance rates at a K > 1, the true alpha is higher and so are the predictions. Every number the section
shows is labelled measured (costs), predicted (speedups) or published (the original's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdec.core import theory
from specdec.report.document import Bullets, Section, Table, f

__all__ = ["ORIGINAL", "comparison", "load_arch_costs", "original_pairs_section", "predict"]

#: The original study's published figures (its README): GPT-2 -> GPT-2-large unless noted.
ORIGINAL: dict[str, Any] = {
    "hardware": "NVIDIA RTX 2070 (GPU)",
    "pairs": [("gpt2", "gpt2-medium"), ("gpt2", "gpt2-large")],
    "ks": [1, 2, 4, 8, 16],
    "acceptance": {"repetitive": 1.000, "dialogue": 0.896, "wikipedia_style": 0.821, "natural": 0.714,
                   "technical": 0.671},
    "speedup": {"natural": 0.950, "technical": 0.903},
    "best_speedup": 1.846,
    "best_k": {"repetitive": 16, "dialogue": 16, "wikipedia_style": 16, "list_items": 16, "code": 8,
               "repetitive_pattern": 8, "code_python": 8, "creative_fiction": 8},
    "no_win_types": ["natural", "technical", "code_json", "technical_ml"],
}  # fmt: skip


def predict(arch_costs: dict[str, Any], original: dict[str, Any] = ORIGINAL) -> list[dict[str, Any]]:
    """Predicted speedup per (pair, prompt type, K) from measured costs and the original's acceptance.

    Args:
        arch_costs: `specdec.measure.archs.measure_arch_costs` output (its ``pairs`` give c and v(n) per pair).
        original: the published figures (default `ORIGINAL`).

    Returns:
        One dict per (pair, type, K) for each original pair that was costed and each type with a published
        acceptance: ``pair`` ("gpt2 -> gpt2-large"), ``prompt_type``, ``alpha`` (the original's
        acceptance), ``k``, ``c``, ``v`` (v(K+1) in target steps), ``predicted`` (refined speedup,
        dimensionless), ``ideal`` (the same with v = 1, Leviathan et al.'s model), ``best_k`` (the K of
        the highest prediction for that pair and type), ``original_speedup`` and ``original_best_k`` (the
        published figure or None).

    Raises:
        ValueError: a pair's v(n) does not reach K + 1 for the largest K (measure with max_n >= 17).
    """
    rows: list[dict[str, Any]] = []
    wanted = {tuple(p) for p in original["pairs"]}
    for pair in arch_costs.get("pairs", []):
        if (pair["draft"], pair["target"]) not in wanted:
            continue
        v = {int(n): float(x) for n, x in pair["verify_steps"].items()}
        if max(v) < max(original["ks"]) + 1:
            raise ValueError(f"{pair['target']}: v(n) measured up to {max(v)}, need {max(original['ks']) + 1}")
        label = f"{pair['draft']} -> {pair['target']}"
        for ptype, alpha in original["acceptance"].items():
            cells = [
                {"pair": label, "prompt_type": ptype, "alpha": alpha, "k": k, "c": pair["c"],
                 "v": theory.cost_at(v, k + 1),
                 "predicted": float(theory.refined_speedup(alpha, k, pair["c"], v)),
                 "ideal": float(theory.ideal_speedup(alpha, k, pair["c"]))}
                for k in original["ks"]
            ]  # fmt: skip
            best = max(cells, key=lambda r: r["predicted"])["k"]
            for r in cells:
                r.update(best_k=best, original_speedup=original["speedup"].get(ptype),
                         original_best_k=original["best_k"].get(ptype))
            rows.extend(cells)
    return rows


def comparison(rows: list[dict[str, Any]], original: dict[str, Any] = ORIGINAL) -> list[str]:
    """Sentences that set the prediction (`predict`'s rows) beside the original's claims."""
    out: list[str] = []
    large = [r for r in rows if r["pair"].endswith("gpt2-large")]
    if not large:
        return out + ["GPT-2-large was not costed here; no comparison."]
    best = max(large, key=lambda r: r["predicted"])
    out.append(
        f"Best case: the original reports {original['best_speedup']:.3f}x; predicted here "
        f"{best['predicted']:.2f}x ({best['prompt_type']}, K = {best['k']})."
    )
    for ptype, reported in original["speedup"].items():
        cells = [r for r in large if r["prompt_type"] == ptype]
        if cells:
            top = max(cells, key=lambda r: r["predicted"])
            out.append(
                f"{ptype}: the original measured {reported:.3f}x (no win); predicted best here "
                f"{top['predicted']:.2f}x at K = {top['k']} "
                f"({'above 1' if top['predicted'] > 1 else 'below 1 here too'})."
            )
    for ptype in original["best_k"]:
        cells = [r for r in large if r["prompt_type"] == ptype]
        if cells:
            out.append(
                f"{ptype}: best K {original['best_k'][ptype]} on the GPU, {cells[0]['best_k']} predicted here."
            )
    out.append(
        "Why they can differ: the GPU verifies 17 tokens for about the price of one step and runs the "
        "draft at a small fraction of the target's cost, while a CPU's v(n) and c are what the table above "
        "measured; the original's Python loop adds per-round overheads the model leaves out; and its "
        "acceptance figures' K and definition are not stated."
    )
    return out


#: The v(n) columns of the section's cost table.
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
        ValueError: as `predict` (a cost curve too short for K = 16).
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
