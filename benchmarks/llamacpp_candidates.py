"""Benchmark: which llama.cpp target gives speculative decoding the cheapest verification on this CPU.

For each candidate - the shipped GGUF with weight repacking off and on, and copies requantized from it with
llama.cpp's own quantizer (Q4_0, IQ4_NL, Q8_0; pure, repacking on; made once into the model cache by
`specdec.models.requant.requantized_gguf`, the files the ``llamacpp-q4_0`` ... sweep configurations run) -
it prints the single step t(1) in ms and the verification cost curve v(n) = t(n) / t(1) on a warm cache for
n = 1..17, the roofline per width (`specdec.measure.roofline.shape_roofline`: GOP/s each width reaches, counting the
GGUF's weight-matrix FLOPs per token, and the v(n) kernels running every width at the best measured
throughput would give), and the candidate's quality: greedy agreement over `--new` tokens of each built-in
primary prompt (`specdec.measure.agreement`: first divergence position, share of identical tokens) with the shipped
file as it runs by default and, with `--fp32-reference`, with the fp32 transformers reference of the same
target (the converted checkpoint, loaded through `specdec.runtimes.loading`; slow: it loads 6 GB of fp32 weights for
the 1.5B target). Every model sees the same prompt ids. Prints figures; asserts nothing (timings on a shared machine
are noisy).

Method: every candidate is loaded once; the timed forwards are interleaved - for each repetition, each n,
each candidate in turn - so a drift of the machine's speed hits every candidate alike; the median over
`--reps` is printed. Each timed forward of n tokens is rolled back (one ``truncate``) before the next.
Run it on a quiet machine: ggml's worker threads spin, so another busy process makes n >= 9 erratic.

    python benchmarks/llamacpp_candidates.py                       # the default pair's target
    python benchmarks/llamacpp_candidates.py --fp32-reference --json candidates.json   # quality vs fp32 too
    python benchmarks/llamacpp_candidates.py --gguf model.gguf --types Q4_0,Q8_0 --reps 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

NS = tuple(range(1, 18))
CONTEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n" * 2


def candidates(src: Path, types: list[str], threads: int) -> list[tuple[str, Path, bool]]:
    """(label, GGUF path, repack) per candidate; requantized files are made once into the model cache
    (`specdec.models.requant.requantized_gguf`, the same files the sweep's ``llamacpp-<type>`` configurations
    load)."""
    from specdec.models.requant import check_gguf_type, requantized_gguf

    out = [(f"{src.stem} repack off", src, False), (f"{src.stem} repack on", src, True)]
    for t in types:
        name = check_gguf_type(t)
        out.append((f"{name} (pure) repack on", requantized_gguf(src, name, threads=threads), True))
    return out


def quality(backends: dict, prompt_ids: dict[str, list[int]], new: int, shipped: str,
            fp32=None, vocab_size: int | None = None) -> dict:
    """Greedy agreement of every candidate with the shipped file (label `shipped` of `backends`) and, when
    `fp32` (a transformers backend of the same target) is given, with it (`specdec.measure.agreement`).

    Args:
        backends: label -> loaded llama.cpp backend. prompt_ids: prompt id -> token ids (the same for every
            model). new: greedy tokens per prompt. vocab_size: columns the fp32 reference scores.

    Returns:
        ``{"outputs": {label: [ids per prompt]}, "agreement": specdec.measure.agreement.compare_outputs(...)}``; the
        fp32 reference's own outputs are under ``"fp32 reference"``.
    """
    from specdec.measure.agreement import compare_outputs, greedy_ids

    outs = {label: [greedy_ids(be, ids, new) for ids in prompt_ids.values()] for label, be in backends.items()}
    refs = {"shipped": outs[shipped]}
    if fp32 is not None:
        refs["fp32"] = [greedy_ids(fp32, ids, new, vocab_size) for ids in prompt_ids.values()]
        outs["fp32 reference"] = refs["fp32"]
    return {"outputs": outs, "agreement": compare_outputs(outs, refs, list(prompt_ids))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="source GGUF (default: the default pair's target)")
    ap.add_argument("--types", default="Q4_0,IQ4_NL,Q8_0", help="requantized candidates ('' for none)")
    ap.add_argument("--fp32-reference", action="store_true", help="also compare greedy output with the fp32 "
                    "transformers reference of the target (its converted checkpoint; slow, GBs of weights)")
    ap.add_argument("--fp32-spec", default=None, help="model spec of that reference (default: the default "
                    "pair's target, or --gguf)")
    ap.add_argument("--skip-timing", action="store_true", help="quality only (no t(1), v(n))")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--new", type=int, default=32, help="greedy tokens per prompt for the quality check")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    args = ap.parse_args()

    from specdec.bench.prompts import load_builtin
    from specdec.measure.environment import machine_info
    from specdec.measure.roofline import (
        format_shape_roofline,
        measure_bandwidth,
        shape_roofline,
        weight_bytes,
    )
    from specdec.measure.timing import interleaved_forward_times
    from specdec.models.loaders import gguf_file
    from specdec.runtimes.gguf import gguf_matmul_flops, gguf_weight_types
    from specdec.runtimes.llamacpp import load_llamacpp, repack_default
    from specdec.runtimes.llamacpp_record import ggml_env

    default_target = "qwen2.5-coder:target"
    src = (args.gguf or gguf_file(default_target)).resolve()
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    cands = candidates(src, types, args.threads)
    loaded = [(label, load_llamacpp(path, n_ctx=1024, n_threads=args.threads, extra_buffers=repack), path)
              for label, path, repack in cands]
    for (label, be, _), (_, _, repack) in zip(loaded, cands):
        if be.extra_buffers != repack:  # e.g. where ggml's AMX buffer type would crash (LlamaCppBackend)
            print(f"{label}: {be.extra_buffers_note}")
    repack_on, _ = repack_default()
    shipped = next(label for label, path, repack in cands if path == src and repack == repack_on)

    prompts = load_builtin(per_type=1)
    prompt_ids = {p.id: loaded[0][1].tokenize(p.text) for p in prompts}  # one tokenization for every model
    fp32 = vocab = ref_model = None
    if args.fp32_reference:
        from specdec.runtimes.compat import real_vocab_size
        from specdec.runtimes.loading import load_model

        spec = args.fp32_spec or (str(args.gguf) if args.gguf else default_target)
        print(f"loading the fp32 reference {spec} (transformers) ...", flush=True)
        ref_model = load_model(spec, runtime="transformers", dtype="float32", threads=args.threads)
        fp32, vocab = ref_model.backend, real_vocab_size(ref_model.tokenizer)
    q = quality({label: be for label, be, _ in loaded}, prompt_ids, args.new, shipped, fp32, vocab)
    fp32 = ref_model = None  # the reference's weights are not needed for the timing

    agree = q["agreement"]
    print(f"greedy agreement over {args.new} new tokens of {len(prompt_ids)} primary prompts "
          f"(identical prompts, mean first divergence, mean identical share); reference 'shipped' = {shipped}")
    refs = list(next(iter(agree.values())))
    print(f"{'candidate':<38}" + "".join(f"{'vs ' + r:>30}" for r in refs))
    for label, by_ref in agree.items():
        cells = "".join(f"{a['prompts_identical']:>8}/{a['prompts']:<2}{a['mean_first_divergence']:8.1f}"
                        f"{a['mean_identical_share']:11.2f}" for a in by_ref.values())
        print(f"{label:<38}{cells}")
    if args.skip_timing:
        if args.json:
            args.json.write_text(json.dumps({"machine": machine_info(), "threads": args.threads, "new": args.new,
                                             "ggml_env": ggml_env(), "quality": q}, indent=1, default=str))
        for _, be, _ in loaded:
            be.close()
        return

    contexts = {label: be.tokenize(CONTEXT) for label, be, _ in loaded}
    times = interleaved_forward_times({label: (be, contexts[label]) for label, be, _ in loaded}, NS,
                                      repeats=args.reps, warm_forwards=3)

    bandwidth = measure_bandwidth(threads=args.threads)
    rows = []
    for label, be, path in loaded:
        med = {n: statistics.median(v) for n, v in times[label].items()}
        roof = shape_roofline(med, gguf_matmul_flops(path), weight_bytes(path), bandwidth["gbps"])
        rows.append({"candidate": label, "file": path.name, "repack": be.extra_buffers,
                     "weight_types": {k: v for k, v in list(gguf_weight_types(path).items())[:3]},
                     "t1_ms": med[1] * 1e3, "v": {n: med[n] / med[1] for n in NS}, "roofline": roof,
                     "agreement": {r: {k: v for k, v in a.items() if k != "per_prompt"}
                                   for r, a in agree[label].items()}})
        be.close()
    info = machine_info()
    print(f"machine: {info.get('cpu_model', platform.processor())}, threads {args.threads}, context "
          f"{len(contexts[loaded[0][0]])} tokens, median of {args.reps} interleaved repetitions")
    head = "".join(f" v({n})".rjust(7) for n in NS[1:])
    print(f"{'candidate':<38}{'t(1) ms':>8}{head}")
    for r in rows:
        vs = "".join(f"{r['v'][n]:7.2f}" for n in NS[1:])
        print(f"{r['candidate']:<38}{r['t1_ms']:8.1f}{vs}")
    print(f"\nroofline per width (machine bandwidth {bandwidth['gbps']:.1f} GB/s, streaming copy); v_roof: the "
          "cost with every width at the peak throughput measured")
    for r in rows:
        print(format_shape_roofline(r["candidate"], r["roofline"]))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "threads": args.threads, "reps": args.reps,
                                         "bandwidth": bandwidth,
                                         "new": args.new, "ggml_env": ggml_env(), "rows": rows, "quality": q},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
