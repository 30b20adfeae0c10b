"""The original GPT-2 study's pairs predicted from measured costs and the original's published acceptance
(`study.original`), and the report section that shows them."""

from __future__ import annotations

import json

import pytest

from specdec.core import theory
from specdec.measure import archs
from study import original


def _costs(c: float, v17: float) -> dict:
    v = {n: 1.0 + (v17 - 1.0) * (n - 1) / 16 for n in range(1, 18)}
    return {"weights": archs.RANDOM_WEIGHTS_LABEL, "dtype": "float32", "device": "cpu",
            "archs": {"gpt2": {"params": 1, "step_s": c, "verify_steps": v},
                      "gpt2-large": {"params": 1, "step_s": 1.0, "verify_steps": v}},
            "pairs": [{"draft": "gpt2", "target": "gpt2-large", "c": c, "verify_steps": v},
                      {"draft": "qwen2.5-coder-0.5b", "target": "qwen2.5-coder-1.5b", "c": c,
                       "verify_steps": v}]}


def test_original_pairs_prediction_by_hand():
    """alpha = 1 (repetitive), K = 16, c = 0.1, v(17) = 2: 17 tokens per round for 1.6 + 2 steps = 4.72x;
    natural (alpha 0.714) at K = 1: (1 + 0.714) / (0.1 + v(2) = 1.0625) = 1.474x."""
    rows = original.predict(_costs(0.1, 2.0))
    assert {r["pair"] for r in rows} == {"gpt2 -> gpt2-large"}  # the default pair is not an original pair
    rep16 = next(r for r in rows if r["prompt_type"] == "repetitive" and r["k"] == 16)
    assert rep16["predicted"] == pytest.approx(17 / 3.6) and rep16["best_k"] == 16
    assert rep16["original_best_k"] == 16 and rep16["original_speedup"] is None
    nat1 = next(r for r in rows if r["prompt_type"] == "natural" and r["k"] == 1)
    assert nat1["predicted"] == pytest.approx(1.714 / (0.1 + 1.0625))
    assert nat1["original_speedup"] == 0.950
    assert nat1["ideal"] == pytest.approx(float(theory.ideal_speedup(0.714, 1, 0.1)))
    with pytest.raises(ValueError, match="need 17"):
        original.predict({"pairs": [{"draft": "gpt2", "target": "gpt2-large", "c": 0.1,
                                           "verify_steps": {1: 1.0, 2: 1.1}}]})


def test_original_pairs_section_labels_what_is_measured_and_what_is_predicted():
    from specdec.report.document import Bullets, Table

    sec = original.original_pairs_section(_costs(0.5, 6.0))
    intro = sec.blocks[0]
    assert "random weights: timing only" in intro and "PREDICTS" in intro and "MEASURED" in intro
    tables = [b for b in sec.blocks if isinstance(b, Table)]
    pred = tables[-1]
    row = next(r for r in pred.rows if r[:2] == ["gpt2 -> gpt2-large", "natural"])
    assert row[2] == "0.714" and row[-1] == "0.950x"  # the original's published acceptance and speedup
    (bullets,) = [b for b in sec.blocks if isinstance(b, Bullets)]
    text = "\n".join(bullets.items)
    assert "the original reports 1.846x" in text
    # c = 0.5, v(n) rising linearly to v(17) = 6 (a CPU-like curve): natural's best is K = 1 at
    # 1.714 / (0.5 + 1.3125) = 0.946x, no win, as the original measured on its GPU
    assert "natural: the original measured 0.950x (no win); predicted best here 0.95x at K = 1 (below 1 here too)" in text
    assert "repetitive: best K 16 on the GPU, 16 predicted here" in text  # alpha = 1: the longest draft pays


def test_study_report_with_arch_costs_has_the_section(tmp_path, capsys):
    """``python -m study.report --arch-costs FILE`` puts the section in both the HTML and the Markdown report;
    the tool's single-store report no longer offers it; a file that is not such a measurement is refused in
    one line before anything is written."""
    from test_study import _store

    from specdec.entrypoints.cli import main as specdec_main
    from study.report import main, write_study

    db = _store(tmp_path / "fast.db", "fast")
    costs = tmp_path / "arch.json"
    costs.write_text(json.dumps(_costs(0.3, 3.0)))
    res = write_study([db], tmp_path / "rep", arch_costs=costs)
    for path in (res.html, res.markdown):
        text = path.read_text()
        assert "The original pairs (predicted from measured costs)" in text
        assert "gpt2 -&gt; gpt2-large" in text or "gpt2 -> gpt2-large" in text
    plain = write_study([db], tmp_path / "plain")
    assert "The original pairs" not in plain.markdown.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"archs": {}}))
    capsys.readouterr()
    assert main(["--db", str(db), "--out", str(tmp_path / "none"), "--arch-costs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"study.report: error: {bad}: not a 'specdec costs --arch' measurement (no 'archs'/'pairs')\n"
    assert not (tmp_path / "none").exists()
    with pytest.raises(SystemExit) as exc:
        specdec_main(["report", "--db", str(db), "--out", str(tmp_path / "tool"), "--arch-costs", str(costs)])
    assert exc.value.code == 2 and not (tmp_path / "tool").exists()
