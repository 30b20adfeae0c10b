"""The batch sweep (specdec.bench.batch_sweep, ``specdec batch-sweep``) and its report section, on the tiny
models: plan and dry run, a real run into a tmp store, resume, exactness counts, one-line errors."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from specdec.bench import batch_sweep as BS
from specdec.bench.store import Store
from specdec.bench.store_batch import BatchTables
from specdec.prompts import Prompt

#: Short prompts (the tiny models have 128 positions) of the ``code`` and ``repetitive`` groups' types.
POOL = [
    Prompt("code-01", "code", "def f(x): return x + 1\ndef g(x): return f(x)"),
    Prompt("code_json-01", "code_json", '{"a": 1, "b": 2, "c": 3, "a": 1, "b":'),
    Prompt("code_python-01", "code_python", "for i in range(10):\n    print(i)\nfor j in"),
    Prompt("rep-01", "repetitive", "abc abc abc abc abc abc abc abc"),
    Prompt("rep-02", "repetitive_pattern", "one two one two one two one two"),
]


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from specdec.bench.commands import register

    app = typer.Typer()
    register(app)
    return app


def tiny_cfg(tiny_pair, draft_dir, **kw):
    flags = {"target": str(tiny_pair.target_dir), "draft": str(draft_dir), "batch_sizes": "1,2",
             "configs": "transformers-eager", "groups": "code", "batches": 2, "max_new_tokens": 6, "max_k": 3,
             "calibration_repeats": 1, "threads": 1}
    flags.update(kw)
    return BS.make_batch_config(**flags)


def run(cfg, db, **kw):
    lines: list[str] = []
    res = BS.run_batch_sweep(cfg, db, echo=lines.append, prompts=POOL, **kw)
    return res, lines


def test_groups_cycle_their_prompts_round_robin_over_types():
    pool = BS.group_prompts("code", POOL)
    assert [p.id for p in pool] == ["code-01", "code_json-01", "code_python-01"]
    assert [p.id for p in BS.batch_prompts(pool, 2, 1)] == ["code_python-01", "code-01"]
    builtin = BS.group_prompts("mixed")
    assert len({p.type for p in builtin[:12]}) == 12 and len(builtin) == 63  # one of each type first
    assert BS.run_sequence(["draft"]) == (("baseline", None), ("draft", "fixed"), ("baseline", None),
                                          ("draft", "cost"), ("baseline", None), ("aa", None), ("baseline", None))


@pytest.mark.parametrize("args, message", [
    (["--batch-sizes", "0"], "B must be in 1..16, got 0"),
    (["--batch-sizes", "4,17"], "B must be in 1..16, got 17"),
    (["--batch-sizes", "two"], "'two' is not an integer"),
    (["--groups", "code,poetry"], "unknown group poetry"),
    (["--methods", "medusa"], "unknown method medusa"),
    (["--configs", "transformers-compiled"], "batched decoding runs the eager"),
    (["--batches", "0"], "--batches must be >= 1"),
])
def test_bad_input_is_one_line(app, tmp_path, args, message):
    res = CliRunner().invoke(app, ["batch-sweep", "--dry-run", "--db", str(tmp_path / "b.db"), *args])
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("specdec: error: ") and message in res.output


def test_db_that_is_a_directory_is_refused_before_loading(app, tmp_path):
    for extra in ([], ["--dry-run"]):
        res = CliRunner().invoke(app, ["batch-sweep", "--db", str(tmp_path), *extra])
        assert res.exit_code == 2 and res.output.count("\n") == 1 and "is a directory" in res.output


def test_dry_run_prints_the_plan_and_loads_nothing(app, tmp_path, tiny_pair, monkeypatch):
    import specdec.runtimes.loading

    monkeypatch.setattr(specdec.runtimes.loading, "load_pair", lambda *a, **k: pytest.fail("a dry run loaded a model"))
    db = tmp_path / "b.db"
    res = CliRunner().invoke(app, ["batch-sweep", "--dry-run", "--target", str(tiny_pair.target_dir), "--draft",
                                   str(tiny_pair.draft_dir), "--configs", "transformers-eager,llamacpp",
                                   "--batch-sizes", "1,2,4", "--groups", "code,prose", "--batches", "2",
                                   "--db", str(db)])
    assert res.exit_code == 0, res.output
    # 2 configs x 2 groups x 3 B x 2 batches = 24 cells of 11 runs
    assert "24 cells x 11 runs = 264 timed batched generations" in res.output
    assert "transformers-eager: rough estimate" in res.output and "llamacpp: rough estimate" in res.output
    assert not db.exists()


def test_end_to_end_store_resume_and_exactness(tmp_path, tiny_pair, near_draft_dir):
    """A tiny sweep stores every run of every cell with its measurements; greedy rows equal the batched and
    the single-sequence target-only rows (counted 0); a second run without --resume is refused, with it
    skips every stored run and runs nothing; the calibration holds B x m points and the draft step."""
    cfg = tiny_cfg(tiny_pair, near_draft_dir)
    db = tmp_path / "b.db"
    res, lines = run(cfg, db)
    n_cells, n_seq = 2 * 2, len(BS.run_sequence(cfg.methods))
    assert (res.ran, res.skipped, res.failed, res.status) == (n_cells * n_seq, 0, 0, "done")
    with Store(db, readonly=True) as store:
        bt = BatchTables(store)
        runs = bt.runs(res.sweep_id)
        cal = store.conn.execute("SELECT role, batch_size, n_tokens FROM batch_calibration").fetchall()
        status = store.conn.execute("SELECT status FROM batch_sweeps").fetchone()[0]
    assert status == "done"
    assert sorted((r[0], r[1], r[2]) for r in cal) == sorted(
        [("target", b, m) for b in (1, 2) for m in range(1, 5)] + [("draft", b, 1) for b in (1, 2)])
    assert len(runs) == n_cells * n_seq and all(r["error"] is None for r in runs)
    for r in runs:
        b = r["batch_size"]
        assert len(r["token_ids"]) == b == len(r["prompt_ids"])
        assert r["new_tokens"] == sum(len(t) for t in r["token_ids"]) and all(1 <= len(t) <= 6 for t in r["token_ids"])
        assert r["rows_mismatch_batched"] == 0 and r["rows_mismatch_single"] == 0
        assert r["tokens_per_s"] > 0 and r["row_tps_p50"] > 0 and r["row_tps_p95"] >= r["row_tps_p50"]
        assert r["forward_s"] > 0 and r["num_rounds"] >= 1 and r["row_rounds"] >= r["num_rounds"]
        assert r["predicted_speedup"] > 0
        if r["method"] in ("baseline", "aa"):
            assert r["num_drafted"] == 0 and r["predicted_speedup"] == 1.0
            assert r["num_rounds"] == max(len(t) for t in r["token_ids"]) and r["row_rounds"] == r["new_tokens"]
        else:
            assert r["policy"] in ("fixed", "cost") and 0.0 <= r["alpha_pre"] <= 1.0 and 0 <= r["k_best"] <= 3
        if r["policy"] == "fixed":
            assert r["k"] == max(1, r["k_best"])
    # the near draft on the repetitive-free code prompts: some drafts accepted, per-row rounds fewer than 6
    drafted = [r for r in runs if r["method"] == "draft" and r["policy"] == "fixed"]
    assert sum(r["num_accepted"] for r in drafted) > 0
    assert any("B=2 batch 1" in line for line in lines)

    from specdec.bench.store_access import SweepExistsError

    with pytest.raises(SweepExistsError, match="--resume"):
        run(cfg, db)
    res2, _ = run(cfg, db, resume=True)
    assert (res2.ran, res2.skipped) == (0, n_cells * n_seq)

    # extending the grid keeps the sweep: only the new B is calibrated and run
    cfg3 = tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="1,2,3")
    res3, _ = run(cfg3, db, resume=True)
    assert res3.sweep_id == res.sweep_id and res3.skipped == n_cells * n_seq and res3.ran == 2 * n_seq


def test_a_deleted_run_is_rerun_on_resume_against_the_stored_baseline(tmp_path, tiny_pair, near_draft_dir):
    cfg = tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="2", batches=1, methods="ngram", single_reference=False)
    db = tmp_path / "b.db"
    res, _ = run(cfg, db)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("DELETE FROM batch_runs WHERE seq = 1")
    conn.close()
    res2, _ = run(cfg, db, resume=True)
    assert res2.ran == 1
    with Store(db, readonly=True) as store:
        (r,) = BatchTables(store).runs(res.sweep_id, seq=1)
    assert r["method"] == "ngram" and r["rows_mismatch_batched"] == 0 and r["rows_mismatch_single"] is None


def test_mismatching_rows_are_counted_not_fatal(tmp_path, tiny_pair, near_draft_dir, monkeypatch):
    """A scripted fake flips the last token of row 1 in every speculative run and the single-sequence
    reference of one prompt differs: the counts say so, the sweep finishes."""
    real_generate = BS._generate

    def fake_generate(target, prompts, n, **kw):
        out = real_generate(target, prompts, n, **kw)
        if kw.get("drafter") is not None and n > BS.PRE_TOKENS and len(out) > 1:  # timed runs, not pre-runs
            out[1].token_ids[-1] = (out[1].token_ids[-1] + 1) % 1000
        return out

    real_single = BS.single_reference
    calls = []

    def fake_single(backend, ids, n, **kw):
        toks = real_single(backend, ids, n, **kw)
        calls.append(ids)
        return [t + 1 for t in toks] if len(calls) == 1 else toks  # the first prompt referenced: code-01

    monkeypatch.setattr(BS, "_generate", fake_generate)
    monkeypatch.setattr(BS, "PRE_TOKENS", 4)
    monkeypatch.setattr(BS, "single_reference", fake_single)
    cfg = tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="2", batches=1, methods="draft")
    res, _ = run(cfg, tmp_path / "b.db")
    assert res.failed == 0
    with Store(tmp_path / "b.db", readonly=True) as store:
        runs = BatchTables(store).runs(res.sweep_id)
    for r in runs:
        spec = r["method"] == "draft"
        # batch 0 of code = [code-01, code_json-01]: row 0 is the prompt whose single reference differs
        assert r["rows_mismatch_batched"] == (1 if spec else 0), r
        assert r["rows_mismatch_single"] == (2 if spec else 1), r


def test_a_failed_run_is_recorded_and_retried_on_resume(tmp_path, tiny_pair, near_draft_dir, monkeypatch):
    real_generate = BS._generate

    def failing(target, prompts, n, **kw):
        if kw.get("policy") is not None:
            raise RuntimeError("boom")
        return real_generate(target, prompts, n, **kw)

    monkeypatch.setattr(BS, "_generate", failing)
    cfg = tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="1", batches=1, methods="ngram")
    db = tmp_path / "b.db"
    res, lines = run(cfg, db)
    assert res.failed == 1 and any("boom" in line for line in lines)
    monkeypatch.setattr(BS, "_generate", real_generate)
    res2, _ = run(cfg, db, resume=True)
    assert res2.ran == 1 and res2.failed == 0
    with Store(db, readonly=True) as store:
        runs = BatchTables(store).runs(res.sweep_id)
    assert len(runs) == len(BS.run_sequence(["ngram"])) and all(r["error"] is None for r in runs)


def test_batch_costs_price_k_from_the_calibration():
    """Flat target cost up to 4 tokens in total, then linear: K = 3 pays at B = 1 (4 tokens for the price of
    one) and nothing pays at B = 4 (every extra token costs as much as a step); the prediction at K = 0 is 1."""
    target = {(b, m): max(1.0, b * m / 4) for b in (1, 4) for m in range(1, 5)}
    costs = BS.BatchCosts(target, {1: 0.01, 4: 0.02})
    assert costs.target_cost(4) == 1.0 and costs.target_cost(16) == 4.0
    assert costs.best_k([0.9], 3, drafting_model=True) == 3
    assert costs.best_k([0.9] * 4, 3, drafting_model=True) == 0
    assert costs.predicted_speedup([0.9] * 4, 0, drafting_model=True) == 1.0
    assert costs.predicted_speedup([1.0], 3, drafting_model=False) == pytest.approx(4.0)
    assert costs.draft_cost(2, 3) == pytest.approx(3 * (0.01 + 0.01 / 3))


def test_llamacpp_configuration_end_to_end(tmp_path, smollm2_gguf):
    """The llama.cpp configuration on the tiny GGUF (target and draft the same file: every draft accepted):
    its batched backends are opened for max(B) rows, calibrated and timed; rows that differ from the
    single-sequence output are counted (llama.cpp's batched kernels may flip a near tie), not fatal."""
    pytest.importorskip("llama_cpp")
    cfg = BS.make_batch_config(target=str(smollm2_gguf), draft=str(smollm2_gguf), batch_sizes="1,2",
                               configs="llamacpp", groups="code", batches=1, max_new_tokens=4, max_k=2,
                               calibration_repeats=1, threads=1, methods="draft")
    res, _ = run(cfg, tmp_path / "l.db")
    assert (res.ran, res.failed) == (2 * len(BS.run_sequence(["draft"])), 0)
    with Store(tmp_path / "l.db", readonly=True) as store:
        runs = BatchTables(store).runs(res.sweep_id)
    assert {r["dtype"] for r in runs} == {"gguf"} and all(r["tokens_per_s"] > 0 for r in runs)
    spec = [r for r in runs if r["method"] == "draft"]
    assert all(r["alpha_pre"] == 1.0 for r in spec)
    assert all(r["rows_mismatch_single"] is not None and r["rows_mismatch_batched"] is not None for r in runs)


# -- the report --------------------------------------------------------------------------------------------


def test_report_renders_the_batch_section_and_its_figure(tmp_path, tiny_pair, near_draft_dir):
    """A store holding only a batch sweep: the report writes the section (a row per config x group x B x
    method, the crossover table) and the speedup-against-B figure; a store without batch runs has neither."""
    from specdec.report.render import write_report

    cfg = tiny_cfg(tiny_pair, near_draft_dir, methods="ngram", single_reference=False)
    db = tmp_path / "b.db"
    run(cfg, db)
    result = write_report(db, tmp_path / "rep")
    html = result.html.read_text()
    md = result.markdown.read_text()
    assert "Speedup against batch size" in html and "Speedup against batch size" in md
    for name in ("ngram/fixed", "ngram/cost", "aa"):
        assert all(f"| transformers-eager | code | {b} | {name} |" in md for b in (1, 2)), name
    assert "crossover B" in md
    assert any(f"| transformers-eager | code | ngram/fixed | {x}" in md for x in ("B = 1", "B = 2", "none up to B = 2"))
    (fig,) = [e for e in result.figures if e.kind == "batch"]
    assert fig.skipped is None and fig.png.is_file() and fig.svg.is_file()
    assert "batch__speedup_vs_b.png" in md

    other = tmp_path / "empty.db"
    Store(other).close()
    plain = write_report(other, tmp_path / "rep2")
    assert "Speedup against batch size" not in plain.html.read_text()
    assert not [e for e in plain.figures if e.kind == "batch"]


def _runs_frame(speedups: dict[int, list[float]]) -> pd.DataFrame:
    """batch_runs rows: per B, one batch per speedup, each cell baseline (100 tok/s), draft/fixed, baseline."""
    rows = []
    for b, xs in speedups.items():
        for j, x in enumerate(xs):
            for seq, (m, p, tps) in enumerate([("baseline", None, 100.0), ("draft", "fixed", 100.0 * x),
                                                ("baseline", None, 100.0)]):
                rows.append({"sweep_id": "s", "config_label": "c", "group_name": "code", "batch_size": b,
                             "batch_idx": j, "seq": seq, "method": m, "policy": p, "k": 2 if m == "draft" else None,
                             "tokens_per_s": tps, "predicted_speedup": 1.5 if m == "draft" else 1.0,
                             "new_tokens": 10, "total_s": 10 / tps, "prefill_s": 0.02,
                             "num_accepted": 6, "row_rounds": 4 * b,
                             "rows_mismatch_batched": 0, "rows_mismatch_single": 1 if j == 0 else 0,
                             "error": None})
    return pd.DataFrame(rows)


def test_speedup_interval_and_crossover_from_paired_runs():
    """Ratios pair each run with its own cell's baselines; the crossover is the first B whose interval lies
    below 1 (not merely a center below 1)."""
    from specdec.report.sections_batch import batch_ratios, batch_summary, crossovers

    runs = _runs_frame({1: [1.5, 1.6, 1.4], 2: [1.1, 0.8, 1.2], 4: [0.7, 0.72, 0.69], 8: [0.5, 0.52, 0.49]})
    s = batch_summary(batch_ratios(runs))
    b1 = s[s["batch_size"] == 1].iloc[0]
    assert b1["speedup"] == pytest.approx((1.5 * 1.6 * 1.4) ** (1 / 3)) and b1["lo"] > 1.0 and b1["n"] == 3
    assert b1["mismatch_single"] == 1 and b1["ks"] == [2] and b1["predicted"] == pytest.approx(1.5)
    # decode-only: 10 tokens in 0.1 s - 0.02 s prefill against 10 / (1 / x) - 0.02 s, per batch
    want = [(10 / (0.1 / x - 0.02)) / (10 / 0.08) for x in (1.5, 1.6, 1.4)]
    assert b1["decode_speedup"] == pytest.approx((want[0] * want[1] * want[2]) ** (1 / 3))
    assert s[s["batch_size"] == 2].iloc[0]["hi"] > 1.0  # center below 1 at B = 2 is not a crossover
    (c,) = crossovers(s).itertuples()
    assert c.crossover == "B = 4"
    c2 = crossovers(batch_summary(batch_ratios(_runs_frame({1: [1.5, 1.6], 2: [1.2, 1.3]}))))
    assert c2["crossover"].iloc[0] == "none up to B = 2"


def test_the_batch_section_reads_only_the_store():
    """sections_batch imports nothing from the bench but the store (the report reads the store only)."""
    import ast
    import importlib.util

    with open(importlib.util.find_spec("specdec.report.sections_batch").origin) as f:
        src = f.read()
    bench = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec.bench"):
            bench |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "specdec":
            bench |= {f"specdec.{a.name}" for a in node.names if a.name == "bench"}
    assert bench == {"specdec.bench.store"}


def test_report_of_a_store_with_two_batch_sweeps_reports_the_newest(tmp_path, tiny_pair, near_draft_dir):
    from specdec.report.sections_batch import batch_report

    db = tmp_path / "b.db"
    first, _ = run(tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="1", batches=1, methods="ngram",
                            single_reference=False), db)
    second, _ = run(tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="2", batches=1, methods="ngram",
                             single_reference=False, max_new_tokens=5), db)
    assert first.sweep_id != second.sweep_id
    (sec,), _ = batch_report(db, tmp_path / "figs")
    text = " ".join(b for b in sec.blocks if isinstance(b, str))
    assert f"reports {second.sweep_id}" in text and f"left out: {first.sweep_id}" in text
    table = next(b for b in sec.blocks if not isinstance(b, str))
    assert {row[2] for row in table.rows} == {"2"}  # B = 2 only: the first sweep's B = 1 is left out


