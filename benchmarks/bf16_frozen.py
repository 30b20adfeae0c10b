"""Benchmark: the bf16 target compiled with frozen weights against the same static-cache path uncompiled.

Loads the target in bfloat16 once and builds two `specdec.runtimes.compiled.CompiledHFBackend` on it: mode
``eager`` (the static cache and bucketing, no compilation: the reference) and mode ``frozen`` (inductor
compiled with weight freezing: weights become constants that inductor prepacks for oneDNN). Each compiled
bucket holds its own frozen copy of the weights (about 3 GB per bucket for the 1.5B target), hence few
buckets. It prints the compile seconds, resident memory, t(1) and v(n) = t(n) / t(1) per bucket for both
(forwards on a warm cache of `--context` tokens, interleaved, median of `--reps`), and whether the frozen
graph's next-token argmax equals the reference's (and the largest logit difference).
Prints figures; asserts nothing.

    python benchmarks/bf16_frozen.py --threads 2
    python benchmarks/bf16_frozen.py --spec qwen2.5-coder:draft --buckets 1,4,8,16
"""

from __future__ import annotations

import argparse
import statistics
import time


def rss_gb() -> float:
    """Resident memory of this process in GB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="qwen2.5-coder:target")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--buckets", default="1,4,8", help="compiled widths (each holds a frozen weight copy)")
    ap.add_argument("--context", type=int, default=64, help="tokens in the warm cache")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    buckets = tuple(sorted({int(b) for b in args.buckets.split(",") if b.strip()}))
    if not buckets or buckets[0] != 1:
        raise SystemExit("bf16_frozen: --buckets needs widths >= 1, among them 1 (v(n) is relative to t(1))")

    import torch
    from transformers.utils import logging as hf_logging

    from specdec.measure.timing import interleaved_forward_times
    from specdec.runtimes.compiled import CompiledHFBackend
    from specdec.runtimes.loading import load_model

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model = load_model(args.spec, runtime="transformers", dtype="bfloat16", threads=args.threads).hf_model
    max_length = args.context + buckets[-1] + 64
    backends = {"eager": CompiledHFBackend(model, mode="eager", buckets=buckets, max_length=max_length)}
    backends["frozen"] = CompiledHFBackend(model, mode="frozen", buckets=buckets, max_length=max_length)
    t0 = time.perf_counter()
    backends["frozen"].warmup()
    print(f"{args.spec} bf16, {args.threads} threads: compiled {len(buckets)} buckets in "
          f"{time.perf_counter() - t0:.0f} s; resident memory {rss_gb():.1f} GB", flush=True)

    ids = [1000 + i for i in range(args.context)]
    # interleaved: both paths at one width back to back
    times = interleaved_forward_times({name: (be, ids) for name, be in backends.items()}, buckets,
                                      repeats=args.reps)
    print(f"{'path':<8}{'t(1) ms':>9}" + "".join(f"{'v(' + str(n) + ')':>8}" for n in buckets[1:]))
    for name in backends:
        med = {n: statistics.median(v) for n, v in times[name].items()}
        print(f"{name:<8}{med[1] * 1e3:9.1f}" + "".join(f"{med[n] / med[1]:8.2f}" for n in buckets[1:]))
    logits = {}
    for name, be in backends.items():  # each cache still holds the prefilled context
        logits[name] = be.forward(ids[:1]).float()
    diff = float((logits["eager"] - logits["frozen"]).abs().max())
    same = int(logits["eager"][-1].argmax()) == int(logits["frozen"][-1].argmax())
    print(f"next-token argmax equal: {same}; largest logit difference {diff:.3g}")


if __name__ == "__main__":
    main()
