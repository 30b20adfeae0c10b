"""Sampled traces against sampled runs: predicted block efficiency against measured, per drafter, K and
temperature, on a real pair.

Per built-in prompt and temperature: one seeded target-only sampled run, its sampled acceptance trace
(`specdec.engine.sampled_traces.record_sampled_trace`: the draft model's overlap and the model-free drafters'
chains) and the expected block efficiency of each drafter at each K (`expected_run`); then one seeded
speculative run per (drafter, K) (another seed than the trace's: a sampled run is one draw) and its measured
block efficiency (tokens per target forward). Prints per (temperature, drafter, K) and pooled the geometric
mean of predicted / measured with its 95% t-interval over the prompts; nothing here is timed, so the figures
do not depend on the machine's load.

    python benchmarks/sampled_replay.py --prompts 12 --temperatures 0.7,1.0 --ks 4 --max-new-tokens 64 \
        --out results/sampled_replay_check.json
"""

from __future__ import annotations

import argparse
import json
import math


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="transformers", choices=("transformers", "llamacpp"))
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--drafters", default="draft,ngram", help="catalogue drafters: the draft model and model-free ones")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--prompts", type=int, default=12, help="built-in primary prompts (one per type)")
    ap.add_argument("--per-type", type=int, default=1, help="built-in prompts per type")
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first N of those prompts (continue a stopped run; seeds stay per prompt)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write every cell's row as JSON here")
    args = ap.parse_args()

    from specdec.bench.prompts import load_builtin
    from specdec.catalogue.drafters import DraftSource, drafter, single_drafter
    from specdec.core.sampling import SamplingParams
    from specdec.core.stats import ratio_interval
    from specdec.engine.decoding import autoregressive_generate, speculative_generate
    from specdec.engine.sampled_traces import DRAFT_MODEL, expected_run, record_sampled_trace
    from specdec.entrypoints.api import load_pair
    from specdec.measure.environment import machine_info
    from specdec.prompts import encode_prompt

    names = [drafter(n).name for n in args.drafters.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    temps = [float(t) for t in args.temperatures.split(",")]
    pair = load_pair(backend=args.backend, dtype=args.dtype, threads=args.threads,
                     with_draft=any(drafter(n).needs_model for n in names))
    loaded = pair.loaded
    target = loaded.target.backend
    draft = loaded.draft.backend if loaded.draft is not None else None
    vocab = loaded.vocab_size
    prompts = load_builtin(per_type=args.per_type)[: args.prompts]
    m = machine_info("cpu", args.threads)
    print(f"machine: {m['cpu_model']} ({m['host']}), {args.threads} threads; {args.backend} {pair.dtype or 'gguf'}; "
          f"{len(prompts)} prompts, {args.max_new_tokens} new tokens, top-p {args.top_p}")
    rows = []
    for temp in temps:
        sp = SamplingParams(temperature=temp, top_p=args.top_p)
        source = DraftSource(loaded, sp)
        for n, p in enumerate(prompts):
            if n < args.start:
                continue
            ids = encode_prompt(loaded.tokenizer, p.text)
            out = autoregressive_generate(target, ids, args.max_new_tokens, sampling=sp, vocab_size=vocab,
                                          seed=1000 + n).token_ids
            free = {name: (lambda name=name, source=source: single_drafter(name, source)) for name in names
                    if not drafter(name).needs_model}
            trace = record_sampled_trace(target, ids, out, args.max_new_tokens, sp, draft=draft, drafters=free,
                                         k_max=max(ks), vocab_size=vocab)
            for name in names:
                key = DRAFT_MODEL if drafter(name).needs_model else name
                for k in ks:
                    pred = expected_run(trace, key, k)
                    run = speculative_generate(target, single_drafter(name, source), ids, args.max_new_tokens,
                                               k=k, sampling=sp, vocab_size=vocab, seed=n)
                    meas = len(run.token_ids) / len(run.rounds)
                    rows.append({"temperature": temp, "prompt_id": p.id, "prompt_type": p.type, "drafter": name,
                                 "k": k, "predicted": pred.block_efficiency, "measured": meas,
                                 "ratio": pred.block_efficiency / meas})
                    print(f"T={temp} {p.id:24s} {name:6s} K={k:2d} predicted {pred.block_efficiency:.3f} "
                          f"measured {meas:.3f}", flush=True)
    print("\npredicted / measured block efficiency (geometric mean, 95% t-interval over prompts; a prompt's runs "
          "pooled first, its runs sharing its trace):")
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        if not (math.isfinite(r["ratio"]) and r["ratio"] > 0):
            continue
        for key in ((r["temperature"], r["drafter"], r["k"]), ("all", r["drafter"], "all"), ("all", "all", "all")):
            groups.setdefault(key, {}).setdefault(r["prompt_id"], []).append(math.log(r["ratio"]))
    for key, by_prompt in groups.items():
        ci = ratio_interval([math.exp(sum(v) / len(v)) for v in by_prompt.values()])
        runs = sum(len(v) for v in by_prompt.values())
        print(f"  T={key[0]} {key[1]:6s} K={key[2]}: {ci.center:.3f} [{ci.lo:.3f}, {ci.hi:.3f}] "
              f"({ci.n} prompts, {runs} runs)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": m, "args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
