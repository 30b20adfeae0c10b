"""The batch axis of the one sweep (``specdec sweep --batch-sizes``): plan, pairing, pricing, the stored rows,
resume, exactness counts, the dry run, one-line errors, and the report's batch section (one path for the
sweep's batched rows and the former harness's tables), on the tiny models."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import typer
from conftest import tiny_sweep_config
from typer.testing import CliRunner

from specdec.bench import batch_runs
from specdec.bench import methods as M
from specdec.bench import sweep as S
from specdec.bench.grid import batch_cost_ns, batch_k, batch_policies, batch_units
from specdec.bench.store import Store, SweepExistsError
from specdec.prompts import Prompt

PUBLISHED = Path(__file__).resolve().parents[1] / "results"
#: Built-in-like prompts of the code and repetitive groups (short: the tiny models have 128 positions).
POOL = [
    Prompt("code-01", "code", "def f(x): return x + 1\ndef g(x): return f(x)"),
    Prompt("code_json-01", "code_json", '{"a": 1, "b": 2, "c": 3, "a": 1, "b":'),
    Prompt("code_python-01", "code_python", "for i in range(10):\n    print(i)\nfor j in"),
    Prompt("rep-01", "repetitive", "abc abc abc abc abc abc abc abc"),
    Prompt("rep-02", "repetitive_pattern", "one two one two one two one two"),
    Prompt("poem-01", "poetry", "roses are red, violets are"),
]
BATCH = {"batch_sizes": "1,2", "ks": "", "secondary_ks": "", "policies": "best,draft:cost",
         "methods": "baseline,aa,draft,ngram", "policy_k": 3}


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from specdec.bench.commands import register

    app = typer.Typer()
    register(app)
    return app


def _cfg(tiny_pair, draft_dir, prompt_file, **kw) -> S.SweepConfig:
    return tiny_sweep_config(tiny_pair, draft_dir, prompt_file, **{**BATCH, **kw})


def _runs(db: Path, sid: str, **where) -> list[dict]:
    with Store(db, readonly=True) as st:
        return st.runs(sid, **where)


def _batched(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Batched runs: (batch id, method, planned policy, repeat) -> rows, in row order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["batch_id"] is not None:
            parts = r["cell_key"].split("|")
            out.setdefault((r["batch_id"], parts[3], parts[5], parts[6]), []).append(r)
    return {k: sorted(v, key=lambda r: r["row"]) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ plan


def test_batches_are_drawn_from_one_group_round_robin_and_cover_it():
    units = dict(batch_units(POOL, 2))
    assert list(units) == ["code/2/0", "code/2/1", "repetitive/2/0", "poetry/2/0"]
    assert [p.id for p in units["code/2/0"]] == ["code-01", "code_json-01"]
    assert [p.id for p in units["code/2/1"]] == ["code_python-01", "code-01"]  # the group starts over
    assert [p.id for p in units["poetry/2/0"]] == ["poem-01", "poem-01"]  # a type outside the groups: its own
    assert [len(u) for u in dict(batch_units(POOL, 4)).values()] == [4, 4, 4]


def test_a_batch_is_bracketed_by_batched_target_only_runs(tiny_pair, near_draft_dir, prompt_file):
    """At B > 1: every method with a batched form under the policies with a batch form (heuristic has none;
    the K grid and the peers are single-sequence only), each between two batched target-only runs of the
    same prompts at the same B, repeats outermost."""
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="1", policies="best,heuristic,draft:cost", repeats=2,
               peers=True, batch_sizes="2")
    plan = S.prepare(cfg).plan
    assert {c.batch_size for c in plan} == {2} and {c.batch_id for c in plan} == {"repetitive/2/0", "code/2/0"}
    one = [c for c in plan if c.batch_id == "code/2/0"]
    assert [c.method for c in one[::2]] == ["baseline"] * 9 and [c.repeat for c in one[::2]] == list(range(9))
    assert [(c.method, c.policy, c.repeat) for c in one[1::2]] == [
        (m, p, r) for r in (0, 1) for m, p in (("aa", None), ("draft", "best"), ("draft", "cost"), ("ngram", "best"))]
    assert all(c.k == batch_k(cfg, 2) == 3 for c in one if c.policy)
    assert batch_policies(cfg, "ngram") == ("best",) and batch_policies(cfg, "draft") == ("best", "cost")
    assert len({c.key(S.prepare(cfg).sweep_id) for c in plan}) == len(plan)
    assert all(c.rows[0] == c.prompt and len(c.rows) == 2 for c in plan)


def test_methods_without_a_batched_form_stay_single_sequence():
    assert {m.name for m in M.METHODS.values() if m.batch is not None} == {
        "baseline", "aa", "draft", "ngram", "ngram_hf", "suffix", "mixed"}  # xtok: one row; suffix_corpus: per-row corpus


def test_batch_k_and_its_pricing_forwards(tiny_pair, near_draft_dir, prompt_file):
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, policy_k=16, batch_sizes="1,2,8")
    assert (batch_k(cfg, 2), batch_k(cfg, 8)) == (16, 15)  # B x (K + 1) <= 128, as generate caps it
    target, draft = batch_cost_ns(cfg)
    assert {2, 4, 6, 34, 8, 16, 128} <= set(target) and 17 not in target and draft == [1, 2, 8]
    assert batch_cost_ns(_cfg(tiny_pair, near_draft_dir, prompt_file, batch_sizes="1")) == ([], [])


# -------------------------------------------------------------------------------------- identity, CLI


@pytest.mark.parametrize("db, flags", [
    ("fp32_all.db", {"threads": 2, "prompts_per_type": 6, "ks": "1,2,4", "secondary_ks": "2",
                     "methods": "baseline,aa,draft", "policies": "cost", "secondary_policies": "cost",
                     "peers": False, "max_new_tokens": 128, "name": "fp32-all"}),
    ("llamacpp_all.db", {"threads": 2, "configs": "llamacpp", "prompts_per_type": 6, "ks": "1", "secondary_ks": "1",
                         "methods": "baseline,aa,draft,ngram", "policies": "cost", "secondary_policies": "cost",
                         "peers": False, "max_new_tokens": 128, "name": "llamacpp-all"}),
])
@pytest.mark.parametrize("sizes", ["1", "1,2,4,8"])
def test_batch_sizes_keep_the_published_sweep_ids(db, flags, sizes):
    """The batch axis is part of the grid, not of a sweep's meaning: --batch-sizes 1 (the default) and a
    larger axis keep the published stores' sweep ids, so --resume adds batches to them."""
    path = PUBLISHED / db
    if not path.is_file():
        pytest.skip(f"{db} is not in this checkout")
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        stored = conn.execute("SELECT sweep_id, config_json FROM sweeps").fetchall()
    finally:
        conn.close()
    prepared = S.prepare(S.make_config({**flags, "batch_sizes": sizes}))
    assert [(prepared.sweep_id, prepared.meaning)] == [(sid, json.loads(cfg)) for sid, cfg in stored]
    assert S.make_config(flags).batch_sizes == (1,)


