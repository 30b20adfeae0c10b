"""`study.replay_curve`: a store's acceptance traces priced with another machine's cost curve."""

from __future__ import annotations

import pytest

from specdec.core.costs import CostCurve
from specdec.engine.traces import AcceptanceTrace
from specdec.report.predicted import PromptModel, trace_best_k, trace_grid
from study import replay_curve as mod


def test_replay_curve_prices_traces_with_another_machines_curve(tmp_path):
    """study.replay_curve: the same acceptance traces, priced with a curve where a draft step costs a
    target step (the H200's launch-bound regime), predict a loss for the draft model at every K even when it
    always agrees, while prompt lookup still pays on text it can copy; the overheads are zeroed, not the
    traces changed."""
    assert mod.parse_ms("1:20,17:24") == {1: 0.020, 17: 0.024}
    with pytest.raises(ValueError, match="n:ms"):
        mod.parse_ms("1:20,17")
    out = tuple([5, 6, 7, 8] * 8)  # 32 tokens the prompt already holds: prompt lookup copies them
    trace = AcceptanceTrace(tuple([5, 6, 7, 8] * 3), out, out, None, 32)  # the draft agrees everywhere
    cpu = CostCurve({1: 1.0, 2: 1.1, 17: 1.3}, 0.1)  # c = 0.1: the draft model pays
    m = PromptModel(("c", "p", ""), "repetitive", trace, cpu, 0.05, 0.05, 0.02, (3, 1), None)
    gpu = CostCurve({1: 0.020, 2: 0.021, 17: 0.024}, 0.021)  # c = 1.05
    (g,) = mod.repriced([m], gpu)
    assert (g.curve, g.o_base, g.o_spec, g.ngram_draft_s) == (gpu, 0.0, 0.0, 0.0) and g.trace is m.trace
    assert m.curve is cpu and m.o_spec == 0.05  # the original is untouched
    own, other = trace_grid([m]), trace_grid([g])
    draft = other[(other["method"] == "draft") & (other["policy"] == "fixed")]
    assert (draft["predicted"] < 1).all() and len(draft) > 3
    assert (own[(own["method"] == "draft") & (own["k"] == 4)]["predicted"] > 1.5).all()
    best = trace_best_k(other).set_index("method")
    assert best.loc["ngram", "predicted"] > 3 and best.loc["draft", "predicted"] < 1
    table = mod.best_k_table([g], "gpu")
    assert set(table["method"]) == {"draft", "ngram", "suffix", "mixed"} and (table["curve"] == "gpu").all()
