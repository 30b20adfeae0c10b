"""The sweep end to end on tiny checkpoints: every method and peer, greedy equality, resume, refusals, CLI.

Nothing here asserts on wall time (a shared machine's timings vary): timings are recorded, only counts
and ids are checked.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import typer
from conftest import SWEEP_PROMPTS, tiny_sweep_config
from typer.testing import CliRunner

from specdec.bench import methods as M
from specdec.bench import sweep as S
from specdec.bench.export import export_runs
from specdec.bench.methods import peers_for
from specdec.bench.store import Store, SweepExistsError, SweepNotFoundError
from specdec.core.costs import CostCurve
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.measure.environment import machine_changes
from specdec.prompts import Prompt, PromptFileError

#: The published stores (results/*.db), read-only.
PUBLISHED = Path(__file__).resolve().parents[1] / "results"
PROMPTS = SWEEP_PROMPTS


def _cfg(tiny_pair, draft_dir, prompt_file, **kw) -> S.SweepConfig:
    return tiny_sweep_config(tiny_pair, draft_dir, prompt_file, **kw)


# ------------------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def full_sweep(tmp_path_factory, tiny_pair, near_draft_dir, prompt_file):
    db = tmp_path_factory.mktemp("sweep") / "full.db"
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, peers=True, peer_ks="2", policies="heuristic,confidence,cost",
               policy_k=4)
    lines: list[str] = []
    result = S.run_sweep(cfg, db=db, progress=False, echo=lines.append)
    return cfg, db, result, lines


def test_full_sweep_runs_every_method_and_peer(full_sweep):
    cfg, db, result, lines = full_sweep
    plan = S.build_plan(cfg, S.select_prompts(cfg))
    assert result.status == "done" and result.failed == 0 and result.ran == len(plan) == result.planned
    with Store(db) as st:
        runs = st.runs(result.sweep_id)
        sweep = st.get_sweep(result.sweep_id)
    assert len(runs) == len(plan) and len({r["cell_key"] for r in runs}) == len(runs)
    assert all(r["error"] is None for r in runs), [r["error"] for r in runs if r["error"]]
    methods = {r["method"] for r in runs}
    assert methods == {"baseline", "aa", "draft", "ngram", "hf_generate", "hf_assisted", "hf_prompt_lookup"}
    # Secondary prompt: baseline + secondary K only, no peers or policies; each run between two baselines.
    rep2 = [(r["method"], r["k"], r["policy"], r["repeat"]) for r in runs if r["prompt_id"] == "rep-02"]
    assert rep2 == [("baseline", None, None, 0), ("aa", None, None, 0), ("baseline", None, None, 1),
                    ("draft", 1, "fixed", 0), ("baseline", None, None, 2), ("ngram", 1, "fixed", 0),
                    ("baseline", None, None, 3)]
    pol = {(r["method"], r["policy"]) for r in runs if r["policy"] not in (None, "fixed")}
    assert pol == {(m, p) for m in ("draft", "ngram") for p in ("heuristic", "confidence", "cost")}
    for r in runs:
        ids = json.loads(r["token_ids"])
        assert r["new_tokens"] == len(ids) <= cfg.max_new_tokens
        assert r["matches_baseline"] in (0, 1), r["method"]
        if r["method"] in ("baseline", "draft", "ngram", "hf_generate"):
            assert r["matches_baseline"] == 1, (r["method"], r["k"], r["policy"])
        assert r["total_s"] > 0 and r["tokens_per_s"] > 0 and r["threads"] == 1
        assert r["prompt_tokens"] > 0 and r["config_label"] == "transformers-eager"
        if r["method"].startswith("hf_"):
            assert r["prefill_s"] is None and r["num_rounds"] is None and r["policy"] is None
        else:
            assert r["prefill_s"] is not None and r["num_rounds"] >= 1
    drafted = sum(r["num_drafted"] or 0 for r in runs if r["method"] == "draft")
    accepted = sum(r["num_accepted"] or 0 for r in runs if r["method"] == "draft")
    assert drafted > 0 and accepted > 0  # the near draft agrees sometimes
    assert sweep["status"] == "done" and json.loads(sweep["config_json"])["max_new_tokens"] == 8
    machine = json.loads(sweep["machine_json"])
    for key in ("cpu_model", "cpu_count", "memory_gib", "python", "torch", "transformers", "os"):
        assert key in machine
    # One summary line per cell, with the speedup once the baseline is known.
    assert any("x" in ln and "vs baseline" in ln for ln in lines)
    assert any("rough estimate" in ln and "alpha = 0.5" in ln for ln in lines)


def test_sweep_stores_traces_that_replay_its_timed_runs(full_sweep):
    """Each prompt's acceptance trace is stored after its first baseline; replaying it gives exactly the rounds
    of every timed greedy run (fixed K and every policy, both drafters) - fp32 on tiny models, no near-tie
    flips - and the calibration block is stored once per prompt at the prompt's own context."""
    from specdec.catalogue.policies import make_policy
    from specdec.core.metrics import RoundRecord
    from specdec.engine.traces import AcceptanceTrace, compare_rounds, replay

    cfg, db, result, _ = full_sweep
    with Store(db) as st:
        traces = {t["prompt_id"]: t for t in st.traces(result.sweep_id)}
        runs = st.runs(result.sweep_id)
        assert set(traces) == {r["prompt_id"] for r in runs}
        cal = {}
        for c in st.calibration(result.sweep_id):  # the cost policy of a prompt decides with its own block
            cal.setdefault(c["prompt_id"], {}).setdefault(c["role"], {})[c["n_tokens"]] = c["seconds"]
        # the block times the draft's step and its catch-up forwards (DRAFT_CALIBRATION_NS tokens)
        from specdec.core.costs import DRAFT_CALIBRATION_NS
        assert [sorted(c["draft"]) for c in cal.values()] == [sorted(DRAFT_CALIBRATION_NS)] * len(cal)
        checked = 0
        for r in runs:
            t = traces[r["prompt_id"]]
            costs = CostCurve(cal[r["prompt_id"]]["target"], cal[r["prompt_id"]]["draft"][1])
            if r["method"] == "baseline" and r["repeat"] == 0:
                assert t["run_id"] == r["run_id"] and t["target_ids"] == json.loads(r["token_ids"])
            if r["method"] not in ("draft", "ngram"):
                continue
            trace = AcceptanceTrace(tuple(t["prompt_ids"]), tuple(t["target_ids"]), tuple(t["draft_ids"]),
                                    tuple(t["draft_top_prob"]), t["max_new_tokens"])
            drafter = None if r["method"] == "draft" else PromptLookupDrafter(cfg.ngram_max, cfg.ngram_min)
            timed = [RoundRecord(k=x["k"], num_accepted=x["num_accepted"], accept_flags=(),
                                 next_kind=x["next_kind"], num_emitted=x["num_emitted"], draft_s=x["draft_s"],
                                 verify_s=x["verify_s"], other_s=x["other_s"])
                     for x in st.rounds_of(r["run_id"])]
            if r["policy"] == "fixed":
                rounds = replay(trace, k=r["k"], drafter=drafter, draft_context=t["draft_context"])
            else:
                c = costs if r["method"] == "draft" else costs.with_draft_step(0.0)
                policy = make_policy(r["policy"], r["k"], costs=c) if r["policy"] == "cost" else \
                    make_policy(r["policy"], r["k"])
                # the cost policy's ledger weighs measured seconds: the replay is fed the run's own
                rounds = replay(trace, policy=policy, drafter=drafter, draft_context=t["draft_context"],
                                clock=timed)
            if r["policy"] == "confidence" and r["method"] == "draft":
                # past a rejected token the draft's confidence is off the trace: K is an upper bound there
                assert [(x.num_accepted, x.num_emitted) for x in timed] == \
                    [(x.num_accepted, x.num_emitted) for x in rounds]
                assert all(a.k <= b.k for a, b in zip(timed, rounds, strict=True))
            else:
                assert compare_rounds(timed, rounds) == [], (r["method"], r["k"], r["policy"], r["prompt_id"])
            checked += 1
        assert checked >= 10
        # margins: one per output position, in [0, 1]
        assert all(len(t["target_margin"]) == len(t["target_ids"]) and all(0 <= m <= 1 for m in t["target_margin"])
                   for t in traces.values())
        cal = st.calibration(result.sweep_id)
        by_prompt = {}
        for c in cal:
            by_prompt.setdefault(c["prompt_id"], set()).add((c["role"], c["n_tokens"]))
        assert set(by_prompt) == set(traces)
        assert all(v == {("target", n) for n in range(1, 18)} | {("draft", n) for n in DRAFT_CALIBRATION_NS}
                   for v in by_prompt.values())
        # the target forward is timed apart from verification, inside it
        for r in runs:
            if r["method"] in ("draft", "baseline"):
                for x in st.rounds_of(r["run_id"]):
                    assert 0 < x["forward_s"] <= x["verify_s"]


def test_rounds_stored_for_our_runs_only(full_sweep):
    _, db, result, _ = full_sweep
    with Store(db) as st:
        for r in st.runs(result.sweep_id):
            rounds = st.rounds_of(r["run_id"])
            if r["method"].startswith("hf_"):
                assert rounds == []
            else:
                assert len(rounds) == r["num_rounds"]
                assert sum(x["num_emitted"] for x in rounds) == r["new_tokens"]
                assert sum(x["num_accepted"] for x in rounds) == r["num_accepted"]
                assert all(len(x["accept_flags"] or "") <= x["k"] for x in rounds)


def test_costs_table_filled(full_sweep):
    cfg, db, result, _ = full_sweep
    with Store(db) as st:
        rows = st.conn.execute(
            "SELECT role, n_tokens, seconds, repeats FROM costs WHERE sweep_id = ?", (result.sweep_id,)
        ).fetchall()
        costs = st.load_costs(result.sweep_id, "transformers-eager")
    target_n = sorted(n for role, n, _, _ in rows if role == "target")
    assert target_n == list(range(1, 18))  # 1..17 always covered
    # the draft's catch-up curve, which the cost policy prices a round's first draft forward on, and its
    # prefill-sized forwards (the deferred prefill's price)
    from specdec.core.costs import DRAFT_PREFILL_NS
    from specdec.measure.timing import SWEEP_DRAFT_MAX_N

    draft_ns = list(range(1, SWEEP_DRAFT_MAX_N + 1)) + list(DRAFT_PREFILL_NS)
    assert sorted(n for role, n, _, _ in rows if role == "draft") == draft_ns
    assert sorted(costs["draft_forward_s"]) == draft_ns
    assert all(s > 0 for _, _, s, _ in rows)
    # the draft is timed 3x as often as the target (its forwards are cheap; 3 samples were too few)
    assert {(role, reps) for role, _, _, reps in rows} == {("target", cfg.cost_repeats),
                                                          ("draft", 3 * cfg.cost_repeats)}
    assert costs["repeats"] == cfg.cost_repeats and costs["draft_repeats"] == 3 * cfg.cost_repeats
    assert costs["c"] == pytest.approx(costs["draft_step_s"] / costs["target_step_s"])


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_export_full_sweep(full_sweep, tmp_path, fmt):
    _, db, result, _ = full_sweep
    out = tmp_path / f"runs.{fmt}"
    n = export_runs(db, fmt, out)
    assert n == result.planned
    if fmt == "csv":
        with open(out, newline="") as fh:
            assert len(list(csv.DictReader(fh))) == n
    elif fmt == "jsonl":
        assert len(out.read_text().splitlines()) == n
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        assert pq.read_table(out).num_rows == n


# --------------------------------------------------------------------------------------- resume, errors


def test_resume_after_interruption_no_duplicates(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    db = tmp_path / "r.db"
    planned = len(S.build_plan(cfg, S.select_prompts(cfg)))
    first = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None, max_runs=4)
    assert first.status == "interrupted" and first.ran == 4
    with pytest.raises(SweepExistsError, match="--resume"):
        S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    second = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert second.already_done == 4 and second.ran == planned - 4 and second.status == "done"
    with Store(db) as st:
        runs = st.runs(second.sweep_id)
        assert st.get_sweep(second.sweep_id)["status"] == "done"
    assert len(runs) == planned and len({r["cell_key"] for r in runs}) == planned
    third = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert third.ran == 0 and third.already_done == planned