def test_dry_run_plans_and_prices_the_batch_axis(app, tmp_path, tiny_pair, near_draft_dir, prompt_file, monkeypatch):
    import specdec.runtimes.loading

    monkeypatch.setattr(specdec.runtimes.loading, "load_pair", lambda *a, **k: pytest.fail("a dry run loaded a model"))
    db = tmp_path / "b.db"
    base = ["sweep", "--dry-run", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompts",
            str(prompt_file), "--configs", "transformers-eager", "--ks", "", "--policies", "best,draft:cost",
            "--methods", "baseline,aa,draft,ngram", "--db", str(db)]
    one = CliRunner().invoke(app, base)
    res = CliRunner().invoke(app, [*base, "--batch-sizes", "1,2"])
    assert one.exit_code == 0 and res.exit_code == 0, res.output
    assert "batch axis: B=2: 2 batches" in res.output and "batch axis" not in one.output
    for line in ("B=2 baseline", "B=2 aa", "B=2 draft best (K<=16)", "B=2 draft cost (K<=16)", "B=2 ngram best"):
        assert line in res.output, line
    assert one.output.splitlines()[0] == res.output.splitlines()[0]  # the same sweep id
    assert "rough estimate" in res.output and not db.exists()
    plan = S.prepare(_cfg(tiny_pair, near_draft_dir, prompt_file)).plan
    costs = S.REFERENCE_COSTS
    (b1,) = [c for c in plan if c.batch_id is None and c.method == "baseline"][:1]
    (b2,) = [c for c in plan if c.batch_id is not None and c.method == "baseline"][:1]
    t1, _ = S.estimate_plan_s([b1], {"transformers-eager": costs}, max_new_tokens=8, warmup_tokens=2)
    t2, _ = S.estimate_plan_s([b2], {"transformers-eager": costs}, max_new_tokens=8, warmup_tokens=2)
    assert t2 == pytest.approx(S.estimate_generation_s("baseline", None, None, costs, 8, rows=2)) and t2 > t1


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0"], "B must be an integer in 1..16, got 0"),
    (["--batch-sizes", "4,17"], "B must be an integer in 1..16, got 17"),
    (["--batch-sizes", "two"], "'two' is not an integer"),
    (["--batch-sizes", ","], "give at least one batch size"),
    (["--batch-sizes", "1,2", "--configs", "transformers-compiled"], "batched decoding runs the eager backend"),
])
def test_bad_batch_sizes_are_one_line(app, tmp_path, args, message):
    res = CliRunner().invoke(app, ["sweep", "--dry-run", "--db", str(tmp_path / "b.db"), *args])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("specdec: error: ") and message in res.output


