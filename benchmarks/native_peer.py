"""Benchmark: llama.cpp's own speculative decoding (a measured peer) beside specdec's llama.cpp target-only.

For a few built-in prompts (`specdec.bench.prompts.load_builtin`, the primary prompt of each `--types`),
encoded with the target's tokenizer as the sweep does (`--chat-template` wraps them in the chat template),
it runs, interleaved per prompt and repetition (the method order rotates each repetition):

* ``specdec``: specdec's llama.cpp target-only decoding (`autoregressive_generate` on `LlamaCppBackend`),
  in this process;
* ``specdec:<drafter>``: specdec's speculative decoding on that same backend with each `--ours` drafter of
  the catalogue under its default policy (`specdec.entrypoints.api.generate`; default: prompt lookup and
  the suffix drafter);
* ``native:<method>``: llama.cpp's ``llama-server`` (`specdec.bench.native`), one long-lived process per
  method - ``target`` (native target-only), ``draft-simple`` (the native draft model) and every model-free
  ``--spec-type`` this build has (a drafter whose state outlives a request gets a fresh process per run).

All greedy, stopping at an EOS, `--new` tokens, `--threads` threads everywhere. Printed per prompt and
method: tokens/s end to end (new tokens over the engine's prefill + decode time: specdec's ``tokens_per_s``
and the server's ``prompt_ms + predicted_ms``), decode tokens/s (specdec: new tokens / decode seconds;
native: llama.cpp's ``predicted_per_second``, which leaves out the first token), the client's wall-clock
tokens/s for native runs (adds HTTP and JSON), the ratio of end-to-end tokens/s to specdec's target-only on
the same prompt, drafted / accepted tokens, and whether the output equals specdec's target-only ids (``=``,
or the first divergence). Medians over `--reps`. Then, per method, the geometric mean over prompts of its
per-prompt ratio to its own target-only (specdec's drafters over ``specdec``, native drafters over
``native:target``) and to ``specdec``, with the 95% t-interval over prompts (at least 5 prompts for an
interval worth quoting). The machine (CPU, load, versions, the llama.cpp build) is
printed first. Timings on a shared machine are noisy: say so when quoting them.

    python benchmarks/native_peer.py                                  # default pair, 3 prompts, 64 tokens
    python benchmarks/native_peer.py --types code,natural --new 128 --reps 3 --json native.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
from pathlib import Path

DEFAULT_TYPES = "code,repetitive,natural"


def _first_divergence(a: list[int], b: list[int]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"@{i}"
    return "=" if len(a) == len(b) else f"@{min(len(a), len(b))}"


def _machine(threads: int) -> dict:
    from specdec.bench import native
    from specdec.measure.environment import machine_info

    info = machine_info(threads=threads)
    keep = ("cpu_model", "cpus_usable", "memory_gib", "loadavg_1m", "python", "llama_cpp_python", "ggml_env")
    out = {k: info.get(k) for k in keep}
    out["native"] = native.build_info()
    return out


def _prompts(target: Path, types: str, chat_template: bool) -> list[tuple[str, list[int]]]:
    from specdec.bench.prompts import load_builtin
    from specdec.prompts import encode_prompt
    from specdec.runtimes.gguf import hf_tokenizer_from_gguf

    tok = hf_tokenizer_from_gguf(target)
    chosen = load_builtin(types, per_type=1)
    return [(p.id, encode_prompt(tok, p.text, chat_template=chat_template)) for p in chosen]


def _specdec_run(backend, ids: list[int], new: int, eog) -> dict:
    from specdec.engine.decoding import autoregressive_generate

    r = autoregressive_generate(backend, ids, new, eos_ids=eog)
    return {"ids": r.token_ids, "tokens_per_s": r.tokens_per_s, "decode_tokens_per_s": r.decode_tokens_per_s,
            "wall_tokens_per_s": r.tokens_per_s, "drafted": 0, "accepted": 0}  # fmt: skip


def _ours_run(pair, drafter: str, ids: list[int], new: int) -> dict:
    from specdec.entrypoints.api import generate

    r = generate(pair, ids, drafter=drafter, max_new_tokens=new)
    return {"ids": r.token_ids, "tokens_per_s": r.tokens_per_s, "decode_tokens_per_s": r.decode_tokens_per_s,
            "wall_tokens_per_s": r.tokens_per_s, "drafted": r.num_drafted, "accepted": r.num_accepted}


def _native_run(server, ids: list[int], new: int) -> dict:
    r = server.complete(ids, new)
    return {"ids": r.token_ids, "tokens_per_s": r.tokens_per_s, "decode_tokens_per_s": r.decode_tokens_per_s,
            "wall_tokens_per_s": r.wall_tokens_per_s, "drafted": r.draft_n, "accepted": r.draft_accepted,
            "prompt_n": r.prompt_n, "cache_n": r.cache_n}  # fmt: skip


def _interleave(runners: dict, prompts: list, reps: int, runs: list[dict]) -> None:
    """Warm every runner up once, then run each (prompt, runner) `reps` times, the runners' order rotating
    each repetition; appends to `runs` as it goes (a stopped run keeps what was measured)."""
    for fn in runners.values():  # warm-up (a stateful drafter's process is replaced before its next run)
        fn(prompts[0][1][:32])
    names = list(runners)
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for pid, ids in prompts:
            for name in order:
                runs.append({"prompt": pid, "method": name, "rep": rep, **runners[name](ids)})
                r = runs[-1]
                print(f"run {pid} {name} rep={rep}: {r['tokens_per_s']:.2f} tok/s, {len(r['ids'])} tokens, "
                      f"drafted {r['drafted']} accepted {r['accepted']}", flush=True)


def measure(args) -> dict:
    """Run every (prompt, method) `args.reps` times, interleaved; returns the raw runs and the machine."""
    from specdec.bench import native
    from specdec.catalogue.drafters import drafter
    from specdec.entrypoints.api import load_pair
    from specdec.models.loaders import gguf_file

    target, draft = Path(args.target or gguf_file("qwen2.5-coder:target")), None
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else None
    if methods is None:
        methods = ["target", "draft-simple", *native.model_free_methods()]
    if "draft-simple" in methods:
        draft = Path(args.draft or gguf_file("qwen2.5-coder:draft"))
    prompts = _prompts(target, args.types, args.chat_template)
    machine = _machine(args.threads)
    ours = [d.strip() for d in args.ours.split(",") if d.strip()]
    runs: list[dict] = []
    servers = {}
    try:
        for m in methods:
            cfg = native.NativeConfig(target, method=m, draft=draft if m == "draft-simple" else None,
                                      threads=args.threads, n_ctx=args.n_ctx, draft_max=args.draft_max if
                                      m == "draft-simple" else None)  # fmt: skip
            servers[m] = native.NativeServer(cfg).start()
        model = any(drafter(d).needs_model for d in ours)  # a drafter of ours that drafts with the draft model
        draft_gguf = str(draft or args.draft or gguf_file("qwen2.5-coder:draft")) if model else None
        pair = load_pair(target=str(target), draft=draft_gguf, backend="llamacpp", draft_backend="llamacpp",
                         threads=args.threads, with_draft=model)
        backend, eog = pair.loaded.target.backend, pair.loaded.eos_ids  # one context for all of specdec's
        runners = {"specdec": lambda ids: _specdec_run(backend, ids, args.new, eog)}
        for d in ours:
            runners[f"specdec:{d}"] = lambda ids, d=d: _ours_run(pair, d, ids, args.new)
        for m, srv in servers.items():
            runners[f"native:{m}"] = lambda ids, srv=srv: _native_run(srv, ids, args.new)
        _interleave(runners, prompts, args.reps, runs)
    finally:
        for srv in servers.values():
            srv.close()
    machine["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    return {"machine": machine, "target": str(target), "draft": str(draft) if draft else None,
            "new": args.new, "threads": args.threads, "draft_max": args.draft_max, "runs": runs}  # fmt: skip


def summarize(result: dict) -> list[dict]:
    """One row per (prompt, method): medians over repetitions, the ratio to specdec's target-only tokens/s,
    and whether the ids equal specdec's target-only ids (``=``, else ``@i``, the first divergence)."""
    rows = []
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for r in result["runs"]:
        by_cell.setdefault((r["prompt"], r["method"]), []).append(r)
    for (pid, method), rs in by_cell.items():
        ref = by_cell[(pid, "specdec")]
        med = {k: statistics.median(r[k] for r in rs) for k in ("tokens_per_s", "decode_tokens_per_s",
                                                                "wall_tokens_per_s", "drafted", "accepted")}
        base = statistics.median(r["tokens_per_s"] for r in ref)
        same = {_first_divergence(r["ids"], ref[0]["ids"]) for r in rs}
        rows.append({"prompt": pid, "method": method, **med, "vs_specdec": med["tokens_per_s"] / base,
                     "new_tokens": len(rs[0]["ids"]), "equal": ",".join(sorted(same))})  # fmt: skip
    return rows


