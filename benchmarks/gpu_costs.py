"""Cost curves of the original study's architectures (and the default pair's) on a GPU, plus a CUDA exactness
check - one prepared script for a lent GPU machine (issue 21). Runs on CPU too (`--device cpu`), which is how
the test suite checks it.

    python benchmarks/gpu_costs.py --device cuda --e2e-dtype none --out results/gpu   # checks + cost tables
    python benchmarks/gpu_costs.py --device cuda --only-e2e --out results/gpu_e2e      # ~4 min on an H200 (estimate)
    python benchmarks/gpu_costs.py --device cpu --archs gpt2 --dtypes float32 --max-n 3 --repeats 1 --out /tmp/x

Every model is built on the device from its published configuration with RANDOM weights (`specdec.measure.archs`;
nothing is downloaded): the figures are timing only. Clocks are read after `torch.cuda.synchronize()`
(`HFBackend.synchronize`). Writes `<out>/gpu_costs.json` (costs per dtype, the exactness checks, the machine;
rewritten after every section, so a run cut off by its time limit keeps what it measured) and prints a table
per dtype. The exactness checks, on tiny random GPT-2 models on the same device:
greedy speculative output equals target-only greedy for K in {1, 2, 4, 8} (draft model and prompt lookup),
and speculative sampling's emitted token follows the target distribution (`stochastic_verify`, K = 2,
vocab 4, 20,000 draws, total variation < 0.02; a negative control that samples from q must fail it).

The end-to-end check (`--e2e-dtype`, default bfloat16 on cuda) times whole generations of the default pair's
architectures (random weights, a 64-token synthetic prompt, 128 new tokens, greedy) through the engine on the
device: target-only, the 0.5B draft at K in {1, 2, 4, 8} (random weights: it almost never agrees with the
target, the acceptance floor), an identical copy of the target as draft at K = 4 (it agrees everywhere, the
ceiling) and prompt lookup at K = 4, after an untimed warm-up, in `--e2e-passes` passes that each open and close
with a target-only run (speedups paired within the pass; the two give an A/A check). Each run's decode seconds (total minus prefill) are set beside the decode
seconds its own rounds predict from the cost curves of the same models timed in the same process (forwards
only: draft catch-up and steps plus one target forward of K + 1 tokens per round), so the gap is the engine's
own per-round cost on this device, the part `specdec.report.predicted` calls o_base / o_spec. Whether each
run's output equals the target-only run's is recorded, not gated: in bf16 a (K + 1)-token forward may round
differently from single steps (the fp32 exactness check above is the gate).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from specdec.bench.sweep import machine_info
from specdec.core.costs import CostCurve
from specdec.core.verification import stochastic_verify
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.measure import archs
from specdec.measure.timing import forward_times
from specdec.report.predicted import PromptModel
from specdec.runtimes.hf import HFBackend

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


def _predicted_decode_s(rounds, curve: CostCurve, drafter: str) -> float:
    """Forward seconds a run's own rounds predict, by the report's time model (`PromptModel.decode_s`) with
    the per-round overheads at 0: the draft model's catch-up and k - 1 steps (prompt lookup: 0) plus one
    target forward of k + 1 tokens per round."""
    model = PromptModel(("", "", ""), "", None, curve, 0.0, 0.0, 0.0, (3, 1), None)
    return model.decode_s(drafter, rounds)


def end_to_end(device: str, dtype: str, *, target_arch: str = "qwen2.5-coder-1.5b",
               draft_arch: str = "qwen2.5-coder-0.5b", new_tokens: int = 128, context_tokens: int = 64,
               ks: tuple[int, ...] = (1, 2, 4, 8), repeats: int = 5, passes: int = 2) -> dict:
    """Whole greedy generations through the engine on `device` (random weights), measured decode seconds
    beside the decode seconds each run's rounds predict from cost curves timed in the same process.

    After an untimed warm-up (one full-length target-only run and one speculative run), each of `passes`
    passes runs target-only, every configuration, then target-only again: a run's speedup is taken against
    the mean of its own pass's two target-only runs (paired), and their ratio is the pass's A/A check.

    Returns:
        ``{"dtype", "target", "draft", "new_tokens", "context_tokens", "passes", "target_forward_s": {n: s},
        "draft_forward_s": {n: s}, "twin_forward_s": {n: s}, "runs": [{"pass", "name", "drafter", "k",
        "decode_s", "prefill_s", "predicted_decode_s", "overhead_per_round_s", "rounds", "drafted",
        "accepted", "tokens_per_s", "speedup", "identical_to_target_only"}]}``; seconds throughout, tokens/s
        for decode only; ``speedup`` = the pass's mean target-only decode seconds / this run's.
    """
    target = HFBackend(archs.build_random_model(target_arch, dtype=dtype, device=device, seed=0))
    draft = HFBackend(archs.build_random_model(draft_arch, dtype=dtype, device=device, seed=1))
    twin = HFBackend(archs.build_random_model(target_arch, dtype=dtype, device=device, seed=0))
    vocab = archs.ARCHS[target_arch].config["vocab_size"]
    prompt = [(7 + 31 * i) % vocab for i in range(context_tokens)]
    tf, _ = forward_times(target, prompt, list(range(1, max(ks) + 2)), repeats=repeats)
    df, _ = forward_times(draft, prompt, [1, 2, 3], repeats=3 * repeats, last=1)
    wf, _ = forward_times(twin, prompt, [1, 2, 3], repeats=3 * repeats, last=1)
    curves = {"baseline": CostCurve(tf), "draft": CostCurve(tf, draft_forward_s=df),
              "twin": CostCurve(tf, draft_forward_s=wf), "ngram": CostCurve(tf)}
    drafters = {"draft": ModelDrafter(draft, vocab), "twin": ModelDrafter(twin, vocab), "ngram": PromptLookupDrafter()}
    plan = ([("draft", k) for k in ks] + [("twin", 4), ("ngram", 4)])
    ref = autoregressive_generate(target, prompt, new_tokens, vocab_size=vocab)  # warm-up, and the reference
    speculative_generate(target, drafters["draft"], prompt, new_tokens, k=ks[0], vocab_size=vocab)  # warm-up
    rows = []
    for i in range(passes):
        pass_rows = []
        for name, k in [("baseline", 0), *plan, ("baseline", 0)]:
            if name == "baseline":
                out = autoregressive_generate(target, prompt, new_tokens, vocab_size=vocab)
                predicted = len(out.rounds) * curves["baseline"].forward_s(1)
            else:
                out = speculative_generate(target, drafters[name], prompt, new_tokens, k=k, vocab_size=vocab)
                predicted = _predicted_decode_s(out.rounds, curves[name], "ngram" if name == "ngram" else "draft")
            decode = out.total_s - out.prefill_s
            pass_rows.append({
                "pass": i, "name": "target-only" if name == "baseline" else f"{name} K={k}", "drafter": name, "k": k,
                "decode_s": decode, "prefill_s": out.prefill_s, "predicted_decode_s": predicted,
                "overhead_per_round_s": (decode - predicted) / len(out.rounds), "rounds": len(out.rounds),
                "drafted": out.num_drafted, "accepted": out.num_accepted, "tokens_per_s": out.num_tokens / decode,
                "identical_to_target_only": out.token_ids == ref.token_ids})
            print(f"  pass {i} {pass_rows[-1]['name']}: {decode:.3f} s decode ({predicted:.3f} predicted), "
                  f"{out.num_accepted}/{out.num_drafted} accepted", flush=True)
        base = (pass_rows[0]["decode_s"] + pass_rows[-1]["decode_s"]) / 2
        for r in pass_rows:
            r["speedup"] = base / r["decode_s"]
        rows += pass_rows
    del target, draft, twin
    return {"dtype": dtype, "target": target_arch, "draft": draft_arch, "new_tokens": new_tokens,
            "context_tokens": context_tokens, "passes": passes, "target_forward_s": tf, "draft_forward_s": df,
            "twin_forward_s": wf, "runs": rows}


def format_end_to_end(e2e: dict) -> str:
    """`end_to_end` output as a plain-text table: per run, medians over the passes (ms, tokens/s, the paired
    speedup over its pass's target-only runs), and each pass's A/A ratio (first / last target-only run)."""
    import statistics

    lines = [(f"{archs.RANDOM_WEIGHTS_LABEL}: end to end, {e2e['draft']} -> {e2e['target']}, {e2e['dtype']}, "
              f"{e2e['context_tokens']}-token prompt, {e2e['new_tokens']} new tokens, greedy; medians of "
              f"{e2e['passes']} passes"),
             (f"{'run':14s} {'rounds':>6s} {'acc/drafted':>11s} {'decode ms':>9s} {'predicted':>9s} "
              f"{'ms/round':>8s} {'tok/s':>7s} {'speedup':>7s} same")]
    names = list(dict.fromkeys(r["name"] for r in e2e["runs"]))
    for name in names:
        rs = [r for r in e2e["runs"] if r["name"] == name]
        med = {f: statistics.median(r[f] for r in rs) for f in
               ("decode_s", "predicted_decode_s", "overhead_per_round_s", "tokens_per_s", "speedup")}
        lines.append(f"{name:14s} {rs[0]['rounds']:6d} {rs[0]['accepted']:5d}/{rs[0]['drafted']:<5d} "
                     f"{med['decode_s'] * 1e3:9.1f} {med['predicted_decode_s'] * 1e3:9.1f} "
                     f"{med['overhead_per_round_s'] * 1e3:8.2f} {med['tokens_per_s']:7.1f} {med['speedup']:7.2f} "
                     f"{'yes' if all(r['identical_to_target_only'] for r in rs) else 'NO'}")
    for i in range(e2e["passes"]):
        base = [r["decode_s"] for r in e2e["runs"] if r["pass"] == i and r["drafter"] == "baseline"]
        lines.append(f"pass {i}: A/A (first / last target-only decode) {base[0] / base[-1]:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default=None, help="comma-separated; default bfloat16,float16 on cuda, float32 on cpu")
    ap.add_argument("--archs", default=",".join(archs.ARCHS))
    ap.add_argument("--max-n", type=int, default=17)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context-tokens", type=int, default=64)
    ap.add_argument("--e2e-dtype", default=None,
                    help="dtype of the end-to-end runs (default bfloat16 on cuda, float32 on cpu); 'none' skips them")
    ap.add_argument("--e2e-target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--e2e-draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--e2e-tokens", type=int, default=128)
    ap.add_argument("--e2e-ks", default="1,2,4,8", help="draft-model K values of the end-to-end runs")
    ap.add_argument("--e2e-passes", type=int, default=2)
    ap.add_argument("--only-e2e", action="store_true", help="skip the exactness checks and the cost tables")
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
              "costs": {}}
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every section, so a run cut short by its time limit keeps what it measured
        result["wall_s"] = time.perf_counter() - t0
        (args.out / "gpu_costs.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")

    ok = True
    if not args.only_e2e:
        result["greedy_exactness"] = greedy_exactness(args.device)
        result["sampling_exactness"] = s = sampling_exactness(args.device)
        print(f"greedy exactness on {args.device}: {'PASS' if result['greedy_exactness']['passed'] else 'FAIL'}")
        print(f"sampling exactness on {args.device}: TV {s['tv']:.4f} (negative control {s['tv_negative_control']:.4f}):"
              f" {'PASS' if s['passed'] else 'FAIL'}")
    for dtype in ([] if args.only_e2e else dtypes):
        costs = archs.measure_arch_costs(chosen, dtype=dtype, device=args.device, max_n=args.max_n,
                                         repeats=args.repeats, context_tokens=args.context_tokens)
        result["costs"][dtype] = costs
        print(archs.format_arch_costs(costs))
        save()
    e2e_dtype = args.e2e_dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if e2e_dtype != "none":
        e2e = end_to_end(args.device, e2e_dtype, target_arch=args.e2e_target, draft_arch=args.e2e_draft,
                         new_tokens=args.e2e_tokens, context_tokens=args.context_tokens, repeats=args.repeats,
                         ks=tuple(int(k) for k in args.e2e_ks.split(",")), passes=args.e2e_passes)
        result["end_to_end"] = e2e
        print(format_end_to_end(e2e))
        same = sum(r["identical_to_target_only"] for r in e2e["runs"])
        print(f"end-to-end output identical to target-only in {same} of {len(e2e['runs'])} runs ({e2e_dtype})")
    save()
    print(f"wrote {args.out / 'gpu_costs.json'} in {result['wall_s']:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
