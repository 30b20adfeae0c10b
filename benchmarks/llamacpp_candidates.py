"""Benchmark: which llama.cpp target gives speculative decoding the cheapest verification on this CPU.

For each candidate - the shipped GGUF with weight repacking off and on, and copies requantized from it with
llama.cpp's own quantizer (Q4_0, IQ4_NL, Q8_0; pure, repacking on) - it prints the single step t(1) in ms
and the verification cost curve v(n) = t(n) / t(1) on a warm cache, and the candidate's quality against the
shipped file: greedy agreement over the first `--new` tokens of each built-in primary prompt. Prints
figures; asserts nothing (timings on a shared machine are noisy).

Method: every candidate is loaded once; the timed forwards are interleaved - for each repetition, each n,
each candidate in turn - so a drift of the machine's speed hits every candidate alike; the median over
`--reps` is printed. Each timed forward of n tokens is rolled back (one ``truncate``) before the next.
Run it on a quiet machine: ggml's worker threads spin, so another busy process makes n >= 9 erratic.

    python benchmarks/llamacpp_candidates.py                       # the default pair's target
    python benchmarks/llamacpp_candidates.py --gguf model.gguf --types Q4_0,Q8_0 --reps 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

NS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17)
CONTEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 2


def candidates(src: Path, types: list[str], cache: Path, threads: int) -> list[tuple[str, Path, bool]]:
    """(label, GGUF path, repack) per candidate; requantized files are made once into `cache`."""
    from specdec.backends.llamacpp import requantize_gguf

    out = [(f"{src.stem} repack off", src, False), (f"{src.stem} repack on", src, True)]
    for t in types:
        dst = cache / f"{src.stem}.{t}.gguf"
        if not dst.exists():
            t0 = time.perf_counter()
            requantize_gguf(src, dst, t, threads=threads)
            print(f"requantized {src.name} -> {dst.name} in {time.perf_counter() - t0:.1f} s", flush=True)
        out.append((f"{t} (pure) repack on", dst, True))
    return out


def greedy(be, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after `ids` on a fresh cache (llama.cpp's own logits)."""
    be.reset()
    logits = be.forward(ids, last=1)
    out = []
    for _ in range(n):
        tok = int(logits[-1].argmax())
        out.append(tok)
        logits = be.forward([tok])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="source GGUF (default: the default pair's target)")
    ap.add_argument("--types", default="Q4_0,IQ4_NL,Q8_0", help="requantized candidates ('' for none)")
    ap.add_argument("--cache", type=Path, default=None, help="where requantized files go (default: beside "
                    "the model cache's GGUFs)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new", type=int, default=32, help="greedy tokens per prompt for the quality check")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()

    from specdec.backends.llamacpp import gguf_weight_types, load_llamacpp
    from specdec.bench.environment import machine_info
    from specdec.bench.prompts import load_builtin
    from specdec.models.loaders import gguf_file

    src = (args.gguf or gguf_file("qwen2.5-coder:target")).resolve()
    cache = args.cache or src.parent / "requantized"
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    cands = candidates(src, types, cache, args.threads)
    loaded = [(label, load_llamacpp(path, n_ctx=1024, n_threads=args.threads, extra_buffers=repack), path)
              for label, path, repack in cands]

    prompts = load_builtin(per_type=1)
    quality = {}
    ref = None
    for label, be, _ in loaded:
        outs = [greedy(be, be.tokenize(p.text), args.new) for p in prompts]
        if ref is None:
            ref = outs
        same = sum(o == r for o, r in zip(outs, ref, strict=True))
        prefix = statistics.mean(next((i for i, (a, b) in enumerate(zip(o, r, strict=True)) if a != b), len(r))
                                 for o, r in zip(outs, ref, strict=True))
        quality[label] = {"prompts_equal": same, "prompts": len(prompts), "mean_equal_prefix": prefix}

    warm = {}
    for label, be, _ in loaded:
        be.reset()
        ids = be.tokenize(CONTEXT)
        be.forward(ids, logits=False)
        warm[label] = (ids, be.cache_length)
        for _ in range(3):
            be.forward(ids[:1])
            be.truncate(be.cache_length - 1)
    times: dict[str, dict[int, list[float]]] = {label: {n: [] for n in NS} for label, _, _ in loaded}
    for _ in range(args.reps):
        for n in NS:
            for label, be, _ in loaded:
                ids, length = warm[label]
                t0 = time.perf_counter()
                be.forward(ids[:n])
                times[label][n].append(time.perf_counter() - t0)
                be.truncate(length)

    rows = []
    for label, be, path in loaded:
        med = {n: statistics.median(v) for n, v in times[label].items()}
        rows.append({"candidate": label, "file": path.name, "repack": be.extra_buffers,
                     "weight_types": {k: v for k, v in list(gguf_weight_types(path).items())[:3]},
                     "t1_ms": med[1] * 1e3, "v": {n: med[n] / med[1] for n in NS}, **quality[label]})
        be.close()
    info = machine_info()
    print(f"machine: {info.get('cpu_model', platform.processor())}, threads {args.threads}, context "
          f"{len(warm[loaded[0][0]][0])} tokens, median of {args.reps} interleaved repetitions")
    head = "".join(f" v({n})".rjust(7) for n in NS[1:])
    print(f"{'candidate':<38}{'t(1) ms':>8}{head}  greedy = shipped (prompts, mean equal prefix)")
    for r in rows:
        vs = "".join(f"{r['v'][n]:7.2f}" for n in NS[1:])
        print(f"{r['candidate']:<38}{r['t1_ms']:8.1f}{vs}  {r['prompts_equal']}/{r['prompts']}, "
              f"{r['mean_equal_prefix']:.1f} of {args.new}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "threads": args.threads, "reps": args.reps,
                                         "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
