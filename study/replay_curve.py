"""Price a store's acceptance traces with another machine's cost curve: per prompt type, each drafter's best
fixed K and its predicted decode speedup, beside the same traces priced with the store's own curves.

What the algorithm does (the traces: which drafted tokens the target accepts, recorded once per prompt) does
not depend on the hardware; what a forward costs does. So a curve measured elsewhere - a GPU's, where no
trained weights can be copied (`benchmarks/gpu_costs.py`, random weights) - answers "would speculation pay
there, on these prompts, and at which K" without running the pair there. Predictions are decode-only and
forward-only: the engine's per-round work (o_base / o_spec in `specdec.report.predicted`) and prompt
lookup's search are priced at 0 on the other curve (on the store's own curves they are measured), and the
draft's catch-up forward at one draft step unless the curve gives the draft's forwards.

    python -m study.replay_curve --db results/bf16_128.db --costs results/gpu/gpu_costs.json --dtype bfloat16
    python -m study.replay_curve --db results/bf16_128.db --target-ms 1:16.86,2:17.70,17:20.06 --draft-ms 20.11

The best K is chosen per type after the fact (optimistic); the cost policy is replayed deciding with the
curve it is priced with.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import pandas as pd

from specdec.core.costs import CostCurve


def parse_ms(spec: str) -> dict[int, float]:
    """``"1:16.86,2:17.7"`` (n tokens : milliseconds) as ``{n: seconds}``.

    Raises:
        ValueError: a malformed entry.
    """
    out = {}
    for part in spec.split(","):
        n, _, ms = part.partition(":")
        if not ms:
            raise ValueError(f"expected n:ms, got {part!r}")
        out[int(n)] = float(ms) / 1e3
    return out


def curve_from_costs(path: Path, dtype: str, target: str, draft: str) -> CostCurve:
    """The target's forward curve and the draft's step (and forwards, as its catch-up curve) from a
    `benchmarks/gpu_costs.py` JSON (``costs[dtype]["archs"][name]``).

    Raises:
        KeyError: the dtype or an architecture is not in the file.
    """
    costs = json.loads(path.read_text()).get("costs", {})
    if dtype not in costs:
        raise KeyError(f"{path} has no {dtype} costs (it has: {', '.join(costs) or 'none'})")
    archs = costs[dtype]["archs"]
    for name in (target, draft):
        if name not in archs:
            raise KeyError(f"{path} has no {dtype} costs for {name} (it has: {', '.join(archs)})")
    t, d = archs[target], archs[draft]
    return CostCurve(t["forward_s"], d["step_s"], {n: s for n, s in d["forward_s"].items() if int(n) <= 3})


def repriced(models, curve: CostCurve) -> list:
    """Copies of the `PromptModel`s priced with `curve`, the per-round overheads and prompt lookup's search at 0."""
    out = []
    for m in models:
        mm = copy.copy(m)
        mm.curve, mm.o_base, mm.o_spec, mm.ngram_draft_s = curve, 0.0, 0.0, 0.0
        mm.padded = False
        out.append(mm)
    return out


def best_k_table(models, label: str) -> pd.DataFrame:
    """Per (prompt type, drafter): best fixed K, its predicted decode speedup and the cost policy's."""
    from specdec.report.predicted import trace_best_k, trace_grid

    best = trace_best_k(trace_grid(models))
    return best.assign(curve=label)[["curve", "prompt_type", "method", "best_k", "predicted", "policy_predicted",
                                     "n_prompts"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="a results store with acceptance traces")
    ap.add_argument("--config", default=None, help="the store's configuration whose traces to price (default: its first)")
    ap.add_argument("--costs", type=Path, default=None, help="a benchmarks/gpu_costs.py JSON")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--target-ms", default=None, help="n:ms,... target forward times (n = 1 required)")
    ap.add_argument("--draft-ms", type=float, default=None, help="draft step, ms")
    ap.add_argument("--label", default="other curve")
    args = ap.parse_args(argv)
    try:
        if args.costs is not None:
            curve = curve_from_costs(args.costs, args.dtype, args.target, args.draft)
        elif args.target_ms:
            curve = CostCurve(parse_ms(args.target_ms), args.draft_ms / 1e3 if args.draft_ms is not None else None)
        else:
            ap.error("give --costs or --target-ms")
    except (ValueError, OSError) as err:
        print(f"replay_curve: error: {err}", file=sys.stderr)
        return 2
    except KeyError as err:
        print(f"replay_curve: error: {err.args[0]}", file=sys.stderr)
        return 2
    from specdec.report import analyze, load_store

    try:
        an = analyze(load_store(args.db))
    except (FileNotFoundError, ValueError) as err:
        print(f"replay_curve: error: {err}", file=sys.stderr)
        return 2
    labels = sorted({m.key[0] for m in an.prompt_models})
    if not labels:
        print(f"replay_curve: error: {args.db} holds no acceptance traces", file=sys.stderr)
        return 2
    label = args.config or labels[0]
    models = [m for m in an.prompt_models if m.key[0] == label]
    if not models:
        print(f"replay_curve: error: no traces for configuration {label!r} (have {', '.join(labels)})",
              file=sys.stderr)
        return 2
    print(f"{args.db}: {len(models)} traced prompts of {label}")
    print(f"{args.label}: target step {curve.target_step_s * 1e3:.2f} ms, v(2) {curve.v(2):.2f}, v(5) {curve.v(5):.2f}, "
          f"v(17) {curve.v(17):.2f}, c {(curve.draft_step_s or float('nan')) / curve.target_step_s:.2f}")
    own = best_k_table(models, "own")
    other = best_k_table(repriced(models, curve), args.label)
    t = own.merge(other, on=["prompt_type", "method"], suffixes=("_own", "_other"))
    pd.set_option("display.width", 200)
    cols = {"best_k_own": "own K", "predicted_own": "own", "policy_predicted_own": "own policy",
            "best_k_other": "other K", "predicted_other": "other", "policy_predicted_other": "other policy",
            "n_prompts_own": "prompts"}
    shown = ["prompt_type", "method", "prompts", "own K", "own", "own policy", "other K", "other", "other policy"]
    print(t.rename(columns=cols)[shown].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
