"""Cost curves of the original study's architectures (and the default pair's) on a GPU, plus a CUDA exactness
check - one prepared script for a lent GPU machine (issue 21). Runs on CPU too (`--device cpu`), which is how
the test suite checks it.

    python benchmarks/gpu_costs.py --device cuda --out results/gpu_costs           # ~3-6 minutes on an H200
    python benchmarks/gpu_costs.py --device cpu --archs gpt2 --dtypes float32 --max-n 3 --repeats 1 --out /tmp/x

Every model is built on the device from its published configuration with RANDOM weights (`specdec.archs`;
nothing is downloaded): the figures are timing only. Clocks are read after `torch.cuda.synchronize()`
(`HFBackend.synchronize`). Writes `<out>/gpu_costs.json` (costs per dtype, the exactness checks, the machine)
and prints a table per dtype. The exactness checks, on tiny random GPT-2 models on the same device:
greedy speculative output equals target-only greedy for K in {1, 2, 4, 8} (draft model and prompt lookup),
and speculative sampling's emitted token follows the target distribution (`stochastic_verify`, K = 2,
vocab 4, 20,000 draws, total variation < 0.02; a negative control that samples from q must fail it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specdec import archs
from specdec.backends.hf import HFBackend
from specdec.bench.sweep import machine_info
from specdec.decoding import autoregressive_generate, speculative_generate
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.verification import stochastic_verify

TINY = {"n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 1000, "n_positions": 128, "bos_token_id": 0,
        "eos_token_id": 0}


def _tiny_backend(seed: int, device: str) -> HFBackend:
    arch = archs.Arch(f"tiny-{seed}", {**archs.ARCHS["gpt2"].config, **TINY}, 0)
    return HFBackend(archs.build_random_model(arch, device=device, seed=seed))


def greedy_exactness(device: str) -> dict:
    """Speculative greedy == target-only greedy on tiny random models on `device` (K in 1, 2, 4, 8)."""
    target, draft = _tiny_backend(0, device), _tiny_backend(1, device)
    prompts = [[5, 17, 99, 4, 250, 8, 17, 99, 4], [3], [1, 2, 3, 1, 2, 3, 1, 2]]
    checks = []
    for prompt in prompts:
        ref = autoregressive_generate(target, prompt, 32, vocab_size=1000).token_ids
        for k in (1, 2, 4, 8):
            for name, drafter in (("draft", ModelDrafter(draft, 1000)), ("ngram", PromptLookupDrafter())):
                out = speculative_generate(target, drafter, prompt, 32, k=k, vocab_size=1000)
                checks.append({"prompt_len": len(prompt), "k": k, "drafter": name,
                               "identical": out.token_ids == ref, "accepted": out.num_accepted})
    return {"passed": all(c["identical"] for c in checks), "checks": checks}


def sampling_exactness(device: str, draws: int = 20_000, seed: int = 0) -> dict:
    """Total variation between the first emitted token of `stochastic_verify` (K = 2) and p_1, on `device`,
    and the same for a known-wrong rule (emit the draft token as sampled from q) as a negative control."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], device=device)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    counts, wrong = torch.zeros(4), torch.zeros(4)
    for _ in range(draws):
        d = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        verdict = stochastic_verify(d, q, p, gen)
        first = d[0] if verdict.num_accepted >= 1 else verdict.next_token
        counts[first] += 1
        wrong[d[0]] += 1
    tv = 0.5 * float((counts / draws - p[0].cpu()).abs().sum())
    tv_wrong = 0.5 * float((wrong / draws - p[0].cpu()).abs().sum())
    return {"draws": draws, "tv": tv, "tv_negative_control": tv_wrong, "passed": tv < 0.02 <= tv_wrong}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default=None, help="comma-separated; default bfloat16,float16 on cuda, float32 on cpu")
    ap.add_argument("--archs", default=",".join(archs.ARCHS))
    ap.add_argument("--max-n", type=int, default=17)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_costs: error: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    dtypes = (args.dtypes or ("bfloat16,float16" if args.device.startswith("cuda") else "float32")).split(",")
    chosen = archs.resolve_archs(args.archs)
    t0 = time.perf_counter()
    result = {"device": args.device, "machine": machine_info(args.device, torch.get_num_threads()),
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
              "greedy_exactness": greedy_exactness(args.device),
              "sampling_exactness": sampling_exactness(args.device), "costs": {}}
    print(f"greedy exactness on {args.device}: {'PASS' if result['greedy_exactness']['passed'] else 'FAIL'}")
    s = result["sampling_exactness"]
    print(f"sampling exactness on {args.device}: TV {s['tv']:.4f} (negative control {s['tv_negative_control']:.4f}):"
          f" {'PASS' if s['passed'] else 'FAIL'}")
    for dtype in dtypes:
        costs = archs.measure_arch_costs(chosen, dtype=dtype, device=args.device, max_n=args.max_n,
                                         repeats=args.repeats, context_tokens=args.context_tokens)
        result["costs"][dtype] = costs
        print(archs.format_arch_costs(costs))
    result["wall_s"] = time.perf_counter() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_costs.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(f"wrote {args.out / 'gpu_costs.json'} in {result['wall_s']:.0f} s")
    ok = result["greedy_exactness"]["passed"] and s["passed"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
