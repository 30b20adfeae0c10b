"""Report: analysis on synthetic stores with known answers, and the HTML/Markdown/figure outputs.

The synthetic store is built here with plain sqlite3 from the schema (``specdec/bench/store.py``,
schema_version 1), so these tests do not depend on the store's writer.
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specdec.core import stats, theory
from specdec.core.metrics import RATES
from specdec.report import analyze, load_store
from specdec.report.cells import cell_table
from specdec.report.diagnostics import baseline_stability_table, position_acceptance
from specdec.report.load import prepare_runs
from specdec.report.model import cost_infos
from specdec.report.render import write_report
from specdec.report.vocab import ALL_PROMPTS, SINGLE_RUN

XSS = "<script>alert(1)</script>"

# --------------------------------------------------------------------------------------------------
# synthetic store
# --------------------------------------------------------------------------------------------------

DDL = """
CREATE TABLE sweeps (sweep_id TEXT PRIMARY KEY, name TEXT, config_json TEXT NOT NULL, created_at TEXT,
  git_commit TEXT, machine_json TEXT, status TEXT);
CREATE TABLE runs (run_id INTEGER PRIMARY KEY, sweep_id TEXT REFERENCES sweeps, cell_key TEXT NOT NULL UNIQUE,
  config_label TEXT, pair TEXT, target TEXT, draft TEXT, target_backend TEXT, draft_backend TEXT,
  compiled INTEGER, device TEXT, dtype TEXT, threads INTEGER, prompt_id TEXT, prompt_type TEXT,
  chat_template INTEGER, prompt_tokens INTEGER, method TEXT, policy TEXT, k INTEGER, repeat INTEGER,
  seed INTEGER, temperature REAL, top_k INTEGER, top_p REAL, max_new_tokens INTEGER, new_tokens INTEGER,
  finish_reason TEXT, token_ids TEXT, matches_baseline INTEGER, num_rounds INTEGER, num_drafted INTEGER,
  num_accepted INTEGER, num_rejections INTEGER, prefill_s REAL, ttft_s REAL, decode_s REAL, total_s REAL,
  draft_s REAL, verify_s REAL, tokens_per_s REAL, error TEXT, created_at TEXT, machine_id TEXT,
  first_divergence INTEGER, policy_note TEXT, batch_size INTEGER, batch_id TEXT, row INTEGER,
  batch_total_s REAL, batch_tokens_per_s REAL, matches_single INTEGER, predicted_speedup REAL);
CREATE TABLE rounds (run_id INTEGER REFERENCES runs, round_idx INTEGER, k INTEGER, k_requested INTEGER,
  num_accepted INTEGER, accept_flags TEXT, next_kind TEXT, num_emitted INTEGER, draft_s REAL, verify_s REAL,
  other_s REAL, alpha_estimate REAL, forward_s REAL, n_forward INTEGER, draft_source TEXT,
  PRIMARY KEY (run_id, round_idx));