# ------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def batch_sweep(tmp_path_factory, tiny_pair, near_draft_dir, prompt_file):
    db = tmp_path_factory.mktemp("batch") / "b.db"
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    lines: list[str] = []
    result = S.run_sweep(cfg, db=db, progress=False, echo=lines.append)
    return cfg, db, result, lines


def test_batched_runs_are_stored_as_rows_paired_and_exact(batch_sweep):
    """Each batched run is B rows committed together (row, batch id, the batch's wall time and aggregate
    tokens/s on every row); in every batch the runs alternate with batched target-only runs; greedy rows equal
    the batched and the single-sequence target-only rows; the batch pricing's forwards are stored."""
    cfg, db, result, lines = batch_sweep
    assert (result.status, result.failed, result.ran) == ("done", 0, result.planned)
    rows = _runs(db, result.sweep_id)
    single = [r for r in rows if r["batch_id"] is None]
    assert single and all(r["batch_size"] is None and r["matches_single"] is None for r in single)
    runs = _batched(rows)
    assert {k[0] for k in runs} == {"repetitive/2/0", "code/2/0"}
    assert len(runs) == 2 * 9  # per batch: 5 baselines, aa, draft best, draft cost, ngram best
    for (batch_id, method, planned, _), rs in runs.items():
        assert [r["row"] for r in rs] == [0, 1] and {r["batch_size"] for r in rs} == {2}
        assert len({(r["batch_total_s"], r["batch_tokens_per_s"]) for r in rs}) == 1
        assert rs[0]["batch_tokens_per_s"] == pytest.approx(sum(r["new_tokens"] for r in rs) / rs[0]["batch_total_s"])
        assert all(r["matches_baseline"] == 1 and r["matches_single"] == 1 and r["error"] is None for r in rs)
        assert all(r["cell_key"].endswith(f"|{batch_id}|{r['row']}") for r in rs)
        if method in ("draft", "ngram"):
            assert rs[0]["predicted_speedup"] > 0 and rs[0]["k"] >= 1
            assert rs[0]["policy"] == ("cost" if planned == "cost" else "fixed")
    code = [r for r in runs.items() if r[0][0] == "code/2/0"]
    assert [r[0]["prompt_id"] for _, r in code][:1] == ["code-01"] and code[0][1][1]["prompt_id"] == "code-01"
    order = sorted(code, key=lambda kv: kv[1][0]["run_id"])
    assert [k[1] == "baseline" for k, _ in order] == [True, False] * 4 + [True]
    with Store(db, readonly=True) as st:
        batch_costs = st.load_costs(result.sweep_id, "transformers-eager", batch=True)
        plain = st.load_costs(result.sweep_id, "transformers-eager")
    assert set(batch_costs["target_forward_s"]) == set(batch_cost_ns(cfg)[0]) and batch_costs["draft_step_s"] > 0
    assert max(plain["target_forward_s"]) == 17  # the single-sequence curve is untouched
    assert any("batch code/2/0 (B=2) draft" in line for line in lines)


