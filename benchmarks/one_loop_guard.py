"""B = 1 through the one decoding loop against a reference loop, paired and interleaved.

The decoding loop serves one sequence as B = 1 of the batched loop (`specdec.engine.decoding.generate_batch`
on `specdec.runtimes.base.OneRow`). This benchmark times it beside a reference single-sequence loop loaded
from a file (the loop of an earlier commit: ``git show COMMIT:specdec/engine/decoding.py > old.py``), on the
same loaded pair, prompts, drafter and K policy: per prompt, ABAB... runs (A = reference, B = the one loop,
alternating which goes first), each run's end-to-end tokens/s, the per-prompt geometric mean of B/A, and the
95% t-interval of that ratio over the prompts. Greedy outputs are compared too (they must be identical).

    git show 7304b13:specdec/engine/decoding.py > /tmp/old_loop.py
    python benchmarks/one_loop_guard.py --old-loop /tmp/old_loop.py --backend transformers --drafter draft
    python benchmarks/one_loop_guard.py --old-loop /tmp/old_loop.py --backend llamacpp --drafter ngram
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
from pathlib import Path

# Modules the reference loop imports that have moved since (old path -> current path).
MOVED = {"specdec.engine.metrics": "specdec.core.metrics", "specdec.engine.sampling": "specdec.core.sampling",
         "specdec.engine.verification": "specdec.core.verification"}


def _load(path: str):
    """The reference loop's module, its imports of moved modules pointed at their current paths."""
    source = Path(path).read_text()
    for old, new in MOVED.items():
        source = source.replace(old, new)
    spec = importlib.util.spec_from_loader("reference_loop", loader=None)
    mod = importlib.util.module_from_spec(spec)
    exec(compile(source, path, "exec"), mod.__dict__)  # noqa: S102 (the reference loop the user named)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-loop", required=True, help="the reference loop's decoding.py")
    ap.add_argument("--backend", default="transformers", choices=("transformers", "llamacpp"))
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--drafter", default="draft", help="a catalogue drafter (draft, ngram, suffix, ...)")
    ap.add_argument("--policy", default="cost")
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=6, help="built-in primary prompts (one per type), >= 5")
    ap.add_argument("--repeats", type=int, default=2, help="A/B pairs per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from specdec.bench.prompts import load_builtin
    from specdec.catalogue.drafters import DraftSource, drafter
    from specdec.catalogue.policies import make_policy
    from specdec.core.costs import CostCurve
    from specdec.core.stats import ratio_interval
    from specdec.engine import decoding
    from specdec.entrypoints.api import load_pair
    from specdec.measure.cost_cache import cached_costs
    from specdec.measure.environment import machine_info
    from specdec.prompts import encode_prompt

    old = _load(args.old_loop)
    entry = drafter(args.drafter)
    pair = load_pair(backend=args.backend, dtype=args.dtype, threads=args.threads, with_draft=entry.needs_model)
    loaded = pair.loaded
    costs, note = cached_costs(loaded, pair.cost_key, plan="quick", max_n=args.k + 1)
    curve = CostCurve.from_costs(costs)
    prompts = load_builtin(per_type=1)[: args.prompts]
    m = machine_info("cpu", args.threads)
    print(f"machine: {m['cpu_model']} ({m['host']}), {args.threads} threads, load {m['loadavg_1m']}; "
          f"{args.backend} {pair.dtype or 'gguf'}; drafter {entry.name}, policy {args.policy} K {args.k}; {note}")
    ratios, same = [], 0
    for n, p in enumerate(prompts):
        ids = encode_prompt(loaded.tokenizer, p.text)
        per = []
        for rep in range(args.repeats):
            order = ("old", "new") if (n + rep) % 2 == 0 else ("new", "old")
            tps, toks = {}, {}
            for which in order:
                loop = old if which == "old" else decoding
                d = entry.row(DraftSource(loaded, None, curve))
                pol = make_policy(args.policy, args.k, costs=curve, free_drafts=entry.k_is_cap)
                res = loop.speculative_generate(loaded.target.backend, d, ids, args.max_new_tokens, policy=pol,
                                                eos_ids=loaded.eos_ids, vocab_size=loaded.vocab_size)
                tps[which], toks[which] = res.tokens_per_s, res.token_ids
            per.append(tps["new"] / tps["old"])
            same += toks["new"] == toks["old"]
        r = math.exp(statistics.fmean(math.log(x) for x in per))
        ratios.append(r)
        print(f"  {p.id:24s} new/old {r:.4f} ({', '.join(f'{x:.3f}' for x in per)})")
    ci = ratio_interval(ratios)
    print(f"one loop / reference loop, tokens/s: {ci.center:.4f} [{ci.lo:.4f}, {ci.hi:.4f}] (95% t-interval over "
          f"{ci.n} prompts); identical greedy outputs in {same} of {len(prompts) * args.repeats} pairs")


if __name__ == "__main__":
    main()