def test_killed_mid_run_loses_only_the_run_in_flight(tmp_path, tiny_pair, near_draft_dir, prompt_file,
                                                     monkeypatch):
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    db = tmp_path / "k.db"
    planned = len(S.build_plan(cfg, S.select_prompts(cfg)))
    real = M.speculative_generate
    calls = {"n": 0}

    def dying(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 6:  # warm-ups count too: this dies in the middle of a timed run
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(M, "speculative_generate", dying)
    stored: list[dict] = []
    with pytest.raises(KeyboardInterrupt):
        S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None, on_run=stored.append)
    with Store(db) as st:
        sid = st.sweeps()[0]["sweep_id"]
        assert st.get_sweep(sid)["status"] == "interrupted"
        assert st.count_runs(sid) == len(stored) > 0
    monkeypatch.setattr(M, "speculative_generate", real)
    done = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert done.already_done == len(stored) and done.status == "done"
    with Store(db) as st:
        keys = [r["cell_key"] for r in st.runs(sid)]
    assert len(keys) == planned == len(set(keys))


def test_sigterm_marks_the_sweep_interrupted(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """`kill` (SIGTERM; a SLURM time limit sends it too) stops a sweep like Ctrl-C: the sweep is marked
    interrupted, finished runs are kept, and the previous SIGTERM handler is back afterwards."""
    import os
    import signal

    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    db = tmp_path / "t.db"
    stored: list[dict] = []

    def on_run(rec):
        stored.append(rec)
        if len(stored) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None, on_run=on_run)
    assert signal.getsignal(signal.SIGTERM) is before
    with Store(db) as st:
        sid = st.sweeps()[0]["sweep_id"]
        assert st.get_sweep(sid)["status"] == "interrupted"
        assert st.count_runs(sid) == len(stored) == 2


def test_failed_run_recorded_sweep_continues_and_resume_retries(tmp_path, tiny_pair, near_draft_dir,
                                                                prompt_file, monkeypatch):
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    db = tmp_path / "f.db"
    real = M.speculative_generate

    def flaky(target, drafter, ids, n, **kw):
        if kw.get("k") == 2 and isinstance(drafter, PromptLookupDrafter) and n == cfg.max_new_tokens:
            raise RuntimeError("boom\nsecond line")
        return real(target, drafter, ids, n, **kw)

    monkeypatch.setattr(M, "speculative_generate", flaky)
    res = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    assert res.status == "done" and res.failed == 2  # ngram K=2 on the two primaries
    with Store(db) as st:
        bad = st.runs(res.sweep_id, method="ngram", k=2)
        assert [r["error"] for r in bad] == ["RuntimeError: boom"] * 2
        assert all(r["token_ids"] is None and r["tokens_per_s"] is None for r in bad)
    monkeypatch.setattr(M, "speculative_generate", real)
    again = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert again.ran == 2 and again.failed == 0
    with Store(db) as st:
        assert st.count_runs(res.sweep_id, errors=True) == 0
        assert st.count_runs(res.sweep_id) == res.planned


def test_mixing_configurations_refused(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="1", methods="baseline,ngram", secondary_ks="")
    db = tmp_path / "m.db"
    first = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    other = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="1", methods="baseline,ngram", secondary_ks="",
                 max_new_tokens=6)
    with pytest.raises(SweepNotFoundError) as exc:
        S.run_sweep(other, db=db, resume=True, progress=False, echo=lambda _: None)
    assert first.sweep_id in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(SweepExistsError):
        S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    # A larger grid is the same sweep: --resume adds only the new cells.
    bigger = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="1,2", methods="baseline,ngram", secondary_ks="")
    assert S.prepare(bigger).sweep_id == first.sweep_id
    more = S.run_sweep(bigger, db=db, resume=True, progress=False, echo=lambda _: None)
    assert more.already_done == first.planned and more.ran == more.planned - first.planned > 0


def test_resume_with_a_larger_grid_keeps_the_bracket(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """K = 1 and 4 added between the stored K = 2 and 8 (the new baselines are numbered after the stored
    ones, so in plan order the new cells come back to back): each new cell is timed right after a new
    target-only run of its prompt, as in a fresh sweep."""
    db = tmp_path / "g.db"
    first = S.run_sweep(_cfg(tiny_pair, near_draft_dir, prompt_file, ks="2,8", methods="baseline,ngram",
                             secondary_ks=""), db=db, progress=False, echo=lambda _: None)
    grown = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="1,2,4,8", methods="baseline,ngram", secondary_ks="")
    more = S.run_sweep(grown, db=db, resume=True, progress=False, echo=lambda _: None)
    assert more.sweep_id == first.sweep_id and more.ran == 2 * 4  # two primaries: K = 1, 4 and two baselines
    with Store(db) as st:
        runs = sorted(st.runs(first.sweep_id), key=lambda r: r["run_id"])
    old_ids = {r["run_id"] for r in runs[: first.planned]}
    added = [r for r in runs if r["run_id"] not in old_ids]
    assert [(r["method"], r["k"]) for r in added] == [("baseline", None), ("ngram", 1), ("baseline", None),
                                                      ("ngram", 4)] * 2
    assert len({r["prompt_id"] for r in added[:4]}) == len({r["prompt_id"] for r in added[4:]}) == 1


def test_rebracket_keeps_alternating_plans_and_brackets_the_rest(tiny_pair, near_draft_dir, prompt_file):
    """A fresh plan and one resumed after an interruption alternate already and stay as they are; a prompt
    whose runs left are back to back (a larger grid resumed) gets a baseline before each of them."""
    from specdec.bench.plan import rebracket

    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="1,2,4", methods="baseline,ngram", secondary_ks="2")
    plan = S.prepare(cfg).plan
    assert rebracket(plan) == plan and [c.method for c in plan[:3]] == ["baseline", "ngram", "baseline"]
    interrupted = plan[3:]  # B0 X1 B1 ran: X2 B2 X3 B3 ... left
    assert rebracket(interrupted) == interrupted
    first = [c for c in plan if c.prompt.id == plan[0].prompt.id]
    b, x = [c for c in first if c.method == "baseline"], [c for c in first if c.method != "baseline"]
    grown = [x[0], x[2], b[2], b[3]]  # K = 1 and K = 4 new, the baselines numbered after the stored ones
    assert rebracket(grown + plan[len(first):]) == [b[2], x[0], b[3], x[2], *plan[len(first):]]
    assert rebracket([x[0], x[1]]) == [x[0], x[1]]  # no baseline left: nothing to put between them


def test_a_new_drafting_method_is_one_registry_entry(tmp_path, tiny_pair, near_draft_dir, prompt_file,
                                                     monkeypatch):
    """Register a drafter (one that repeats the last token) in the catalogue, and nothing else: it is a sweep
    method of the same name; the plan runs it over the K grid, the runner times and stores it, and greedy
    output still equals the baseline's."""
    from conftest import ScriptedDrafter

    from specdec.catalogue import drafters as catalogue

    entry = catalogue.DrafterEntry("echo", "echo", "repeats the last token",
                                   lambda source: ScriptedDrafter(lambda seq, k: [seq[-1]] * k))
    monkeypatch.setitem(catalogue.DRAFTERS, "echo", entry)
    assert "echo" in M.METHODS and M.METHODS["echo"].takes_k
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, methods="baseline,echo", ks="2,3", secondary_ks="")
    res = S.run_sweep(cfg, db=tmp_path / "e.db", progress=False, echo=lambda _: None)
    with Store(tmp_path / "e.db") as st:
        runs = st.runs(res.sweep_id, method="echo")
    assert res.failed == 0 and sorted({r["k"] for r in runs}) == [2, 3] and len(runs) == 4  # 2 primaries
    assert all(r["matches_baseline"] == 1 and r["num_drafted"] > 0 for r in runs)


