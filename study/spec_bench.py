"""Spec-Bench on our engine: pick questions from Spec-Bench's ``question.jsonl`` (fetched at run time; it never
enters this repository), and print a store's results in the shape of Spec-Bench's leaderboard.

Spec-Bench (Xia et al. 2024, https://github.com/hemingkx/Spec-Bench) has six main categories: multi-turn
conversation (MT-bench's 80 questions in 8 sub-categories), translation, summarization, question answering,
mathematical reasoning and retrieval-augmented generation (80 questions each). We use each question's first
turn only. Its leaderboard gives, per category, the speedup over target-only decoding and the mean accepted
tokens (#MAT: tokens committed per target forward, bonus token included: our block efficiency).

    # 1. choose N questions per main category (evenly spread through each category; MT-bench round-robin
    #    over its sub-categories) into a prompt file outside the repository
    python -m study.spec_bench pick --question /path/to/Spec-Bench/data/spec_bench/question.jsonl \\
        --per-category 10 --out /tmp/spec_bench_10.jsonl
    # 2. time them (any sweep settings; the chat template is what Spec-Bench's questions expect)
    specdec sweep --prompts /tmp/spec_bench_10.jsonl --chat-template --db results/spec_bench_128.db ...
    # 3. the leaderboard-shaped table
    python -m study.spec_bench table --db results/spec_bench_128.db
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

#: MT-bench's sub-categories, pooled as Spec-Bench's "multi-turn conversation".
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
#: Spec-Bench's six main categories, in its leaderboard's order (our type names).
MAIN = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def main_category(category: str) -> str:
    """Spec-Bench category -> main category (MT-bench sub-categories pool into ``mt_bench``).

    Raises:
        ValueError: a category outside Spec-Bench's.
    """
    if category in MT_BENCH:
        return "mt_bench"
    if category in MAIN:
        return category
    raise ValueError(f"unknown Spec-Bench category {category!r}; expected one of {', '.join(MAIN + MT_BENCH)}")


def pick(records: list[dict], per_category: int) -> list[dict]:
    """`per_category` questions of each main category, in a fixed order: evenly spaced through the category's
    questions in file order (its sources are contiguous), MT-bench round-robin over its sub-categories.

    Args:
        records: Spec-Bench question records (``question_id``, ``category``, ``turns``).
        per_category: questions per main category (>= 1; all of them when a category has fewer).

    Returns:
        Prompt records for `specdec.prompts.read_prompts` (``id``, ``type``, ``prompt``).

    Raises:
        ValueError: per_category < 1, or an unknown category.
    """
    if per_category < 1:
        raise ValueError(f"--per-category must be >= 1, got {per_category}")
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(main_category(r["category"]), []).append(r)
    out = []
    for cat in MAIN:
        qs = by.get(cat, [])
        if cat == "mt_bench":
            subs = [[q for q in qs if q["category"] == s] for s in MT_BENCH]
            order = [s[i] for i in range(max((len(s) for s in subs), default=0)) for s in subs if i < len(s)]
        else:
            n = len(qs)
            order = [qs[int(i * n / per_category)] for i in range(min(per_category, n))]
        for q in order[:per_category]:
            out.append({"id": f"specbench-{q['question_id']}", "type": cat, "prompt": q["turns"][0]})
    return out


def _pick(args) -> int:
    lines = Path(args.question).read_text(encoding="utf-8").splitlines()
    records = [json.loads(x) for x in lines if x.strip()]
    chosen = pick(records, args.per_category)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in chosen), encoding="utf-8")
    counts = {c: sum(r["type"] == c for r in chosen) for c in MAIN}
    print(f"{len(chosen)} questions -> {args.out}: " + ", ".join(f"{c} {n}" for c, n in counts.items()))
    return 0


def _table(args) -> int:
    from specdec.report import analyze, load_store
    from specdec.report import tables as T

    an = analyze(load_store(args.db, args.sweep))
    import pandas as pd

    cells = pd.concat([an[T.CELLS], an[T.OVERALL]], ignore_index=True)
    if cells.empty:
        print("no runs")
        return 1
    spec = cells[cells["method"].isin(["draft", "ngram"])]
    print(f"store {args.db}, sweep {an.store.sweep_id}; machine {(an.store.sweep or {}).get('machine_json') or '?'}")
    print("Speedup: paired end-to-end tokens/s over target-only with its 95 % t-interval over the category's "
          "questions; #MAT: mean tokens per target forward (bonus included; Spec-Bench's mean accepted tokens).")
    for (label, method, policy, k), g in spec.groupby(["config_label", "method", "policy", "k"]):
        what = f"{method} " + (f"K={int(k)}" if policy in ("fixed", "-") else f"{policy} (K<={int(k)})")
        print(f"\n{label}, {what}:")
        print("| category | questions | speedup | 95% CI | verdict | #MAT | tok/s | target-only tok/s |")
        print("|---|---|---|---|---|---|---|---|")
        order = [c for c in (*MAIN, "(all prompts)") if c in set(g["prompt_type"])]
        for cat in order:
            r = g[g["prompt_type"] == cat].iloc[0]
            ci = (f"[{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]" if np.isfinite(float(r.speedup_lo)) else "-")
            print(f"| {cat} | {int(r.n_aligned)} | {r.speedup:.2f}x | {ci} | {r.verdict} | "
                  f"{r.block_efficiency:.2f} | {r.tok_s:.1f} | {r.baseline_tok_s:.1f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pick", help="write a prompt file of N questions per main category")
    p.add_argument("--question", required=True, help="Spec-Bench's data/spec_bench/question.jsonl")
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--out", required=True, help="prompt file to write (JSONL; keep it out of the repository)")
    t = sub.add_parser("table", help="the leaderboard-shaped table of a store")
    t.add_argument("--db", required=True)
    t.add_argument("--sweep", default=None)
    args = ap.parse_args(argv)
    return _pick(args) if args.cmd == "pick" else _table(args)


if __name__ == "__main__":
    sys.exit(main())
