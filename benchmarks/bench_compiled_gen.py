"""Eager vs compiled generation, interleaved: target-only and draft-model speculation on both paths.

Prints figures, never asserts on time. The sweep runs one configuration after another, so on a machine whose
speed drifts (a shared VM) its eager-vs-compiled ratios mix the two paths with the drift between them. Here
both pairs stay loaded in one process (`specdec.runtimes.loading.load_pair` with and without ``compile``) and the
four generations of one block run back to back, in an order rotated every block:

    eager baseline, compiled baseline, eager speculative (K = --k), compiled speculative (K = --k)

so each ratio is taken inside a block of a few minutes and drift hits all four alike. Each timed run is the
same call the sweep makes (`autoregressive_generate` / `speculative_generate` with a `ModelDrafter`),
greedy, ``--tokens`` new tokens; on each prompt every configuration first runs one untimed warm-up
generation. Speculative
output is checked token for token against target-only output on the same path (eager vs eager, compiled vs
compiled); eager vs compiled agreement is reported, not required (kernels round differently).

Memory: two copies of each model (the compiled target's packed weights are new memory); for the default
pair in fp32 that is above 10 GB of weights (`bench_compiled.py` peaked at 22 GiB resident with two target
copies while compiling), so run nothing else beside it on a 24 GiB machine.

Example (the default pair, converted by `specdec.models` on first use):

    python benchmarks/bench_compiled_gen.py --threads 2 --prompts repetitive --blocks 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.bench.prompts import load_builtin, parse_types
from specdec.bench.sweep import encode_prompt
from specdec.drafters.model import ModelDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.runtimes.loading import load_pair

RUNS = ("eager baseline", "compiled baseline", "eager draft", "compiled draft")


def generate(pair, run: str, ids: list[int], n: int, k: int):
    """One greedy generation of `run` (a name from `RUNS`) on `pair`; a `GenerationResult`."""
    common = {"eos_ids": pair.eos_ids, "vocab_size": pair.vocab_size, "seed": 0}
    if run.endswith("baseline"):
        return autoregressive_generate(pair.target.backend, ids, n, **common)
    drafter = ModelDrafter(pair.draft.backend, pair.vocab_size)
    return speculative_generate(pair.target.backend, drafter, ids, n, k=k, **common)


def summarize(records: list[dict]) -> None:
    """Print, per prompt, the median (min-max) over blocks of each within-block ratio and each run's tok/s."""
    for pid in dict.fromkeys(r["prompt"] for r in records):
        blocks: dict[int, dict[str, float]] = {}
        for r in records:
            if r["prompt"] == pid:
                blocks.setdefault(r["block"], {})[r["run"]] = r["tokens_per_s"]
        print(f"\n{pid}: within-block ratios, median (min-max) over {len(blocks)} blocks")
        for num, den in (("compiled draft", "eager baseline"), ("compiled draft", "compiled baseline"),
                         ("eager draft", "eager baseline"), ("compiled baseline", "eager baseline")):
            ratios = [b[num] / b[den] for b in blocks.values()]
            print(f"  {num} / {den}: x{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        for run in RUNS:
            vals = [b[run] for b in blocks.values()]
            print(f"  {run}: median {statistics.median(vals):.2f} tok/s ({min(vals):.2f}-{max(vals):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder:target")
    ap.add_argument("--draft", default="qwen2.5-coder:draft")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default="repetitive", help="prompt types (built-in prompts)")
    ap.add_argument("--per-type", type=int, default=1, help="prompts per type (file order)")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation")
    ap.add_argument("--warmup-tokens", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=4, help="blocks of the four runs per prompt")
    ap.add_argument("--json", help="also write every run's figures to this file")
    ap.add_argument("--summarize", metavar="JSON", help="only print the summary of an earlier --json file")
    args = ap.parse_args()
    if args.summarize:
        summarize(json.loads(Path(args.summarize).read_text())["runs"])
        return

    t0 = time.perf_counter()
    pairs = {}
    for path in ("eager", "compiled"):
        t = time.perf_counter()
        pairs[path] = load_pair(args.target, args.draft, threads=args.threads, compile=path == "compiled")
        compile_s = sum(m.compile_s for m in (pairs[path].target, pairs[path].draft))
        print(f"{path}: loaded in {time.perf_counter() - t:.1f} s ({compile_s:.1f} s compiling)", flush=True)
    print(f"both pairs loaded in {time.perf_counter() - t0:.1f} s", flush=True)

    prompts = load_builtin(parse_types(args.prompts), per_type=args.per_type)
    records = []
    for prompt in prompts:
        ids = {p: encode_prompt(pairs[p].tokenizer, prompt.text) for p in pairs}
        for run in RUNS:  # untimed warm-up of each configuration on this prompt
            pair = pairs[run.split()[0]]
            generate(pair, run, ids[run.split()[0]], args.warmup_tokens, args.k)
        tokens: dict[str, list[int]] = {}
        for block in range(args.blocks):
            order = RUNS[block % 4:] + RUNS[:block % 4]
            tps = {}
            for run in order:
                path = run.split()[0]
                res = generate(pairs[path], run, ids[path], args.tokens, args.k)
                tps[run] = res.summary()["tokens_per_s"]
                prev = tokens.setdefault(run, list(res.token_ids))
                if prev != list(res.token_ids):
                    print(f"  WARNING: {run} output changed between blocks", flush=True)
                records.append({"prompt": prompt.id, "block": block, "run": run, "tokens_per_s": tps[run],
                                "new_tokens": res.num_tokens, "total_s": res.total_s,
                                "accepted": res.num_accepted, "drafted": res.num_drafted})
            print(f"{prompt.id} block {block} ({' > '.join(order)}): "
                  + ", ".join(f"{r} {tps[r]:.2f}" for r in RUNS) + " tok/s; compiled draft / eager baseline "
                  f"x{tps['compiled draft'] / tps['eager baseline']:.2f}", flush=True)
        for path in pairs:
            same = tokens[f"{path} draft"] == tokens[f"{path} baseline"]
            print(f"{prompt.id}: {path} speculative output {'==' if same else 'DIFFERS FROM'} {path} "
                  f"target-only output", flush=True)
        agree = tokens["compiled baseline"] == tokens["eager baseline"]
        print(f"{prompt.id}: compiled target-only output {'==' if agree else '!='} eager target-only output",
              flush=True)

    summarize(records)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": records}, indent=1))


if __name__ == "__main__":
    main()