def test_report_pairs_batches_and_keeps_the_single_sequence_analysis(batch_sweep, tmp_path):
    from specdec.report.render import write_report

    _, db, result, _ = batch_sweep
    rep = write_report(db, tmp_path / "rep")
    md = rep.markdown.read_text()
    assert "Speedup against batch size" in md and f"of sweep {result.sweep_id}" in md
    for b in (1, 2):
        for name in ("draft/fixed", "draft/cost", "ngram/fixed", "aa"):
            assert f"| transformers-eager | repetitive | {b} | {name} |" in md, (b, name)
    assert "| transformers-eager | code | 2 | draft/fixed |" in md and "crossover B" in md
    (fig,) = [e for e in rep.figures if e.kind == "batch"]
    assert fig.skipped is None and fig.png.is_file()
    assert rep.analysis.store.runs["batch_size"].isna().all()  # batched rows stay out of the B = 1 tables
    single = _runs(db, result.sweep_id, batch_id=None)
    assert len(rep.analysis.store.runs) == len(single)


def test_export_marks_batched_rows(batch_sweep, tmp_path):
    from specdec.bench.export import export_runs

    _, db, result, _ = batch_sweep
    n = export_runs(db, "csv", tmp_path / "runs.csv")
    rows = _runs(db, result.sweep_id)
    assert n.by_kind == {"single": sum(r["batch_id"] is None for r in rows),
                         "batch": sum(r["batch_id"] is not None for r in rows)}


def test_resume_skips_stored_batches_and_reruns_an_incomplete_one(batch_sweep, tmp_path, tiny_pair, near_draft_dir,
                                                                 prompt_file):
    cfg, db0, result, _ = batch_sweep
    db = tmp_path / "b.db"
    db.write_bytes(db0.read_bytes())
    with pytest.raises(SweepExistsError, match="--resume"):
        S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    again = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert again.ran == 0 and again.already_done == result.planned
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM runs WHERE batch_id = 'code/2/0' AND method = 'ngram' AND row = 1")
    conn.close()
    third = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert third.ran == 1 and third.failed == 0
    (rs,) = [v for k, v in _batched(_runs(db, result.sweep_id)).items() if k[:2] == ("code/2/0", "ngram")]
    assert [r["row"] for r in rs] == [0, 1] and rs[0]["matches_baseline"] == 1  # against the stored baseline


def test_mismatching_rows_are_counted_not_fatal(tmp_path, tiny_pair, near_draft_dir, prompt_file, monkeypatch):
    """A scripted drafting method flips row 1's last token in every timed run, and one prompt's single-sequence
    reference differs: the rows say so and the sweep finishes."""
    real = M.METHODS["draft"]

    def flipped(rt, req):
        out = real.batch(rt, req)
        if req.max_new_tokens > 2:  # timed runs, not the warm-up
            out[1].token_ids[-1] = (out[1].token_ids[-1] + 1) % 1000
        return out

    monkeypatch.setitem(M.METHODS, "draft", dataclasses.replace(real, batch=flipped))
    real_single = batch_runs._single
    monkeypatch.setattr(batch_runs, "_single", lambda loaded, s, p: (
        [t + 1 for t in real_single(loaded, s, p)] if p.id == "rep-01" else real_single(loaded, s, p)))
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, batch_sizes="2", methods="baseline,draft", policies="best")
    res = S.run_sweep(cfg, db=tmp_path / "m.db", progress=False, echo=lambda _: None)
    assert res.failed == 0
    for (batch_id, method, _, _), rs in _batched(_runs(tmp_path / "m.db", res.sweep_id)).items():
        spec = method == "draft"
        assert [r["matches_baseline"] for r in rs] == [1, 0 if spec else 1], (batch_id, method)
        want = [int(r["prompt_id"] != "rep-01") for r in rs]
        if spec:
            want[1] = 0
        assert [r["matches_single"] for r in rs] == want, (batch_id, method)


def test_a_failed_batched_run_is_recorded_and_retried_on_resume(tmp_path, tiny_pair, near_draft_dir, prompt_file,
                                                                monkeypatch):
    real = M.METHODS["ngram"]

    def boom(rt, req):
        raise RuntimeError("boom")

    monkeypatch.setitem(M.METHODS, "ngram", dataclasses.replace(real, batch=boom))
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, batch_sizes="2", methods="baseline,ngram", policies="best")
    db = tmp_path / "f.db"
    res = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    assert res.failed == 2 and res.status == "done"
    failed = [r for r in _runs(db, res.sweep_id) if r["error"]]
    assert len(failed) == 4 and all("boom" in r["error"] for r in failed)
    monkeypatch.setitem(M.METHODS, "ngram", real)
    again = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert again.ran == 2 and again.failed == 0
    assert not [r for r in _runs(db, res.sweep_id) if r["error"]]


