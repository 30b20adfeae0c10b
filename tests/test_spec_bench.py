"""study.spec_bench: Spec-Bench questions chosen per main category, as a prompt file our sweep reads."""

from __future__ import annotations

import json

import pytest

from specdec.prompts import read_prompts


@pytest.fixture(scope="module")
def sb():
    from study import spec_bench

    return spec_bench


def _questions(sb) -> list[dict]:
    """Spec-Bench's shape: MT-bench's 8 sub-categories x 10, then 5 main categories x 80, contiguous."""
    out, qid = [], 0
    for cat in sb.MT_BENCH:
        for _ in range(10):
            qid += 1
            out.append({"question_id": qid, "category": cat, "turns": [f"{cat} question {qid}", "second turn"]})
    for cat in sb.MAIN[1:]:
        for _ in range(80):
            qid += 1
            out.append({"question_id": qid, "category": cat, "turns": [f"{cat} question {qid}"]})
    return out


def test_pick_spreads_each_category_and_mt_bench_round_robin(sb, tmp_path):
    qs = _questions(sb)
    chosen = sb.pick(qs, 10)
    assert [sum(r["type"] == c for r in chosen) for c in sb.MAIN] == [10] * 6
    mt = [r for r in chosen if r["type"] == "mt_bench"]
    # round-robin: the first 8 cover every MT-bench sub-category once
    assert {r["prompt"].split()[0] for r in mt[:8]} == set(sb.MT_BENCH)
    tr = [int(r["id"].split("-")[1]) for r in chosen if r["type"] == "translation"]
    assert tr == [81 + 8 * i for i in range(10)]  # evenly spaced through its 80 questions
    assert all(r["prompt"] != "second turn" for r in chosen)  # first turn only
    # the file the sweep reads: ids unique, types the six main categories
    qfile = tmp_path / "question.jsonl"
    qfile.write_text("".join(json.dumps(q) + "\n" for q in qs), encoding="utf-8")
    out = tmp_path / "picked.jsonl"
    assert sb.main(["pick", "--question", str(qfile), "--per-category", "3", "--out", str(out)]) == 0
    prompts = read_prompts(out)
    assert len(prompts) == 18 and len({p.id for p in prompts}) == 18
    assert {p.type for p in prompts} == set(sb.MAIN)


def test_pick_refuses_bad_input(sb):
    with pytest.raises(ValueError, match="per-category must be >= 1"):
        sb.pick(_questions(sb), 0)
    with pytest.raises(ValueError, match="unknown Spec-Bench category 'poetry'"):
        sb.pick([{"question_id": 1, "category": "poetry", "turns": ["x"]}], 2)
