"""Side by side: every speculative cell of a llama.cpp sweep against the FASTEST target-only configuration.

The report prices each speculative run against target-only decoding of its own configuration (paired). With
requantized targets (``--configs llamacpp,llamacpp-q4_0,llamacpp-iq4_nl,llamacpp-q8_0``) the question is
also whether speculation beats simply running the fastest target: this prints, per configuration, its
target-only tokens/s and weight type as run (``runs.dtype``), picks the configuration whose target-only
decoding is fastest (geometric mean over prompts of each prompt's median), and gives every speculative cell
(configuration, method, policy, K) its speedup over its own target-only decoding and over that fastest one,
geometric means over the prompts both ran. Greedy output equality is counted against the cell's own
configuration (another configuration is another model).

Per prompt type it also prints the fastest way to generate: each configuration's target-only tokens/s over
the type's prompts, the fastest of them, and the speculative cell with the highest speedup over that fastest
target-only decoding, with a 95% t-interval over the type's prompts (`specdec.core.stats.ratio_interval`).

Caveat printed with the table: across configurations the ratio is unpaired (each configuration's runs were
timed in its own block of the sweep), so machine drift between blocks enters it; within a configuration it
is the sweep's paired comparison.

    python benchmarks/llamacpp_side_by_side.py --db results/llamacpp_quant.db [--sweep-id ID] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
from collections import defaultdict
from pathlib import Path

BASELINE = "baseline"


def _gmean(xs: list[float]) -> float:
    return math.exp(statistics.mean(math.log(x) for x in xs)) if xs else float("nan")


def side_by_side(db: Path, sweep_id: str | None = None) -> dict:
    """The comparison of one sweep of store `db` (the only sweep, or `sweep_id`).

    Returns:
        ``{"sweep_id", "configs": {label: {"dtype", "baseline_tokens_per_s", "prompts"}}, "fastest": label,
        "cells": [{"config_label", "method", "policy", "k", "prompts", "tokens_per_s", "speedup_own",
        "speedup_fastest", "identical", "checked"}], "types": {prompt_type: {"target_only": {label: tokens/s},
        "fastest": label, "best": {"config_label", "method", "policy", "k", "tokens_per_s", "speedup", "lo",
        "hi", "prompts"} or None}}}`` (tokens/s: geometric means over prompts of per-prompt medians; cells
        sorted by ``speedup_fastest``, best first; per type, "best" is the speculative cell with the highest
        geometric-mean speedup over that type's fastest target-only decoding, over every prompt of the type
        both ran, with its 95% t-interval over those prompts).

    Raises:
        ValueError: the store holds no sweep, several and no `sweep_id`, or no successful target-only run.
    """
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        sweeps = [r[0] for r in conn.execute("SELECT sweep_id FROM sweeps")]
        if sweep_id is None:
            if len(sweeps) != 1:
                raise ValueError(f"{db} holds {len(sweeps)} sweeps; pass --sweep-id (one of {', '.join(sweeps)})")
            sweep_id = sweeps[0]
        rows = conn.execute(
            "SELECT config_label, dtype, prompt_id, prompt_type, method, policy, k, tokens_per_s, matches_baseline "
            "FROM runs "
            "WHERE sweep_id = ? AND error IS NULL AND tokens_per_s > 0", (sweep_id,)).fetchall()
    finally:
        conn.close()
    samples: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    equal: dict[tuple, list[int]] = defaultdict(list)
    dtypes: dict[str, str] = {}
    ptype: dict[str, str] = {}
    for r in rows:
        ptype[r["prompt_id"]] = r["prompt_type"]
        cell = (r["config_label"], r["method"], r["policy"], r["k"])
        samples[cell][r["prompt_id"]].append(float(r["tokens_per_s"]))
        dtypes.setdefault(r["config_label"], r["dtype"])
        if r["matches_baseline"] is not None and r["method"] != BASELINE:
            equal[cell].append(int(r["matches_baseline"]))
    medians = {cell: {p: statistics.median(v) for p, v in by_prompt.items()} for cell, by_prompt in samples.items()}
    base = {cell[0]: med for cell, med in medians.items() if cell[1] == BASELINE}
    if not base:
        raise ValueError(f"sweep {sweep_id} in {db} has no successful target-only ({BASELINE}) run")
    configs = {label: {"dtype": dtypes.get(label), "baseline_tokens_per_s": _gmean(list(b.values())),
                       "prompts": len(b)} for label, b in base.items()}
    fastest = max(configs, key=lambda label: configs[label]["baseline_tokens_per_s"])
    cells = []
    for (label, method, policy, k), med in medians.items():
        if method == BASELINE or label not in base:
            continue
        own = [med[p] / base[label][p] for p in med if p in base[label]]
        fast = [med[p] / base[fastest][p] for p in med if p in base[fastest]]
        cells.append({"config_label": label, "method": method, "policy": policy, "k": k, "prompts": len(med),
                      "tokens_per_s": _gmean(list(med.values())), "speedup_own": _gmean(own),
                      "speedup_fastest": _gmean(fast), "identical": sum(equal[(label, method, policy, k)]),
                      "checked": len(equal[(label, method, policy, k)])})
    cells.sort(key=lambda c: -c["speedup_fastest"] if math.isfinite(c["speedup_fastest"]) else math.inf)
    return {"sweep_id": sweep_id, "configs": configs, "fastest": fastest, "cells": cells,
            "types": _by_type(medians, base, ptype)}


def _by_type(medians: dict, base: dict, ptype: dict[str, str]) -> dict:
    """Per prompt type: target-only tokens/s per configuration, the fastest, and the best speculative cell
    against it (see `side_by_side`). `medians`: cell -> prompt -> median tokens/s; `base`: the target-only
    cells' medians by configuration."""
    from specdec.core.stats import ratio_interval

    out = {}
    for t in sorted(set(ptype.values())):
        prompts = {p for p, pt in ptype.items() if pt == t}
        target_only = {label: _gmean([b[p] for p in prompts if p in b]) for label, b in base.items()
                       if any(p in b for p in prompts)}
        if not target_only:
            continue
        fastest = max(target_only, key=target_only.get)
        best = None
        for (label, method, policy, k), med in medians.items():
            if method == BASELINE:
                continue
            ratios = [m / base[fastest][p] for p, m in med.items() if p in prompts and p in base[fastest]]
            if not ratios:
                continue
            ci = ratio_interval(ratios)
            if best is None or ci.center > best["speedup"]:
                best = {"config_label": label, "method": method, "policy": policy, "k": k,
                        "tokens_per_s": _gmean([m for p, m in med.items() if p in prompts]),
                        "speedup": ci.center, "lo": ci.lo, "hi": ci.hi, "prompts": len(ratios)}
        out[t] = {"target_only": target_only, "fastest": fastest, "best": best}
    return out