def test_acceptance_is_pre_run_once_per_prompt_and_method(tmp_path, tiny_pair, near_draft_dir, monkeypatch):
    """The fixed K of every cell is priced from its rows' pre-run acceptance, measured once per prompt and
    drafting method however many cells hold the prompt (a greedy row does not depend on its batch)."""
    real_generate = BS._generate
    pre_rows: list[tuple[str, int]] = []

    def spy(target, prompts, n, **kw):
        if n == BS.PRE_TOKENS:
            pre_rows.extend((kw["drafter"].name, len(p)) for p in prompts)
        return real_generate(target, prompts, n, **kw)

    monkeypatch.setattr(BS, "_generate", spy)
    cfg = tiny_cfg(tiny_pair, near_draft_dir, single_reference=False)  # B = 1, 2 x 2 batches of 3 prompts
    res, _ = run(cfg, tmp_path / "b.db")
    assert res.failed == 0
    assert sorted(name for name, _ in pre_rows) == ["model"] * 3 + ["ngram"] * 3


def test_a_configuration_that_cannot_load_leaves_the_sweep_interrupted(tmp_path, tiny_pair, near_draft_dir):
    def loader(*a, **kw):
        raise ValueError("no such model here")

    cfg = tiny_cfg(tiny_pair, near_draft_dir, batch_sizes="1", batches=1)
    with pytest.raises(ValueError, match="no such model"):
        BS.run_batch_sweep(cfg, tmp_path / "b.db", echo=lambda _: None, loader=loader, prompts=POOL)
    with Store(tmp_path / "b.db", readonly=True) as store:
        assert store.conn.execute("SELECT status FROM batch_sweeps").fetchone()[0] == "interrupted"