CREATE TABLE costs (sweep_id TEXT, config_label TEXT, role TEXT, n_tokens INTEGER, seconds REAL,
  repeats INTEGER, spread_s REAL, PRIMARY KEY (sweep_id, config_label, role, n_tokens));
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
"""

SWEEP = "abcdef0123456789"
LABEL = "eager"
PAIR = "small->large"


class Store:
    """A synthetic results store following the schema."""

    def __init__(self, path: Path, tables: bool = True):
        self.path = path
        self.con = sqlite3.connect(path)
        if tables:
            self.con.executescript(DDL)
            self.con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        self.n = 0

    def sweep(self, sweep_id: str = SWEEP, name: str = "synthetic", created_at: str = "2025-01-01T00:00:00"):
        machine = {"cpu": "Test CPU", "cores": 2, "versions": {"torch": "2.x", "transformers": "5.x"},
                   "note": XSS}
        self.con.execute("INSERT INTO sweeps VALUES (?,?,?,?,?,?,?)", (
            sweep_id, name, json.dumps({"ks": [1, 2, 4], "max_new_tokens": 64, "prompt_filter": XSS}),
            created_at, "deadbeef", json.dumps(machine), "done"))
        return self

    def run(self, *, sweep_id=SWEEP, config_label=LABEL, pair=PAIR, target="large", prompt_id="p0",
            prompt_type="code", method="baseline", policy=None, k=None, repeat=0, tokens_per_s=10.0,
            new_tokens=64, num_rounds=None, num_drafted=None, num_accepted=None, num_rejections=None,
            matches_baseline=None, error=None, draft_s=None, verify_s=None, prefill_s=0.1, rounds=()):
        self.n += 1
        total_s = new_tokens / tokens_per_s if tokens_per_s else None
        if num_rounds is None:
            num_rounds = new_tokens if method == "baseline" else (len(rounds) or None)
        if method == "baseline":
            num_drafted, num_accepted, num_rejections = 0, 0, 0
            if verify_s is None and total_s:
                verify_s = (total_s - prefill_s) * 0.9
            draft_s = 0.0
        cell_key = f"{sweep_id}|{config_label}|{prompt_id}|{method}|{k}|{policy}|{repeat}"
        cur = self.con.execute(
            "INSERT INTO runs (sweep_id, cell_key, config_label, pair, target, draft, prompt_id, prompt_type,"
            " method, policy, k, repeat, temperature, max_new_tokens, new_tokens, matches_baseline, num_rounds,"
            " num_drafted, num_accepted, num_rejections, prefill_s, total_s, draft_s, verify_s, tokens_per_s,"
            " error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (sweep_id, cell_key, config_label, pair, target, "small", prompt_id, prompt_type, method, policy,
             k, repeat, 0.0, new_tokens, new_tokens, matches_baseline, num_rounds, num_drafted, num_accepted,
             num_rejections, prefill_s, None if error else total_s, draft_s, verify_s,
             None if error else tokens_per_s, error))
        run_id = cur.lastrowid
        for idx, (kk, flags) in enumerate(rounds):
            acc = len(flags) - len(flags.lstrip("1"))
            self.con.execute("INSERT INTO rounds VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", (
                run_id, idx, kk, kk, acc, flags, "bonus" if acc == kk else "recovered", acc + 1,
                0.001, 0.002, 0.0001, None, 0.0015, None, None))
        return run_id

    def costs(self, *, sweep_id=SWEEP, config_label=LABEL, t1=0.010, draft1=0.002, slope=0.001, n_max=17):
        for n in range(1, n_max + 1):
            self.con.execute("INSERT INTO costs VALUES (?,?,?,?,?,?,?)",
                             (sweep_id, config_label, "target", n, t1 + slope * (n - 1), 5, 0.0))
        if draft1:
            self.con.execute("INSERT INTO costs VALUES (?,?,?,?,?,?,?)",
                             (sweep_id, config_label, "draft", 1, draft1, 5, 0.0))
        return self

    def close(self) -> Path:
        self.con.commit()
        self.con.close()
        return self.path


#: speedup of draft-model runs over the baseline, by prompt type and K (exact, on every prompt/repeat).
FACTORS = {"code": {1: 1.2, 2: 2.0, 4: 1.5}, "natural": {1: 0.8, 2: 0.7, 4: 0.5}, XSS: {1: 1.0, 2: 1.1, 4: 0.9}}
#: accept flags of the rounds of each draft run, by prompt type (same for every K; truncated to K).
FLAGS = {"code": ["1111", "1110", "1111", "1100"], "natural": ["0", "10", "0", "1"], XSS: ["10", "110"]}


def _flags(ptype: str, k: int) -> list[tuple[int, str]]:
    return [(k, (f + "0" * k)[:k]) for f in FLAGS[ptype]]


def full_store(path: Path) -> Path:
    """One config, 3 prompt types x 2 prompts x 2 repeats; baseline, draft K in {1,2,4}, ngram K=2,
    hf_generate, hf_assisted K=2, a heuristic policy (cap 4), one failed run, and costs."""
    st = Store(path).sweep().costs()
    for ptype, factors in FACTORS.items():
        for p in range(2):
            pid = f"{ptype}-{p}"
            base = 10.0 * (1 + p)
            for rep in range(2):
                common = {"prompt_id": pid, "prompt_type": ptype, "repeat": rep}
                st.run(method="baseline", tokens_per_s=base, **common)
                for k, fac in factors.items():
                    rounds = _flags(ptype, k)
                    acc = sum(len(f) - len(f.lstrip("1")) for _, f in rounds)
                    rej = sum(1 for kk, f in rounds if len(f) - len(f.lstrip("1")) < kk)
                    st.run(method="draft", policy="fixed", k=k, tokens_per_s=base * fac, rounds=rounds,
                           num_drafted=k * len(rounds), num_accepted=acc, num_rejections=rej,
                           draft_s=0.5, verify_s=1.0, matches_baseline=1, **common)
                st.run(method="ngram", policy="fixed", k=2, tokens_per_s=base * 1.1, rounds=_flags(ptype, 2),
                       num_drafted=8, num_accepted=4, num_rejections=2, draft_s=0.01, verify_s=1.0,
                       matches_baseline=1, **common)
                st.run(method="hf_generate", tokens_per_s=base / 1.25, matches_baseline=1, **common)
                st.run(method="hf_assisted", k=2, tokens_per_s=base * factors[2] / 2.0,
                       matches_baseline=0, **common)
                st.run(method="draft", policy="heuristic", k=4, tokens_per_s=base * 1.3, rounds=[(3, "111")],
                       num_drafted=3, num_accepted=3, num_rejections=0, draft_s=0.5, verify_s=1.0, **common)
    st.run(method="draft", policy="fixed", k=8, prompt_id="code-0", prompt_type="code",
           error="CUDA out of memory <b>boom</b>")
    return st.close()


@pytest.fixture
def store_path(tmp_path) -> Path:
    return full_store(tmp_path / "store.db")


@pytest.fixture
def analysis(store_path):
    return analyze(load_store(store_path))


def _cell(cells, ptype, method="draft", k=2, policy="fixed"):
    sel = cells[(cells["prompt_type"] == ptype) & (cells["method"] == method) & (cells["k"] == k)
                & (cells["policy"] == policy)]
    assert len(sel) == 1, sel
    return sel.iloc[0]


# --------------------------------------------------------------------------------------------------
# analysis with known answers
# --------------------------------------------------------------------------------------------------


def test_exact_two_x_gives_speedup_two_with_zero_width_ci_but_two_prompts_give_no_verdict(analysis):
    """Two prompts are two units: the interval is reported, the verdict is withheld (fewer than 5 units)."""
    row = _cell(analysis.table("cells"), "code", k=2)
    assert row["speedup"] == pytest.approx(2.0)
    assert row["speedup_lo"] == pytest.approx(2.0) and row["speedup_hi"] == pytest.approx(2.0)
    assert row["verdict"] == "too few units"
    assert row["n_prompts"] == 2 and row["n_runs"] == 4 and row["n_aligned"] == 2
    loss = _cell(analysis.table("cells"), "natural", k=4)
    assert loss["speedup"] == pytest.approx(0.5) and loss["verdict"] == "too few units"
    same = _cell(analysis.table("cells"), XSS, k=1)
    assert same["speedup"] == pytest.approx(1.0) and same["verdict"] == "too few units"


def test_speedup_interval_is_the_t_interval_over_prompts():
    # Five prompts with different speedups: geometric mean of the per-prompt ratios (medians over repeats),
    # Student-t interval on their logs (specdec.core.stats), and a verdict now that there are 5 units.
    rows = []
    facs = [(10.0, 1.5), (20.0, 2.5), (15.0, 1.8), (12.0, 2.0), (18.0, 1.7)]
    for p, (base, fac) in enumerate(facs):
        for rep in range(3):
            rows.append({"run_id": len(rows), "config_label": "x", "prompt_id": f"p{p}", "prompt_type": "t",
                             "method": "baseline", "k": 0, "repeat": rep, "tokens_per_s": base})
            rows.append({"run_id": len(rows), "config_label": "x", "prompt_id": f"p{p}", "prompt_type": "t",
                             "method": "draft", "policy": "fixed", "k": 3, "repeat": rep, "tokens_per_s": base * fac})
    cells = cell_table(prepare_runs(pd.DataFrame(rows)))
    row = _cell(cells, "t", k=3)
    want = stats.ratio_interval([fac for _, fac in facs])
    assert (row["speedup"], row["speedup_lo"], row["speedup_hi"]) == pytest.approx((want.center, want.lo, want.hi))
    assert row["speedup"] == pytest.approx((1.5 * 2.5 * 1.8 * 2.0 * 1.7) ** 0.2)
    assert row["verdict"] == "win" and row["speedup_lo"] > 1


def test_single_prompt_ci_resamples_repeats():
    rows = [{"run_id": 0, "config_label": "x", "prompt_id": "p", "prompt_type": "t", "method": "baseline", "tokens_per_s": 10.0}]
    for rep, tps in enumerate([15.0, 16.0, 17.0, 30.0]):
        rows.append({"run_id": rep + 1, "config_label": "x", "prompt_id": "p", "prompt_type": "t", "method": "ngram",
                         "policy": "fixed", "k": 2, "repeat": rep, "tokens_per_s": tps})
    row = _cell(cell_table(pd.DataFrame(rows)), "t", method="ngram")
    assert row["ci_over"].startswith("repeats")
    assert row["speedup"] == pytest.approx((1.5 * 1.6 * 1.7 * 3.0) ** 0.25)  # geometric mean of the run ratios
    assert row["verdict"] == "too few units"  # 4 runs of one prompt
    assert row["speedup_lo"] < row["speedup"] < row["speedup_hi"]


def test_rates_from_raw_counts(analysis):
    # code, K=4: flags 1111 1110 1111 1100 per run -> accepted 4+3+4+2 = 13, rejections 2 (rounds 2 and 4),
    # drafted 16, 4 rounds, emitted 13 + 4 (one recovered/bonus per round); 4 identical runs pool the same.
    row = _cell(analysis.table("cells"), "code", k=4)
    assert row["num_accepted"] == 4 * 13 and row["num_drafted"] == 4 * 16 and row["num_rejections"] == 4 * 2
    assert row["acceptance_rate"] == pytest.approx(13 / 16)
    assert row["alpha_hat"] == pytest.approx(13 / 15)
    assert row["alpha_hat"] == pytest.approx(RATES["alpha_hat"].of({"num_accepted": 52, "num_rejections": 8}))
    assert row["mean_accepted"] == pytest.approx(13 / 4)
    assert row["block_efficiency"] == pytest.approx(17 / 4)
    assert row["mean_k"] == pytest.approx(4.0)
    # time shares: draft 0.5 s, verify 1.0 s, prefill 0.1 s of total new_tokens / tok/s
    total = 64 / 15.0 + 64 / 15.0 + 64 / 30.0 + 64 / 30.0
    assert row["share_draft"] == pytest.approx(4 * 0.5 / total)
    assert row["share_verify"] == pytest.approx(4 * 1.0 / total)
    assert row["share_prefill"] + row["share_draft"] + row["share_verify"] + row["share_other"] == pytest.approx(1)
    base = _cell(analysis.table("cells"), "code", method="baseline", k=0, policy="-")
    # decode tokens/s = new tokens / (total - prefill): 64 / 6.3 (10 tok/s) and 64 / 3.1 (20 tok/s), median of 4
    assert base["decode_tok_s"] == pytest.approx((64 / 6.3 + 64 / 3.1) / 2)
    assert base["speedup"] == 1.0 and base["verdict"] == "baseline" and base["block_efficiency"] == 1.0


def test_failed_runs_are_gaps_not_numbers(analysis):
    gaps = analysis.table("gaps")
    assert len(gaps) == 1 and gaps.iloc[0]["k"] == 8 and "boom" in gaps.iloc[0]["error"]
    cells = analysis.table("cells")
    failed = _cell(cells, "code", k=8)
    assert failed["n_failed"] == 1 and failed["n_runs"] == 0 and math.isnan(failed["speedup"])
    assert (analysis.table("best_k")["best_k"] != 8).all()


def test_best_k_picks_the_max_median_speedup(analysis):
    best = analysis.table("best_k")
    draft = best[best["method"] == "draft"].set_index("prompt_type")
    assert draft.loc["code", "best_k"] == 2 and draft.loc["code", "speedup"] == pytest.approx(2.0)
    assert draft.loc["natural", "best_k"] == 1 and draft.loc["natural", "verdict"] == "too few units"
    assert draft.loc[XSS, "best_k"] == 2 and draft.loc["code", "ks_tried"] == "1,2,4"


def test_costs_c_and_v():
    costs = pd.DataFrame([
        *({"config_label": "x", "role": "target", "n_tokens": n, "seconds": 0.01 * (1 + 0.5 * (n - 1))}
          for n in (1, 2, 3, 5)),
        {"config_label": "x", "role": "draft", "n_tokens": 1, "seconds": 0.003},
    ])
    info = cost_infos(costs)["x"]
    assert info.c == pytest.approx(0.3)
    assert info.v == pytest.approx({1: 1.0, 2: 1.5, 3: 2.0, 5: 3.0})
    assert info.v_at(4) == pytest.approx(2.5)
    assert info.c_for("ngram") == 0.0 and info.c_for("hf_assisted") is None


def test_break_even_alpha_matches_theory(analysis):
    be = analysis.table("break_even")
    info = analysis.costs[LABEL]
    assert info.c == pytest.approx(0.2)
    for r in be.itertuples():
        c = 0.2 if r.method == "draft" else 0.0
        assert r.c == pytest.approx(c)
        assert r.break_even_ideal == pytest.approx(theory.break_even_alpha(r.k, c))
        assert r.break_even_refined == pytest.approx(theory.break_even_alpha(r.k, c, info.v))
    assert set(be[be["method"] == "draft"]["k"]) == {1, 2, 4}
    cond = analysis.table("condition")
    code4 = cond[(cond["prompt_type"] == "code") & (cond["k"] == 4) & (cond["method"] == "draft")].iloc[0]
    assert code4["model"] == "refined" and bool(code4["clears"]) == (13 / 15 > code4["break_even"])


def test_model_prediction_and_efficiency(analysis):
    m = analysis.table("model")
    info = analysis.costs[LABEL]
    row = m[(m["prompt_type"] == "code") & (m["k"] == 4) & (m["method"] == "draft")].iloc[0]
    a = 13 / 15
    assert row["ideal"] == pytest.approx((1 - a**5) / ((1 - a) * (4 * 0.2 + 1)))
    refined = theory.refined_speedup(a, 4, 0.2, info.v)
    assert row["refined"] == pytest.approx(refined)
    assert row["v_k1"] == pytest.approx(1.4)  # t(5)/t(1) = 0.014 / 0.010
    assert row["efficiency"] == pytest.approx(1.5 / refined)
    assert row["expected_tokens"] == pytest.approx(theory.expected_tokens_per_round(a, 4))
    ngram = m[m["method"] == "ngram"]
    assert len(ngram) and (ngram["c"] == 0.0).all()


def test_optimal_k_against_measured_best(analysis):
    opt = analysis.table("optimal_k").set_index(["prompt_type", "method"])
    row = opt.loc[("code", "draft")]
    cells = analysis.table("cells")
    fixed = cells[(cells["prompt_type"] == "code") & (cells["method"] == "draft") & (cells["policy"] == "fixed")
                  & cells["speedup"].notna()]
    alpha = fixed["num_accepted"].sum() / (fixed["num_accepted"].sum() + fixed["num_rejections"].sum())
    assert row["alpha_pooled"] == pytest.approx(alpha)
    k, sp = theory.optimal_k(alpha, 0.2, analysis.costs[LABEL].v, ks=[1, 2, 4])
    assert row["predicted_k"] == k and row["predicted_speedup"] == pytest.approx(sp)
    assert row["best_k"] == 2 and bool(row["agree"]) == (k == 2)


def test_peers_ratios_and_equality(analysis):
    p = analysis.table("peers")
    allp = p[p["prompt_type"] == ALL_PROMPTS].set_index("peer")
    assert allp.loc["hf_generate", "ratio"] == pytest.approx(1.25)
    assert allp.loc["hf_generate", "verdict"] == "win"
    assert allp.loc["hf_assisted K=2", "ratio"] == pytest.approx(2.0)
    assert allp.loc["hf_assisted K=2", "ours"] == "draft K=2"
    assert allp.loc["hf_assisted K=2", "ours_match"] == 1.0 and allp.loc["hf_assisted K=2", "peer_match"] == 0.0
    eq = analysis.table("equality").set_index(["method", "k"])
    assert eq.loc[("hf_assisted", 2), "equal_rate"] == 0.0 and eq.loc[("draft", 2), "equal_rate"] == 1.0


def test_adaptive_vs_best_fixed(analysis):
    ad = analysis.table("adaptive")
    code = ad[ad["prompt_type"] == "code"].iloc[0]
    assert code["policy"] == "heuristic" and code["k_cap"] == 4 and code["mean_k"] == pytest.approx(3.0)
    assert code["speedup"] == pytest.approx(1.3)
    assert code["best_fixed_k"] == 2 and code["vs_best_fixed"] == pytest.approx(1.3 / 2.0)
    assert code["vs_best_verdict"] == "too few units"  # 2 prompts
    nat = ad[ad["prompt_type"] == "natural"].iloc[0]
    assert nat["best_fixed_k"] == 1 and nat["vs_best_fixed"] == pytest.approx(1.3 / 0.8)
    pooled = ad[ad["prompt_type"] == ALL_PROMPTS]
    assert len(pooled) == 1 and pooled.iloc[0]["best_fixed_k"] in (1, 2, 4)


def test_baseline_stability_spread_and_generate_ratio(tmp_path, analysis):
    st = Store(tmp_path / "s.db").sweep().costs()
    st.run(prompt_id="a", tokens_per_s=3.0)
    st.run(prompt_id="a", repeat=1, tokens_per_s=3.6)
    st.run(prompt_id="a", method="hf_generate", tokens_per_s=3.0)
    st.run(prompt_id="b", tokens_per_s=4.0)
    st.run(prompt_id="b", repeat=1, tokens_per_s=0.0, error="killed")
    stab = baseline_stability_table(load_store(st.close()).runs).set_index("prompt_id")
    assert stab.loc["a", "n_runs"] == 2 and stab.loc["a", "median_tok_s"] == pytest.approx(3.3)
    assert stab.loc["a", "spread"] == pytest.approx(0.6 / 3.3)
    assert stab.loc["a", "vs_hf_generate"] == pytest.approx(1.1)
    assert stab.loc["b", "n_runs"] == 1 and stab.loc["b", "spread"] == 0.0  # the failed run does not count
    assert math.isnan(stab.loc["b", "hf_generate_tok_s"])
    full = analysis.table("baseline_stability")  # full store: 2 runs per prompt, equal, generate() 1.25x slower
    assert len(full) == 6 and (full["spread"] == 0).all() and np.allclose(full["vs_hf_generate"], 1.25)


def test_speedup_uses_the_baseline_run_nearest_in_time(tmp_path):
    # baseline 10 tok/s first, 5 tok/s last (the machine slowed between); each run is compared with the
    # baseline nearest it in run order (ties -> the earlier): all three are 1.2x, where the median of the
    # two baselines (7.5) would say 1.6, 1.6 and 0.8.
    st = Store(tmp_path / "s.db").sweep().costs()
    st.run(method="baseline", tokens_per_s=10.0)
    st.run(method="draft", policy="fixed", k=1, tokens_per_s=12.0)
    st.run(method="ngram", policy="fixed", k=1, tokens_per_s=12.0)
    st.run(method="draft", policy="fixed", k=2, tokens_per_s=6.0)
    st.run(method="baseline", repeat=1, tokens_per_s=5.0)
    cells = analyze(load_store(st.close())).table("cells")
    assert _cell(cells, "code", "draft", 1)["speedup"] == pytest.approx(1.2)
    assert _cell(cells, "code", "ngram", 1)["speedup"] == pytest.approx(1.2)
    assert _cell(cells, "code", "draft", 2)["speedup"] == pytest.approx(1.2)
    assert _cell(cells, "code", "draft", 2)["baseline_tok_s"] == pytest.approx(5.0)


def test_machine_drift_from_round_traces(tmp_path):
    st = Store(tmp_path / "s.db").sweep().costs(t1=0.010, slope=0.001)  # v(n) = 1 + 0.1 (n - 1)

    def trace(run_id, k, verify_s, n=6):
        for idx in range(n):
            st.con.execute("INSERT INTO rounds VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                           (run_id, idx, k, k, 0, "", "recovered", 1, 0.0, verify_s, 0.0, None, verify_s, None,
                            None))

    trace(st.run(method="baseline", tokens_per_s=10.0), 0, 0.010)  # baseline: 0.010 s per step
    # draft K=2 ran while the machine was twice as slow: its 3-token forwards took 2 x 0.010 x v(3) = 0.024 s
    trace(st.run(method="draft", policy="fixed", k=2, tokens_per_s=15.0), 2, 0.024)
    # ngram K=1 at the baseline's speed: 0.010 x v(2) = 0.011 s
    trace(st.run(method="ngram", policy="fixed", k=1, tokens_per_s=12.0), 1, 0.011)
    st.run(method="hf_generate", tokens_per_s=9.0)  # no trace: not in the drift table
    a = analyze(load_store(st.close()))
    runs = a.table("drift_runs").set_index("method")
    assert set(runs.index) == {"baseline", "draft", "ngram"}
    assert runs.loc["baseline", "step_s"] == pytest.approx(0.010) and runs.loc["baseline", "drift"] == pytest.approx(0)
    assert runs.loc["draft", "step_s"] == pytest.approx(0.020) and runs.loc["draft", "drift"] == pytest.approx(1.0)
    assert runs.loc["draft", "speedup"] == pytest.approx(1.5)
    assert "normalized_speedup" not in runs.columns  # drift is a diagnostic, never a correction
    cells = a.table("drift").set_index("method")
    assert bool(cells.loc["draft", "flagged"]) and not bool(cells.loc["ngram", "flagged"])
    assert cells.loc["ngram", "speedup"] == pytest.approx(1.2)


def test_position_acceptance():
    runs = pd.DataFrame([{"run_id": 1, "config_label": "x", "prompt_id": "p", "prompt_type": "t", "method": "draft",
                              "policy": "fixed", "k": 3, "tokens_per_s": 1.0}])
    rounds = pd.DataFrame([
        {"run_id": 1, "round_idx": 0, "k": 3, "num_accepted": 3, "accept_flags": "111"},
        {"run_id": 1, "round_idx": 1, "k": 3, "num_accepted": 1, "accept_flags": "101"},  # stops at position 2
        {"run_id": 1, "round_idx": 2, "k": 3, "num_accepted": 0, "accept_flags": "011"},
        {"run_id": 1, "round_idx": 3, "k": 3, "num_accepted": 2, "accept_flags": None},  # falls back to num_accepted
    ])
    p = position_acceptance(runs, rounds).set_index("position")
    assert list(p["reached"]) == [4, 3, 2] and list(p["accepted"]) == [3, 2, 1]
    assert p.loc[2, "p"] == pytest.approx(2 / 3)


def test_position_acceptance_stops_where_the_output_stops():
    """A K = 4 round whose flags say 4 accepted but whose output stopped at an EOS as its 2nd token
    (num_emitted 2; an old store kept the verifier's raw count 4): positions 3 and 4 were never reached."""
    runs = pd.DataFrame([{"run_id": 1, "config_label": "x", "prompt_id": "p", "prompt_type": "t", "method": "draft",
                          "policy": "fixed", "k": 4, "tokens_per_s": 1.0}])
    rounds = pd.DataFrame([
        {"run_id": 1, "round_idx": 0, "k": 4, "num_accepted": 4, "accept_flags": "1111", "num_emitted": 2},
        {"run_id": 1, "round_idx": 1, "k": 4, "num_accepted": 1, "accept_flags": "10", "num_emitted": 2},
    ])
    p = position_acceptance(runs, rounds).set_index("position")
    assert list(p.index) == [1, 2] and list(p["reached"]) == [2, 2] and list(p["accepted"]) == [2, 1]


def test_runtimes_side_by_side(tmp_path):
    st = Store(tmp_path / "two.db").sweep().costs().costs(config_label="compiled", t1=0.005, draft1=0.004)
    for label, fac in ((LABEL, 1.5), ("compiled", 0.9)):
        for p in range(2):
            st.run(config_label=label, prompt_id=f"p{p}", tokens_per_s=10.0 + p)
            st.run(config_label=label, prompt_id=f"p{p}", method="draft", policy="fixed", k=2,
                   tokens_per_s=(10.0 + p) * fac, num_drafted=10, num_accepted=8, num_rejections=2, rounds=[(2, "11")])
    a = analyze(load_store(st.close()))
    rt = a.table("runtimes").set_index("config_label")
    assert rt.loc["compiled", "c"] == pytest.approx(0.8) and rt.loc[LABEL, "c"] == pytest.approx(0.2)
    assert rt.loc[LABEL, "best_speedup"] == pytest.approx(1.5)
    assert rt.loc["compiled", "best_speedup"] == pytest.approx(0.9) and rt.loc["compiled", "best_verdict"] == "too few units"
    assert rt.loc[LABEL, "v(5)"] == pytest.approx(1.4)
    bt = a.table("runtimes_by_type")
    assert len(bt) == 1 and len(bt.columns) == 3


# --------------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------------

KINDS = {"headline", "heatmap", "speedup_vs_k", "alpha_vs_speedup", "best_k", "predicted_vs_measured", "time_breakdown",
         "acceptance_by_position", "verification_cost"}


def test_report_from_full_store(store_path, tmp_path):
    res = write_report(store_path, tmp_path / "out")
    # this store holds no acceptance trace: the answer's figures say so, every other figure is drawn
    assert {(e.kind, e.skipped) for e in res.skipped} == {("answer_vs_k", "no acceptance trace"),
                                                          ("answer_vs_acceptance", "no acceptance trace")}
    assert {e.kind for e in res.drawn} == KINDS
    for e in res.drawn:
        assert e.png.stat().st_size > 1000 and e.svg.stat().st_size > 1000
        assert e.png.parent == tmp_path / "out" / "figures"
    text = res.html.read_text(encoding="utf-8")
    low = text.lower()
    assert "http://" not in low and "https://" not in low and "<script src" not in low
    assert "<script" not in low and "<link" not in low and "@import" not in low
    assert XSS not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "<b>boom</b>" not in text and "&lt;b&gt;boom&lt;/b&gt;" in text
    assert text.count("data:image/png;base64,") == len(res.drawn)
    assert "deadbeef" in text and "Test CPU" in text and "prompt_filter" in text
    assert "How to read this" in text and "win" in text
    # reader first: how to read it, the headline (figure + verdict), ...; the raw configuration in the appendix
    at = {a: text.index(f'<section id="{a}">') for a in ("how", "headline", "summary", "gaps", "definitions",
                                                         "source")}
    assert at["how"] < at["headline"] < at["summary"] < at["gaps"] < at["definitions"] < at["source"]
    assert text.index("sweeps.config_json") > at["source"]
    head = text[at["headline"]:at["summary"]]
    assert head.count("data:image/png;base64,") == 1 and head.count("<li>") <= 5
    md = res.markdown.read_text(encoding="utf-8")
    outside_fences = "".join(md.split("```")[::2])  # fenced code is shown verbatim, never rendered
    assert XSS not in outside_fences and "| &lt;script>alert(1)&lt;/script> |" in md
    assert "deadbeef" in md and "| code |" in md
    for e in res.drawn:
        assert f"figures/{e.name}.png" in md
    assert not [m for m in res.analysis.missing if "could not be computed" in m]


def test_headline_table_picks_each_types_best_cell(analysis):
    from specdec.report import tables as T
    from specdec.report.headline import headline_table, verdict_lines

    t = headline_table(analysis[T.CELLS])
    assert list(t["speedup"]) == sorted(t["speedup"], reverse=True)
    rows = t.set_index("prompt_type")
    # code: draft K = 2 at 2.0x; natural and the XSS type: the heuristic policy (1.3x) beats every fixed K
    assert (rows.loc["code", "method"], rows.loc["code", "k"]) == ("draft", 2)
    assert rows.loc["code", "speedup"] == pytest.approx(2.0)
    assert rows.loc["natural", "policy"] == "heuristic" and rows.loc["natural", "speedup"] == pytest.approx(1.3)
    assert t["default_speedup"].isna().all()  # this store has no cost-policy runs
    lines = verdict_lines(analysis)
    assert 1 <= len(lines) <= 5 and "of 3 prompt types" in lines[0]
    assert "Highest: code 2.00x" in lines[1]


def test_headline_shows_the_default_policy_and_the_aa_floor(tmp_path):
    from specdec.report import tables as T
    from specdec.report.headline import aa_floor, headline_table, padded_reference, verdict_lines

    st = Store(tmp_path / "h.db").sweep().costs()
    for p in range(6):
        common = {"prompt_id": f"code-{p}", "prompt_type": "code"}
        st.run(method="baseline", tokens_per_s=10.0, repeat=0, **common)
        st.run(method="aa", tokens_per_s=10.0 * (1 + 0.01 * (p - 2.5)), **common)
        st.run(method="baseline", tokens_per_s=10.0, repeat=1, **common)
        st.run(method="draft", policy="cost", k=16, tokens_per_s=15.0 * (1 + 0.02 * (p % 2)), rounds=[(2, "11")],
               num_drafted=2, num_accepted=2, num_rejections=0, matches_baseline=1, **common)
        st.run(method="baseline", tokens_per_s=10.0, repeat=2, **common)
        st.run(method="draft", policy="fixed", k=2, tokens_per_s=18.0, rounds=[(2, "11")], num_drafted=2,
               num_accepted=2, num_rejections=0, matches_baseline=int(p > 0), **common)
        st.run(method="baseline", tokens_per_s=10.0, repeat=3, **common)
        st.run(method="baseline_padded", tokens_per_s=11.6, **common)
        st.run(method="baseline", tokens_per_s=10.0, repeat=4, **common)
    a = analyze(load_store(st.close()))
    t = headline_table(a[T.CELLS])
    r = t.iloc[0]
    assert (r["method"], r["k"], r["verdict"]) == ("draft", 2, "win") and r["speedup"] == pytest.approx(1.8)
    assert r["default_speedup"] == pytest.approx(1.5 * 1.01, rel=0.01) and r["default_verdict"] == "win"
    lo, hi, label = aa_floor(a)
    assert lo < 1.0 < hi and label == LABEL
    text = " ".join(verdict_lines(a))
    assert "The default policy" in text and "A/A noise floor" in text
    assert "11 of 12 (92%)" in text  # one fixed-K run left the target-only output
    assert padded_reference(a)[0] == pytest.approx(1.16) and "runs at 1.16x" in text
    assert "noise on this machine; target-only padded to its cheapest" in text  # one sentence, lower case after ';'
    res = write_report(tmp_path / "h.db", tmp_path / "out")
    assert "headline" in {e.kind for e in res.drawn}


def test_cli_report(store_path, tmp_path):
    typer = pytest.importorskip("typer")
    from typer.testing import CliRunner

    from specdec.report.commands import register

    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps `report` a subcommand
        pass

    result = CliRunner().invoke(app, ["report", "--db", str(store_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.html").exists() and (tmp_path / "r" / "report.md").exists()
    bad = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "nope.db"), "--out", str(tmp_path / "r2")])
    assert isinstance(bad.exception, FileNotFoundError)


def _report_names_missing(path: Path, out: Path, *needles: str):
    res = write_report(path, out)
    text = res.html.read_text(encoding="utf-8")
    md = res.markdown.read_text(encoding="utf-8")
    for needle in needles:
        assert needle in text and needle in md, needle
    assert "http://" not in text and "https://" not in text
    assert not [m for m in res.analysis.missing if "could not be computed" in m], res.analysis.missing
    assert not [e for e in res.figures if e.skipped and "drawing failed" in e.skipped]
    return res


def test_empty_db_file(tmp_path):
    """A 0-byte store is what a WAL store's .db holds before its first checkpoint when copied without its
    -wal file: the report names that in one line instead of reporting an empty sweep, and writes nothing."""
    path = tmp_path / "empty.db"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty.db: is empty \(no tables\) and empty.db-wal is missing") as err:
        write_report(path, tmp_path / "o")
    assert "\n" not in str(err.value) and not (tmp_path / "o" / "report.html").exists()


def test_store_with_tables_but_nothing(tmp_path):
    path = Store(tmp_path / "s.db").close()
    _report_names_missing(path, tmp_path / "o", "the store holds no sweep")


def test_sweep_without_runs(tmp_path):
    path = Store(tmp_path / "s.db").sweep().close()
    res = _report_names_missing(path, tmp_path / "o", "has no runs", "deadbeef")
    assert not res.drawn


def test_runs_without_costs(tmp_path):
    st = Store(tmp_path / "s.db").sweep()
    for p in range(2):
        st.run(prompt_id=f"p{p}", tokens_per_s=10.0)
        st.run(prompt_id=f"p{p}", method="draft", policy="fixed", k=2, tokens_per_s=12.0,
               num_drafted=4, num_accepted=3, num_rejections=1, rounds=[(2, "11"), (2, "10")])
    res = _report_names_missing(st.close(), tmp_path / "o", "no costs measured")
    kinds = {e.kind for e in res.drawn}
    assert {"heatmap", "speedup_vs_k", "best_k", "acceptance_by_position"} <= kinds
    assert "verification_cost" not in kinds and "predicted_vs_measured" not in kinds
    assert _cell(res.analysis.table("cells"), "code")["speedup"] == pytest.approx(1.2)


def test_only_baseline(tmp_path):
    st = Store(tmp_path / "s.db").sweep().costs()
    for p in range(3):
        st.run(prompt_id=f"p{p}", tokens_per_s=10.0 + p)
    res = _report_names_missing(st.close(), tmp_path / "o", "no speculative runs", "not drawn")
    assert {e.kind for e in res.drawn} == {"verification_cost"}


def test_only_failed_runs_and_orphan_sweep(tmp_path):
    st = Store(tmp_path / "s.db")  # runs of a sweep with no sweeps row
    st.run(error="model failed to load", tokens_per_s=0)
    res = _report_names_missing(st.close(), tmp_path / "o", "every run failed or was skipped", "model failed to load",
                                "no row in")
    assert len(res.analysis.table("gaps")) == 1


def test_missing_baseline_names_the_config(tmp_path):
    st = Store(tmp_path / "s.db").sweep().costs()
    st.run(method="draft", policy="fixed", k=2, tokens_per_s=12.0, num_drafted=4, num_accepted=3, num_rejections=1)
    res = _report_names_missing(st.close(), tmp_path / "o", "no successful baseline run for config")
    assert math.isnan(_cell(res.analysis.table("cells"), "code")["speedup"])


def test_a_missing_beside_store_is_one_error_and_nothing_is_written(tmp_path):
    """`write_report(..., beside=...)` reads the other store before it writes anything."""
    from specdec.report.render import write_report

    st = Store(tmp_path / "s.db").sweep()
    st.run(tokens_per_s=10.0, prompt_id="p0", prompt_type="code")
    path = st.close()
    with pytest.raises(FileNotFoundError):
        write_report(path, tmp_path / "o", beside=tmp_path / "missing.db")
    assert not (tmp_path / "o").exists()


def test_store_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_store(tmp_path / "missing.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, just some bytes" * 100)
    with pytest.raises(ValueError, match="SQLite"):
        load_store(junk)
    path = Store(tmp_path / "s.db").sweep().sweep("abcdef9999999999", created_at="2024-01-01").close()
    with pytest.raises(ValueError, match="ambiguous"):
        load_store(path, "abcdef")
    with pytest.raises(ValueError, match="no sweep"):
        load_store(path, "zzz")
    assert load_store(path, "abcdef99").sweep_id == "abcdef9999999999"
    newest = load_store(path)
    assert newest.sweep_id == SWEEP and any("other sweep" in n for n in newest.notes)


def test_dollar_and_odd_labels_do_not_break_figures(tmp_path):
    st = Store(tmp_path / "s.db").sweep().costs(config_label="mixed:llamacpp-draft")
    for p in range(2):
        kw = {"config_label": "mixed:llamacpp-draft", "prompt_type": "$x^2$ | a_b", "prompt_id": f"p{p}"}
        st.run(tokens_per_s=10.0, **kw)
        st.run(method="draft", policy="fixed", k=2, tokens_per_s=11.0, num_drafted=4, num_accepted=3,
               num_rejections=1, rounds=[(2, "11")], draft_s=0.1, verify_s=0.2, **kw)
    res = write_report(st.close(), tmp_path / "o")
    assert not [e for e in res.figures if e.skipped and "drawing failed" in e.skipped]
    assert "\\|" in res.markdown.read_text(encoding="utf-8")
    assert np.isfinite(res.analysis.table("model")["efficiency"]).all()


def test_default_cpu_plan_one_run_per_type(tmp_path):
    """One prompt per type, one repeat (the default CPU plan): per type a point without an interval;
    the pooled row gets its interval across prompts. A 'skipped:' peer is a gap of kind 'skipped'."""
    st = Store(tmp_path / "s.db").sweep().costs()
    for j, (ptype, fac) in enumerate((("code", 1.5), ("natural", 1.2), ("dialogue", 1.4))):
        kw = {"prompt_type": ptype, "prompt_id": f"{ptype}-01"}
        st.run(tokens_per_s=10.0 + j, **kw)
        st.run(method="draft", policy="fixed", k=4, tokens_per_s=(10.0 + j) * fac, num_drafted=8, num_accepted=6,
               num_rejections=1, rounds=[(4, "1111"), (4, "1100")], draft_s=0.2, verify_s=0.5, **kw)
        st.run(method="llama_prompt_lookup", k=4, error="skipped: needs n_outputs_max_per_seq", **kw)
    res = write_report(st.close(), tmp_path / "o")
    cells = res.analysis.table("cells")
    row = _cell(cells, "code", k=4)
    assert row["speedup"] == pytest.approx(1.5) and row["verdict"] == SINGLE_RUN
    assert math.isnan(row["speedup_lo"]) and math.isnan(row["speedup_hi"])
    pooled = _cell(res.analysis.table("overall"), ALL_PROMPTS, k=4)
    assert pooled["speedup"] == pytest.approx((1.5 * 1.2 * 1.4) ** (1 / 3)) and pooled["n_aligned"] == 3
    want = stats.ratio_interval([1.5, 1.2, 1.4])
    assert (pooled["speedup_lo"], pooled["speedup_hi"]) == pytest.approx((want.lo, want.hi))
    assert pooled["verdict"] == "too few units"  # 3 prompts
    gaps = res.analysis.table("gaps")
    assert len(gaps) == 3 and set(gaps["kind"]) == {"skipped"}
    text = res.html.read_text(encoding="utf-8")
    assert "0 failed and 3 skipped" in text and SINGLE_RUN in text
    assert not [e for e in res.figures if e.skipped and "drawing failed" in e.skipped]


# --------------------------------------------------------------------------------------------------
# the schema, the table registry, the best fixed K
# --------------------------------------------------------------------------------------------------


def _table_columns(con: sqlite3.Connection) -> dict[str, list[str]]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")] for t in names}


def test_report_columns_are_the_store_schema(tmp_path):
    """The columns the report reads (and the synthetic store these tests build) are exactly those the
    results store creates, in order: a column added to or renamed in the store fails here."""
    from specdec.bench.store import Store as ResultsStore
    from specdec.report import load

    with ResultsStore(tmp_path / "real.db"):
        pass
    con = sqlite3.connect(tmp_path / "real.db")
    real = _table_columns(con)
    con.close()
    assert real["runs"] == load.RUN_COLUMNS
    assert real["rounds"] == load.ROUND_COLUMNS
    assert real["sweeps"] == load.SWEEP_COLUMNS
    assert real["costs"] == load.COST_COLUMNS
    synthetic = _table_columns(sqlite3.connect(":memory:").executescript(DDL))
    read = ("sweeps", "runs", "rounds", "costs")  # the tables the report reads
    assert {t: synthetic[t] for t in read} == {t: real[t] for t in read}


def test_every_registered_table_is_built_once_in_order(analysis):
    from specdec.report.tables import REGISTRY

    names = [t.name for t in REGISTRY]
    assert len(set(names)) == len(names)
    assert list(analysis.tables) == names
    for t in REGISTRY:  # a handle and its name read the same frame
        assert analysis[t] is analysis.table(t.name)


def test_a_failing_table_builder_is_a_gap_not_a_crash(store_path, monkeypatch):
    from specdec.report import analysis as analysis_mod
    from specdec.report.tables import BEST_K, REGISTRY, ReportTable

    def boom(_inputs):
        raise RuntimeError("bad data")

    broken = tuple(ReportTable(t.name, t.what, boom) if t is BEST_K else t for t in REGISTRY)
    monkeypatch.setattr(analysis_mod, "REGISTRY", broken)
    a = analyze(load_store(store_path))
    assert "best K could not be computed: RuntimeError: bad data" in a.missing
    assert a.table("best_k").empty
    assert len(a.table("optimal_k")) and a.table("optimal_k")["best_k"].isna().all()  # built without it
    assert len(a.table("cells"))


def test_best_fixed_prefers_the_higher_speedup_then_the_smaller_k():
    from specdec.report.cells import best_fixed

    cells = pd.DataFrame({
        "policy": ["fixed", "fixed", "-", "cost", "fixed"],
        "k": [4, 2, 8, 16, 0],
        "speedup": [1.5, 1.5, 1.2, 9.0, 3.0],  # the adaptive row and the K = 0 row are not fixed-K cells
    })
    assert best_fixed(cells)["k"] == 2
    assert best_fixed(cells[cells["k"] == 8])["k"] == 8
    assert best_fixed(cells[cells["policy"] == "cost"]) is None


def test_best_fixed_prefers_a_k_measured_on_every_prompt():
    """A K timed on the primary prompt only is not chosen over a K timed on all six, even with a higher
    median: the two medians are over different prompt sets."""
    from specdec.report.cells import best_fixed, best_k_table

    cells = pd.DataFrame({
        "config_label": "c", "pair": "p", "prompt_type": "code", "method": "draft", "policy": "fixed",
        "k": [2, 5, 8], "speedup": [2.27, 2.19, 1.90], "speedup_lo": [np.nan, 2.0, 1.7],
        "speedup_hi": [np.nan, 2.4, 2.1], "verdict": ["single run", "win", "win"],
        "n_prompts": [1, 6, 6],
    })
    assert best_fixed(cells)["k"] == 5
    row = best_k_table(cells).iloc[0]
    assert row["best_k"] == 5 and row["n_prompts"] == 6 and not row["same_prompts"]
    assert best_fixed(cells.drop(columns="n_prompts"))["k"] == 2  # without prompt counts: the highest median


def test_speedups_are_taken_within_one_machine(tmp_path, capsys):
    """A merged (sharded) store: a run is divided only by a baseline timed on its own machine; one without
    such a baseline gets no speedup rather than a ratio across machines."""
    st = Store(tmp_path / "m.db").sweep().costs()
    st.run(prompt_id="p0", tokens_per_s=10.0)  # machine A's baseline
    st.run(prompt_id="p0", method="draft", policy="fixed", k=2, tokens_per_s=15.0, num_drafted=4,
           num_accepted=2, num_rejections=1, rounds=[(2, "10")])
    st.run(prompt_id="p0", method="draft", policy="fixed", k=4, tokens_per_s=30.0, num_drafted=4,
           num_accepted=2, num_rejections=1, rounds=[(4, "1100")])
    st.con.execute("UPDATE runs SET machine_id = CASE WHEN k = 4 THEN 'B' ELSE 'A' END")
    st.con.execute("CREATE TABLE machines (machine_id TEXT PRIMARY KEY, machine_json TEXT)")
    st.con.execute("INSERT INTO machines VALUES ('A', ?), ('B', ?)",
                   (json.dumps({"cpu_model": "AMD EPYC", "cpu_count": 2}), json.dumps({"cpu_model": "Xeon"})))
    # each machine's own start-up costs; the sweep-level ``costs`` (0.010 s / 0.002 s) are machine B's,
    # written when the sweep resumed there
    st.con.execute("CREATE TABLE machine_costs (sweep_id TEXT, machine_id TEXT, config_label TEXT, role TEXT, "
                   "n_tokens INTEGER, seconds REAL, repeats INTEGER, spread_s REAL)")
    for mid, t1, d1 in (("A", 0.020, 0.004), ("B", 0.010, 0.002)):
        st.con.executemany("INSERT INTO machine_costs SELECT sweep_id, ?, config_label, role, n_tokens, "
                           "seconds * ? / ?, repeats, spread_s FROM costs WHERE role = ?",
                           [(mid, t1, 0.010, "target"), (mid, d1, 0.002, "draft")])
    res = write_report(st.close(), tmp_path / "out")
    cells = res.analysis.table("cells")
    assert _cell(cells, "code", k=2)["speedup"] == pytest.approx(1.5)
    assert math.isnan(_cell(cells, "code", k=4)["speedup"])  # machine B has no baseline of p0
    md = res.markdown.read_text()  # the machines are a dimension of the report
    assert "2 machines timed this sweep's runs" in md and "AMD EPYC, 2 CPUs" in md
    assert "| A | AMD EPYC, 2 CPUs | 2 | 1 | 20.0 / 4.0 |" in md and "| B | Xeon | 1 | 0 | 10.0 / 2.0 |" in md
    assert res.analysis.store.machine_runs() == [("A", "AMD EPYC, 2 CPUs", 2, 1), ("B", "Xeon", 1, 0)]
    # the sections priced with the sweep-level costs name the machine that measured them
    assert res.analysis.store.costs_machine() == "B"
    runtimes = md.split("## Runtimes side by side")[1].split("\n## ")[0]
    assert "the sweep-level start-up costs: those of machine B (Xeon)" in runtimes
    data = res.analysis.store
    data.machine_costs = data.machine_costs[data.machine_costs["machine_id"] == "A"]  # no machine matches
    assert data.costs_machine() is None and "which machine measured them is not recorded" in data.costs_note()

    # study.targets.fast names every machine of the store, not only the sweep's first
    from study.targets import fast as mod

    assert mod.main(["--db", str(tmp_path / "m.db")]) == 0
    out = capsys.readouterr().out
    assert "2 machines (each ratio within one):" in out
    assert "machine A: AMD EPYC, 2 CPUs, 2 runs" in out and "machine B: Xeon, 1 runs" in out


def test_aa_noise_floor_by_hand(tmp_path):
    """A/A: each prompt's last baseline run over its first; geometric mean and t-interval over prompts,
    the median |ratio - 1| as the noise floor; no verdict below 5 prompts."""
    from specdec.report.diagnostics import aa_table

    st = Store(tmp_path / "aa.db").sweep().costs()
    pairs = [(10.0, 11.0), (10.0, 9.0), (20.0, 21.0)]  # ratios 1.1, 0.9, 1.05
    for p, (first, last) in enumerate(pairs):
        st.run(prompt_id=f"p{p}", tokens_per_s=first)
        st.run(prompt_id=f"p{p}", method="draft", policy="fixed", k=2, tokens_per_s=2 * first, num_drafted=4,
               num_accepted=2, num_rejections=1, rounds=[(2, "10")])
        st.run(prompt_id=f"p{p}", tokens_per_s=last, repeat=1)
    st.run(prompt_id="p9", tokens_per_s=5.0)  # one baseline run: no A/A ratio
    a = analyze(load_store(st.close()))
    (row,) = a.table("aa").itertuples()
    want = stats.ratio_interval([1.1, 0.9, 1.05])
    assert row.n_prompts == 3 and row.aa_ratio == pytest.approx(want.center)
    assert (row.aa_lo, row.aa_hi) == pytest.approx((want.lo, want.hi)) and row.verdict == "too few units"
    assert row.median_abs_dev == pytest.approx(0.1)
    assert len(aa_table(a.store.runs[a.store.runs["method"] != "baseline"])) == 0
    from specdec.report.sections import _summary_section

    # the summary says the floor rests on too few prompts
    (line,) = [x for b in _summary_section(a).blocks for x in getattr(b, "items", []) if "A/A noise floor" in x]
    assert "over 3 prompts (too few units: a rough floor)" in line


def test_aa_noise_floor_stays_within_one_machine(tmp_path):
    """A prompt resumed on a faster machine: its A/A ratio is taken on each machine's own baselines, never
    the new machine's last baseline over the old machine's first (that would read the machines' speed
    difference, 1.5x here, as noise)."""
    st = Store(tmp_path / "aa2.db").sweep().costs()
    for p in range(3):
        st.run(prompt_id=f"p{p}", tokens_per_s=10.0)  # machine A: 10.0 then 10.0 + p / 10
        st.run(prompt_id=f"p{p}", tokens_per_s=10.0 + p / 10, repeat=1)
        st.run(prompt_id=f"p{p}", tokens_per_s=15.0, repeat=2)  # machine B, one baseline: no ratio
    st.con.execute("UPDATE runs SET machine_id = CASE WHEN repeat = 2 THEN 'B' ELSE 'A' END")
    a = analyze(load_store(st.close()))
    (row,) = a.table("aa").itertuples()
    want = stats.ratio_interval([1.0, 1.01, 1.02])
    assert row.n_prompts == 3 and row.aa_ratio == pytest.approx(want.center)


def test_policy_against_best_fixed_k_stays_within_one_machine(tmp_path):
    """A store resumed on a faster machine for the fixed-K runs: 'adaptive / best fixed' divides tokens/s,
    so it is taken per prompt on one machine only; prompts whose two sides ran on different machines drop
    out (here the machines' 2x speed difference would have read as a 0.6x loss for the policy)."""
    from specdec.report.comparisons import adaptive_table

    st = Store(tmp_path / "ad.db").sweep().costs()
    for p in range(3):
        st.run(prompt_id=f"p{p}", tokens_per_s=10.0)
        st.run(prompt_id=f"p{p}", method="draft", policy="cost", k=16, tokens_per_s=25.0, num_drafted=4,
               num_accepted=2, num_rejections=1, rounds=[(2, "10")])
        st.run(prompt_id=f"p{p}", tokens_per_s=20.0, repeat=1)  # machine B from here on (2x faster)
        st.run(prompt_id=f"p{p}", method="draft", policy="fixed", k=4, tokens_per_s=40.0 + p, num_drafted=4,
               num_accepted=2, num_rejections=1, rounds=[(4, "1100")])
    st.run(prompt_id="p3", tokens_per_s=10.0)  # p3: both sides on machine A
    st.run(prompt_id="p3", method="draft", policy="cost", k=16, tokens_per_s=22.0, num_drafted=4,
           num_accepted=2, num_rejections=1, rounds=[(2, "10")])
    st.run(prompt_id="p3", method="draft", policy="fixed", k=4, tokens_per_s=20.0, num_drafted=4,
           num_accepted=2, num_rejections=1, rounds=[(4, "1100")])
    st.con.execute("UPDATE runs SET machine_id = CASE WHEN prompt_id != 'p3' AND "
                   "(repeat = 1 OR policy = 'fixed') THEN 'B' ELSE 'A' END")
    a = analyze(load_store(st.close()))
    ad = adaptive_table(a.store.runs, a.table("cells"))
    (row,) = ad.itertuples()
    assert row.best_fixed_k == 4 and row.vs_best_fixed == pytest.approx(22.0 / 20.0)
    assert row.vs_best_verdict == "single run (no interval)"


def test_policy_against_each_types_own_best_fixed_k_pooled(tmp_path):
    """A sweep that timed each type's own K (``--type-ks``): the pooled row against each type's best fixed K
    divides, per prompt, the policy's tokens/s by its own type's best K (K = 4 on code, K = 2 on natural),
    not by one K for all types; its fixed-K speedup pools those runs over their bracketing baselines."""
    import numpy as np

    from specdec.report.vocab import ALL_PROMPTS, EACH_TYPE_BEST_K

    st = Store(tmp_path / "each.db").sweep().costs()
    ratios, fixed_speedups = [], []
    for ptype, best_k, other_k in (("code", 4, 2), ("natural", 2, 4)):
        for p in range(5):
            pid, base = f"{ptype}-{p}", 10.0 + p
            best_tps, policy_tps = 2.0 * base + p, 1.8 * base + (p % 3)
            st.run(prompt_id=pid, prompt_type=ptype, tokens_per_s=base)
            st.run(prompt_id=pid, prompt_type=ptype, method="draft", policy="cost", k=16, tokens_per_s=policy_tps,
                   num_drafted=4, num_accepted=2, num_rejections=1, rounds=[(2, "10")])
            st.run(prompt_id=pid, prompt_type=ptype, tokens_per_s=base, repeat=1)
            st.run(prompt_id=pid, prompt_type=ptype, method="draft", policy="fixed", k=best_k, tokens_per_s=best_tps,
                   num_drafted=4, num_accepted=2, num_rejections=1, rounds=[(best_k, "1" * best_k)])
            st.run(prompt_id=pid, prompt_type=ptype, tokens_per_s=base, repeat=2)
            st.run(prompt_id=pid, prompt_type=ptype, method="draft", policy="fixed", k=other_k,
                   tokens_per_s=0.9 * base, num_drafted=4, num_accepted=2, num_rejections=1,
                   rounds=[(other_k, "0" * other_k)])
            st.run(prompt_id=pid, prompt_type=ptype, tokens_per_s=base, repeat=3)
            ratios.append(policy_tps / best_tps)
            fixed_speedups.append(best_tps / base)
    a = analyze(load_store(st.close()))
    ad = a.table("adaptive").set_index("prompt_type")
    assert list(ad.index[-2:]) == [ALL_PROMPTS, EACH_TYPE_BEST_K]
    each = ad.loc[EACH_TYPE_BEST_K]
    assert np.isnan(each["best_fixed_k"])
    assert each["vs_best_fixed"] == pytest.approx(float(np.exp(np.mean(np.log(ratios)))))
    assert each["vs_best_lo"] < each["vs_best_fixed"] < each["vs_best_hi"] < 1
    assert each["vs_best_verdict"] == "loss"
    assert each["best_fixed_speedup"] == pytest.approx(float(np.exp(np.mean(np.log(fixed_speedups)))))
    # per type, the same K as the pooled row uses; pooled over all prompts one K can only be best on one type
    assert ad.loc["code", "best_fixed_k"] == 4 and ad.loc["natural", "best_fixed_k"] == 2
    assert ad.loc[ALL_PROMPTS, "vs_best_fixed"] != pytest.approx(each["vs_best_fixed"])


def test_time_model_prices_the_drafts_catch_up():
    """The predicted decode time of a draft-model replay prices each round's catch-up on the draft curve:
    an always-agreeing draft at K = 2 accepts everything, so every round after the first feeds 2 tokens.
    Without a measured curve the timed rounds give it (`catchup_from_rounds`: same-K differences)."""
    from specdec.core.costs import CostCurve
    from specdec.engine.traces import AcceptanceTrace, draft_pending
    from specdec.report.predicted import PromptModel, catchup_from_rounds

    out = tuple(range(10, 22))  # 12 tokens
    trace = AcceptanceTrace((1, 2), out, out, None, 12)
    curve = CostCurve({1: 1.0, 2: 1.5, 3: 2.0}, 0.25, {1: 0.25, 2: 0.45})
    m = PromptModel(("c", "p", ""), "code", trace, curve, 0.0, 0.0, 0.0, (3, 1), None)
    rounds = m.rounds("draft", 2)
    assert [(r.k, r.num_accepted) for r in rounds] == [(2, 2)] * 4
    assert draft_pending(rounds) == [1, 2, 2, 2]
    assert m.decode_s("draft", rounds) == pytest.approx(4 * 2.0 + (0.25 + 0.25) + 3 * (0.45 + 0.25))
    assert m.speedup("draft", rounds) == pytest.approx(12.0 / m.decode_s("draft", rounds))
    flat = PromptModel(("c", "p", ""), "code", trace, curve.with_draft_forward(None), 0.0, 0.0, 0.0, (3, 1), None)
    assert flat.decode_s("draft", rounds) == pytest.approx(4 * 2.0 + 4 * 0.5)  # the old model: K steps
    # prompt lookup has no cache to catch up: its drafting time is the measured per-round median
    ng = PromptModel(("c", "p", ""), "code", trace, curve, 0.0, 0.0, 0.01, (3, 1), None)
    assert ng.decode_s("ngram", rounds) == pytest.approx(4 * 2.01)

    # timed rounds of two runs (K = 2 fixed, then K = 1 with plain rounds): draft_s = d(pending) + (k - 1) x step,
    # the two runs on prompts with different draft steps (the estimate is in steps, pooled over prompts)
    ratio = {1: 1.0, 2: 1.8, 3: 2.4}
    seqs = {1: (0.25, [(2, 2), (2, 2), (2, 1), (2, 0), (2, 2), (2, 1)]),
            2: (0.5, [(1, 0), (0, 0), (0, 0), (1, 1), (1, 0), (0, 0), (1, 0), (1, 1), (1, 1), (1, 0)])}
    rows = []
    for run_id, (step, seq) in seqs.items():
        recs = [pd.Series({"k": k, "num_accepted": a}) for k, a in seq]
        for i, ((k, a), p) in enumerate(zip(seq, draft_pending(recs))):
            rows.append({"run_id": run_id, "round_idx": i, "k": k, "num_accepted": a, "step_s": step,
                         "draft_s": 0.0 if k == 0 else step * (ratio[p] + k - 1)})
    assert catchup_from_rounds(pd.DataFrame(rows)) == pytest.approx(ratio)  # d(3): the one round after 2 plain
    assert catchup_from_rounds(pd.DataFrame(rows), min_rounds=2) == pytest.approx({1: 1.0, 2: 1.8})
    assert catchup_from_rounds(pd.DataFrame(rows[:1])) is None  # no round fed more than one token


def test_a_prompt_without_a_calibration_block_is_priced_with_its_own_machines_costs():
    """Two machines timed one sweep (a resumed shard): a traced prompt without a calibration block falls back
    to the start-up curve of the machine that timed it, never to the sweep-level ``costs`` (which a resumed
    sweep overwrites with its newest machine's), and to those only for a store without per-machine curves."""
    from specdec.core.costs import CostCurve
    from specdec.report.predicted import machine_curves, prompt_models

    runs = pd.DataFrame([{"run_id": 1, "ok": True, "config_label": "c", "prompt_id": "p", "prompt_type": "code",
                          "machine_id": "A", "method": "baseline"}])
    out = [10, 11, 12, 13]
    traces = pd.DataFrame([{"config_label": "c", "prompt_id": "p", "machine_id": "A", "prompt_ids": "[1, 2]",
                            "target_ids": json.dumps(out), "draft_ids": json.dumps(out), "draft_top_prob": None,
                            "max_new_tokens": 4, "draft_context": None}])
    calibration = pd.DataFrame(columns=["config_label", "prompt_id", "machine_id", "role", "n_tokens", "seconds"])
    mc = pd.DataFrame([("c", "A", "target", 1, 0.5), ("c", "A", "target", 2, 1.0), ("c", "A", "draft", 1, 0.2),
                       ("c", "B", "target", 1, 0.3), ("c", "B", "draft", 1, 0.1), ("c", "C", "draft", 1, 0.1)],
                      columns=["config_label", "machine_id", "role", "n_tokens", "seconds"])
    curves = machine_curves(mc)
    assert set(curves) == {("c", "A"), ("c", "B")}  # C has no target step: no curve
    newest = {"c": CostCurve({1: 0.3}, 0.1)}  # the sweep-level costs: machine B's, written last
    (m,) = prompt_models(runs, pd.DataFrame(), traces, calibration, newest, machine_costs=curves)
    assert m.curve.target_forward_s == {1: 0.5, 2: 1.0} and m.curve.draft_step_s == pytest.approx(0.2)
    (old,) = prompt_models(runs, pd.DataFrame(), traces, calibration, newest)  # a store before per-machine costs
    assert old.curve.target_forward_s == {1: 0.3}
    assert machine_curves(mc.iloc[:0]) == {}


def test_a_trace_without_prompt_ids_is_refused_in_one_line_not_a_type_error():
    """Older stores kept traces without the prompt's ids; replaying a model-free drafter needs them, so the
    report names the prompt and the cause (it shows the message where the predicted grid would be)."""
    from specdec.report.predicted import prompt_models

    runs = pd.DataFrame([{"run_id": 1, "ok": True, "config_label": "c", "prompt_id": "p", "prompt_type": "code",
                          "machine_id": "A", "method": "baseline"}])
    traces = pd.DataFrame([{"config_label": "c", "prompt_id": "p", "machine_id": "A", "prompt_ids": None,
                            "target_ids": "[10, 11]", "draft_ids": "[10, 11]", "draft_top_prob": None,
                            "max_new_tokens": 2, "draft_context": None}])
    calibration = pd.DataFrame(columns=["config_label", "prompt_id", "machine_id", "role", "n_tokens", "seconds"])
    with pytest.raises(ValueError, match=r"trace of p \(c\) has no prompt token ids") as err:
        prompt_models(runs, pd.DataFrame(), traces, calibration)
    assert "\n" not in str(err.value)


def test_padded_configs_read_from_the_rounds_as_the_runtime_declares_them():
    """Whether a configuration pads verification comes from the store (rounds.n_forward of our speculative
    runs), not from the harness's RUNTIME_CONFIGS; on the published stores both give the same answer."""
    from specdec.bench.config import RUNTIME_CONFIGS
    from specdec.report.predicted import padded_configs

    runs = pd.DataFrame([{"run_id": 1, "config_label": "p", "method": "draft", "tokens_per_s": 1.0},
                         {"run_id": 2, "config_label": "u", "method": "ngram", "tokens_per_s": 1.0},
                         {"run_id": 3, "config_label": "b", "method": "baseline_padded", "tokens_per_s": 1.0}])
    rounds = pd.DataFrame({"run_id": [1, 1, 2, 3], "n_forward": [3, None, None, 2]})
    assert padded_configs(runs, rounds) == {"p"}  # a padded target-only method does not make its config pad
    assert padded_configs(runs, rounds.drop(columns="n_forward")) == set() == padded_configs(runs, None)
    root = Path(__file__).resolve().parents[1] / "results"
    for name in ("padded.db", "bf16_padded.db"):
        if not (root / name).exists():
            continue
        st = load_store(root / name)
        labels = set(st.runs["config_label"].dropna())
        want = {"padded.db": {"transformers-padded"}, "bf16_padded.db": set()}[name]
        assert padded_configs(st.runs, st.rounds) == want
        assert want == {lab for lab in labels if RUNTIME_CONFIGS[lab].pad_verify}


def test_importing_the_report_loads_neither_the_engine_nor_the_harness():
    """The report reads the store: importing it loads no torch/transformers and, from the bench, only the store
    schema (every `specdec.report` module it loads imports from `specdec.bench` nothing but `store`)."""
    import subprocess
    import sys

    code = ("import ast, importlib.util, sys, specdec.report.document\n"
            "print([m for m in ('torch', 'transformers', 'specdec.bench.runner', 'specdec.bench.config') "
            "if m in sys.modules])\n"
            "bench = set()\n"
            "for name in [m for m in sys.modules if m.startswith('specdec.report')]:\n"
            "    src = open(importlib.util.find_spec(name).origin).read()\n"
            "    for node in ast.walk(ast.parse(src)):\n"
            "        if isinstance(node, ast.ImportFrom):\n"
            "            mods = [f'{node.module}.{a.name}' for a in node.names]\n"
            "        else:\n"
            "            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []\n"
            "        bench |= {m for m in mods if m.startswith('specdec.bench')}\n"
            "print(sorted(bench))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.splitlines()
    assert out == ["[]", "['specdec.bench.store']"], out
