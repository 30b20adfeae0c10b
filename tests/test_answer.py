"""The report's answer per prompt type (specdec.report.answer): predicted intervals over a type's prompts,
widened by the timed check, verdicts, best drafter and K, and the timed cells beside them."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from specdec.core import stats
from specdec.report.answer import model_check, type_answer, widened


def _grid(per_prompt: dict[str, dict[tuple[str, str, int], float]], ptype: str = "code") -> pd.DataFrame:
    rows = []
    for pid, cells in per_prompt.items():
        for (method, policy, k), v in cells.items():
            rows.append({"config_label": "c", "prompt_id": pid, "prompt_type": ptype, "method": method,
                         "policy": policy, "k": k, "predicted": v, "block_efficiency": 2.0, "mean_k": float(k)})
    return pd.DataFrame(rows)


def _pvm(ratios, ptype="code", method="draft", policy="cost", k=16, measured=1.5) -> pd.DataFrame:
    return pd.DataFrame([{"run_id": i, "config_label": "c", "prompt_id": f"p{i}", "prompt_type": ptype,
                          "method": method, "policy": policy, "k": k, "replay_exact": i % 2 == 0, "mismatch": "",
                          "predicted": r * measured, "measured": measured, "ratio": r, "n_adjacent": 2}
                         for i, r in enumerate(ratios)])


FIVE = {f"p{i}": {("draft", "cost", 16): 1.4 + 0.02 * i, ("draft", "fixed", 2): 1.5 + 0.02 * i,
                  ("draft", "fixed", 4): 1.3, ("ngram", "fixed", 2): 1.1, ("ngram", "fixed", 8): 0.9}
        for i in range(5)}


def test_five_prompts_give_a_verdict_with_the_interval_over_prompts():
    t = type_answer(_grid(FIVE), _pvm([]).iloc[0:0])
    (r,) = t.itertuples()
    ref = stats.ratio_interval([1.5 + 0.02 * i for i in range(5)])
    assert (r.best_method, r.best_k, r.n_prompts) == ("draft", 2, 5)
    assert r.best == pytest.approx(ref.center) and (r.best_lo, r.best_hi) == pytest.approx((ref.lo, ref.hi))
    assert r.best_verdict == "win" and r.default_verdict == "win"
    assert "draft K=2 1.54x" in r.drafters and "ngram K=2 1.10x" in r.drafters
    assert r.n_timed == 0 and r.timed == ""


def test_four_prompts_give_no_verdict_whatever_the_interval():
    four = {k: v for k, v in FIVE.items() if k != "p4"}
    (r,) = type_answer(_grid(four), _pvm([]).iloc[0:0]).itertuples()
    assert r.best_lo > 1 and r.best_verdict == "too few prompts" and r.default_verdict == "too few prompts"


def test_the_timed_check_widens_the_interval_and_can_take_a_verdict_away():
    """Predictions 8 % above measurement on 6 timed cells: the type's interval is divided by the check's
    interval ends, and a prediction of 1.05x that was a win on its own becomes a loss."""
    near = {f"p{i}": {("draft", "cost", 16): 1.05 + 0.002 * i, ("draft", "fixed", 2): 1.05 + 0.002 * i}
            for i in range(5)}
    pvm = _pvm([1.06, 1.08, 1.10, 1.07, 1.09, 1.08])
    alone = type_answer(_grid(near), pvm.iloc[0:0]).iloc[0]
    checked = type_answer(_grid(near), pvm).iloc[0]
    mc = model_check(pvm).set_index("method").loc["all"]
    assert alone["best_verdict"] == "win"
    assert checked["best_lo"] == pytest.approx(alone["best_lo"] / mc["hi"])
    assert checked["best_hi"] == pytest.approx(alone["best_hi"] / mc["lo"])
    assert checked["best_verdict"] == "loss"  # 1.05x predicted by a model 6-10 % optimistic: below 1 measured
    assert checked["n_timed"] == 6 and "draft cost 1.50x (predicted 1.62x, 6 runs)" == checked["timed"]


def test_a_check_over_few_prompts_still_widens_the_interval():
    """A check over 3 prompts (6 cells) is rough but still widens: a model checked on few prompts never gives
    a stronger verdict than one checked on many. Cells of one prompt are one unit, not three."""
    near = {f"p{i}": {("draft", "cost", 16): 1.05 + 0.002 * i, ("draft", "fixed", 2): 1.05 + 0.002 * i}
            for i in range(5)}
    pvm = _pvm([1.06, 1.08, 1.10, 1.07, 1.09, 1.08]).assign(prompt_id=["p0", "p0", "p1", "p1", "p2", "p2"])
    mc = model_check(pvm).set_index("method").loc["all"]
    assert (mc["n"], mc["n_runs"]) == (3, 6)
    alone = type_answer(_grid(near), pvm.iloc[0:0]).iloc[0]
    checked = type_answer(_grid(near), pvm).iloc[0]
    assert checked["best_lo"] == pytest.approx(alone["best_lo"] / mc["hi"])
    assert checked["best_verdict"] != "win" == alone["best_verdict"]


def test_model_check_pools_and_splits_by_drafter_with_the_prompt_as_unit():
    """A prompt's cells share its trace and costs: they are pooled into one unit before the interval (prompts
    p0 and p1 hold a draft and an ngram cell each, p2 a draft cell)."""
    pvm = pd.concat([_pvm([1.0, 1.1, 0.9]), _pvm([2.0, 2.0], method="ngram", policy="fixed", k=4)])
    mc = model_check(pvm).set_index("method")
    assert (mc.loc["all", "n"], mc.loc["draft", "n"], mc.loc["ngram", "n"]) == (3, 3, 2)
    assert (mc.loc["all", "n_runs"], mc.loc["draft", "n_runs"], mc.loc["ngram", "n_runs"]) == (5, 3, 2)
    assert mc.loc["ngram", "ratio"] == pytest.approx(2.0)
    units = [math.sqrt(1.0 * 2.0), math.sqrt(1.1 * 2.0), 0.9]
    assert mc.loc["all", "ratio"] == pytest.approx(math.exp(np.mean(np.log(units))))
    assert mc.loc["all", "lo"] == pytest.approx(stats.ratio_interval(units).lo)
    assert mc.loc["all", "n_exact"] == 3


def test_widened_keeps_an_unchecked_interval_and_names_a_loss():
    ci = stats.ratio_interval([0.8, 0.82, 0.79, 0.81, 0.8])
    assert widened(ci, None) == (ci.lo, ci.hi, "loss")
    lo, hi, verdict = widened(ci, (0.5, 2.0))
    assert (lo, hi) == pytest.approx((ci.lo / 2.0, ci.hi / 0.5)) and verdict == "no measurable difference"


def test_no_grid_no_answer():
    assert type_answer(pd.DataFrame(), pd.DataFrame()).empty


def test_the_main_job_on_a_prompt_file_prices_every_prompt_and_opens_the_report_with_the_answer(
        tmp_path, tiny_pair, near_draft_dir):
    """The default main job (its policies and dealt checks; tiny models, 6 new tokens) on a prompt file of two
    types x 5 prompts: the 8 non-primary prompts run once (target-only, with trace and one calibration pass),
    the primaries carry the checks between baselines, and the report's first section is the answer with one
    row per type over its 5 prompts."""
    import json
    import sqlite3

    from conftest import tiny_sweep_config

    from specdec.bench import sweep as S
    from specdec.report.render import write_report

    prompts = tmp_path / "heldout.jsonl"
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    rows = [{"id": f"{t}-{i}", "type": t, "prompt": f"{t} {w} " * (3 + i)} for t in ("one", "two")
            for i, w in enumerate(words)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompts, ks="", secondary_ks="", policies="best,draft:cost",
                            methods="baseline,aa,draft,ngram,mixed",
                            checks_per_prompt=2, max_new_tokens=6)
    result = S.run_sweep(cfg, db=tmp_path / "job.db", progress=False, echo=lambda _: None)
    assert result.status == "done" and result.failed == 0
    con = sqlite3.connect(tmp_path / "job.db")
    per_prompt = dict(con.execute("SELECT prompt_id, COUNT(*) FROM runs GROUP BY prompt_id").fetchall())
    passes = dict(con.execute("SELECT prompt_id, repeats FROM calibration WHERE role = 'target' AND n_tokens = 1"
                              ).fetchall())
    traced = {r[0] for r in con.execute("SELECT prompt_id FROM traces")}
    con.close()
    assert traced == {r["id"] for r in rows}
    for r in rows:
        primary = r["id"].endswith("-0")
        assert per_prompt[r["id"]] == (5 if primary else 1)  # B X B X B, or the pricing run alone
        assert passes[r["id"]] == (cfg.calibration_repeats if primary else 1)
    res = write_report(tmp_path / "job.db", tmp_path / "report")
    md = res.markdown.read_text(encoding="utf-8")
    first = md.split("\n## ")[1]
    assert first.startswith("The answer: when speculative decoding beats target-only decoding here")
    assert "| one | 5 |" in first and "| two | 5 |" in first
    assert {e.kind for e in res.drawn} >= {"answer_vs_k", "answer_vs_acceptance"}
    # --beside: a sweep beside another (here itself): both sides equal, per type and drafter
    beside = write_report(tmp_path / "job.db", tmp_path / "beside", beside=tmp_path / "job.db").markdown
    part = beside.read_text(encoding="utf-8").split("\n## Beside greedy")[1].split("\n## ")[0]
    lines = [ln for ln in part.splitlines() if ln.startswith("| ") and "| draft |" in ln]
    cells = [ln.strip("| ").split(" | ") for ln in lines]
    assert len(cells) == 2 and all(c[3] == c[4] and c[3].startswith("K=") for c in cells)
    assert "greedy (" in part


def test_a_sampled_stores_answer_table_shows_its_timed_runs_block_efficiency_not_none():
    """Under sampling no speedup is replayed run by run (the greedy check is empty), but the timed sampled
    fixed-K runs are checked by block efficiency: the answer's 'timed' column lists them per drafter and K
    instead of saying 'none', and a type without a default-policy prediction shows '-' as its verdict."""
    from specdec.report import tables as T
    from specdec.report.analysis import Analysis
    from specdec.report.document import Table
    from specdec.report.sampled import COLUMNS
    from specdec.report.sections_answer import answer_section

    answer = type_answer(_grid({f"p{i}": {("draft", "fixed", 4): 1.3, ("ngram", "fixed", 8): 0.9}
                                for i in range(2)}), _pvm([]).iloc[0:0])
    assert (answer["timed"] == "").all() and (answer["default_verdict"] == "").all()
    sampled = pd.DataFrame([[1, "c", "p0", "code", "draft", "fixed", 4, 0.7, 2.5, 3.0, 2.5 / 3.0],
                            [2, "c", "p1", "code", "draft", "fixed", 4, 0.7, 2.5, 2.0, 2.5 / 2.0],
                            [3, "c", "p0", "code", "ngram", "fixed", 8, 0.7, 1.2, 1.0, 1.2],
                            [4, "c", "p1", "code", "mixed cost", "cost", 16, 0.7, 2.2, 2.0, 1.1]], columns=COLUMNS)
    a = Analysis(store=None, tables={T.ANSWER.name: answer, T.SAMPLED.name: sampled}, costs={}, missing=[])
    (tab,) = [b for b in answer_section(a, []).blocks if isinstance(b, Table)]
    row = dict(zip(tab.headers, tab.rows[0], strict=True))
    assert row["timed (measured, predicted)"] == ("tokens/forward: draft K=4 2.45 (predicted 2.50, 2 runs); "
                                                  "mixed cost (K up to 16) 2.00 (predicted 2.20, 1 run); "
                                                  "ngram K=8 1.00 (predicted 1.20, 1 run)")
    assert row["default verdict"] == "-"
    empty = Analysis(store=None, tables={T.ANSWER.name: answer}, costs={}, missing=[])
    (tab,) = [b for b in answer_section(empty, []).blocks if isinstance(b, Table)]
    assert dict(zip(tab.headers, tab.rows[0], strict=True))["timed (measured, predicted)"] == "none"


def test_the_default_column_is_the_default_policy_the_store_names():
    grid = _grid({f"p{i}": {("draft", "cost", 16): 1.2, ("mixed", "cost", 16): 1.8 + 0.01 * i} for i in range(5)})
    mixed = stats.ratio_interval([1.8 + 0.01 * i for i in range(5)])
    (r,) = type_answer(grid, _pvm([]).iloc[0:0], ("mixed", "cost")).itertuples()
    assert r.default == pytest.approx(mixed.center) and r.default_verdict == "win"
    (d,) = type_answer(grid, _pvm([]).iloc[0:0], ("draft", "cost")).itertuples()
    assert d.default == pytest.approx(1.2)