def test_acceptance_is_pre_run_once_per_prompt_and_method(tmp_path, tiny_pair, near_draft_dir, prompt_file,
                                                          monkeypatch):
    """The batch-priced K of every batch comes from its rows' pre-run acceptance, measured once per prompt and
    drafting method however many batches (and rows) hold the prompt."""
    from specdec.engine import decoding as batched

    real = batched.generate_batch
    pre: list[str] = []

    def spy(target, prompts, n, **kw):
        if n == min(batch_runs.PRE_TOKENS, 5) and kw.get("k") == batch_runs.PRE_K:
            pre.extend([type(kw["drafter"]).__name__] * len(prompts))
        return real(target, prompts, n, **kw)

    monkeypatch.setattr(batched, "generate_batch", spy)
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, batch_sizes="2,3", methods="baseline,draft,ngram",
               policies="best", max_new_tokens=5)
    res = S.run_sweep(cfg, db=tmp_path / "p.db", progress=False, echo=lambda _: None)
    assert res.failed == 0
    assert sorted(pre) == sorted(["BatchedModelDrafter"] * 3 + ["PerRowDrafters"] * 3)  # rep-01, rep-02, code-01


def test_llamacpp_configuration_end_to_end(tmp_path, smollm2_gguf, prompt_file):
    """The llama.cpp configuration on the tiny GGUF (target and draft the same file): batched backends opened
    for the largest B, the batch pricing measured, every batched run timed; rows that differ from the
    single-sequence output are counted (llama.cpp's batched kernels may flip a near tie), not fatal."""
    pytest.importorskip("llama_cpp")
    cfg = S.make_config({"target": str(smollm2_gguf), "draft": str(smollm2_gguf), "prompts": str(prompt_file),
                         "configs": "llamacpp", "batch_sizes": "2", "ks": "", "secondary_ks": "", "policies": "best",
                         "methods": "baseline,draft", "policy_k": 2, "max_new_tokens": 4, "threads": 1,
                         "cost_repeats": 1, "warmup_tokens": 2})
    res = S.run_sweep(cfg, db=tmp_path / "l.db", progress=False, echo=lambda _: None)
    assert res.failed == 0 and res.ran == res.planned == 2 * 3
    rows = _runs(tmp_path / "l.db", res.sweep_id)
    assert {r["dtype"] for r in rows} == {"gguf"} and all(r["batch_tokens_per_s"] > 0 for r in rows)
    assert all(r["matches_single"] is not None and r["matches_baseline"] is not None for r in rows)


# -------------------------------------------------------------------------------------------- the report


def _shape(speedups: dict[int, list[float]]) -> pd.DataFrame:
    """Batched runs in the one shape: per B, one batch per speedup: baseline (100 tok/s), draft/fixed, baseline."""
    rows = []
    for b, xs in speedups.items():
        for j, x in enumerate(xs):
            for order, (m, p, tps) in enumerate([("baseline", None, 100.0), ("draft", "fixed", 100.0 * x),
                                                  ("baseline", None, 100.0)]):
                rows.append({"sweep_id": "s", "config_label": "c", "group_name": "code", "batch_size": b,
                             "batch": j, "order": order, "method": m, "policy": p, "k": 2 if m == "draft" else None,
                             "tokens_per_s": tps, "predicted_speedup": 1.5 if m == "draft" else 1.0,
                             "new_tokens": 10, "total_s": 10 / tps, "prefill_s": 0.02, "num_accepted": 6,
                             "row_rounds": 4 * b, "rows_mismatch_batched": 0,
                             "rows_mismatch_single": 1 if j == 0 else 0, "error": None})
    return pd.DataFrame(rows)


