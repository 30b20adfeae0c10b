"""What ``specdec generate`` prints and writes: the text, one statistics line or a per-row table, and one JSON
document with the same figures for one prompt and for many (`report`), including what ran (the runtime
record) and, with a baseline, where each greedy output first leaves target-only output."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from specdec.core.metrics import GenerationResult

__all__ = ["divergence_line", "print_batch", "print_single", "report", "row_figures"]


def _clean(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def row_figures(result: GenerationResult) -> dict[str, Any]:
    """The per-row figures the table and the JSON share: tokens, acceptance rate (accepted / drafted),
    tokens per target forward (block efficiency), tokens/s (new tokens over the seconds from the batch's
    start to the row's end), TTFT, and the acceptance record in the serving engines' shape
    (`GenerationResult.acceptance_record`); NaN -> None."""
    return {"num_tokens": result.num_tokens, "finish_reason": result.finish_reason,
            "num_drafted": result.num_drafted, "num_accepted": result.num_accepted,
            "acceptance_rate": _clean(result.acceptance_rate), "block_efficiency": _clean(result.block_efficiency),
            "tokens_per_s": _clean(result.tokens_per_s), "ttft_s": result.ttft_s, "total_s": result.total_s,
            "num_rounds": result.num_rounds, "acceptance": result.acceptance_record()}


def report(run: Any, texts: Sequence[str], *, runtime: dict, lines: Sequence[str] | None = None,
           prompts: Sequence[str] | None = None, extra: dict | None = None) -> dict[str, Any]:
    """The JSON document of a run (`specdec.entrypoints.generation.Run`): settings, the runtime record (what
    ran: backend, dtype, quantization, requantized GGUF type), one entry per prompt (where it was read, its
    batch, prompt tokens, text, token ids, `row_figures`, the K of each round and which part of a combining
    drafter drafted it (``rounds_source``: ``suffix``, ``model``, ``none`` or None for a single drafter) and, with a baseline,
    ``baseline_tokens_per_s``, ``speedup``, ``identical_to_baseline`` and ``divergence``; with `prompts`, the
    prompt's text), one entry per batch, and the aggregate tokens/s (all new tokens over the batches' summed
    wall time)."""
    rows = []
    for i, (r, text) in enumerate(zip(run.results, texts, strict=True)):
        row = {"index": i, **({"line": lines[i]} if lines is not None else {}),
               **({"prompt": prompts[i]} if prompts is not None else {}), "batch": run.batch_of[i],
               "prompt_tokens": len(r.prompt_ids), "text": text, "token_ids": list(r.token_ids), **row_figures(r),
               "rounds_k": [x.k for x in r.rounds], "rounds_alpha": [x.alpha_estimate for x in r.rounds],
               "rounds_source": [x.draft_source for x in r.rounds]}
        if run.padded:
            row["rounds_n_forward"] = [x.n_forward for x in r.rounds]
        if run.baselines is not None:
            base = run.baselines[i]
            b, s = _clean(base.tokens_per_s) or None, _clean(r.tokens_per_s) or None
            row.update(baseline_token_ids=list(base.token_ids), baseline_tokens_per_s=b,
                       speedup=s / b if s and b else None, identical_to_baseline=base.token_ids == r.token_ids,
                       divergence=run.divergences[i])
        if r.policy_note:
            row["policy_note"] = r.policy_note
        rows.append(row)
    return {**(extra or {}), "runtime": runtime, "batch_size": run.batch_size, "drafter": run.drafter,
            "policy": run.policy, "k": run.k, "pad_verify": run.padded, "num_prompts": len(rows),
            "total_tokens": run.total_tokens, "wall_s": run.wall_s,
            "aggregate_tokens_per_s": _clean(run.tokens_per_s), "batches": run.batches, "rows": rows}


def divergence_line(div: dict, dtype: str | None) -> str:
    """The plain-words line printed when greedy speculative output differs from target-only decoding: where,
    the two tokens, the target's top-2 logit margin there, and what it means for the dtype that ran (a
    near-tie rounded differently by reduced-precision kernels, or, in float32, a difference that should not
    happen)."""
    where = (f"first difference at new token {div['step']}: baseline {div['eager_token']}, speculative "
             f"{div['compiled_token']}; target top-2 logit margin there {div['margin']:.4g}")
    if dtype in ("bfloat16", "float16"):
        return (f"{where}. In {dtype} the kernels that score 1 token and K+1 tokens round differently, so a "
                "near-tie can flip; the algorithm is exact, and --dtype float32 gives token-identical output")
    if dtype is None:  # llama.cpp: quantized kernels whose rounding depends on the batch size
        return (f"{where}. llama.cpp scores 1 token and K+1 tokens with kernels that round differently, so a "
                "near-tie can flip; the transformers backend in --dtype float32 gives token-identical output")
    return f"{where}. In {dtype} this is unexpected: please report it"


def print_single(doc: dict[str, Any], *, label: str, file=None) -> None:
    """One prompt: its text, the statistics line, the policy's note, and the baseline comparison."""
    out = file or sys.stdout
    row = doc["rows"][0]
    print(row["text"], file=out)
    print(f"\n[{row['num_tokens']} tokens, {row['finish_reason']}] {_fmt(row['tokens_per_s'])} tok/s, "
          f"TTFT {_fmt(row['ttft_s'])} s, rounds {row['num_rounds']}, acceptance {_fmt(row['acceptance_rate'])}, "
          f"block efficiency {_fmt(row['block_efficiency'])}; drafter {doc['drafter']}, ran {label}", file=out)
    sources = [s for s in row.get("rounds_source", ()) if s]
    if sources:  # a combining drafter (the mixed drafter): which part drafted how many rounds
        print("rounds by part: " + ", ".join(f"{'no draft' if s == 'none' else s} {sources.count(s)}"
                                             for s in dict.fromkeys(sources)), file=out)
    if row.get("policy_note"):  # e.g. the cost policy ran target-only because no K pays on this configuration
        drafted = sum(1 for k in row["rounds_k"] if k > 0)
        print(f"{doc['policy']} policy: {row['policy_note']}; drafted in {drafted} of {row['num_rounds']} rounds",
              file=out)
    if doc["pad_verify"]:
        ks, ns = row["rounds_k"], row["rounds_n_forward"]
        padded = sum(1 for k, n in zip(ks, ns, strict=True) if n is not None and n > k + 1)
        print(f"verification padded in {padded} of {row['num_rounds']} rounds "
              f"({sum(n - k - 1 for k, n in zip(ks, ns, strict=True))} filler tokens)", file=out)
    _print_baseline(row, doc["runtime"].get("dtype"), out, sampled=bool(doc.get("temperature")))