def test_bad_prompt_file_fails_before_any_model_loads(tmp_path, tiny_pair, near_draft_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "type": "code"}\n{"prompt": \n')

    def loader(*a, **kw):
        raise AssertionError("a model was loaded")

    cfg = _cfg(tiny_pair, near_draft_dir, bad)
    with pytest.raises(PromptFileError, match="line 2"):
        S.run_sweep(cfg, db=tmp_path / "b.db", progress=False, echo=lambda _: None, loader=loader)
    assert not (tmp_path / "b.db").exists()


def test_unloadable_config_is_a_clear_error(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    # A checkpoint directory has no GGUF for llama.cpp: the only configuration cannot load.
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, configs="llamacpp")
    with pytest.raises(ValueError, match="no configuration could be loaded"):
        S.run_sweep(cfg, db=tmp_path / "l.db", progress=False, echo=lambda _: None)


def test_llama_prompt_lookup_is_recorded_as_skipped(tiny_tokenizer):
    prompt = Prompt("p-01", "code", "def f(x): return x")
    cell = S.PlannedRun("llamacpp", prompt, "llama_prompt_lookup", 4, None, 0)
    cfg = S.make_config({"configs": "llamacpp"})
    pair = type("P", (), {"tokenizer": tiny_tokenizer})()
    prepared = S.Prepared([prompt], "t.gguf", "d.gguf", None, {}, "sid", [cell])
    row, rounds = S.execute(S.LoadedConfig(cfg, S.RUNTIME_CONFIGS["llamacpp"], pair), cell, prepared)
    assert row["error"].startswith("skipped: ") and rounds == [] and row["prompt_tokens"] > 0
    assert "llama_prompt_lookup" in peers_for(S.RUNTIME_CONFIGS["llamacpp"])
    assert peers_for(S.RUNTIME_CONFIGS["mixed:llamacpp-draft"]) == ("hf_generate", "hf_prompt_lookup")
    # transformers' own generate()/assisted generation are measured on the eager model only
    assert peers_for(S.RUNTIME_CONFIGS["transformers-compiled"]) == ()
    assert peers_for(S.RUNTIME_CONFIGS["transformers-eager"]) == ("hf_generate", "hf_assisted", "hf_prompt_lookup")


# ------------------------------------------------------------------------------------ plan and config


def test_plan_repeats_run_in_passes_so_drift_hits_every_method():
    cfg = S.make_config({"prompt_types": "natural", "ks": "2,16", "methods": "baseline,draft",
                         "policies": "cost", "peers": False, "repeats": 2, "baseline_repeats": 3,
                         "pairing": "none", "prompts_per_type": 1})
    plan = S.build_plan(cfg, S.select_prompts(cfg))
    order = [(c.method, c.k, c.policy, c.repeat) for c in plan]
    one_pass = [("baseline", None, None), ("draft", 2, "fixed"), ("draft", 16, "fixed"), ("draft", 64, "cost")]
    assert order == [(*g, 0) for g in one_pass] + [(*g, 1) for g in one_pass] + [("baseline", None, None, 2)]


def test_bracket_plan_puts_a_baseline_on_each_side_of_every_run():
    """pairing="bracket" (default): B X1 B X2 ... B per prompt, repeats in passes; baselines numbered in order;
    every non-baseline run has a baseline immediately before and after it (the pair's two neighbours)."""
    cfg = S.make_config({"prompt_types": "natural,code", "ks": "2,16", "methods": "baseline,aa,draft",
                         "policies": "cost", "peers": False, "repeats": 2})
    plan = S.build_plan(cfg, S.select_prompts(cfg))
    for pid in ("natural-01", "code-01"):
        cells = [c for c in plan if c.prompt.id == pid]
        order = [(c.method, c.k, c.policy, c.repeat) for c in cells]
        one_pass = [("aa", None, None), ("draft", 2, "fixed"), ("draft", 16, "fixed"), ("draft", 64, "cost")]
        others = [(*g, 0) for g in one_pass] + [(*g, 1) for g in one_pass]
        assert order[1::2] == others
        assert order[0::2] == [("baseline", None, None, r) for r in range(len(others) + 1)]
    with pytest.raises(ValueError, match="pairing must be one of"):
        S.make_config({"pairing": "abba"})
    # without a baseline method there is nothing to pair with: the plain order
    lone = S.make_config({"prompt_types": "code", "ks": "2", "methods": "draft", "policies": "none", "peers": False})
    assert [c.method for c in S.build_plan(lone, S.select_prompts(lone))] == ["draft"]


def test_secondary_policies_time_a_policy_on_every_prompt_of_a_type():
    """Policies run on primaries only unless `secondary_policies` names them for the other prompts too."""
    base = {"prompt_types": "code", "prompts_per_type": 3, "ks": "2", "secondary_ks": "", "methods": "baseline,draft",
            "policies": "cost", "peers": False}
    plain = S.make_config(base)
    wide = S.make_config({**base, "secondary_policies": "cost"})
    for cfg, want in ((plain, {"code-01"}), (wide, {"code-01", "code-02", "code-03"})):
        plan = S.build_plan(cfg, S.select_prompts(cfg))
        assert {c.prompt.id for c in plan if c.policy == "cost"} == want
        assert all(c.k == 64 for c in plan if c.policy == "cost")  # the cost policy's own default K
    # secondaries get the policy but not the primary's fixed-K grid
    wplan = S.build_plan(wide, S.select_prompts(wide))
    assert [(c.method, c.k, c.policy) for c in wplan if c.prompt.id == "code-02"] == [
        ("baseline", None, None), ("draft", 64, "cost"), ("baseline", None, None)]
    assert wide.secondary_policies == ("cost",) and plain.secondary_policies == ()
    with pytest.raises(ValueError, match="unknown policy fixed"):
        S.make_config({**base, "secondary_policies": "fixed"})


def test_secondary_peers_time_the_peers_on_every_prompt_of_a_type():
    """Peers run on primaries only unless `secondary_peers` is set: then every prompt of the type gets them,
    each between two baselines, after the prompt's own cells (its A/A run and secondary policies)."""
    base = {"prompt_types": "code", "prompts_per_type": 3, "ks": "", "secondary_ks": "", "configs": "llamacpp",
            "methods": "baseline,aa,suffix,native_target,native_ngram_mod", "policies": "suffix:cost",
            "secondary_policies": "suffix:cost", "checks_per_prompt": 1}
    plain, wide = S.make_config(base), S.make_config({**base, "secondary_peers": True})
    assert (plain.secondary_peers, wide.secondary_peers) == (False, True)
    for cfg, want in ((plain, {"code-01"}), (wide, {"code-01", "code-02", "code-03"})):
        plan = S.build_plan(cfg, S.select_prompts(cfg))
        assert {c.prompt.id for c in plan if c.method == "native_ngram_mod"} == want
    wplan = S.build_plan(wide, S.select_prompts(wide))
    assert [(c.method, c.policy) for c in wplan if c.prompt.id == "code-02"] == [
        ("baseline", None), ("aa", None), ("baseline", None), ("suffix", "cost"), ("baseline", None),
        ("native_target", None), ("baseline", None), ("native_ngram_mod", None), ("baseline", None)]


def test_type_ks_time_a_types_best_k_on_every_prompt_of_it():
    """--type-ks method:type=K adds fixed-K cells on every prompt of that type (primaries and the others),
    each between two baselines; a K already in the prompt's grid is not timed twice; type=K alone means every
    drafting method; the report's best-K table prints the value in this form (it parses back)."""
    from specdec.report.predicted import type_ks_flags

    base = {"prompt_types": "code,natural", "prompts_per_type": 2, "ks": "2", "secondary_ks": "",
            "methods": "baseline,draft,ngram", "policies": "none", "peers": False}
    cfg = S.make_config({**base, "type_ks": "draft:code=7,ngram:code=2,natural=3"})
    assert cfg.type_ks == ("draft:code=7", "ngram:code=2", "draft:natural=3", "ngram:natural=3")
    plan = S.build_plan(cfg, S.select_prompts(cfg))
    cells = {pid: [(c.method, c.k) for c in plan if c.prompt.id == pid] for pid in {c.prompt.id for c in plan}}
    assert cells["code-01"] == [("baseline", None), ("draft", 2), ("baseline", None), ("draft", 7),
                                ("baseline", None), ("ngram", 2), ("baseline", None)]  # ngram K = 2 once
    assert cells["code-02"] == [("baseline", None), ("draft", 7), ("baseline", None), ("ngram", 2),
                                ("baseline", None)]
    assert cells["natural-02"] == [("baseline", None), ("draft", 3), ("baseline", None), ("ngram", 3),
                                   ("baseline", None)]
    assert S.cost_max_n(S.make_config({**base, "type_ks": "draft:code=20"})) == 21
    for bad, match in (("draft:code", "not method:type=K"), ("draft:code=0", "K >= 1"),
                       ("baseline:code=2", "not a drafting method"), ("hf_assisted:code=2", "not a drafting")):
        with pytest.raises(ValueError, match=match):
            S.make_config({**base, "type_ks": bad})
    with pytest.raises(ValueError, match="not in this sweep: poetry"):
        odd = S.make_config({**base, "type_ks": "draft:poetry=2"})
        S.build_plan(odd, S.select_prompts(odd))
    best = pd.DataFrame({"config_label": ["c", "c"], "prompt_type": ["code", "natural"], "method": ["draft", "ngram"],
                         "best_k": [3, 16]})
    flags = type_ks_flags(best)["c"]
    assert S.make_config({**base, "type_ks": flags}).type_ks == ("draft:code=3", "ngram:natural=16")


#: The original study's grid, one flag set away from the default plan (README, docs/STORE.md).
# (its policies ran at K <= 16, before each policy took its own default K: its commands name --policy-k 16)
ORIGINAL_GRID = {"ks": "1,2,4,8,16", "policies": "cost", "policy_k": 16, "peers": True, "configs": "transformers-eager",
                 "prompts_per_type": 1, "checks_per_prompt": 0, "methods": "baseline,aa,draft,ngram"}


def test_default_plan_and_budget_fit_the_cpu():
    """The main job: five prompts per type, each priced by one target-only run (which yields its trace and
    calibration block); on the primary of each type two checks between baselines, dealt in turn from the A/A
    run, each drafter at its trace's best K and the default drafter's and the draft model's cost policies, so
    each check is timed on 4 types;
    the configuration is the fastest exact transformers path of this machine."""
    from specdec.bench.config import default_config

    cfg = S.make_config({})
    prompts = S.select_prompts(cfg)
    plan = S.build_plan(cfg, prompts)
    assert len(prompts) == 60 and sum(p.id.endswith("-01") for p in prompts) == 12
    assert cfg.configs == (default_config(),) and cfg.peers is False and cfg.checks_per_prompt == 2
    assert cfg.methods == ("baseline", "aa", "draft", "ngram", "mixed")
    assert S.plan_summary(plan) == {
        "baseline": 84, "aa": 4, "draft best (K<=16)": 4, "draft cost (K<=64)": 4, "ngram best (K<=16)": 4,
        "mixed best (K<=16)": 4, "mixed cost (K<=64)": 4,
    }  # fmt: skip
    primaries = sorted({c.prompt.id for c in plan if c.prompt.id.endswith("-01")})
    dealt = set()
    for pid in {c.prompt.id for c in plan}:
        cells = [c for c in plan if c.prompt.id == pid]
        if pid not in primaries:  # priced only: one target-only run, no A/A
            assert [c.method for c in cells] == ["baseline"]
            continue
        assert [c.method for c in cells[0::2]] == ["baseline"] * 3 and len(cells) == 5
        dealt.add(frozenset((c.method, c.policy) for c in cells[1::2]))
    checks = [("aa", None), ("draft", "best"), ("draft", "cost"), ("ngram", "best"), ("mixed", "best"),
              ("mixed", "cost")]
    assert dealt == {frozenset((checks[2 * j % 6], checks[(2 * j + 1) % 6])) for j in range(6)}
    every = S.make_config({"checks_per_prompt": 0, "prompts_per_type": 1})
    assert len(S.build_plan(every, S.select_prompts(every))) == 12 * (1 + 2 * len(checks))  # every check, every primary
    with pytest.raises(ValueError, match="checks_per_prompt must be >= 0"):
        S.make_config({"checks_per_prompt": -1})
    # the original study's timed grid is one flag set away
    original = S.make_config(ORIGINAL_GRID)
    oplan = S.build_plan(original, S.select_prompts(original))
    assert len(oplan) == 396
    assert S.plan_summary(oplan)["draft K=16"] == 12 and S.plan_summary(oplan)["hf_assisted K=4"] == 12
    for pid in {c.prompt.id for c in oplan}:
        cells = [c for c in oplan if c.prompt.id == pid]
        assert [c.method for c in cells[0::2]] == ["baseline"] * 17 and len(cells) == 33
    quick = S.make_config({}, quick=True)
    qplan = S.build_plan(quick, S.select_prompts(quick))
    assert {c.method for c in qplan} == {"baseline", "aa", "draft", "ngram"} and len(qplan) == 84
    assert [c.method for c in qplan].count("baseline") == 48  # 4 per prompt: around aa, draft K=4, ngram K=4


def test_policies_can_name_one_drafting_method(tiny_pair, near_draft_dir, prompt_file):
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, ks="", secondary_ks="",
                            policies="best,ngram:cost", methods="baseline,draft,ngram")
    groups = {(c.method, c.policy) for c in S.build_plan(cfg, S.select_prompts(cfg)) if c.method != "baseline"}
    assert groups == {("draft", "best"), ("ngram", "best"), ("ngram", "cost")}
    with pytest.raises(ValueError, match="not a drafting method"):
        tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, policies="aa:cost")
    with pytest.raises(ValueError, match="unknown policy"):
        tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, policies="draft:sometimes")


def _published_study() -> tuple[list[dict], CostCurve, str]:
    import sqlite3

    path = PUBLISHED / "archive" / "study.db"
    if not path.is_file():
        pytest.skip("results/archive/study.db is not in this checkout")
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        runs = [dict(r) for r in conn.execute("SELECT * FROM runs WHERE error IS NULL")]
        forward = {n: s for n, s in conn.execute("SELECT n_tokens, seconds FROM costs WHERE role = 'target'")}
        (draft,) = conn.execute("SELECT seconds FROM costs WHERE role = 'draft' AND n_tokens = 1").fetchone()
        (sid,) = conn.execute("SELECT sweep_id FROM sweeps").fetchone()
    finally:
        conn.close()
    return runs, CostCurve(forward, draft), sid


def test_duration_estimate_against_the_published_study():
    """The estimate (measured costs, ASSUMED alpha = 0.5) against what the published default study measured:
    its 184 runs took 2.30 h of generation; the estimate for exactly those cells must be within a factor 1.5
    of that, and the full default plan on the same measured costs is the README's "about 3 hours"."""
    runs, curve, sid = _published_study()
    cfg = S.make_config({"threads": 2, **ORIGINAL_GRID})
    prepared = S.prepare(cfg)
    done = {r["cell_key"] for r in runs}
    cells = [c for c in prepared.plan if c.key(sid) in done]
    assert len(cells) == len(runs) > 100
    tokens = {r["prompt_id"]: r["prompt_tokens"] for r in runs}
    timed, _ = S.estimate_plan_s(cells, {"transformers-eager": curve}, max_new_tokens=cfg.max_new_tokens,
                                 warmup_tokens=cfg.warmup_tokens, prompt_tokens=tokens)
    measured = sum(r["total_s"] for r in runs)
    assert 1 / 1.5 < timed / measured < 1.5, (timed, measured)
    t, w = S.estimate_plan_s(prepared.plan, {"transformers-eager": curve}, max_new_tokens=cfg.max_new_tokens,
                             warmup_tokens=cfg.warmup_tokens)
    total = t + w + S.cost_measurement_s(curve, S.cost_max_n(cfg), cfg.cost_repeats)
    # paired timing (a baseline between every two runs) roughly doubles the published plan's ~3 hours
    assert 4.8 * 3600 < total < 5.8 * 3600, S.format_duration(total)  # README: "~5 h 15 min"
    quick = S.make_config({"threads": 2, "configs": "transformers-eager"}, quick=True)
    qt, qw = S.estimate_plan_s(S.prepare(quick).plan, {"transformers-eager": curve}, max_new_tokens=32,
                               warmup_tokens=quick.warmup_tokens)
    q_total = qt + qw + S.cost_measurement_s(curve, S.cost_max_n(quick), quick.cost_repeats)
    assert 16 * 60 < q_total < 28 * 60, S.format_duration(q_total)  # fp32 --quick: ~25 min
    # the main job (default plan) in bf16, priced with the bf16 reference costs: about half an hour
    main = S.make_config({"threads": 2, "configs": "transformers-bf16"})
    bf16 = S.REFERENCE_COSTS_BF16
    mt, mw = S.estimate_plan_s(S.prepare(main).plan, {"transformers-bf16": bf16}, max_new_tokens=128,
                               warmup_tokens=main.warmup_tokens)
    m_total = (mt + mw + S.cost_measurement_s(bf16, S.cost_max_n(main), main.cost_repeats)
               + 12 * S.instrumentation_s(bf16, max_n=S.cost_max_n(main), calibration_repeats=2, traces=True)
               + 48 * S.instrumentation_s(bf16, max_n=S.cost_max_n(main), calibration_repeats=1, traces=True))
    # README: ~42 min (5 prompts per type; the curve and each calibration block reach 65 tokens, the cost
    # policy's default K of 64)
    assert 36 * 60 < m_total < 45 * 60, S.format_duration(m_total)


