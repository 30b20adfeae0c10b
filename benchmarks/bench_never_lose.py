"""Benchmark: the default (cost) policy against target-only decoding on one runtime, per prompt type.

For each built-in prompt (``--per-type`` of each of the twelve types) and each repetition it times, greedy and
interleaved: target-only, then every method under the cost policy (the draft model, prompt lookup; their
order rotated by repetition), then target-only again. Each method's run is paired with the mean of the two
target-only runs around it (a drift of the machine's speed hits both sides alike), and its ratio is
target-only seconds / the method's seconds, end to end (prefill included: the draft's prefill is deferred
to its first drafting round). Every run's tokens must equal target-only's (greedy is exact); a mismatch is
printed. Prints, per method and prompt type, the geometric mean ratio, its lowest prompt and the runs
that drafted, and flags every type below 0.97; asserts nothing about time.

The costs the policy prices K with are measured once at the start (the target curve to n = 17, the draft
step and its catch-up forward to n = 16), as ``specdec costs`` does. Run it on a quiet machine:

    python benchmarks/bench_never_lose.py                        # default pair on llama.cpp, 2 threads
    python benchmarks/bench_never_lose.py --per-type 5 --repeats 1 --tokens 128 --json never_lose.json
    python benchmarks/bench_never_lose.py --backend transformers  # the same check on fp32 transformers

About 12 types x per-type x repeats x (2 target-only + 2 methods) generations: with the defaults (2 per
type, 1 repeat, 128 tokens, llama.cpp at ~18 tokens/s on 2 cores) about 96 generations of ~7 s, 12 min.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

METHODS = ("draft", "ngram")
FLOOR = 0.97


def _generate(loaded, method: str, prompt_ids: list[int], n: int, curve, clock):
    """One greedy generation: ``baseline`` (target-only) or `method` under the cost policy (K <= 16)."""
    from specdec.catalogue.policies import make_policy
    from specdec.drafters.model import ModelDrafter
    from specdec.drafters.ngram import PromptLookupDrafter
    from specdec.engine.decoding import autoregressive_generate, speculative_generate

    target = loaded.target.backend
    common = {"vocab_size": loaded.vocab_size, "clock": clock}
    if method == "baseline":
        return autoregressive_generate(target, prompt_ids, n, **common)
    if method == "draft":
        drafter, costs = ModelDrafter(loaded.draft.backend, loaded.vocab_size), curve
    elif method == "ngram":
        drafter, costs = PromptLookupDrafter(), curve.with_draft_step(0.0)
    else:
        raise ValueError(f"unknown method {method!r} (known: baseline, {', '.join(METHODS)})")
    policy = make_policy("cost", 16, costs=costs)
    return speculative_generate(target, drafter, prompt_ids, n, policy=policy, **common)


def measure(loaded, prompts: Sequence, curve, *, max_new_tokens: int = 128, repeats: int = 1,
            methods: Sequence[str] = METHODS, clock: Callable[[], float] = time.perf_counter,
            echo: Callable[[str], None] = print) -> list[dict]:
    """Time every prompt and method, interleaved with target-only runs (module docstring).

    Args:
        loaded: a `specdec.runtimes.loading.LoadedPair` (with a draft model when "draft" is in `methods`).
        prompts: `specdec.bench.prompts.Prompt`s. curve: the `specdec.core.costs.CostCurve` the policy prices with.
        max_new_tokens: the budget of every generation. repeats: repetitions of the whole interleaved set.
        methods: of `METHODS`. clock: seconds. echo: progress lines.

    Returns:
        One dict per method run: prompt_id, prompt_type, repeat, method, seconds, baseline_s (the mean of
        the two target-only runs around it), ratio (baseline_s / seconds), speculative_rounds, exact (its
        tokens equal target-only's), policy_note.
    """
    from specdec.prompts import encode_prompt

    rows = []
    for rep in range(repeats):
        for i, p in enumerate(prompts):
            ids = encode_prompt(loaded.tokenizer, p.text)
            order = list(methods)
            shift = (rep + i) % len(order)
            order = order[shift:] + order[:shift]  # no method always runs first after target-only
            before = _generate(loaded, "baseline", ids, max_new_tokens, curve, clock)
            runs = [(m, _generate(loaded, m, ids, max_new_tokens, curve, clock)) for m in order]
            after = _generate(loaded, "baseline", ids, max_new_tokens, curve, clock)
            base_s = (before.total_s + after.total_s) / 2.0
            for m, res in runs:
                rows.append({
                    "prompt_id": p.id, "prompt_type": p.type, "repeat": rep, "method": m,
                    "seconds": res.total_s, "baseline_s": base_s, "ratio": base_s / res.total_s,
                    "speculative_rounds": sum(r.k > 0 for r in res.rounds),
                    "exact": res.token_ids == before.token_ids, "policy_note": res.policy_note,
                })  # fmt: skip
                if not rows[-1]["exact"]:
                    echo(f"MISMATCH: {m} on {p.id} differs from target-only")
            echo(f"[{rep + 1}/{repeats}] {p.id}: " + ", ".join(
                f"{r['method']} {r['ratio']:.3f}x ({r['speculative_rounds']} spec rounds)" for r in rows[-len(runs):]))
    return rows


def summarize(rows: Sequence[dict], floor: float = FLOOR) -> dict[str, dict[str, dict]]:
    """``{method: {prompt_type | "all": {"ratio": geometric mean, "lowest": min, "n": runs, "drafted": runs
    with a speculative round, "below_floor": ratio < floor}}}``."""
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[r["method"]][r["prompt_type"]].append(r)
        groups[r["method"]]["all"].append(r)
    out: dict[str, dict[str, dict]] = {}
    for m, by_type in groups.items():
        out[m] = {}
        for t, rs in sorted(by_type.items()):
            g = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rs))
            out[m][t] = {"ratio": g, "lowest": min(r["ratio"] for r in rs), "n": len(rs),
                         "drafted": sum(r["speculative_rounds"] > 0 for r in rs), "below_floor": g < floor}
    return out


def print_summary(summary: dict, echo: Callable[[str], None] = print, floor: float = FLOOR) -> None:
    """One line per method and prompt type (the "all" row last)."""
    for m, by_type in summary.items():
        echo(f"\n{m} (cost policy) vs target-only, geometric mean of paired ratios:")
        for t in [*sorted(k for k in by_type if k != "all"), "all"]:
            s = by_type[t]
            flag = f"  BELOW {floor}" if s["below_floor"] else ""
            echo(f"  {t:20s} {s['ratio']:.3f}x  lowest {s['lowest']:.3f}x  n={s['n']}  drafted in "
                 f"{s['drafted']}{flag}")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="a preset (default: the default pair)")
    ap.add_argument("--backend", default="llamacpp", choices=("llamacpp", "transformers"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--per-type", type=int, default=2, help="prompts of each type (in file order)")
    ap.add_argument("--types", default=None, help="comma-separated prompt types (default: all twelve)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation")
    ap.add_argument("--cost-repeats", type=int, default=5, help="timed forwards per n for the cost curve")
    ap.add_argument("--json", default=None, help="write the runs and the summary here")
    args = ap.parse_args(argv)

    from specdec.bench.prompts import load_builtin, parse_types
    from specdec.core.costs import CostCurve
    from specdec.entrypoints import api
    from specdec.measure.timing import measure_costs
    from specdec.prompts import encode_prompt

    t0 = time.perf_counter()
    pair = api.load_pair(args.pair, backend=args.backend, threads=args.threads,
                         dtype="float32" if args.backend == "transformers" else "auto")
    loaded = pair.loaded
    print(f"loaded {pair.target} + {pair.draft} on {args.backend} in {time.perf_counter() - t0:.1f} s")
    costs = measure_costs(loaded, max_n=17, repeats=args.cost_repeats, draft_max_n=16)
    curve = CostCurve.from_costs(costs)
    print(f"target step {curve.target_step_s * 1e3:.1f} ms, c = {curve.c:.3f}, v(n): "
          + " ".join(f"{n}:{v:.2f}" for n, v in curve.relative().items()))
    prompts = load_builtin(parse_types(args.types) if args.types else None, per_type=args.per_type)
    print(f"{len(prompts)} prompts x {args.repeats} repeats x (2 target-only + {len(METHODS)} methods)")
    for m in ("baseline", *METHODS):  # warm-up, untimed
        _generate(loaded, m, encode_prompt(loaded.tokenizer, prompts[0].text), 8, curve, time.perf_counter)
    rows = measure(loaded, prompts, curve, max_new_tokens=args.tokens, repeats=args.repeats)
    summary = summarize(rows)
    print_summary(summary)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "costs": {k: v for k, v in costs.items()}, "runs": rows,
                       "summary": summary}, f, indent=1, default=str)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
