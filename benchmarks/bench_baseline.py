"""Benchmark: the verification cost curve, c, and our target-only baseline against transformers' generate().

Prints figures; asserts nothing about time. Usage:

    python benchmarks/bench_baseline.py                       # default pair, 2 threads
    python benchmarks/bench_baseline.py --target DIR --draft DIR --tokens 64 --repeats 3

Method (docs/DESIGN.md): models loaded once; a warm-up generation of each method before timing; the
median of `--repeats` timed runs; tokens counted by id; both methods greedy on the same prompt and budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per timed generation")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-n", type=int, default=17)
    ap.add_argument("--prompt", default="def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n")
    args = ap.parse_args()

    from specdec import models
    from specdec.engine.decoding import autoregressive_generate
    from specdec.measure.timing import measure_costs
    from specdec.runtimes.loading import load_pair

    t_spec, d_spec = models.resolve_pair(args.pair, args.target, args.draft)
    t0 = time.perf_counter()
    pair = load_pair(t_spec, d_spec, threads=args.threads)
    print(f"loaded {t_spec} + {d_spec} in {time.perf_counter() - t0:.1f} s, torch threads {torch.get_num_threads()}")

    costs = measure_costs(pair, max_n=args.max_n, repeats=args.repeats)
    step = costs["target_step_s"]
    print(f"target step {step * 1e3:.1f} ms, draft step {costs['draft_step_s'] * 1e3:.1f} ms, c = {costs['c']:.3f}")
    print("verification cost curve (target forward of n tokens, warm cache):")
    for n, s in costs["target_forward_s"].items():
        print(f"  n={n:2d}  {s * 1e3:8.1f} ms   v(n) = {s / step:5.2f} steps")

    tok = pair.tokenizer
    ids = tok(args.prompt).input_ids
    model = pair.target.hf_model
    backend = pair.target.backend
    gen_kw = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False,
              "pad_token_id": tok.pad_token_id or 0}

    def ours():
        r = autoregressive_generate(backend, ids, args.tokens, vocab_size=pair.vocab_size)
        return r.token_ids, r.total_s

    def theirs():
        x = torch.tensor([ids])
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.generate(x, attention_mask=torch.ones_like(x), **gen_kw)
            dt = time.perf_counter() - t
        return out[0, len(ids):].tolist(), dt

    ours()
    theirs()  # warm-up
    o_times, g_times = [], []
    for _ in range(args.repeats):
        o_ids, o_s = ours()
        g_ids, g_s = theirs()
        o_times.append(args.tokens / o_s)
        g_times.append(args.tokens / g_s)
    o_med, g_med = statistics.median(o_times), statistics.median(g_times)
    print(f"target-only, {args.tokens} tokens, median of {args.repeats}:")
    print(f"  specdec baseline       {o_med:7.2f} tok/s  (runs: {', '.join(f'{x:.2f}' for x in o_times)})")
    print(f"  transformers generate  {g_med:7.2f} tok/s  (runs: {', '.join(f'{x:.2f}' for x in g_times)})")
    print(f"  ratio ours/generate    {o_med / g_med:7.3f}; identical tokens: {o_ids == g_ids[: len(o_ids)]}")
    print(json.dumps({"costs": {k: v for k, v in costs.items() if "spread" not in k},
                      "baseline_tok_s": o_med, "generate_tok_s": g_med}, default=str))


if __name__ == "__main__":
    main()
