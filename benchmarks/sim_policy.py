"""Replay benchmark: adaptive K policies against every fixed K on the real acceptance sequences of a sweep.

Under greedy decoding the committed sequence is the target's greedy output whatever K or policy is used, so
whether the draft would accept at output position p is a fixed fact of the prompt: the draft model's greedy
token at p (given the target's prefix) equals the target's token, or it does not; prompt lookup's proposal
at p depends only on the prefix too. This script takes each primary prompt's target-only output from a
results store, computes that acceptance sequence once (one draft forward over prompt + output; prompt lookup
in pure Python), and replays any policy against it on the store's measured cost curve: a round with K
tokens costs ``K * draft_step_s + T(K + 1)`` seconds (the cost model of `specdec.policies.CostPolicy`, the
same for every policy) and yields its accepted prefix plus one token.

So it compares policies on identical text and identical costs, free of the machine drift that a timed sweep
carries, in about a minute. It is a model, not a measurement: it omits the draft's prefill after a bonus
token, rollback time and timing noise, so its absolute speedups are not the sweep's. The timed check is
`benchmarks/bench_policy.py` on a sweep. Prints PASS / FAIL for the issue-7 targets (policy within 10% of
the best fixed K, never below 0.95x the baseline); asserts nothing, exits 0.

    python benchmarks/sim_policy.py --db results/archive/study.db                      # draft model and prompt lookup
    python benchmarks/sim_policy.py --db results/archive/study.db --methods ngram --policies cost,heuristic
    python benchmarks/sim_policy.py --db results/archive/study.db --synthetic --cost-kw '{"explore_z": 0}'

``--synthetic`` replays i.i.d. acceptance instead (each draft position accepted with probability alpha, 40
seeded sequences per alpha, the draft model's cost), where the best fixed K is known from theory: it shows
what a policy costs on text below break-even and how close it gets above.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

FIXED_KS = (1, 2, 3, 4, 6, 8, 12, 16)


def draft_matches(draft_model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> list[bool]:
    """``m[p]``: the draft's greedy token at output position p, given the prompt and the target's first p
    output tokens, equals the target's token p. One forward of the draft over prompt + output.

    Args:
        draft_model: a transformers causal LM.
        prompt_ids, output_ids: token ids (the target's greedy output after the prompt).
    """
    import torch

    ids = torch.tensor([list(prompt_ids) + list(output_ids)])
    with torch.inference_mode():
        logits = draft_model(ids).logits[0]  # [len(prompt) + len(output), vocab]
    n0 = len(prompt_ids)
    pred = logits[n0 - 1:n0 - 1 + len(output_ids)].argmax(-1).tolist()
    return [int(a) == int(b) for a, b in zip(pred, output_ids)]


def prefix_acceptor(matches: Sequence[bool]) -> Callable[[int, int], tuple[int, int]]:
    """``(p, k) -> (k, accepted)`` for a drafter whose token at output position i is right iff
    ``matches[i]``: K tokens drafted at p, accepted up to the first miss."""
    def accepted_from(p: int, k: int) -> tuple[int, int]:
        a = 0
        while a < k and p + a < len(matches) and matches[p + a]:
            a += 1
        return k, a

    return accepted_from


def replay(
    policy,
    n_out: int,
    accepted_from: Callable[[int, int], tuple[int, int]],
    round_cost_s: Callable[[int], float],
    *,
    max_k: int,
    trace: list | None = None,
) -> tuple[float, int, float]:
    """Replay one generation of `n_out` tokens.

    Args:
        policy: a `specdec.policies` K policy (started here).
        accepted_from: ``(p, k) -> (proposed, accepted)`` at output position p for K = k.
        round_cost_s: ``proposed -> seconds`` of one round.
        max_k: the engine's cap on K.
        trace: if given, ``(p, K, accepted, alpha estimate, upper bound)`` of every round is appended to it
            (None where the policy has no estimate / bound).

    Returns:
        (seconds, rounds, mean proposed K).
    """
    from specdec.metrics import RoundRecord

    policy.start()
    p, secs, rounds, drafted = 0, 0.0, 0, 0
    while p < n_out:
        k = min(policy.next_k(), max_k, n_out - p - 1) if n_out - p > 1 else 0
        k = max(k, 0)
        proposed, acc = accepted_from(p, k) if k > 0 else (0, 0)
        secs += round_cost_s(proposed)
        rec = RoundRecord(
            k=proposed, num_accepted=acc, accept_flags=tuple([True] * acc + ([False] if acc < proposed else [])),
            next_kind="bonus" if acc == proposed else "recovered", num_emitted=acc + 1,
        )
        if trace is not None:
            alpha = getattr(policy, "alpha_estimate", lambda: None)()
            upper = getattr(policy, "upper_alpha", lambda: None)()
            trace.append((p, proposed, acc, alpha, upper))
        policy.observe(rec)
        p += acc + 1
        rounds += 1
        drafted += proposed
    return secs, rounds, drafted / max(rounds, 1)


def make(name: str, costs: dict, max_k: int, cost_kw: dict):
    """The policy `name` for a replay: `CostPolicy` with `cost_kw` for ``cost``, else `make_policy`."""
    from specdec.policies import CostPolicy, make_policy

    if name == "cost":
        return CostPolicy.from_costs(costs, max_k=max_k, **cost_kw)
    return make_policy(name, max_k, costs=costs)


def synthetic(policies: Sequence[str], costs: dict, cost_kw: dict, max_k: int, *, n_out: int = 128,
              seeds: int = 40) -> None:
    """Print mean speedups over plain decoding (replayed cost model) of fixed K and `policies` on i.i.d.
    acceptance sequences (alpha = 0 ... 0.95, `seeds` sequences of `n_out` tokens each)."""
    import random
    import statistics

    from specdec.policies import CostPolicy, make_policy

    shape = CostPolicy.from_costs(costs, max_k=max(FIXED_KS))
    t1 = shape.round_cost_s[0]
    cost = shape.round_cost_s.__getitem__
    print(f"i.i.d. acceptance, c = {shape.c:.2f}: mean speedup over {seeds} sequences of {n_out} tokens")
    print(f"{'alpha':>5} " + " ".join(f"K={k:<3}" for k in FIXED_KS) + " " + " ".join(f"{p:>9}" for p in policies))
    for alpha in (0.0, 0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        res: dict = {}
        for seed in range(seeds):
            rng = random.Random(seed)
            acc_from = prefix_acceptor([rng.random() < alpha for _ in range(n_out)])

            for k in FIXED_KS:
                secs = replay(make_policy("fixed", k), n_out, acc_from, cost, max_k=k)[0]
                res.setdefault(k, []).append(n_out * t1 / secs)
            for name in policies:
                secs = replay(make(name, costs, max_k, cost_kw), n_out, acc_from, cost, max_k=max_k)[0]
                res.setdefault(name, []).append(n_out * t1 / secs)
        print(f"{alpha:5.2f} " + " ".join(f"{statistics.mean(res[k]):5.2f}" for k in FIXED_KS) + " "
              + " ".join(f"{statistics.mean(res[p]):9.3f}" for p in policies))


def _store(db: str, sweep: str | None) -> tuple[str, list[tuple[str, str, list[int]]], dict]:
    """(sweep id, [(prompt_id, prompt_type, baseline token ids)], the stored costs) of the sweep's first
    configuration; the sweep is chosen as `specdec report` chooses it (id, unique prefix, or the newest)."""
    from specdec.bench.store import Store
    from specdec.report import load_store

    data = load_store(db, sweep)
    base = data.runs[(data.runs["method"] == "baseline") & data.runs["error"].isna()].sort_values("run_id")
    if base.empty:
        raise SystemExit(f"sweep {data.sweep_id} of {db} has no successful baseline run")
    config = str(base["config_label"].iloc[0])
    prompts = base[base["config_label"] == config].drop_duplicates("prompt_id")
    with Store(db) as st:
        outs = [(pid, ptype, st.baseline_tokens(data.sweep_id, config, pid))
                for pid, ptype in zip(prompts["prompt_id"], prompts["prompt_type"], strict=True)]
        costs = st.load_costs(data.sweep_id, config)
    if costs is None:
        raise SystemExit(f"sweep {data.sweep_id} of {db} has no stored costs for {config}")
    return data.sweep_id, outs, costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="results/archive/study.db", help="SQLite results store with baseline runs and costs")
    ap.add_argument("--sweep", default=None, help="sweep id or prefix (default: the newest)")
    ap.add_argument("--draft", default="qwen2.5-coder:draft", help="draft model spec (the store's pair)")
    ap.add_argument("--methods", default="draft,ngram")
    ap.add_argument("--policies", default="cost,heuristic")
    ap.add_argument("--max-k", type=int, default=16, help="policies' maximum / heuristic's starting K")
    ap.add_argument("--cost-kw", default="{}", help="JSON keyword arguments for CostPolicy (e.g. '{\"decay\": 0.9}')")
    ap.add_argument("--within", type=float, default=0.10)
    ap.add_argument("--floor", type=float, default=0.95)
    ap.add_argument("--trace", default=None, help="prompt id: print the draft's per-position matches (draft method) "
                    "and each policy's rounds (position:K/accepted@estimate^bound)")
    ap.add_argument("--synthetic", action="store_true", help="replay i.i.d. acceptance at alpha = 0 ... 0.95 "
                    "on the store's draft-model costs instead of the prompts' sequences")
    args = ap.parse_args()

    from specdec.bench.prompts import load_builtin
    from specdec.bench.sweep import encode_prompt
    from specdec.drafters import PromptLookupDrafter
    from specdec.policies import CostPolicy, make_policy

    sweep, outs, costs = _store(args.db, args.sweep)
    if args.trace is not None and args.trace not in {pid for pid, _, _ in outs}:
        raise SystemExit(f"--trace {args.trace}: no such prompt with a baseline in sweep {sweep} of {args.db}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if args.synthetic:
        synthetic(policies, {"draft_step_s": costs["draft_step_s"] or 0.0,
                             "target_forward_s": costs["target_forward_s"]}, json.loads(args.cost_kw), args.max_k)
        return
    texts = {p.id: p.text for p in load_builtin()}
    print(f"sweep {sweep} ({args.db}): {len(outs)} prompts; draft step {costs['draft_step_s'] or 0.0:.4f} s, "
          f"target step {costs['target_forward_s'][1]:.4f} s")

    model = None
    if "draft" in methods:
        from specdec.loading import load_model

        lm = load_model(args.draft)
        model, tok = lm.hf_model, lm.tokenizer
    else:  # prompt lookup only: the pair's tokenizer is enough
        from specdec.models import hf_tokenizer

        tok = hf_tokenizer(args.draft)

    shortfalls: dict[str, list[str]] = {p: [] for p in policies}
    slow: dict[str, list[str]] = {p: [] for p in policies}
    header = f"{'method':6} {'prompt':22} {'base':>5} " + " ".join(f"K={k:<3}" for k in FIXED_KS)
    header += " " + " ".join(f"{p[:4] + '/mean K':<10}" for p in policies) + " best"
    for method in methods:
        d = (costs["draft_step_s"] or 0.0) if method == "draft" else 0.0
        pol_costs = {"draft_step_s": d, "target_forward_s": costs["target_forward_s"]}
        shape = CostPolicy.from_costs(pol_costs, max_k=max(FIXED_KS))
        t1 = shape.round_cost_s[0]

        def cost(n: int, _s=shape) -> float:
            return _s.round_cost_s[n]

        print(f"\n{method}: speedups over target-only on the replayed cost model (c = {shape.c:.2f})")
        print(header)
        for pid, ptype, out in outs:
            if pid not in texts:
                continue
            prompt_ids = encode_prompt(tok, texts[pid])
            n = len(out)
            if method == "draft":
                m = draft_matches(model, prompt_ids, out)
                if pid == args.trace:
                    print(f"  {pid} draft matches target (1) per output position: "
                          + "".join("1" if x else "." for x in m))
                acc_from = prefix_acceptor(m)
            else:
                seq = list(prompt_ids) + list(out)
                n0 = len(prompt_ids)
                look = PromptLookupDrafter()

                def acc_from(p: int, k: int, _seq=seq, _n0=n0, _look=look) -> tuple[int, int]:
                    prop = _look.propose(_seq[:_n0 + p], k, None, None).tokens
                    a = 0
                    while a < len(prop) and _n0 + p + a < len(_seq) and prop[a] == _seq[_n0 + p + a]:
                        a += 1
                    return len(prop), a
            base = n * t1
            fixed = {}
            for k in FIXED_KS:
                secs, _, _ = replay(make_policy("fixed", k), n, acc_from, cost, max_k=k)
                fixed[k] = base / secs
            pol, mean_ks = {}, {}
            for name in policies:
                polobj = make(name, pol_costs, args.max_k, json.loads(args.cost_kw))
                trace = [] if pid == args.trace else None
                secs, _, mean_k = replay(polobj, n, acc_from, cost, max_k=args.max_k, trace=trace)
                if trace is not None:
                    print(f"  {pid} {name} (position:K/accepted@estimate^upper bound): " + " ".join(
                        f"{q}:{k}/{a}" + (f"@{al:.2f}" if al is not None else "")
                        + (f"^{up:.2f}" if up is not None else "") for q, k, a, al, up in trace))
                pol[name] = base / secs
                mean_ks[name] = mean_k
            best_k = max(fixed, key=fixed.get)
            line = f"{method:6} {pid:22} {1.0:5.2f} " + " ".join(f"{fixed[k]:5.2f}" for k in FIXED_KS)
            line += " " + " ".join(f"{pol[p]:5.2f}/{mean_ks[p]:<4.1f}" for p in policies) + f"  K={best_k}"
            print(line)
            for name in policies:
                if pol[name] < (1 - args.within) * fixed[best_k]:
                    shortfalls[name].append(f"{method}/{ptype}")
                if pol[name] < args.floor:
                    slow[name].append(f"{method}/{ptype}")
    print()
    for name in policies:
        s, f = shortfalls[name], slow[name]
        print(f"{name}: within {args.within:.0%} of the best fixed K everywhere: "
              f"{'PASS' if not s else 'FAIL (' + ', '.join(s) + ')'}")
        print(f"{name}: never below {args.floor:.2f}x the baseline: {'PASS' if not f else 'FAIL (' + ', '.join(f) + ')'}")


if __name__ == "__main__":
    main()