def test_estimate_follows_the_analytical_model():
    costs = S.REFERENCE_COSTS
    base = S.estimate_generation_s("baseline", None, None, costs, 128, prompt_tokens=1)
    assert base == pytest.approx(0.2748 * 129)
    # alpha 0.5, K = 4: 128 / 1.9375 rounds of (4 * 0.0994 + forward(5)), forward(5) = 0.5576 s measured.
    draft4 = S.estimate_generation_s("draft", 4, "fixed", costs, 128, prompt_tokens=1)
    assert draft4 == pytest.approx(0.2748 * (1 + 0.0994 / 0.2748) + 128 / 1.9375 * (4 * 0.0994 + 0.5576))
    best = min(S.estimate_generation_s("ngram", k, "fixed", costs, 128) for k in range(1, 17))
    assert S.estimate_generation_s("ngram", 16, "cost", costs, 128) == pytest.approx(best)
    # the estimate reads forwards off the one cost curve (specdec.core.costs): interpolated, extended by the
    # least-squares slope past the measured range
    assert S.estimate_generation_s("baseline", None, None, CostCurve({1: 1.0, 3: 2.0}), 1,
                                   prompt_tokens=3) == pytest.approx(1.5 + 1.0)
    assert S.estimate_generation_s("ngram", 4, "fixed", CostCurve({1: 1.0, 3: 2.0}), 5,
                                   prompt_tokens=2, alpha=0.0) == pytest.approx(1.0 + 5 * 3.0)


def test_dry_run_prices_a_sampled_traces_chain_forwards(app, tmp_path):
    """Under sampling every traced prompt's trace is priced as a greedy one's plus `CHAIN_RUN_SHARE` of a
    target-only run per model-free drafter whose chains it records (prompt lookup and the suffix drafter
    here), not left out."""
    import re

    from specdec.bench.estimate import CHAIN_RUN_SHARE

    def instrumentation_s(*extra: str) -> int:
        res = CliRunner().invoke(app, ["sweep", "--configs", "transformers-bf16", "--methods",
                                       "baseline,draft,ngram,suffix", "--dry-run", "--db",
                                       str(tmp_path / "none.db"), *extra])
        assert res.exit_code == 0, res.output
        (part,) = re.findall(r"\+ ((?:\d+[hms] ?)+) traces and calibration", res.output)
        return sum(int(v) * {"h": 3600, "m": 60, "s": 1}[u] for v, u in re.findall(r"(\d+)([hms])", part))

    greedy, sampled = instrumentation_s(), instrumentation_s("--temperature", "0.7", "--top-p", "0.95")
    main = S.make_config({"configs": "transformers-bf16"})
    chains = 2 * CHAIN_RUN_SHARE * 128 * S.REFERENCE_COSTS_BF16.target_step_s * len(S.prepare(main).prompts)
    assert sampled - greedy == pytest.approx(chains, rel=0.05, abs=2), (greedy, sampled, chains)


def test_dry_run_prices_each_configuration_with_its_own_reference(app, tmp_path):
    """Without stored costs, --dry-run prices a configuration with the reference curve of its runtime and
    dtype (a bf16 plan was priced with fp32 costs, 2-3x too long); a mixed pair takes the target's curve
    of one runtime and the draft step of the other, and the printed source names each."""
    import re

    fp32, _ = S.reference_costs("transformers", "transformers", "float32")
    bf16, bf16_label = S.reference_costs("transformers", "transformers", "bfloat16")
    llama, _ = S.reference_costs("llamacpp", "llamacpp", "float32")
    mixed, mixed_label = S.reference_costs("transformers", "llamacpp", "float32")
    assert fp32 == S.REFERENCE_COSTS and llama == S.REFERENCE_COSTS_LLAMACPP and bf16 == S.REFERENCE_COSTS_BF16
    assert bf16.target_step_s < 0.6 * fp32.target_step_s and bf16.forward_s(2) < bf16.forward_s(1)
    assert mixed.target_forward_s == fp32.target_forward_s and mixed.draft_step_s == llama.draft_step_s
    assert "AMD EPYC" in bf16_label and "Intel Xeon" in mixed_label and "llama.cpp" in mixed_label

    def total_s(configs: str) -> tuple[float, str]:
        res = CliRunner().invoke(app, ["sweep", "--quick", "--configs", configs, "--dry-run", "--db",
                                       str(tmp_path / "none.db")])
        assert res.exit_code == 0, res.output
        (total,) = re.findall(r"= ((?:\d+[hms] ?)+) \(model loading", res.output)
        unit = {"h": 3600, "m": 60, "s": 1}
        return sum(int(v) * unit[u] for v, u in re.findall(r"(\d+)([hms])", total)), res.output

    t32, out32 = total_s("transformers-eager")
    t16, out16 = total_s("transformers-bf16")
    assert 0.2 * t32 < t16 < 0.6 * t32, (t32, t16)
    assert "fp32, Intel Xeon" in out32 and "bf16, AMD EPYC" in out16 and "fp32" not in out16.split("reference")[-1]
    assert not (tmp_path / "none.db").exists()


def test_dry_run_over_the_main_job_says_how_many_prompts_per_type_fit(app, tmp_path):
    """A dry run of the built-in prompts estimated over the main job's ~35 min names the most prompts per type
    whose plan fits on the same costs (its own dry run agrees: that count fits, one more does not), says
    when fewer than 5 leave no per-type verdicts, and says when not even one prompt per type fits; a plan
    that fits gets no such line."""
    import re

    from specdec.bench.commands import MAIN_JOB_S

    def dry(*extra: str) -> tuple[int, str]:
        res = CliRunner().invoke(app, ["sweep", "--dry-run", "--db", str(tmp_path / "none.db"), *extra])
        assert res.exit_code == 0, res.output
        (total,) = re.findall(r"= ((?:\d+[hms] ?)+) \(model loading", res.output)
        return sum(int(v) * {"h": 3600, "m": 60, "s": 1}[u] for v, u in re.findall(r"(\d+)([hms])", total)), res.output

    full, out = dry("--configs", "transformers-bf16")
    assert full > MAIN_JOB_S
    (n,) = map(int, re.findall(r"--prompts-per-type (\d+) fits", out))
    assert 1 <= n < 5 and "too few units" in out
    fits, _ = dry("--configs", "transformers-bf16", "--prompts-per-type", str(n))
    over, _ = dry("--configs", "transformers-bf16", "--prompts-per-type", str(n + 1))
    assert fits <= MAIN_JOB_S < over
    assert f"--prompts-per-type {n} fits (~{S.format_duration(fits)};" in out
    _, slow = dry("--configs", "transformers-eager")
    assert "even with --prompts-per-type 1" in slow
    quick, fast = dry("--configs", "llamacpp")
    assert quick <= MAIN_JOB_S and "main job's" not in fast


def test_sweep_id_covers_meaning_not_grid(tiny_pair, near_draft_dir, prompt_file):
    base = _cfg(tiny_pair, near_draft_dir, prompt_file)
    sid = S.prepare(base).sweep_id
    same = [{"ks": "4"}, {"repeats": 3}, {"peers": True}, {"methods": "baseline"}, {"name": "x"}]
    for kw in same:
        assert S.prepare(_cfg(tiny_pair, near_draft_dir, prompt_file, **kw)).sweep_id == sid, kw
    differ = [{"max_new_tokens": 9}, {"temperature": 0.7}, {"threads": 2}, {"dtype": "bfloat16"},
              {"draft": str(tiny_pair.draft_dir)}, {"prompt_types": "code"}]
    for kw in differ:
        assert S.prepare(_cfg(tiny_pair, near_draft_dir, prompt_file, **kw)).sweep_id != sid, kw


@pytest.mark.parametrize("db, flags", [
    ("archive/study.db", {"threads": 2, **ORIGINAL_GRID}),  # results/archive/README.md: its continue command
    ("fp32_all.db", {"threads": 2, "prompts_per_type": 6, "ks": "1,2,4", "secondary_ks": "2",
                     "methods": "baseline,aa,draft", "policies": "cost", "secondary_policies": "cost",
                     "peers": False, "max_new_tokens": 128, "name": "fp32-all"}),
    ("bf16_padded.db", {"threads": 2, "configs": "transformers-bf16", "prompts_per_type": 6, "ks": "2",
                        "secondary_ks": "", "methods": "baseline,baseline_padded", "policies": "none",
                        "peers": False, "max_new_tokens": 64, "name": "bf16-padded"}),
    ("llamacpp_all.db", {"threads": 2, "configs": "llamacpp", "prompts_per_type": 6, "ks": "1", "secondary_ks": "1",
                         "methods": "baseline,aa,draft,ngram", "policies": "cost", "secondary_policies": "cost",
                         "peers": False, "max_new_tokens": 128, "name": "llamacpp-all"}),
    ("mixed_all.db", {"threads": 2, "configs": "mixed:llamacpp-draft-bf16", "prompts_per_type": 6, "ks": "2",
                      "secondary_ks": "", "methods": "baseline,draft", "policies": "cost",
                      "secondary_policies": "cost", "peers": False, "max_new_tokens": 128, "name": "mixed-all"}),
    ("bf16_all.db", {"threads": 2, "configs": "transformers-bf16", "prompts_per_type": 6, "ks": "2",
                     "secondary_ks": "", "methods": "baseline,aa,draft", "policies": "cost",
                     "secondary_policies": "cost", "peers": False, "max_new_tokens": 64, "name": "bf16-all"}),
    ("bf16_128.db", {"threads": 2, "configs": "transformers-bf16", "prompts_per_type": 6, "ks": "1,2,4",
                     "secondary_ks": "1,2,4",
                     "type_ks": "draft:code=3,draft:code_json=2,draft:code_python=3,draft:creative_fiction=2,"
                                "draft:dialogue=2,draft:list_items=3,draft:natural=1,draft:repetitive=6,"
                                "draft:repetitive_pattern=3,draft:technical=2,draft:technical_ml=2,"
                                "draft:wikipedia_style=2",
                     "methods": "baseline,aa,draft", "policies": "cost", "secondary_policies": "cost",
                     "peers": False, "max_new_tokens": 128, "name": "bf16-128"}),
    ("fp32_peers.db", {"threads": 2, "configs": "transformers-eager",
                       "prompt_types": "code,natural,dialogue,repetitive,technical,list_items", "ks": "4",
                       "secondary_ks": "", "methods": "baseline,draft,ngram_hf", "peers": True, "peer_ks": "4",
                       "policies": "none", "max_new_tokens": 128, "name": "fp32-peers", "prompts_per_type": 1}),
    ("fp32_peers_other_types.db", {"threads": 2, "configs": "transformers-eager",
                         "prompt_types": "code_python,code_json,technical_ml,creative_fiction,wikipedia_style,"
                                         "repetitive_pattern", "ks": "4", "secondary_ks": "",
                         "methods": "baseline,draft,ngram_hf", "peers": True, "peer_ks": "4", "policies": "none",
                         "max_new_tokens": 128, "name": "fp32-peers-b", "prompts_per_type": 1}),
])
def test_published_sweeps_keep_their_identity(db, flags):
    """The README's rerun commands must --resume the published stores: the same settings give the same sweep
    id (the hash of `meaning`), whatever the code's layout. Read-only: the published files are not opened by
    Store (WAL writes)."""
    import sqlite3

    path = PUBLISHED / db
    if not path.is_file():
        pytest.skip(f"{db} is not in this checkout")
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        stored = conn.execute("SELECT sweep_id, config_json FROM sweeps").fetchall()
    finally:
        conn.close()
    prepared = S.prepare(S.make_config(flags))
    assert [(prepared.sweep_id, prepared.meaning)] == [(sid, json.loads(cfg)) for sid, cfg in stored]


