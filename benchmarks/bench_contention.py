"""Benchmark: does a loaded llama.cpp draft slow the transformers target in the same process?

The mixed configuration (`mixed:llamacpp-draft-bf16`) times its target-only baseline with the llama.cpp draft
loaded in the same process. If the idle draft (its thread pool, its memory) slowed the torch target, the
baseline would be slow and every speedup of that configuration inflated. This times target-only decoding
of the transformers target in four states, alternating, so drift shows up as spread rather than as a
difference: before the draft is loaded, with the draft loaded and idle, right after a draft generation
(llama.cpp's threads have just run), and after the draft is freed.

Prints figures; asserts nothing about time. Usage:

    python benchmarks/bench_contention.py                     # default pair, bf16 target, 2 threads
    python benchmarks/bench_contention.py --dtype float32 --tokens 64 --repeats 3

Method (docs/DESIGN.md): a warm-up generation first; each state timed `--repeats` times, greedy, the same
prompt and budget; tokens/s = new tokens / wall seconds of the whole generation (prefill included).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--dtype", default="bfloat16", help="the transformers target's dtype")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per timed generation")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt", default='def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
    args = ap.parse_args()

    from specdec import models
    from specdec.bench.machines import machine_label
    from specdec.engine.decoding import autoregressive_generate
    from specdec.measure.environment import machine_info
    from specdec.runtimes.loading import load_model, set_threads

    t_spec, d_spec = models.resolve_pair(args.pair, args.target, args.draft)
    set_threads(args.threads)
    target = load_model(t_spec, runtime="transformers", dtype=args.dtype, threads=args.threads)
    ids = target.tokenizer(args.prompt)["input_ids"]
    m = machine_info(threads=args.threads)
    print(f"machine {machine_label(m)}; torch {m['torch']}, llama-cpp-python {m['llama_cpp_python']}, "
          f"load average {m['loadavg_1m']}")
    print(f"target {t_spec} ({args.dtype}, transformers), draft {d_spec} (llama.cpp), {args.threads} threads, "
          f"{args.tokens} new tokens")

    def timed() -> float:
        t0 = time.perf_counter()
        r = autoregressive_generate(target.backend, ids, args.tokens)
        return len(r.token_ids) / (time.perf_counter() - t0)

    timed()  # warm-up
    rates: dict[str, list[float]] = {}

    def state(name: str) -> None:
        rates.setdefault(name, []).append(timed())

    for _ in range(args.repeats):
        state("target alone")
    draft = load_model(d_spec, runtime="llamacpp", threads=args.threads)
    for _ in range(args.repeats):
        state("draft loaded, idle")
        autoregressive_generate(draft.backend, ids, 16)
        state("right after a draft generation")
    del draft
    gc.collect()
    for _ in range(args.repeats):
        state("draft freed")

    base = statistics.median(rates["target alone"])
    for name, xs in rates.items():
        print(f"  {name:32s} {statistics.median(xs):6.2f} tokens/s (runs: "
              f"{', '.join(f'{x:.2f}' for x in xs)}; {statistics.median(xs) / base:5.3f} of target alone)")


if __name__ == "__main__":
    main()
