"""What a ragged batched forward costs on llama.cpp, with and without padding the rows to the longest.

A batched speculative round feeds rows of different lengths (a row whose draft matched verifies 1 + K
tokens, a row without a draft 1). With one KV stream per row llama.cpp splits such a batch into
micro-batches of equally many tokens per sequence, one pass over the weights per token depth;
`specdec.runtimes.llamacpp_batched.BatchedLlamaCppBackend` pads the rows to the longest (fillers unscored,
removed after the decode) so the batch runs as one micro-batch. This prints, for B rows on a warm cache of
`--context` tokens, the median milliseconds of: one token per row (a plain batched step), the ragged shape
(row 0 feeds m tokens, the others 1) with the backend's padding off and on (on: it pads when the fillers
are at most the real tokens), and every row feeding m tokens - interleaved, median of `--reps`.

    python benchmarks/llamacpp_ragged.py [--gguf model.gguf] [--rows 8] [--depths 2,3,5] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="GGUF (default: the default pair's target)")
    ap.add_argument("--rows", type=int, default=8, help="rows B (default 8)")
    ap.add_argument("--depths", default="2,3,5", help="tokens m of the longest row (default 2,3,5)")
    ap.add_argument("--context", type=int, default=64, help="cached tokens per row (default 64)")
    ap.add_argument("--reps", type=int, default=7, help="timed passes (default 7)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from specdec.measure.environment import machine_info
    from specdec.models.loaders import gguf_file
    from specdec.runtimes.llamacpp_batched import BatchedLlamaCppBackend

    path = (args.gguf or gguf_file("qwen2.5-coder:target")).resolve()
    b = args.rows
    be = BatchedLlamaCppBackend(path, max_rows=b, n_ctx=args.context + 64, n_threads=args.threads)
    ctx = [(17 * i + 3) % 5000 + 100 for i in range(args.context)]
    depths = [int(x) for x in args.depths.split(",") if x.strip()]
    shapes: list[tuple[str, list[int], bool]] = [("1 token per row", [1] * b, True)]
    for m in depths:
        shapes += [(f"row 0: {m}, others 1, padding off", [m] + [1] * (b - 1), False),
                   (f"row 0: {m}, others 1, padding on", [m] + [1] * (b - 1), True),
                   (f"{m} tokens per row", [m] * b, True)]
    be.prefill([ctx] * b)
    times: dict[str, list[float]] = {label: [] for label, _, _ in shapes}
    for rep in range(args.reps + 1):  # pass 0 warms up
        order = shapes if rep % 2 == 0 else shapes[::-1]
        for label, counts, pad in order:
            be.pad_ragged = pad
            feed = [[ctx[(j * 7 + i) % len(ctx)] for j in range(n)] for i, n in enumerate(counts)]
            be.synchronize()
            t0 = time.perf_counter()
            be.forward(feed)
            be.synchronize()
            dt = time.perf_counter() - t0
            be.truncate([len(ctx)] * b)
            if rep:
                times[label].append(dt)
    m = machine_info()
    print(f"{path.name}, B = {b}, context {args.context}, {args.threads} threads, median of {args.reps}; "
          f"{m.get('cpu_model', '?')}")
    base = statistics.median(times[shapes[0][0]])
    for label, counts, _ in shapes:
        t = statistics.median(times[label])
        print(f"  {label:32s} {sum(counts):4d} tokens  {1000 * t:7.1f} ms  {t / base:5.2f} plain steps")
    be.close()


if __name__ == "__main__":
    main()
