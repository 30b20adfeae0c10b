"""The roofline of target decoding steps: bytes of weights per step, step time, achieved GB/s, the machine's
memory bandwidth and the share of it a step uses (gpt-fast's "achieved bandwidth"; `specdec.measure.roofline`).

Prints figures, never asserts on time. The machine's bandwidth is measured once (a streaming copy of
``--bandwidth-mib`` MiB per buffer, best of 5; GB/s = 1e9 bytes/s); then for every model spec and dtype
(and ``--quant``) the target alone is loaded, its single decoding step timed on a warm cache of
``--context-tokens`` tokens (median of ``--repeats``, `specdec.measure.timing.measure_costs`), and its weight
bytes counted (`specdec.measure.roofline.weight_bytes`: parameters and buffers at their stored dtype, or the GGUF
file's size on llama.cpp). One model is in memory at a time.

Example (the default target, fp32 and bf16, 2 threads):

    python benchmarks/roofline.py --models Qwen/Qwen2.5-Coder-1.5B-Instruct --dtypes float32,bfloat16 \
        --threads 2
    python benchmarks/roofline.py --models path/to/target-q4_k_m.gguf --backend llamacpp --threads 2
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.measure.roofline import format_roofline, measure_bandwidth, roofline, weight_bytes
from specdec.measure.timing import measure_costs
from specdec.runtimes.loading import load_pair


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", required=True, help="comma-separated model specs (hub ids, dirs, .gguf files)")
    p.add_argument("--dtypes", default="float32", help="comma-separated transformers dtypes")
    p.add_argument("--quant", default=None, help="int8: int8 weight-only linears (torchao)")
    p.add_argument("--backend", default="transformers", help="transformers | llamacpp")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (models and the copy)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per model (median)")
    p.add_argument("--context-tokens", type=int, default=64, help="tokens in the warm cache")
    p.add_argument("--bandwidth-mib", type=float, default=512, help="MiB per buffer of the streaming copy")
    p.add_argument("--json", action="store_true", help="also print one JSON object (last line)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the benchmark; returns one dict per model and dtype (`specdec.measure.roofline.roofline`'s keys plus
    ``label``, ``model``, ``dtype``, ``quant``, ``backend``)."""
    args = parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars would interleave with the table
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not models or not dtypes:
        raise SystemExit("give at least one model and one dtype")
    bandwidth = measure_bandwidth(args.bandwidth_mib, threads=args.threads)
    print(f"machine bandwidth {bandwidth['gbps']:.2f} GB/s (median {bandwidth['median_gbps']:.2f}; streaming "
          f"copy of {bandwidth['size_mib']:g} MiB, read + write, best of {bandwidth['repeats']}, "
          f"{bandwidth['threads']} threads)")
    rows = []
    for spec in models:
        for dtype in dtypes if args.backend == "transformers" else ["gguf"]:
            kw = {"dtype": dtype, "quant": args.quant} if args.backend == "transformers" else {}
            pair = load_pair(spec, None, backend=args.backend, threads=args.threads, **kw)
            costs = measure_costs(pair, max_n=1, repeats=args.repeats, context_tokens=args.context_tokens)
            row = roofline(weight_bytes(pair.target), costs["target_step_s"], bandwidth)
            label = f"{Path(spec).name} {dtype}{' ' + args.quant if args.quant else ''}"
            rows.append({"label": label, "model": spec, "dtype": dtype, "quant": args.quant,
                         "backend": args.backend, **row})
            del pair
            gc.collect()
    print(format_roofline(rows))
    if args.json:
        print(json.dumps({"bandwidth": bandwidth, "rows": rows}))
    return rows


if __name__ == "__main__":
    main()