def test_speedup_interval_and_crossover_from_paired_runs():
    """Ratios pair each run with its own batch's baselines; the crossover is the first B whose interval lies
    below 1 (not merely a center below 1)."""
    from specdec.report.sections_batch import batch_ratios, batch_summary, crossovers

    s = batch_summary(batch_ratios(_shape({1: [1.5, 1.6, 1.4], 2: [1.1, 0.8, 1.2], 4: [0.7, 0.72, 0.69],
                                           8: [0.5, 0.52, 0.49]})))
    b1 = s[s["batch_size"] == 1].iloc[0]
    assert b1["speedup"] == pytest.approx((1.5 * 1.6 * 1.4) ** (1 / 3)) and b1["lo"] > 1.0 and b1["n"] == 3
    assert b1["mismatch_single"] == 1 and b1["ks"] == [2] and b1["predicted"] == pytest.approx(1.5)
    want = [(10 / (0.1 / x - 0.02)) / (10 / 0.08) for x in (1.5, 1.6, 1.4)]
    assert b1["decode_speedup"] == pytest.approx((want[0] * want[1] * want[2]) ** (1 / 3))
    assert s[s["batch_size"] == 2].iloc[0]["hi"] > 1.0  # center below 1 at B = 2 is not a crossover
    (c,) = crossovers(s).itertuples()
    assert c.crossover == "B = 4"
    c2 = crossovers(batch_summary(batch_ratios(_shape({1: [1.5, 1.6], 2: [1.2, 1.3]}))))
    assert c2["crossover"].iloc[0] == "none up to B = 2"


def test_old_and_new_batched_rows_load_to_one_shape():
    """The harness's ``batch_runs`` rows and the sweep's batched ``runs`` rows of the same runs load to the
    same shape and the same ratios."""
    from specdec.report.batches import from_batch_table, from_runs
    from specdec.report.sections_batch import batch_ratios

    old, new, run_id = [], [], 0
    for seq, (m, p, tps) in enumerate([("baseline", None, 100.0), ("draft", "fixed", 150.0), ("baseline", None, 110.0),
                                       ("draft", "cost", 90.0), ("baseline", None, 100.0)]):
        old.append({"sweep_id": "s", "config_label": "c", "group_name": "code", "batch_size": 2, "batch_idx": 0,
                    "seq": seq, "method": m, "policy": p, "k": 2, "tokens_per_s": tps, "total_s": 20 / tps,
                    "prefill_s": 0.01, "new_tokens": 20, "num_accepted": 4, "row_rounds": 8, "predicted_speedup": 1.2,
                    "rows_mismatch_batched": 0, "rows_mismatch_single": 1, "error": None, "run_id": seq})
        planned = {"fixed": "best", None: "-"}.get(p, p)
        for row in (0, 1):
            run_id += 1
            new.append({"sweep_id": "s", "config_label": "c", "run_id": run_id, "batch_size": 2,
                        "batch_id": "code/2/0", "row": row, "prompt_id": f"p{row}", "prompt_type": "code",
                        "cell_key": f"s|c|p{row}|{m}|2|{planned}|{seq}|code/2/0|{row}", "method": m,
                        "policy": p, "k": 2, "batch_tokens_per_s": tps, "batch_total_s": 20 / tps,
                        "prefill_s": 0.01, "new_tokens": 10, "num_accepted": 2, "num_rounds": 4,
                        "predicted_speedup": 1.2, "matches_baseline": 1, "matches_single": row, "error": None,
                        "tokens_per_s": 1.0, "total_s": 1.0})
    a, b = from_batch_table(pd.DataFrame(old)), from_runs(pd.DataFrame(new))
    assert a[["group_name", "method", "policy"]].values.tolist() == b[["group_name", "method", "policy"]].values.tolist()
    for col in ("batch_size", "order", "tokens_per_s", "total_s", "new_tokens", "num_accepted", "row_rounds",
                "predicted_speedup", "rows_mismatch_batched", "rows_mismatch_single"):
        assert a[col].astype(float).tolist() == pytest.approx(b[col].astype(float).tolist()), col
    ra, rb = batch_ratios(a), batch_ratios(b)
    assert ra["ratio"].tolist() == pytest.approx(rb["ratio"].tolist()) and len(ra) == 2


def test_the_batch_section_reads_only_the_store():
    """The report's batch modules import nothing from the bench but the store (the report reads the store)."""
    bench = set()
    for module in ("specdec.report.sections_batch", "specdec.report.batches"):
        with open(importlib.util.find_spec(module).origin) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec.bench"):
                bench |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module == "specdec":
                bench |= {f"specdec.{a.name}" for a in node.names if a.name == "bench"}
    assert bench == {"specdec.bench.store"}