#: What a sampled run's output differing from its target-only run means (nothing wrong).
SAMPLED_DIFFER = "differ (sampled: two draws from the target's distribution, not expected to match)"


def _print_baseline(row: dict[str, Any], dtype: str | None, out, prefix: str = "", sampled: bool = False) -> None:
    if "identical_to_baseline" not in row:
        return
    same = "identical" if row["identical_to_baseline"] else SAMPLED_DIFFER if sampled else "DIFFERENT"
    print(f"{prefix}baseline {_fmt(row['baseline_tokens_per_s'])} tok/s; speedup {_fmt(row['speedup'])}x; "
          f"outputs {same}", file=out)
    if row.get("divergence"):
        print(prefix + divergence_line(row["divergence"], dtype), file=out)


def print_batch(doc: dict[str, Any], *, label: str = "", file=None) -> None:
    """Many prompts: each prompt's text in order (under a ``### prompt i`` line), then one table of the
    per-row figures, a line with the aggregate tokens/s, and each row's baseline comparison."""
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    for row in doc["rows"]:
        where = f" ({row['line']})" if row.get("line") else ""
        print(f"### prompt {row['index'] + 1}{where}", file=out)
        print(row["text"], file=out)
    table = Table(title=f"{doc['num_prompts']} prompts, batches of {doc['batch_size']}, drafter "
                        f"{doc['drafter']}, {doc['policy']} K{'' if doc['policy'] == 'fixed' else ' <='} {doc['k']}")
    cols = ["#", "batch", "prompt tok", "new tok", "finish", "acceptance", "tok/forward", "tok/s"]
    baseline = any("identical_to_baseline" in r for r in doc["rows"])
    cols += ["speedup", "same as target-only"] if baseline else []
    for col in cols:
        table.add_column(col, justify="left" if col in ("finish", "same as target-only") else "right",
                         no_wrap=True)
    for row in doc["rows"]:
        cells = [str(row["index"] + 1), str(row["batch"] + 1), str(row["prompt_tokens"]), str(row["num_tokens"]),
                 row["finish_reason"], _fmt(row["acceptance_rate"]), _fmt(row["block_efficiency"]),
                 _fmt(row["tokens_per_s"], 1)]
        if baseline:
            div = row.get("divergence")
            same = "yes" if row["identical_to_baseline"] else (
                f"no, from token {div['step']} (margin {div['margin']:.3g})" if div
                else "no (sampled)" if doc.get("temperature") else "no")
            cells += [_fmt(row["speedup"]), same]
        table.add_row(*cells)
    print(file=out)
    Console(file=out, width=max(140 if baseline else 100, Console(file=out).width), highlight=False).print(table)
    print(f"[{doc['total_tokens']} tokens in {doc['wall_s']:.3f} s, {len(doc['batches'])} batch(es)] "
          f"aggregate {_fmt(doc['aggregate_tokens_per_s'], 1)} tok/s"
          f"{'; ran ' + label if label else ''} (per-row tok/s: from its batch's start to its end)", file=out)