def pooled(rows: list[dict]) -> list[dict]:
    """Per method: the geometric mean over prompts of its per-prompt ratio to its own target-only
    (``specdec:*`` over ``specdec``, ``native:*`` over ``native:target``) and to ``specdec``, each with the 95%
    t-interval over prompts (`specdec.core.stats.ratio_interval`)."""
    from specdec.core.stats import ratio_interval

    cell = {(r["prompt"], r["method"]): r["tokens_per_s"] for r in rows}
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        own = "native:target" if method.startswith("native:") else "specdec"
        prompts = [p for (p, m) in cell if m == method and (p, own) in cell]
        vs_own = ratio_interval([cell[(p, method)] / cell[(p, own)] for p in prompts])
        vs_specdec = ratio_interval([cell[(p, method)] / cell[(p, "specdec")] for p in prompts])
        out.append({"method": method, "own": own, "n": len(prompts), "vs_own": vs_own, "vs_specdec": vs_specdec})
    return out


def print_table(result: dict, rows: list[dict]) -> None:
    print("machine (shared; timings are noisy):", json.dumps(result["machine"], sort_keys=True))
    print(f"target {result['target']}  draft {result['draft']}  new={result['new']} "
          f"threads={result['threads']} draft_max={result['draft_max'] or 'llama.cpp default'}")  # fmt: skip
    head = f"{'prompt':<16}{'method':<22}{'tok/s':>8}{'decode':>8}{'wall':>8}{'x specdec':>10}"
    print(head + f"{'drafted':>9}{'accepted':>9}{'tokens':>7}  out")
    for r in rows:
        print(f"{r['prompt']:<16}{r['method']:<22}{r['tokens_per_s']:8.2f}{r['decode_tokens_per_s']:8.2f}"
              f"{r['wall_tokens_per_s']:8.2f}{r['vs_specdec']:10.2f}{r['drafted']:9.0f}{r['accepted']:9.0f}"
              f"{r['new_tokens']:7d}  {r['equal']}")  # fmt: skip
    print("\nper method, geometric mean over prompts [95% t-interval] (n prompts):")
    for p in pooled(rows):
        own, sd = p["vs_own"], p["vs_specdec"]
        print(f"{p['method']:<22} vs {p['own']:<14} {own.center:.3f} [{own.lo:.3f}, {own.hi:.3f}]   "
              f"vs specdec {sd.center:.3f} [{sd.lo:.3f}, {sd.hi:.3f}]  ({p['n']})")


def _terminate(signum, frame) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through measure()'s finally: servers stop


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=DEFAULT_TYPES, help="prompt types (primary prompt of each)")
    ap.add_argument("--methods", default=None, help="native methods (default: target, draft-simple, ngram-*)")
    ap.add_argument("--ours", default="ngram,suffix", help="specdec drafters (catalogue names), default policy")
    ap.add_argument("--new", type=int, default=64, help="new tokens per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--draft-max", type=int, default=None, help="--spec-draft-n-max (llama.cpp default: 3)")
    ap.add_argument("--target", default=None, help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the default pair's)")
    ap.add_argument("--chat-template", action="store_true", help="wrap prompts in the chat template")
    ap.add_argument("--json", default=None, help="also write the raw runs and the machine here")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    result = measure(args)
    rows = summarize(result)
    print_table(result, rows)
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