def test_console_baseline_is_this_machines_own(tmp_path):
    """Resumed on another machine, the console's "x vs baseline" divides by this machine's target-only runs
    only: the other machine's stored baselines (here 2x faster) are not this run's reference."""
    from specdec.bench.runner import _baseline_tps

    with Store(tmp_path / "c.db") as st:
        st.begin_sweep("s1", {"x": 1}, resume=False, machine={"cpu_model": "A", "hostname": "a"})
        st.record_run({"sweep_id": "s1", "cell_key": "b0", "config_label": "eager", "prompt_id": "p0",
                       "method": "baseline", "tokens_per_s": 20.0, "machine_id": st.machine_id})
        st.begin_sweep("s1", {"x": 1}, resume=True, machine={"cpu_model": "B", "hostname": "b"})
        st.record_run({"sweep_id": "s1", "cell_key": "b1", "config_label": "eager", "prompt_id": "p0",
                       "method": "baseline", "tokens_per_s": 10.0, "machine_id": st.machine_id})
        assert _baseline_tps(st, "s1") == {("eager", "p0"): [10.0]}


def test_make_config_merging_and_validation(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('[sweep]\nks = [2, 8]\nmax-new-tokens = 64\nmethods = "baseline,draft"\ndb = "x.db"\n')
    file_values = S.load_config_file(toml)
    assert file_values["db"] == "x.db"
    cfg = S.make_config({"max_new_tokens": 16, "ks": None}, file=file_values)
    assert cfg.ks == (2, 8) and cfg.max_new_tokens == 16 and cfg.methods == ("baseline", "draft")
    q = S.make_config({"ks": "1"}, quick=True)
    assert q.ks == (1,) and q.max_new_tokens == 32 and not q.peers and q.policies == ()
    assert S.make_config({"configs": "mixed,eager"}).configs == ("mixed:llamacpp-draft", "transformers-eager")
    assert S.make_config({"backend": "llamacpp"}).configs == ("llamacpp",)
    assert S.make_config({"draft_backend": "llamacpp"}).configs == ("mixed:llamacpp-draft",)
    bad = [
        ({"ks": "1,x"}, "not an integer"), ({"ks": "0"}, ">= 1"), ({"methods": "draft,beam"}, "unknown method"),
        ({"policies": "fixed"}, "--ks grid"), ({"configs": "tpu"}, "unknown config"),
        ({"configs": "llamacpp", "backend": "transformers"}, "not both"), ({"top_p": 0}, "top_p"),
        ({"repeats": 0}, "repeats"),
    ]  # fmt: skip
    for flags, match in bad:
        with pytest.raises(ValueError, match=match):
            S.make_config(flags)
    toml.write_text("kss = [1]\n")
    with pytest.raises(ValueError, match="unknown key 'kss'"):
        S.load_config_file(toml)
    toml.write_text("ks = [1\n")
    with pytest.raises(ValueError, match="invalid TOML"):
        S.load_config_file(toml)


def test_a_config_file_with_a_bom_loads_and_one_not_utf8_is_named(tmp_path):
    """A TOML file saved with a UTF-8 byte-order mark (as Windows editors write it) reads like one without; a
    file that is not UTF-8 is refused in one line naming the file (it used to be the codec's bare message)."""
    toml = tmp_path / "s.toml"
    toml.write_bytes(b"\xef\xbb\xbfmax_new_tokens = 4\nbatch_sizes = [1, 2]\n")
    assert S.load_config_file(toml) == {"max_new_tokens": 4, "batch_sizes": [1, 2]}
    toml.write_bytes(b"name = \"caf\xe9\"\n")
    with pytest.raises(ValueError, match=r"s\.toml: not a TOML file: not UTF-8 text \(bad byte at offset 11\)"):
        S.load_config_file(toml)


def test_a_failing_probe_is_logged_and_the_sweep_goes_on(tmp_path, tiny_pair, near_draft_dir, prompt_file,
                                                         monkeypatch):
    """A probe beside the timed runs (here the acceptance trace) that raises costs one console line naming
    the configuration, the prompt and the error; the runs, the other probes (calibration, equality check)
    and the sweep's status are unaffected."""
    from specdec.bench import probes

    def broken(*_args, **_kwargs):
        raise RuntimeError("trace exploded\nsecond line")

    monkeypatch.setattr(probes, "record_trace", broken)
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, methods="baseline,draft", ks="1", secondary_ks="1",
               prompt_types="code")
    lines: list[str] = []
    res = S.run_sweep(cfg, db=tmp_path / "p.db", progress=False, echo=lines.append)
    assert res.status == "done" and res.failed == 0 and res.ran == 3
    assert "[transformers-eager] code-01: acceptance trace not recorded: RuntimeError: trace exploded" in lines
    with Store(tmp_path / "p.db") as st:
        assert not st.has_trace(res.sweep_id, "transformers-eager", "code-01")
        assert st.calibration(res.sweep_id)  # the next probe ran
        assert {r["matches_baseline"] for r in st.runs(res.sweep_id)} == {1}


def test_probes_run_at_their_moment_in_order():
    """`walk` runs only the probes of the moment asked, in their order; a probe without a failure text
    propagates its error (it sets columns of the run's row: a wrong row must not be stored)."""
    from types import SimpleNamespace

    from specdec.bench import probes

    calls: list[str] = []
    log: list[str] = []

    def probe(name, fail=False):
        def fn(_s, _at):
            calls.append(name)
            if fail:
                raise ValueError(f"{name} failed")
        return fn

    state = SimpleNamespace(log=log.append)
    at = probes.At(SimpleNamespace(label="cfg"))
    seq = [probes.Probe("a", probes.RUN, probe("a")), probes.Probe("b", probes.CONFIGURATION, probe("b")),
           probes.Probe("c", probes.RUN, probe("c", fail=True), "c not measured"),
           probes.Probe("d", probes.RUN, probe("d"))]
    probes.walk(probes.RUN, state, at, seq)
    assert calls == ["a", "c", "d"] and log == ["[cfg] c not measured: ValueError: c failed"]
    with pytest.raises(ValueError, match="e failed"):
        probes.walk(probes.RUN, state, at, [probes.Probe("e", probes.RUN, probe("e", fail=True))])
    assert [p.moment for p in probes.PROBES] == [probes.CONFIGURATION, probes.RUN, probes.FIRST_BASELINE,
                                                 probes.FIRST_BASELINE, probes.FIRST_BASELINE]


def test_hf_peer_generate_matches_our_baseline(tiny_pair, near_draft_dir):
    from specdec.engine.decoding import autoregressive_generate
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(tiny_pair.target_dir), str(near_draft_dir))
    ids = S.encode_prompt(pair.tokenizer, "hello world the quick brown fox")
    ref = autoregressive_generate(pair.target.backend, ids, 12, eos_ids=pair.eos_ids,
                                  vocab_size=pair.vocab_size).token_ids
    saved = pair.draft.hf_model.generation_config
    for method, k in (("hf_generate", None), ("hf_assisted", 3), ("hf_prompt_lookup", 3)):
        out = S.hf_peer_generate(pair, method, ids, 12, k=k)
        assert out.token_ids == ref, method
        assert out.total_s > 0 and out.finish_reason in ("eos", "length")
    assert pair.draft.hf_model.generation_config is saved  # the assistant's config is restored
    # A model whose own generation config samples and penalises repeats (as many hub models do) must
    # still decode greedily and without processors our engine lacks.
    gc = pair.target.hf_model.generation_config
    gc.do_sample, gc.temperature, gc.top_k, gc.repetition_penalty, gc.no_repeat_ngram_size = True, 0.7, 5, 1.5, 2
    for method, k in (("hf_generate", None), ("hf_prompt_lookup", 3), ("hf_assisted", 3)):
        assert S.hf_peer_generate(pair, method, ids, 12, k=k).token_ids == ref, method
    with pytest.raises(ValueError, match="needs K"):
        S.hf_peer_generate(pair, "hf_assisted", ids, 4)
    sampled = S.hf_peer_generate(pair, "hf_generate", ids, 6, sampling=S.SamplingParams(0.8, 20, 0.9), seed=3)
    again = S.hf_peer_generate(pair, "hf_generate", ids, 6, sampling=S.SamplingParams(0.8, 20, 0.9), seed=3)
    assert sampled.token_ids == again.token_ids  # seeded


# ------------------------------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    from specdec.bench.commands import register

    app = typer.Typer()
    register(app)
    return app


def test_dry_run_can_price_the_plan_with_costs_measured_here(app, tmp_path, tiny_pair, near_draft_dir,
                                                           prompt_file):
    """--dry-run --measure-costs loads the models, times them on this machine and prices the plan with
    those costs (a reference curve of another machine mispriced a shard by 2x); it stores nothing, and
    --measure-costs without --dry-run is refused in one line."""
    import re

    runner = CliRunner()
    db = tmp_path / "m.db"
    args = ["sweep", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompts",
            str(prompt_file), "--prompt-types", "code", "--ks", "1,2", "--max-new-tokens", "4", "--no-peers",
            "--policies", "none", "--db", str(db), "--threads", "1", "--dry-run"]
    ref = runner.invoke(app, args)
    here = runner.invoke(app, args + ["--measure-costs"])
    assert ref.exit_code == 0 and here.exit_code == 0, (ref.output, here.output)
    assert "reference costs" in ref.output and "costs measured now on this machine" in here.output
    assert "reference costs" not in here.output and "target step" in here.output
    unit = {"h": 3600, "m": 60, "s": 1}

    def total(out: str) -> int:
        (t,) = re.findall(r"= ((?:\d+[hms] ?)+) \(model loading", out)
        return sum(int(v) * unit[u] for v, u in re.findall(r"(\d+)([hms])", t))

    # the tiny random model's forwards take milliseconds, the reference 1.5B model's ~0.3 s
    assert total(here.output) < 0.1 * total(ref.output), (here.output, ref.output)
    assert not db.exists()  # priced, not run
    bad = runner.invoke(app, args[:-1] + ["--measure-costs"])
    assert bad.exit_code == 2 and "--measure-costs" in bad.output and not db.exists()
    assert len([ln for ln in bad.output.splitlines() if ln.startswith("specdec: error:")]) == 1


def test_cli_sweep_resume_export(app, tmp_path, tiny_pair, near_draft_dir, prompt_file):
    runner = CliRunner()
    db = tmp_path / "cli.db"
    args = ["sweep", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompts",
            str(prompt_file), "--prompt-types", "code", "--ks", "1,2", "--max-new-tokens", "4", "--no-peers",
            "--policies", "none", "--configs", "transformers-eager", "--db", str(db), "--no-progress", "--threads", "1",
            "--methods", "baseline,aa,draft,ngram"]
    dry = runner.invoke(app, args + ["--dry-run"])
    assert dry.exit_code == 0, dry.output
    # code-01: aa, draft and ngram at K = 1, 2, each between two baselines (5 + 6)
    assert "11 timed generations" in dry.output and "rough estimate" in dry.output and not db.exists()
    res = runner.invoke(app, args + ["--max-runs", "4"])
    assert res.exit_code == 0, res.output
    # (a cell's summary line comes after its last run: the baseline's after its last run, at the end)
    assert "interrupted" in res.output and "[transformers-eager] code-01 draft K=1" in res.output
    left = runner.invoke(app, args + ["--dry-run"])  # a dry run on the store prices the 7 runs left
    assert left.exit_code == 0 and "7 timed generations (4 of 11 already done" in left.output, left.output
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "--resume" in again.output
    assert len([ln for ln in again.output.splitlines() if ln.startswith("specdec: error:")]) == 1
    done = runner.invoke(app, args + ["--resume"])
    assert done.exit_code == 0, done.output
    assert "done" in done.output
    for fmt in ("csv", "jsonl", "parquet"):
        out = tmp_path / f"o.{fmt}"
        ex = runner.invoke(app, ["export", "--db", str(db), "--out", str(out)])
        assert ex.exit_code == 0, ex.output
        assert "11 runs written" in ex.output
    bad = runner.invoke(app, ["export", "--db", str(db), "--out", str(tmp_path / "o.xlsx")])
    assert bad.exit_code == 2 and "--format" in bad.output