def format_table(result: dict, top: int = 30) -> str:
    """The comparison as plain text: configurations, then the `top` cells by speedup over the fastest."""
    lines = [f"sweep {result['sweep_id']}: target-only decoding per configuration (geometric mean over prompts)"]
    for label, c in sorted(result["configs"].items(), key=lambda kv: -kv[1]["baseline_tokens_per_s"]):
        star = "  <- fastest target-only" if label == result["fastest"] else ""
        lines.append(f"  {label:<24} {c['dtype'] or '?':<12} {c['baseline_tokens_per_s']:8.2f} tok/s over "
                     f"{c['prompts']} prompts{star}")
    lines.append(f"speculative cells: speedup over their own target-only and over {result['fastest']}'s "
                 "(the latter unpaired across configurations: machine drift between blocks enters it)")
    lines.append(f"  {'configuration':<24} {'cell':<22} {'tok/s':>8} {'own':>7} {'fastest':>8}  greedy = own")
    for c in result["cells"][:top]:
        what = c["method"] + (f" K={c['k']}" if c["policy"] in (None, "fixed") and c["k"] is not None
                              else f" {c['policy']}" if c["policy"] else "")
        same = f"{c['identical']}/{c['checked']}" if c["checked"] else "-"
        lines.append(f"  {c['config_label']:<24} {what:<22} {c['tokens_per_s']:8.2f} {c['speedup_own']:6.2f}x "
                     f"{c['speedup_fastest']:7.2f}x  {same}")
    lines.append("per prompt type: the fastest target-only configuration and the speculative cell fastest against "
                 "it (interval over the type's prompts; unpaired across configurations)")
    for t, r in result.get("types", {}).items():
        b = r["best"]
        spec = "-" if b is None else (
            f"{b['config_label']} {b['method']} {b['policy'] or ''} {b['tokens_per_s']:.1f} tok/s, "
            f"{b['speedup']:.2f}x [{b['lo']:.2f}, {b['hi']:.2f}] ({b['prompts']} prompts)")
        lines.append(f"  {t:<20} {r['fastest']} {r['target_only'][r['fastest']]:.1f} tok/s | {spec}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="the sweep's SQLite store")
    ap.add_argument("--sweep-id", default=None)
    ap.add_argument("--top", type=int, default=30, help="cells printed")
    ap.add_argument("--json", type=Path, default=None, help="also write the comparison as JSON")
    args = ap.parse_args()
    result = side_by_side(args.db, args.sweep_id)
    print(format_table(result, args.top))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
