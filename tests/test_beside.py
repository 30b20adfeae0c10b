"""specdec.report.beside: two sweeps' trace grids side by side per prompt type and drafter."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdec.report.beside import beside_section, beside_table, sweep_label
from specdec.report.document import Table


def _grid(cells: dict[tuple[str, str, int], list[float]], bpf: float, ptype: str = "code") -> pd.DataFrame:
    """A trace grid: per (method, policy, K) one predicted speedup per prompt (prompt i gets the i-th)."""
    rows = [{"config_label": "c", "prompt_id": f"p{i}", "prompt_type": ptype, "method": m, "policy": p, "k": k,
             "predicted": v, "block_efficiency": bpf + 0.1 * i, "mean_k": float(k)}
            for (m, p, k), vals in cells.items() for i, v in enumerate(vals)]  # fmt: skip
    return pd.DataFrame(rows)


def test_each_side_at_its_own_best_k_with_the_interval_over_its_prompts():
    """Greedy: the draft model is best at K = 4 (5 prompts, a verdict); sampled: at K = 1 (3 prompts, too few
    units), and a drafter only the greedy sweep priced shows on its side alone."""
    greedy = _grid({("draft", "fixed", 1): [1.2] * 5, ("draft", "fixed", 4): [1.6, 1.5, 1.7, 1.6, 1.55],
                    ("draft", "cost", 16): [9.0] * 5, ("ngram", "fixed", 8): [1.1] * 5}, bpf=3.0)
    sampled = _grid({("draft", "fixed", 1): [1.25, 1.2, 1.3], ("draft", "fixed", 4): [1.0, 1.1, 0.9]}, bpf=1.8)
    t = beside_table(greedy, sampled).set_index(["prompt_type", "method"])
    draft, ngram = t.loc[("code", "draft")], t.loc[("code", "ngram")]
    assert draft["a_best_k"] == 4 and draft["b_best_k"] == 1  # a policy's row never counts as a fixed K
    assert draft["a_speedup"] == pytest.approx(math.prod([1.6, 1.5, 1.7, 1.6, 1.55]) ** 0.2)
    assert draft["a_lo"] < draft["a_speedup"] < draft["a_hi"] and draft["a_verdict"] == "win"
    assert draft["b_speedup"] == pytest.approx((1.25 * 1.2 * 1.3) ** (1 / 3)) and draft["b_verdict"] == "too few units"
    assert draft["a_block_efficiency"] == pytest.approx(3.2) and draft["b_block_efficiency"] == pytest.approx(1.9)
    assert (draft["a_n_prompts"], draft["b_n_prompts"]) == (5, 3)
    assert ngram["a_best_k"] == 8 and pd.isna(ngram["b_best_k"])
    sec = beside_section(beside_table(greedy, sampled), "greedy (s1)", "T = 0.7 (s2)")
    (tab,) = [b for b in sec.blocks if isinstance(b, Table)]
    rows = {r[2]: dict(zip(tab.headers, r, strict=True)) for r in tab.rows}
    assert rows["ngram"]["T = 0.7 (s2)"] == "-"
    assert rows["draft"]["T = 0.7 (s2)"].startswith("K=1 1.25x [") and "3 prompts, too few units" in rows["draft"]["T = 0.7 (s2)"]


def test_no_traces_on_either_side_says_so():
    sec = beside_section(beside_table(pd.DataFrame(), None), "greedy (a)", "greedy (b)")
    assert "Neither sweep" in sec.blocks[0] and beside_table(pd.DataFrame(), pd.DataFrame()).empty


def test_the_label_names_the_temperature_of_the_runs():
    assert sweep_label(pd.DataFrame({"temperature": [0.0, 0.0]}), "abc") == "greedy (abc)"
    assert sweep_label(pd.DataFrame({"temperature": [0.0, 0.7, 0.7]}), "abc") == "T = 0.7 (abc)"
    assert sweep_label(pd.DataFrame(), None) == "greedy (no sweep)"