def test_cli_bad_prompt_file_and_bad_flags(app, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["sweep", "--prompts", str(tmp_path / "missing.jsonl"), "--db",
                              str(tmp_path / "x.db")])
    assert res.exit_code == 2 and "no such prompt file" in res.output and not (tmp_path / "x.db").exists()
    res = runner.invoke(app, ["sweep", "--ks", "1,two", "--dry-run"])
    assert res.exit_code == 2 and "not an integer" in res.output
    res = runner.invoke(app, ["sweep", "--type-ks", "draft:code", "--dry-run"])
    assert res.exit_code == 2 and "not method:type=K" in res.output
    res = runner.invoke(app, ["sweep", "--prompt-types", "code", "--ks", "2", "--type-ks", "draft:code=7",
                              "--no-peers", "--dry-run", "--db", str(tmp_path / "t.db")])
    assert res.exit_code == 0 and "draft K=7" in res.output, res.output


def _options(command) -> dict[str, object]:
    """A click command's options by their first long name."""
    return {next(o for o in p.opts if o.startswith("--")): p for p in command.params if p.name != "help"}


def test_sweep_options_come_from_one_declaration_per_setting(app, tmp_path):
    """Every `specdec sweep` option is one `Setting` (a `SweepConfig` field's, ``--db``, or the command's own);
    its help ends with the declared default, a ``--config`` file takes the same names, and a flag not
    given leaves the file's value, then the declared default, in force."""
    import dataclasses

    from specdec.bench.commands import sweep_settings
    from specdec.bench.settings import shown_default

    settings = {s.name: s for s in sweep_settings()}
    fields = {f.name: f.default for f in dataclasses.fields(S.SweepConfig)}
    assert set(fields) <= set(settings) and all(settings[n].default == d for n, d in fields.items())
    options = _options(typer.main.get_command(app).commands["sweep"])
    cli = {s.name for s in settings.values() if s.cli}
    assert {o.name for o in options.values()} == cli
    for opt in options.values():
        s = settings[opt.name]
        shown = shown_default(s.default)
        if shown is not None and not (s.type is bool and s.default is False and not opt.secondary_opts):
            assert opt.help.endswith(f"(default: {shown})"), (opt.name, opt.help)
        assert opt.default is (None if s.in_file else s.default), opt.name
    in_file = [s for s in settings.values() if s.in_file]
    toml = tmp_path / "all.toml"
    toml.write_text("".join(f"{s.name.replace('_', '-')} = {json.dumps(s.default)}\n" for s in in_file
                            if s.default is not None and not isinstance(s.default, tuple)))
    assert set(S.load_config_file(toml)) <= {s.name for s in in_file}
    (tmp_path / "k.toml").write_text("ks = [3]\nmax_new_tokens = 5\n")
    res = CliRunner().invoke(app, ["sweep", "--config", str(tmp_path / "k.toml"), "--max-new-tokens", "7",
                                   "--dry-run", "--no-peers", "--db", str(tmp_path / "k.db")])
    assert res.exit_code == 0, res.output
    assert "draft K=3" in res.output and "7 new tokens" in res.output and "draft K=1 " not in res.output


def test_shared_options_have_one_help_text_across_commands(app):
    """--pair, --target, --backend ... read the same in `generate`, `sweep` and `costs` (the declarations of
    `specdec.options.SHARED_OPTIONS`); only a default the command shows may follow."""
    from specdec import options
    from specdec.bench.settings import typer_command
    from specdec.entrypoints import cli

    full = typer.Typer()
    full.command("generate")(typer_command(cli._generate, cli._generate_settings(), cli.GENERATE_DOC))
    from specdec.bench.commands import register

    register(full)
    group = typer.main.get_command(full)
    commands = {name: _options(group.commands[name]) for name in ("generate", "sweep", "costs")}
    checked = 0
    for declared in options.SHARED_OPTIONS.values():
        info = declared.__metadata__[0]  # typer.Option("--name", help=...): the name is its first argument
        text, flag = info.help, info.default.split("/")[0]
        for cmd, opts in commands.items():
            if flag in opts:
                got = opts[flag].help
                assert got == text or got.startswith(f"{text} (default: "), (cmd, flag, got)
                checked += 1
    assert checked >= 3 * 8  # pair, target, draft, backend, draft-backend, device, dtype, threads everywhere
    assert {"--pair", "--quant", "--draft-quant", "--compile"} <= set(commands["costs"])


def test_typer_command_builds_options_from_settings():
    """`typer_command`: one option per setting, defaults shown from the declaration, a file setting not given
    is None (so a file or the declared default decides), a setting with no help and no shared declaration
    refused."""
    from specdec.bench.settings import PANEL_PLAN, PANEL_STORE, Setting, typer_command

    seen: list[dict] = []
    settings = [Setting("grid", (1, 2), "The grid.", PANEL_PLAN, in_file=True),
                Setting("wait_s", 2.5, "Seconds.", PANEL_STORE, float),
                Setting("trace", True, "Trace.", PANEL_PLAN, bool, in_file=True),
                Setting("hidden", 3, "Only in files.", PANEL_PLAN, int, cli=False, in_file=True)]
    app = typer.Typer()
    app.command("x")(typer_command(lambda **kw: seen.append(kw), settings, "Do x."))
    app.command("y")(lambda: None)  # a second command keeps "x" a subcommand
    runner = CliRunner()
    assert runner.invoke(app, ["x"]).exit_code == 0
    assert runner.invoke(app, ["x", "--grid", "3", "--no-trace", "--wait-s", "1"]).exit_code == 0
    assert seen == [{"grid": None, "wait_s": 2.5, "trace": None}, {"grid": "3", "wait_s": 1.0, "trace": False}]
    helps = {o.name: o.help for o in typer.main.get_command(app).commands["x"].params}
    assert helps["grid"] == "The grid. (default: 1,2)" and helps["wait_s"] == "Seconds. (default: 2.5)"
    assert helps["trace"] == "Trace. (default: on)" and "hidden" not in helps
    with pytest.raises(TypeError, match="no help text"):
        typer_command(lambda **kw: None, [Setting("nameless", 1, None, PANEL_PLAN, int)], "Do z.")


def test_cli_costs_json(app, tiny_pair, near_draft_dir):
    res = CliRunner().invoke(app, ["costs", "--target", str(tiny_pair.target_dir), "--draft",
                                   str(near_draft_dir), "--max-n", "5", "--repeats", "1", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(obj["target_forward_s"]) == {"1", "2", "3", "4", "5"}
    assert obj["c"] == pytest.approx(obj["draft_step_s"] / obj["target_step_s"])
    assert all(math.isfinite(v) and v > 0 for v in obj["target_forward_s"].values())


def test_machine_change_detected():
    now = {"cpu_model": "A", "cpu_count": 2, "torch": "2.13.0", "transformers": "5.24.0"}
    assert machine_changes(json.dumps(now), now) == []
    assert machine_changes(json.dumps({**now, "cpu_model": "B", "torch": "2.12"}), now) == ["cpu_model", "torch"]
    assert machine_changes(None, now) == [] and machine_changes("{bad", now) == []


def test_sampled_sweep_records_seeds_and_no_equality(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, prompt_types="code", ks="2", repeats=2, seed=10,
               temperature=0.8, top_k=50, top_p=0.95, methods="baseline,draft,hf_generate")
    res = S.run_sweep(cfg, db=tmp_path / "s.db", progress=False, echo=lambda _: None)
    with Store(tmp_path / "s.db") as st:
        runs = st.runs(res.sweep_id)
    # B draft B hf_generate B | draft B hf_generate B: 4 runs between 5 baselines (numbered 0..4)
    assert res.failed == 0 and len(runs) == 9
    assert sorted({(r["method"], r["repeat"], r["seed"]) for r in runs if r["method"] != "baseline"}) == sorted(
        (m, r, 10 + r) for m in ("draft", "hf_generate") for r in (0, 1)
    )
    assert [(r["repeat"], r["seed"]) for r in runs if r["method"] == "baseline"] == [(r, 10 + r) for r in range(5)]
    assert all(r["matches_baseline"] is None and r["temperature"] == 0.8 for r in runs)
    with Store(tmp_path / "s.db") as st:  # a sampled trace: the draft's overlap along the seeded baseline
        (t,) = st.traces()
        assert st.calibration()
    assert t["sampling_json"] == {"temperature": 0.8, "top_k": 50, "top_p": 0.95} and t["draft_ids"] is None
    assert len(t["overlap"]) == len(t["target_ids"]) and all(0.0 <= x <= 1.0 + 1e-6 for x in t["overlap"])


def test_c18_sampled_runs_use_their_whole_budget(tiny_pair, near_draft_dir, prompt_file):
    """In a sampled sweep every run does the same work - EOS is ignored, by our methods and by
    the transformers peers alike - so no speedup divides a run that stopped after a few tokens by one that
    ran the whole budget. Shown with every token id an EOS: a run that respects EOS stops after 1 token."""
    import dataclasses

    from specdec.core.sampling import SamplingParams
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(tiny_pair.target_dir), str(near_draft_dir), threads=1)
    pair = dataclasses.replace(pair, eos_ids=frozenset(range(1000)))
    for m in (pair.target.hf_model, pair.draft.hf_model):  # the models' own configs stop at every token too
        m.generation_config.eos_token_id = list(range(1000))
    sampled = SamplingParams(temperature=0.8)
    req = M.RunRequest([5, 6, 7, 5, 6, 7], 12, k=2, seed=3)
    ignoring = M.Runtime(pair, sampled, ignore_eos=True)
    for name in ("baseline", "draft", "ngram", "hf_generate", "hf_assisted", "hf_prompt_lookup"):
        rec = M.METHODS[name].run(ignoring, req)
        assert len(rec.token_ids) == 12 and rec.finish_reason == "length", name
    respecting = M.Runtime(pair, sampled)
    for name in ("baseline", "hf_generate"):
        assert len(M.METHODS[name].run(respecting, req).token_ids) == 1, name
    # the sweep: sampled -> ignore_eos (and it is part of the identity); greedy sweeps keep EOS and their ids
    sampled_cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, temperature=0.8)
    greedy_cfg = _cfg(tiny_pair, near_draft_dir, prompt_file)
    assert S.prepare(sampled_cfg).meaning["ignore_eos"] is True
    assert "ignore_eos" not in S.prepare(greedy_cfg).meaning


def test_fast_cpu_configurations_run_and_record_exactness(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """Issue 19: bf16, int8 and the int8 self-draft configurations run side by side in one sweep; every run
    records whether it matched target-only decoding of its OWN configuration (bf16/int8 change the tokens)."""
    pytest.importorskip("torchao")
    from specdec.runtimes.precision import cpu_flags, missing_bf16_support

    if missing_bf16_support(cpu_flags()):
        pytest.skip("this CPU has no native bf16 kernels (the configuration refuses it)")
    configs = "transformers-eager,transformers-bf16,transformers-int8,self-draft:bf16-int8"
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, ks="2", configs=configs, methods="baseline,draft",
               prompt_types="repetitive", max_new_tokens=6)
    res = S.run_sweep(cfg, db=tmp_path / "fast.db", progress=False, echo=lambda m: None)
    assert res.failed == 0 and not res.failed_configs, res
    with Store(tmp_path / "fast.db") as st:
        runs = st.runs(res.sweep_id)
    labels = {r["config_label"] for r in runs}
    assert labels == set(configs.split(","))
    # each run records its target's precision, not the sweep's --dtype (every bf16 run had read float32)
    assert {r["config_label"]: r["dtype"] for r in runs} == {
        "transformers-eager": "float32", "transformers-bf16": "bfloat16", "transformers-int8": "float32+int8",
        "self-draft:bf16-int8": "bfloat16"}
    drafted = [r for r in runs if r["method"] == "draft"]
    assert drafted and all(r["matches_baseline"] is not None for r in drafted)
    base = {(r["config_label"], r["prompt_id"]): r["token_ids"] for r in runs if r["method"] == "baseline"}
    # the self-draft configuration's baseline is the bf16 target's: the same tokens as transformers-bf16
    assert all(base[("self-draft:bf16-int8", p)] == base[("transformers-bf16", p)]
               for (lbl, p) in base if lbl == "self-draft:bf16-int8")


