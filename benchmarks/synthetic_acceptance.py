"""Benchmark: specdec's loop and llama.cpp's own at a set acceptance, against the analytical model.

Both loops decode one built-in prompt on the same GGUF files (`--type`'s primary prompt), greedy, with the
draft model drafting exactly K tokens every round, and accept draft position i with probability alpha given
that the earlier ones passed, whatever the tokens (llama.cpp: ``llama-server --spec-type draft-simple
--spec-draft-n-max K --spec-draft-n-min K --spec-synth-rates alpha,alpha^2,..,alpha^K``; specdec:
``speculative_generate(..., synthetic=[alpha] * K)``): the rounds cost what real rounds cost, the acceptance
is set, so the comparison is of the loops, not of the drafts. Every (alpha, K) cell is run on both loops once
per repetition, each repetition with its own seed and the cells in a rotated order; every repetition also
runs each loop's target-only decoding before and after its cells (specdec's `autoregressive_generate`;
llama-server without a draft), and a speculative run's speedup is its decode rate over the mean of its own
loop's two target-only runs of that repetition. EOS is ignored on both sides (llama.cpp bans it; specdec
passes no EOS ids), so every run decodes `--new` tokens. Each native configuration has one server process,
started and warmed up by a 4-token request at its first use and kept (an idle server waits without
computing), so only one loop computes at a time and no timed figure includes a process start.

Printed per (alpha, K) and loop: decode tokens/s, tokens per round (measured), the speedup over its own
target-only (geometric mean over repetitions, 95% t-interval; fewer than 5 repetitions are labelled so),
the analytical prediction ``E[tokens per round] t_target(1) / round_s(K)`` (Leviathan et al. 2023, with the
round priced on the cost curve measured at the start on specdec's llama.cpp backend:
`specdec.core.costs.CostCurve.round_s`, the draft's K steps and catch-up plus ``t_target(K+1)``), and
measured/predicted, also at the tokens per round the runs drew (``at drawn``: the cost model's error without
the draws' noise). Then per loop and K, what a round costs beyond its forwards: the round's wall time minus
that predicted time of its forwards
(llama.cpp: ``predicted_ms`` over its rounds; specdec: its round records), and per token of target-only,
the step's wall time minus ``t_target(1)``. Both loops are priced on specdec's curve: llama-server is another
build of llama.cpp, so part of a native gap can be its kernels rather than its loop; native target-only's
own step says how much.

    SPECDEC_NATIVE_BIN_DIR=DIR python benchmarks/synthetic_acceptance.py --reps 5 --json synth.json
    python benchmarks/synthetic_acceptance.py --from-json synth.json      # the tables again
    python benchmarks/synthetic_acceptance.py --from-json synth.json --db STORE   # into `specdec report`'s

The summary is `specdec.report.synthetic.summarize`, the same code the report's table runs on a stored
measurement (``--db``: attached to the store's newest sweep, or ``--sweep``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from specdec.report.synthetic import summarize


def _prompt(target: Path, kind: str) -> list[int]:
    from specdec.bench.prompts import load_builtin
    from specdec.prompts import encode_prompt
    from specdec.runtimes.gguf import hf_tokenizer_from_gguf

    return encode_prompt(hf_tokenizer_from_gguf(target), load_builtin(kind, per_type=1)[0].text)


def _specdec(pair, ids: list[int], new: int, k: int, alpha: float, seed: int) -> dict:
    from specdec.catalogue.drafters import DRAFT_MODEL, DraftSource, single_drafter
    from specdec.engine.decoding import autoregressive_generate, speculative_generate

    target = pair.loaded.target.backend
    if k == 0:
        r = autoregressive_generate(target, ids, new)
    else:
        drafter = single_drafter(DRAFT_MODEL, DraftSource(pair.loaded))
        r = speculative_generate(target, drafter, ids, new, k=k, synthetic=[alpha] * k, seed=seed)
    rounds = [x for x in r.rounds if x.k == k] or r.rounds
    return {"decode_tokens_per_s": r.decode_tokens_per_s, "tokens": len(r.token_ids), "rounds": len(r.rounds),
            "round_s": statistics.fmean(x.draft_s + x.verify_s + x.other_s for x in rounds),
            "forward_s": statistics.fmean(x.forward_s for x in rounds),
            "draft_s": statistics.fmean(x.draft_s for x in rounds)}  # fmt: skip


def _native(server, ids: list[int], new: int, seed: int) -> dict:
    r = server.complete(ids, new, ignore_eos=True, seed=seed)
    # the first token comes from the prefill; every decode round adds its accepted drafts plus one token
    rounds = max(1, r.predicted_n - 1 - (r.draft_accepted or 0))
    return {"decode_tokens_per_s": r.decode_tokens_per_s, "tokens": r.predicted_n, "rounds": rounds,
            "round_s": r.predicted_ms / 1000 / rounds, "drafted": r.draft_n, "accepted": r.draft_accepted}


def _servers(args, target: Path, draft: Path, cells) -> dict:
    from specdec.bench import native

    servers = {0: native.NativeServer(native.NativeConfig(target, threads=args.threads))}
    for alpha, k in cells:
        rates = ",".join(f"{alpha ** (i + 1):.6g}" for i in range(k))
        cfg = native.NativeConfig(target, method="draft-simple", draft=draft, threads=args.threads, draft_max=k,
                                  extra_args=("--spec-draft-n-min", str(k), "--spec-synth-rates", rates))
        servers[(alpha, k)] = native.NativeServer(cfg)
    return servers


def measure(args) -> dict:
    """Costs first, then `args.reps` repetitions of: both target-only runs, every cell on both loops (rotated
    order), both target-only runs again."""
    from specdec.bench import native
    from specdec.entrypoints.api import load_pair
    from specdec.measure.environment import machine_info
    from specdec.measure.timing import measure_costs
    from specdec.models.loaders import gguf_file

    target = Path(args.target or gguf_file("qwen2.5-coder:target"))
    draft = Path(args.draft or gguf_file("qwen2.5-coder:draft"))
    rates = [float(x) for x in args.rates.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    cells = [(a, k) for a in rates for k in ks]
    pair = load_pair(target=str(target), draft=str(draft), backend="llamacpp", threads=args.threads)
    ids = _prompt(target, args.type)
    costs = measure_costs(pair.loaded, max_n=max(ks) + 1, repeats=args.cost_repeats)
    out = {"created_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": {**machine_info(threads=args.threads), "native": native.build_info()}, "new": args.new,
           "threads": args.threads, "type": args.type, "prompt_tokens": len(ids), "costs": costs, "runs": []}
    servers = _servers(args, target, draft, cells)
    _specdec(pair, ids[:16], 8, 0, 0.0, 0)  # warm-up of specdec's contexts
    try:
        for rep in range(args.reps):
            seed = args.seed + rep
            order = cells[rep % len(cells) :] + cells[: rep % len(cells)]
            for phase in ("before", *order, "after"):
                for loop in ("specdec", "native"):
                    alpha, k = (None, 0) if isinstance(phase, str) else phase
                    if loop == "specdec":
                        row = _specdec(pair, ids, args.new, k, alpha or 0.0, seed)
                    else:
                        srv = servers[0 if k == 0 else phase]
                        if srv.port is None:  # started and warmed up once, outside any timed figure
                            srv.start().complete(ids[:16], 4, ignore_eos=True)
                        row = _native(srv, ids, args.new, seed)
                    out["runs"].append({"rep": rep, "loop": loop, "alpha": alpha, "k": k, **row})
                    print(f"rep {rep} {loop:<8} alpha={alpha} K={k}: {row['decode_tokens_per_s']:.2f} tok/s, "
                          f"{row['tokens'] / row['rounds']:.2f} tokens/round", flush=True)
    finally:
        for srv in servers.values():
            srv.close()
    out["machine"]["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    return out


def print_table(result: dict, rows: list[dict]) -> None:
    m = result["machine"]
    print(f"machine (shared; timings are noisy): {m.get('cpu_model')}, {result['threads']} threads, load "
          f"{m.get('loadavg_1m')} -> {m.get('loadavg_1m_after')}; llama-server {m['native'].get('version')}")
    c = result["costs"]
    print(f"costs (specdec's llama.cpp backend): t_target(1) {c['target_step_s'] * 1e3:.1f} ms, t_draft "
          f"{c['draft_step_s'] * 1e3:.1f} ms (c = {c['c']:.3f}); prompt {result['type']} "
          f"({result['prompt_tokens']} tokens), {result['new']} new tokens")
    print(f"{'loop':<8}{'alpha':>6}{'K':>4}{'tok/s':>8}{'tok/round':>10}{'(model)':>8}  {'speedup [95% CI]':>22}"
          f"{'predicted':>10}{'meas/pred':>10}{'at drawn':>9}{'round ms':>9}{'beyond ms':>10}")
    for r in rows:
        if r["k"] == 0:
            print(f"{r['loop']:<8}{'-':>6}{0:>4}{r['decode_tokens_per_s']:8.2f}{1:10.2f}{1:8.2f}  {'1 (own target-only)':>22}"
                  f"{'':>10}{'':>10}{'':>9}{r['round_s'] * 1e3:9.1f}{r['beyond_s'] * 1e3:10.1f}")  # fmt: skip
            continue
        s = r["speedup"]
        label = "" if r["n"] >= 5 else f" ({r['n']} reps)"
        print(f"{r['loop']:<8}{r['alpha']:6.2f}{r['k']:4d}{r['decode_tokens_per_s']:8.2f}{r['tokens_per_round']:10.2f}"
              f"{r['expected_tokens_per_round']:8.2f}  {f'{s.center:.3f} [{s.lo:.3f}, {s.hi:.3f}]{label}':>22}"
              f"{r['predicted']:10.3f}{s.center / r['predicted']:10.3f}{s.center / r['predicted_at_drawn']:9.3f}"
              f"{r['round_s'] * 1e3:9.1f}"
              f"{r['beyond_s'] * 1e3:10.1f}")  # fmt: skip


def print_split(result: dict) -> None:
    """specdec's rounds taken apart from its round records: the target forward and the drafting in the loop
    beside the curve's (the first round's drafting holds the draft's deferred prefill), and the rest (the
    Python loop: verification, rollback, bookkeeping), ms per round, means over repetitions."""
    from specdec.core.costs import CostCurve

    curve = CostCurve.from_costs(result["costs"])
    cells: dict[tuple, list[dict]] = {}
    for r in result["runs"]:
        if r["loop"] == "specdec" and r["k"]:
            cells.setdefault((r["alpha"], r["k"]), []).append(r)
    print("\nspecdec's round, ms: target forward in the loop (curve), drafting in the loop (curve), the rest")
    for (alpha, k), rs in cells.items():
        fwd, dr = statistics.fmean(r["forward_s"] for r in rs), statistics.fmean(r["draft_s"] for r in rs)
        rest = statistics.fmean(r["round_s"] for r in rs) - fwd - dr
        print(f"alpha {alpha:.2f} K {k:2d}: {fwd * 1e3:7.1f} ({curve.forward_s(k + 1) * 1e3:6.1f})"
              f"  {dr * 1e3:7.1f} ({curve.draft_round_s(k) * 1e3:6.1f})  {rest * 1e3:5.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="0.3,0.5,0.7,0.9", help="acceptance rates alpha")
    ap.add_argument("--ks", default="2,4,8", help="K values (the draft model drafts exactly K)")
    ap.add_argument("--type", default="natural", help="built-in prompt type (its primary prompt)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="repetition r draws its acceptances with seed + r")
    ap.add_argument("--cost-repeats", type=int, default=5)
    ap.add_argument("--target", default=None, help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the default pair's)")
    ap.add_argument("--json", default=None, help="also write the raw runs, costs and machine here")
    ap.add_argument("--from-json", default=None, help="print the tables of an earlier --json instead of running")
    ap.add_argument("--db", default=None, help="also attach the measurement (or --from-json's) to a sweep of this "
                    "results store, where `specdec report` shows it beside the native methods")
    ap.add_argument("--sweep", default=None, help="with --db: the sweep id (default: the store's newest sweep)")
    args = ap.parse_args(argv)
    # a wrong store or sweep fails before the measurement, not after it
    sweep_id = _sweep_of(args.db, args.sweep) if args.db else None
    result = json.loads(Path(args.from_json).read_text()) if args.from_json else measure(args)
    rows = summarize(result)
    print_table(result, rows)
    print_split(result)
    if args.json and not args.from_json:
        doc = {**result, "rows": [{**r, "speedup": asdict(r["speedup"])} if "speedup" in r else r for r in rows]}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
    if sweep_id is not None:
        from specdec.bench.store import Store

        with Store(args.db) as st:
            st.save_synthetic(sweep_id, {k: v for k, v in result.items() if k != "rows"})
        print(f"attached to sweep {sweep_id} of {args.db}")


def _sweep_of(db: str, sweep: str | None) -> str:
    """The sweep of `db` the measurement is attached to: `sweep` (an id or unique prefix) or the newest."""
    from specdec.report.load import load_store

    if not Path(db).is_file():
        raise SystemExit(f"--db {db}: no such results store (run `specdec sweep` first)")
    sweep_id = load_store(db, sweep).sweep_id
    if sweep_id is None:
        raise SystemExit(f"--db {db}: the store holds no sweep to attach the measurement to")
    return sweep_id


if __name__ == "__main__":
    main()
