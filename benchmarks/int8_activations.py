"""Benchmark: would int8 activations (W8A8) give the transformers target a cheaper step or a flatter curve?

Times the MLP stack of the default target's shape - `--layers` blocks of Linear(hidden, intermediate) and
Linear(intermediate, hidden), no bias, random weights (the MLP holds about two thirds of a Qwen2.5
decoder's linear weights; attention and the output head are left out) - at n = 1, 2, 4, 8, 16 rows, as:

- bf16 eager and bf16 compiled (``torch.compile`` with inductor's weight freezing, which hands the GEMMs to
  oneDNN with prepacked weights);
- W8A8: per-row int8 weights and per-token dynamic int8 activations (torchao's
  ``Int8DynamicActivationInt8WeightConfig``: int8 dot products), eager and compiled the same way.

For each it prints the milliseconds of one pass (median of `--reps` after two warm-up passes), v(n) = t(n) /
t(1), and the GB/s the single row reaches (weight bytes / t(1)). The stack is sized so that its weights do
not fit in the CPU caches (the default 28 blocks: 1.5 GB in bf16, 0.77 GB in int8). Every width is a static
shape, compiled once (the recompile limit is raised to cover them). Prints figures; asserts nothing.

    python benchmarks/int8_activations.py --threads 2
    python benchmarks/int8_activations.py --threads 2 --no-eager-w8a8      # skip the slow eager W8A8 path
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

NS = (1, 2, 4, 8, 16)


def stack(layers: int, hidden: int, intermediate: int):
    """`layers` MLP blocks (up, down; no activation between them: only the GEMMs are timed) in bfloat16, each
    weight drawn with standard deviation 1/sqrt(in_features) so that activations keep unit scale through the
    stack (PyTorch's default init shrinks them ~100x per layer, into subnormals after a few blocks)."""
    import torch

    torch.manual_seed(0)
    mods = [m for _ in range(layers) for m in (torch.nn.Linear(hidden, intermediate, bias=False),
                                               torch.nn.Linear(intermediate, hidden, bias=False))]
    with torch.no_grad():
        for m in mods:
            m.weight.normal_(0.0, m.in_features ** -0.5)
    return torch.nn.Sequential(*mods).to(torch.bfloat16).eval()


def time_ms(fn, n: int, hidden: int, reps: int) -> float:
    """Median milliseconds of ``fn(x)`` for an ``[n, hidden]`` bf16 input, after two warm-up calls."""
    import torch

    x = torch.randn(n, hidden, dtype=torch.bfloat16)
    with torch.no_grad():
        fn(x)
        fn(x)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=28, help="MLP blocks (the 1.5B target has 28)")
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--intermediate", type=int, default=8960)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-eager-w8a8", action="store_true", help="skip eager W8A8 (seconds per pass here)")
    args = ap.parse_args()

    import torch
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.set_num_threads(args.threads)
    inductor_config.freezing = True  # constant weights: inductor prepacks them for oneDNN
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 2 * len(NS) + 2)
    bf16 = stack(args.layers, args.hidden, args.intermediate)
    w8a8 = copy.deepcopy(bf16)
    quantize_(w8a8, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    weights = args.layers * 2 * args.hidden * args.intermediate  # elements
    variants = [("bf16 eager", bf16, 2), ("bf16 compiled", torch.compile(bf16, dynamic=False), 2)]
    if not args.no_eager_w8a8:
        variants.append(("w8a8 eager", w8a8, 1))
    variants.append(("w8a8 compiled", torch.compile(w8a8, dynamic=False), 1))

    rows = {label: {} for label, _, _ in variants}
    for n in NS:  # interleaved: every variant at one width before the next width
        for label, fn, _ in variants:
            rows[label][n] = time_ms(fn, n, args.hidden, args.reps)
    x = torch.randn(4, args.hidden, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = bf16(x).float()
        for label, fn, _ in variants:  # the compiled graphs and W8A8 compute what the eager stack does
            err = float((fn(x).float() - ref).norm() / ref.norm())
            print(f"{label}: relative error against bf16 eager {err:.3g} (output rms {float(ref.pow(2).mean().sqrt()):.3g})")
    print(f"{args.layers} MLP blocks {args.hidden} -> {args.intermediate} -> {args.hidden}, {args.threads} threads, "
          f"median of {args.reps}; ms per pass, v(n) = t(n) / t(1), GB/s at n = 1")
    print(f"{'variant':<16}{'GB':>6}{'GB/s':>7}" + "".join(f"{'t(' + str(n) + ')':>9}" for n in NS)
          + "".join(f"{'v(' + str(n) + ')':>7}" for n in NS[1:]))
    for label, _, nbytes in variants:
        t = rows[label]
        gb = weights * nbytes / 1e9
        print(f"{label:<16}{gb:6.2f}{gb / (t[1] / 1e3):7.1f}" + "".join(f"{t[n]:9.1f}" for n in NS)
              + "".join(f"{t[n] / t[1]:7.2f}" for n in NS[1:]))


if __name__ == "__main__":
    main()