def test_ngram_hf_is_one_registry_entry_compared_like_for_like(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """Issue 16 item 5: ``ngram_hf`` (our engine with transformers' prompt-lookup rule) is not in the default
    plan, runs with --methods, and the report compares it with ``hf_prompt_lookup`` at the same K."""
    from specdec.report import analyze, load_store

    assert "ngram_hf" in M.METHODS and "ngram_hf" not in S.OUR_METHODS
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, methods="baseline,ngram,ngram_hf", ks="2", peers=True,
               peer_ks="2", prompt_types="repetitive")
    res = S.run_sweep(cfg, db=tmp_path / "hf.db", progress=False, echo=lambda m: None)
    assert res.failed == 0
    peers = analyze(load_store(tmp_path / "hf.db")).table("peers")
    rows = peers[(peers["peer"] == "hf_prompt_lookup K=2") & (peers["prompt_type"] == "(all prompts)")]
    assert set(rows["ours"]) == {"ngram K=2", "ngram_hf K=2"}
    assert (rows["ours_match"] == 1.0).all() and (rows["peer_match"] == 1.0).all()


def test_report_predicts_every_k_and_checks_the_timed_runs(full_sweep, tmp_path):
    """The report replays each stored trace over K = 1..16 for every drafter of the grid, checks every timed greedy run
    against its replay (all exact on fp32 tiny models), pairs each run with its adjacent baselines, and shows
    the paired A/A runs."""
    from specdec.report import tables as T
    from specdec.report.analysis import analyze
    from specdec.report.load import load_store
    from specdec.report.render import write_report

    _, db, _, _ = full_sweep
    a = analyze(load_store(db))
    grid, pvm = a[T.TRACE_GRID], a[T.PREDICTED]
    n_prompts = len({r for r in grid["prompt_id"]})
    assert n_prompts == len(SWEEP_PROMPTS)
    fixed = grid[grid["policy"] == "fixed"]
    methods = {"draft", "ngram", "suffix", "mixed"}
    assert sorted(set(fixed["k"])) == list(range(1, 17)) and set(fixed["method"]) == methods
    assert len(fixed) == n_prompts * len(methods) * 16 and (grid["predicted"] > 0).all()
    assert len(pvm) >= 10 and pvm["replay_exact"].all(), pvm[~pvm["replay_exact"]][["method", "policy", "k", "mismatch"]].to_string()
    assert (pvm["n_adjacent"] == 2).all() and (pvm["measured"] > 0).all() and (pvm["predicted"] > 0).all()
    cells = a[T.CELLS]
    spec = cells[cells["method"].isin(["draft", "ngram", "aa"])]
    assert (spec["n_paired"] == spec["n_runs"]).all()  # every run sat between two baselines
    assert len(cells[cells["method"] == "aa"]) and a[T.DIVERGENCE].empty  # fp32: nothing diverged
    res = write_report(db, tmp_path / "rep")
    md, html = res.markdown.read_text(), res.html.read_text()
    assert "Acceptance traces" in md and "Paired A/A" in md and "Replay:" in md and "Acceptance traces" in html
    # the roofline: weight bytes per step and the machine's bandwidth were stored; bytes/s per cell follow
    rl = a[T.ROOFLINE]
    assert len(rl) and (rl["achieved_gbps"] > 0).all() and (rl["share"] > 0).all()
    with Store(db) as st:
        (tb, bw), = st.conn.execute("SELECT target_weight_bytes, bandwidth_gbps FROM roofline").fetchall()
    base = rl[rl["method"] == "baseline"].iloc[0]
    assert base["target_gb"] == pytest.approx(tb / 1e9) and base["bandwidth_gbps"] == pytest.approx(bw)
    assert "Roofline" in md
    assert "transformers-eager: 0 of " in md and "greedy speculative runs left the target-only output" in md


def test_bench_method_prints_the_four_targets(full_sweep, monkeypatch, capsys):
    """study.targets.method on a traced, paired store: replay exact on fp32 (PASS), every timed run's
    predicted / measured ratio printed, the A/A figures, and the simulated coverage."""
    from study.targets import method as mod

    _, db, _, _ = full_sweep
    monkeypatch.setattr("sys.argv", ["method.py", "--db", str(db)])
    mod.main()
    out = capsys.readouterr().out
    assert "exact (100.0%): target >= 99%: PASS" in out
    assert "median |ratio - 1|" in out and "interval contains 1" in out
    assert out.count("coverage") >= 3 and "false-win rate" in out
    n_lines = sum(1 for ln in out.splitlines() if ln.strip().split(" ")[0].isdigit())
    assert n_lines >= 10  # one line per timed draft/ngram run


def test_fastest_table_names_the_fastest_configuration_per_type(full_sweep, capsys):
    """study.fastest: one Markdown row per prompt type with target-only and the best speculative
    cell of each configuration, and the fastest of all by tokens/s."""
    from study import fastest as mod

    _, db, _, _ = full_sweep
    t = mod.main(["--db", str(db)])
    out = capsys.readouterr().out
    types = sorted({p["type"] for p in SWEEP_PROMPTS})
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and not ln.startswith("| prompt type")]
    assert [r.split(" | ")[0][2:] for r in rows] == types
    for ptype, g in t.groupby("prompt_type"):
        top = max(float(g["target_only"].max()), float(g["spec_tok_s"].max()))
        row = next(r for r in rows if r.startswith(f"| {ptype} |"))
        assert f"({top:.1f} tok/s)" in row
    assert "greedy speculative runs left the target-only output" in out


def test_baseline_padded_is_timed_paired_exact_and_read_by_bench_fast(tmp_path, tiny_pair, near_draft_dir,
                                                                         prompt_file, capsys):
    """``baseline_padded`` (target-only, each step padded to the cheapest measured shape; not a default
    method): planned between two baselines on every prompt, token-identical to the baseline, each step's
    forward shape recorded; study.targets.fast reports it against plain target-only and the default
    policy against it, and prints every fast-configuration target."""
    db = tmp_path / "padded.db"
    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, methods="baseline,baseline_padded,draft", ks="1",
               secondary_ks="", policies="cost", secondary_policies="cost", peers=False)
    assert "baseline_padded" not in S.make_config({}).methods
    result = S.run_sweep(cfg, db=db, progress=False)
    assert result.status == "done" and result.failed == 0
    with Store(db) as st:
        runs = st.runs(result.sweep_id)
        rounds = st.conn.execute("SELECT run_id, n_forward FROM rounds").fetchall()
    padded = [r for r in runs if r["method"] == "baseline_padded"]
    assert len(padded) == len(PROMPTS) and all(r["matches_baseline"] == 1 for r in padded)
    by_id = {r["run_id"]: r for r in runs}
    for r in padded:  # paired: a baseline of the same prompt on each side
        assert {by_id[r["run_id"] - 1]["method"], by_id[r["run_id"] + 1]["method"]} == {"baseline"}
    shapes = [n for rid, n in rounds if by_id[rid]["method"] == "baseline_padded"]
    assert shapes and all(n is not None and n >= 1 for n in shapes)
    assert all(n is None for rid, n in rounds if by_id[rid]["method"] == "baseline")
    # the cost policy ran on the secondary prompt too (secondary_policies)
    assert {r["prompt_id"] for r in runs if r["policy"] == "cost"} == {p["id"] for p in PROMPTS}

    from study.targets import fast as mod

    assert mod.main(["--db", str(db)]) == 0
    out = capsys.readouterr().out
    for head in ("1. bf16 step", "2./4. default policy", "3. exactness", "5. target-only padded",
                 "6. the default policy replayed"):
        assert head in out
    assert "transformers-eager, this machine's curve: " in out
    assert "transformers-eager: baseline_padded / baseline = " in out
    assert "default policy / baseline_padded = " in out
    n = sum(1 for r in runs if r["method"] == "draft")
    assert f"equal to plain target-only output {n} of {n}, to padded target-only output {n} of {n}" in out
    assert "repetitive" in out and "code" in out and "NOT MEASURED" in out  # 2 types, not 12: no verdict


def test_bench_fast_measures_fp32_and_bf16_steps_in_one_process(tiny_pair, capsys):
    """study.targets.fast --measure: both dtypes loaded, interleaved passes, the two targets printed."""
    from specdec.runtimes import precision
    from study.targets import fast as mod

    if precision.missing_bf16_support(precision.cpu_flags(), None) is not None:
        pytest.skip("this CPU has no native bf16 kernels (bf16 is refused)")
    mod.measure_steps(str(tiny_pair.target_dir), threads=1, passes=2)
    out = capsys.readouterr().out
    assert "float32   t(1) = " in out and "bfloat16  t(1) = " in out
    assert "bf16 / fp32 single step = " in out and "target <= 0.45: " in out and "bf16 v(17) = " in out


def test_resumed_cost_policy_decides_with_the_prompts_stored_calibration(tmp_path, tiny_pair, near_draft_dir,
                                                                         prompt_file):
    """A sweep stopped after a prompt's first baseline (trace and calibration stored) and resumed in a new
    process: the resumed cost-policy runs decide with that prompt's stored calibration block, so the report's
    replay (which prices with the block) reproduces them exactly."""
    from specdec.report import tables as T
    from specdec.report.analysis import analyze
    from specdec.report.load import load_store

    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, prompt_types="code", ks="1", policies="cost", policy_k=4,
               max_new_tokens=12)
    db = tmp_path / "r.db"
    first = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None, max_runs=2)
    assert first.status == "interrupted"
    done = S.run_sweep(cfg, db=db, resume=True, progress=False, echo=lambda _: None)
    assert done.status == "done" and done.already_done == 2
    pvm = analyze(load_store(db))[T.PREDICTED]
    pol = pvm[pvm["policy"] == "cost"]
    assert len(pol) == 2 and pol["replay_exact"].all(), pol[["method", "mismatch"]].to_string()


def test_policy_best_times_each_drafter_at_the_k_its_trace_predicts(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """Policy ``best``: after a prompt's first baseline the runner replays its acceptance trace for every K in
    1..policy_k, prices the rounds with the prompt's calibration block, and times the drafter at the fastest K.
    The row reads as that fixed-K cell (so the report pairs it with its prediction), its cell key stays the
    planned one (so --resume finds it done), and the K equals what the stored trace and block give."""
    from specdec.bench import sweep as S
    from specdec.core.costs import CostCurve
    from specdec.engine.traces import AcceptanceTrace
    from specdec.measure.pricing import TraceModel

    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, ks="", secondary_ks="", policies="best",
                            secondary_policies="best", policy_k=6, methods="baseline,draft,ngram",
                            calibration_repeats=1)
    db = tmp_path / "best.db"
    lines: list[str] = []
    S.run_sweep(cfg, db=db, progress=False, echo=lines.append)
    with Store(db) as st:
        sid = st.sweeps()[0]["sweep_id"]
        runs = [r for r in st.runs(sid) if r["method"] in ("draft", "ngram")]
        assert runs and all(r["error"] is None for r in runs)
        assert all(r["policy"] == "fixed" and 1 <= r["k"] <= 6 and "|best|" in r["cell_key"] for r in runs)
        assert all(r["matches_baseline"] == 1 for r in runs)
        cal = st.calibration(sid)
        traces = {t["prompt_id"]: t for t in st.traces(sid)}
        for r in runs:
            t = traces[r["prompt_id"]]
            trace = AcceptanceTrace(tuple(t["prompt_ids"]), tuple(t["target_ids"]), tuple(t["draft_ids"]),
                                    tuple(t["draft_top_prob"]), t["max_new_tokens"])
            ctx = t["draft_context"]
            curve = CostCurve.from_calibration([c for c in cal if c["prompt_id"] == r["prompt_id"]])
            k, _ = TraceModel(trace, curve, draft_context=ctx).best_fixed_k(r["method"], range(1, 7))
            assert r["k"] == k, (r["prompt_id"], r["method"])
    assert any("the trace's best" in line for line in lines)
    for r in runs:  # the console's summary line names the K that ran, not the planned maximum
        assert any(line.startswith(f"[{r['config_label']}] {r['prompt_id']} {r['method']} K={r['k']}:")
                   for line in lines), r["prompt_id"]
    again = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None, resume=True)
    assert again.ran == 0


