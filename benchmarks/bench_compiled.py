"""Eager vs compiled forwards on a draft/target pair: the verification cost curve and compile time.

Prints figures, never asserts on time. For each model (draft first, then the target once per ``--mode``):

1. the checkpoint is loaded twice: an eager `HFBackend` and a `CompiledHFBackend` (``--draft-mode``,
   ``--mode``; the oneDNN modes repack their copy in place). transformers maps safetensors files, so the two
   copies share the file's pages; only the packed weights are new memory. Construction + `warmup` seconds;
2. forward ms with a warm cache of ``--context`` tokens for n = 1, 2 (draft) or n = 1..17 (target: the cost
   of verifying K = n-1 drafted tokens), eager and compiled *interleaved* (same n back to back), so that
   load from other processes on a shared machine hits both alike;
3. greedy check on the target: eager target-only, compiled target-only and compiled speculative (compiled
   draft, K = ``--k``) for ``--tokens`` new tokens. Speculative must equal compiled target-only (same path);
   against eager the first divergence, if any, is reported with the eager target's top-2 logit margin there.

Memory: the eager target's file pages + the compiled copy's packed weights (+ the dense pages in ``hybrid``)
+ the draft. Several ``--mode`` values are measured one after another; on a small or shared machine run one
mode per invocation.

Each timing is a forward then a `truncate` back to the context (the rollback the decoding loop does); min
and median over ``--reps`` repetitions are printed, in milliseconds.

Example (the default pair, converted by `specdec.models`):

    python benchmarks/bench_compiled.py --threads 2 \
        --draft  ~/.cache/specdec/converted/qwen2.5-coder-0.5b-instruct-q4_k_m-<hash>-v1 \
        --target ~/.cache/specdec/converted/qwen2.5-coder-1.5b-instruct-q4_k_m-<hash>-v1
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec.drafters.model import ModelDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.engine.traces import divergence_with_margin
from specdec.runtimes.compiled import DEFAULT_BUCKETS, MODES, CompiledHFBackend
from specdec.runtimes.hf import HFBackend


def load(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, use_safetensors=True).eval()


def prompt_ids(path: str, length: int) -> list[int]:
    """`length` token ids: the built-in python-code prompt, tokenized with the checkpoint's tokenizer and
    repeated as needed (random ids when the checkpoint ships no tokenizer)."""
    try:
        from transformers import AutoTokenizer

        from specdec.bench.prompts import load_builtin

        tok = AutoTokenizer.from_pretrained(path)
        text = "\n\n".join(p.text for p in load_builtin(["code_python", "technical"], per_type=2))
        ids = tok(text).input_ids
    except Exception:  # noqa: BLE001 - any tokenizer problem: fall back to random ids
        ids = torch.randint(100, 1000, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    return (ids * (length // max(1, len(ids)) + 1))[:length]


def curves(backends: dict, context: list[int], ns: list[int], reps: int) -> dict[str, dict]:
    """``{name: {n: (min ms, median ms)}}`` of ``forward(n tokens)`` + ``truncate(len(context))``, the
    backends measured interleaved (for each repetition, each n, every backend in turn)."""
    feed = context[-32:]
    for b in backends.values():
        b.reset()
        b.forward(context, logits=False)
    times = {name: {n: [] for n in ns} for name in backends}
    for rep in range(reps + 1):  # the first pass warms allocators and caches, not timed
        for n in ns:
            for name, b in backends.items():
                t0 = time.perf_counter()
                b.forward(feed[:n])
                b.synchronize()
                dt = time.perf_counter() - t0
                b.truncate(len(context))
                if rep:
                    times[name][n].append(dt * 1e3)
    for b in backends.values():
        b.reset()
    return {name: {n: (min(v), statistics.median(v)) for n, v in t.items()} for name, t in times.items()}


class Recording:
    """Wraps a backend and keeps the last logits row of every forward (the eager greedy margins)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.rows: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_length(self):
        return self.inner.cache_length

    def forward(self, tokens, *, logits=True, **kw):
        out = self.inner.forward(tokens, logits=logits, **kw)
        if logits and out is not None and len(out):
            self.rows.append(out[-1].clone())
        return out


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def fmt(c: dict[int, tuple[float, float]], n: int) -> str:
    return f"{c[n][0]:8.1f} {c[n][1]:8.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="HF checkpoint dir of the target")
    ap.add_argument("--draft", required=True, help="HF checkpoint dir of the draft")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", default="hybrid",
                    help=f"target mode(s), comma-separated, each measured on a fresh load; of {', '.join(MODES)}")
    ap.add_argument("--draft-mode", choices=MODES, default="inductor")
    ap.add_argument("--buckets", default=",".join(map(str, DEFAULT_BUCKETS)))
    ap.add_argument("--max-length", type=int, default=1024, help="context (static cache slots) of both models")
    ap.add_argument("--context", type=int, default=256, help="tokens in the cache while timing")
    ap.add_argument("--max-n", type=int, default=17)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="new tokens in the greedy check (0: skip)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    modes = args.mode.split(",")
    if any(m not in MODES for m in modes):
        ap.error(f"--mode: expected a comma-separated list of {', '.join(MODES)}")
    buckets = tuple(int(b) for b in args.buckets.split(","))
    ns = list(range(1, args.max_n + 1))
    context = prompt_ids(args.target, args.context)
    report: dict = {"torch": torch.__version__, "threads": args.threads, "modes": modes,
                    "draft_mode": args.draft_mode, "buckets": buckets, "context": args.context,
                    "max_length": args.max_length}
    print(f"torch {torch.__version__}, {args.threads} threads, target modes {modes}, draft mode "
          f"{args.draft_mode}, buckets {buckets}, context {args.context} tokens, max_length {args.max_length}, "
          f"reps {args.reps}; times in ms (min median)", flush=True)

    # ---- draft: single step eager vs compiled; the compiled draft is kept for the speculative check
    t0 = time.perf_counter()
    eager = HFBackend(load(args.draft), max_length=args.max_length)
    draft = CompiledHFBackend(load(args.draft), max_length=args.max_length, buckets=buckets, mode=args.draft_mode)
    d_build = time.perf_counter() - t0
    d_warm = draft.warmup()
    c = curves({"eager": eager, "compiled": draft}, context, [1, 2], args.reps)
    d_eager, d_comp = c["eager"], c["compiled"]
    del eager, c
    gc.collect()
    print(f"draft  1 token: eager {fmt(d_eager, 1)} | compiled {fmt(d_comp, 1)}; 2 tokens: eager "
          f"{fmt(d_eager, 2)} | compiled {fmt(d_comp, 2)} | load+build {d_build:.1f} s, warmup {d_warm:.1f} s, "
          f"peak RSS {rss_gib():.1f} GiB", flush=True)
    report["draft"] = {"eager": d_eager, "compiled": d_comp, "build_s": d_build, "warmup_s": d_warm}

    # ---- target: eager greedy reference, then per mode the interleaved curve and the greedy check
    eager = HFBackend(load(args.target), max_length=args.max_length)
    vocab = min(int(eager.vocab_size), draft.vocab_size)
    prompt = context[: min(64, len(context))]
    eager_ids, rows = None, []
    if args.tokens:
        rec = Recording(eager)
        t0 = time.perf_counter()
        eager_ids = autoregressive_generate(rec, prompt, args.tokens, vocab_size=vocab).token_ids
        print(f"greedy {args.tokens} tokens eager target-only {time.perf_counter() - t0:.1f} s", flush=True)
        rows, rec = rec.rows, None
    report["target"] = {}
    target = None
    for mode in modes:
        target = None
        gc.collect()
        t0 = time.perf_counter()
        target = CompiledHFBackend(load(args.target), max_length=args.max_length, buckets=buckets, mode=mode)
        t_build = time.perf_counter() - t0
        t_warm = target.warmup()
        c = curves({"eager": eager, "compiled": target}, context, ns, args.reps)
        t_eager, t_comp = c["eager"], c["compiled"]
        one = t_eager[1][0]
        print(f"\ntarget [{mode}] load+build {t_build:.1f} s, warmup {t_warm:.1f} s, peak RSS {rss_gib():.1f} GiB")
        print("target forward, warm cache; ratio = compiled min / eager 1-token min")
        print("   n     eager (min  median)   compiled (min median)  ratio")
        for n in ns:
            print(f"  {n:2d}  {fmt(t_eager, n)}     {fmt(t_comp, n)}     {t_comp[n][0] / one:5.2f}")
        checks = {
            "target 5 tokens <= 1.3x eager step": t_comp[5][0] <= 1.3 * one if 5 in t_comp else None,
            "target 17 tokens <= 1.8x eager step": t_comp[17][0] <= 1.8 * one if 17 in t_comp else None,
            "compiled draft step < eager": d_comp[1][0] < d_eager[1][0],
            "compiled target step < eager": t_comp[1][0] < one,
        }
        for name, ok in checks.items():
            print(f"  [{'n/a' if ok is None else 'met' if ok else 'MISSED'}] {name} (by the min times)")
        entry = {"eager": t_eager, "compiled": t_comp, "build_s": t_build, "warmup_s": t_warm, "checks": checks}
        if args.tokens:
            t0 = time.perf_counter()
            comp_ids = autoregressive_generate(target, prompt, args.tokens, vocab_size=vocab).token_ids
            t_ar = time.perf_counter() - t0
            t0 = time.perf_counter()
            spec = speculative_generate(target, ModelDrafter(draft, vocab), prompt, args.tokens, k=args.k,
                                        vocab_size=vocab)
            t_spec = time.perf_counter() - t0
            same = spec.token_ids == comp_ids
            div = divergence_with_margin(eager_ids, comp_ids, lambda seq: rows[len(seq) - len(prompt)], prompt=prompt)
            print(f"greedy {args.tokens} tokens: compiled target-only {t_ar:.1f} s, compiled speculative "
                  f"K={args.k} {t_spec:.1f} s (acceptance {spec.acceptance_rate:.2f}); "
                  f"speculative == target-only: {same}")
            print(f"eager vs compiled target-only: {'identical' if div is None else div}", flush=True)
            entry["greedy"] = {"spec_equals_target_only": same, "divergence_vs_eager": div,
                               "target_only_s": t_ar, "speculative_s": t_spec,
                               "acceptance": spec.acceptance_rate}
        report["target"][mode] = entry
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