def test_policy_best_under_sampling_times_each_drafter_at_the_k_its_sampled_trace_predicts(tmp_path, tiny_pair,
                                                                                          near_draft_dir, prompt_file):
    """A sampled sweep stores a sampled trace per prompt (the draft's overlap, prompt lookup's and the suffix
    drafter's chains along the seeded baseline) and policy ``best`` times each drafter at the K its expected run,
    priced with the prompt's calibration block, predicts fastest; the report prices every K from it and checks
    the timed runs against it."""
    from specdec.bench import sweep as S
    from specdec.core.costs import CostCurve
    from specdec.core.sampling import SamplingParams
    from specdec.engine.sampled_traces import SampledTrace
    from specdec.measure.pricing import TraceModel
    from specdec.report import tables as T
    from specdec.report.analysis import analyze
    from specdec.report.load import load_store
    from specdec.report.predicted import prompt_models
    from specdec.report.render import write_report

    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, ks="", secondary_ks="",
                            policies="best,draft:cost,mixed:cost", policy_k=6,
                            methods="baseline,draft,ngram,suffix,mixed", calibration_repeats=1, temperature=0.7,
                            top_p=0.9, prompt_types="code,repetitive")
    db = tmp_path / "sampled_best.db"
    S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    with Store(db) as st:
        sid = st.sweeps()[0]["sweep_id"]
        timed = [r for r in st.runs(sid) if r["method"] in ("draft", "ngram", "suffix", "mixed")]
        cal, traces = st.calibration(sid), {t["prompt_id"]: t for t in st.traces(sid)}
    runs = [r for r in timed if r["policy"] == "fixed"]
    policy_runs = [r for r in timed if r["policy"] != "fixed"]
    assert len(runs) >= 6 and all(r["error"] is None for r in timed)
    assert len(policy_runs) == 4
    assert {(r["method"], r["policy"]) for r in policy_runs} == {("draft", "cost"), ("mixed", "cost")}
    for r in runs:
        t = traces[r["prompt_id"]]
        assert set(t["chains"]) == {"ngram", "suffix"} and len(t["overlap"]) == len(t["target_ids"])
        trace = SampledTrace(tuple(t["prompt_ids"]), tuple(t["target_ids"]), t["max_new_tokens"],
                             SamplingParams(0.7, 0, 0.9), tuple(t["overlap"]),
                             {k: tuple(tuple(c) for c in v) for k, v in t["chains"].items()})
        curve = CostCurve.from_calibration([c for c in cal if c["prompt_id"] == r["prompt_id"]])
        assert r["k"] == TraceModel(trace, curve).best_fixed_k(r["method"], range(1, 7))[0], r["prompt_id"]
    store = load_store(db)
    models = prompt_models(store.runs, store.rounds, store.traces, store.calibration)
    assert models and all(m.sampled for m in models)
    a = analyze(store)
    check = a[T.SAMPLED]  # the report checks each timed run against its trace's expectation
    assert sorted(check["run_id"]) == sorted(r["run_id"] for r in timed)
    assert (check["predicted"] >= 1.0).all() and (check["measured"] >= 1.0).all()
    by_model = {m.key[1]: m for m in models}
    for r in policy_runs:  # a policy's run against the mean of its simulated runs, pooled apart
        row = check[check["run_id"] == r["run_id"]].iloc[0]
        assert row["method"] == f"{r['method']} cost"
        assert row["predicted"] == pytest.approx(
            by_model[r["prompt_id"]].expected_policy(r["method"], "cost", 6)[0])
    # the K grid and the answer per type come from the expectations: every fixed K exactly, the cost policy
    # (the default) as the mean of simulated runs
    grid = a[T.TRACE_GRID]
    assert set(grid["method"]) == {"draft", "ngram", "suffix", "mixed"} and set(grid["policy"]) == {"fixed", "cost"}
    assert len(grid) == 17 * 4 * len(models) and (grid["predicted"] > 0).all()
    answer = a[T.ANSWER]
    assert set(answer["prompt_type"]) == {"code", "repetitive"} and answer["best_method"].notna().all()
    assert (answer["default"] > 0).all()  # the default policy predicted per type under sampling
    assert a.default_policy == ("mixed", "cost")  # generate's default, replayed from the sampled traces
    write_report(db, tmp_path / "report")
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Sampled sweeps: each prompt's sampled trace" in text and "priced in expectation" in text


def test_a_temperature_axis_is_one_sweep_per_temperature_in_one_store_each_beside_the_others(
        tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """``--temperatures 0,0.7``: one store, one sweep per temperature (its own id, its runs at that
    temperature, top-p only where T > 0, each seeded); the same command with --resume runs nothing again,
    and one given a third temperature adds only its sweep; the report sets each sweep of the axis beside the
    one it shows. A setting one temperature refuses fails before any sweep."""
    from specdec.report.load import axis_sweeps, load_store
    from specdec.report.render import write_report

    db = tmp_path / "axis.db"
    args = ["sweep", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompts",
            str(prompt_file), "--prompt-types", "code", "--ks", "2", "--secondary-ks", "", "--max-new-tokens", "6",
            "--methods", "baseline,draft,ngram", "--policies", "none", "--no-progress", "--threads", "1",
            "--configs", "transformers-eager", "--top-p", "0.9", "--db", str(db)]
    runner = CliRunner()
    res = runner.invoke(cli_app(), [*args, "--temperatures", "0,0.7"])
    assert res.exit_code == 0, res.output
    with Store(db) as st:
        sweeps = st.sweeps()
        by_t = {json.loads(w["config_json"])["temperature"]: w["sweep_id"] for w in sweeps}
        temps = {sid: {r["temperature"] for r in st.runs(sid)} for sid in by_t.values()}
        seeded = all(r["seed"] is not None for sid in by_t.values() for r in st.runs(sid))
        n_runs = {sid: len(st.runs(sid)) for sid in by_t.values()}
    assert sorted(by_t) == [0.0, 0.7] and len(set(by_t.values())) == 2
    assert temps[by_t[0.0]] == {0.0} and temps[by_t[0.7]] == {0.7} and seeded
    assert json.loads(next(w for w in sweeps if w["sweep_id"] == by_t[0.0])["config_json"])["top_p"] == 1.0
    res = runner.invoke(cli_app(), [*args, "--temperatures", "0,0.7,1.0", "--resume"])
    assert res.exit_code == 0, res.output
    with Store(db) as st:
        again = {sid: len(st.runs(sid)) for sid in (w["sweep_id"] for w in st.sweeps())}
    assert {sid: again[sid] for sid in n_runs} == n_runs and len(again) == 3  # only T = 1.0 ran
    assert len(axis_sweeps(load_store(db, by_t[0.0]))) == 2 and axis_sweeps(load_store(db, by_t[0.7]))[0] == by_t[0.0]
    md = write_report(db, tmp_path / "report", sweep=by_t[0.7]).markdown.read_text(encoding="utf-8")
    assert f"\n## Beside greedy ({by_t[0.0]})" in md and "\n## Beside T = 1 (" in md
    # refused in one line before any sweep starts
    bad = runner.invoke(cli_app(), [*args[:-2], "--db", str(tmp_path / "none.db"), "--temperatures", "0.7,0",
                                    "--temperature", "0.5"])
    assert bad.exit_code != 0 and "not both" in bad.output and not (tmp_path / "none.db").exists()
    bad = runner.invoke(cli_app(), [*args[:-2], "--db", str(tmp_path / "none.db"), "--temperatures", "0,0.7",
                                    "--methods", "baseline,draft,ngram_hf", "--policies", "best"])
    assert bad.exit_code != 0 and "temperature 0.7: policy 'best'" in bad.output
    assert not (tmp_path / "none.db").exists()  # the greedy sweep, which alone would run, did not start


def cli_app():
    from specdec.entrypoints.cli import register_subcommands

    return register_subcommands()


def test_policy_best_needs_traces_calibration_and_a_sampled_replay(tiny_pair, near_draft_dir, prompt_file):
    for kw, why in (({"temperature": 0.7, "methods": "baseline,draft,ngram_hf"}, "under sampling .* without ngram_hf"),
                    ({"traces": False}, "--no-traces"), ({"calibration_repeats": 0}, "--calibration-repeats 0")):
        with pytest.raises(ValueError, match=why):
            tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, policies="best", **kw)
    # the default methods under sampling are those a sampled trace replays: the mixed drafter (the default)
    # among them, so the default policies plan runs at every temperature
    from specdec.bench.grid import idle_policies

    assert S.make_config({}).methods == S.make_config({"temperature": 0.7}).methods
    assert idle_policies(S.make_config({})) is None and idle_policies(S.make_config({"temperature": 0.7})) is None
    # a policy entry whose drafter is not planned says so
    assert idle_policies(S.make_config({"temperature": 0.7, "methods": "baseline,draft"})).startswith(
        "nothing planned for policy mixed:cost")
    # under sampling the draft model, prompt lookup, the suffix drafter and the mixed drafter have a sampled replay
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, policies="best", temperature=0.7,
                            methods="baseline,draft,ngram,suffix,mixed")
    assert cfg.policies == ("best",)


def test_a_resumed_prompt_takes_its_missing_trace_before_policy_best(tmp_path, tiny_pair, near_draft_dir,
                                                                      prompt_file):
    """A sweep stopped after a prompt's first target-only run was stored but before its trace and calibration
    block were: --resume takes them from the stored run, and the prompt's `best` cells run instead of being
    recorded as skipped."""
    import sqlite3

    from specdec.bench import sweep as S

    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, ks="", secondary_ks="", policies="best",
                            policy_k=4, methods="baseline,draft,ngram", calibration_repeats=1,
                            prompt_types="code")
    db = tmp_path / "resume.db"
    S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None)
    con = sqlite3.connect(db)
    pid = con.execute("SELECT prompt_id FROM traces ORDER BY prompt_id LIMIT 1").fetchone()[0]
    best = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE prompt_id = ? AND cell_key LIKE '%|best|%'",
                                      (pid,))]
    assert len(best) == 2
    con.execute(f"DELETE FROM rounds WHERE run_id IN ({','.join('?' * len(best))})", best)
    con.execute(f"DELETE FROM runs WHERE run_id IN ({','.join('?' * len(best))})", best)
    con.execute("DELETE FROM traces WHERE prompt_id = ?", (pid,))
    con.execute("DELETE FROM calibration WHERE prompt_id = ?", (pid,))
    con.commit()
    con.close()
    again = S.run_sweep(cfg, db=db, progress=False, echo=lambda _: None, resume=True)
    assert again.ran == 2 and again.skipped == 0
    with Store(db) as st:
        sid = st.sweeps()[0]["sweep_id"]
        rows = [r for r in st.runs(sid, prompt_id=pid) if "|best|" in r["cell_key"]]
        assert len(rows) == 2 and all(r["error"] is None and r["policy"] == "fixed" for r in rows)
        assert any(t["prompt_id"] == pid for t in st.traces(sid))


def test_compiled_configurations_get_a_static_cache_sized_to_the_sweep(tiny_pair, near_draft_dir, prompt_file):
    """A compiled configuration's static cache (every compiled step attends over all of its slots) holds the
    longest prompt + max_new_tokens + the widest timed forward, rounded up to CACHE_STEP; the loader gets it
    for compiled configurations only; a sweep that needs more than DEFAULT_MAX_LENGTH leaves the backend's
    default (and the long prompts to the fitting check)."""
    from specdec import models
    from specdec.bench.loaded import CACHE_STEP, _load_pair, compiled_max_length
    from specdec.bench.plan import cost_max_n
    from specdec.catalogue.runtimes import RUNTIME_CONFIGS
    from specdec.prompts import encode_prompt
    from specdec.runtimes.compiled import DEFAULT_MAX_LENGTH

    cfg = _cfg(tiny_pair, near_draft_dir, prompt_file, max_new_tokens=300)
    p = S.prepare(cfg)
    tok = models.hf_tokenizer(p.target)
    longest = max(len(encode_prompt(tok, q.text, chat_template=cfg.chat_template)) for q in p.prompts)
    need = longest + 300 + cost_max_n(cfg)
    n = compiled_max_length(cfg, p)
    assert n % CACHE_STEP == 0 and n - CACHE_STEP < need <= n
    seen: dict = {}

    def loader(*args, **kw):
        seen.clear()
        seen.update(kw)

    _load_pair(cfg, RUNTIME_CONFIGS["transformers-bf16-frozen"], p, loader)
    assert seen["max_length"] == n and seen["compile_mode"] == "frozen"
    _load_pair(cfg, RUNTIME_CONFIGS["transformers-eager"], p, loader)
    assert "max_length" not in seen
    huge = _cfg(tiny_pair, near_draft_dir, prompt_file, max_new_tokens=DEFAULT_MAX_LENGTH)
    assert compiled_max_length(huge, S.prepare(huge)) is None
