"""The cross-tokenizer draft and the suffix drafters in the sweep: the preset, method ``xtok`` (a draft of
another tokenizer loaded beside the pair), method ``suffix_corpus`` (the other prompts' target-only outputs
as corpus), the per-type drafter table of the report.

Tiny models only: the TINY pair of tests/conftest.py and the OTHER draft of tests/test_xdrafter.py (another
byte-level BPE with 600 ids). Nothing asserts on wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import V_D, build_other_tokenizer, build_tiny_model, one_row, tiny_sweep_config
from typer.testing import CliRunner

from specdec.bench import sweep as S
from specdec.bench.methods import METHODS
from specdec.bench.store import Store


@pytest.fixture(scope="module")
def other_draft_dir(tmp_path_factory):
    """A tiny causal LM with the OTHER tokenizer (600 ids): a draft of another tokenizer than TINY's."""
    path = tmp_path_factory.mktemp("xtok") / "other_draft"
    build_tiny_model(3, vocab_size=V_D).save_pretrained(path, safe_serialization=True)
    build_other_tokenizer().save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------------ preset


def test_smollm2_preset_is_a_cross_family_pair(smollm2_gguf):
    from specdec.models import list_presets
    from specdec.models.presets import PRESETS, other_tokenizer_pair, resolve_pair
    from specdec.models.spec import resolve

    assert resolve_pair("qwen2.5-coder+smollm2", None, None) == ("qwen2.5-coder:target", "smollm2")
    assert PRESETS["qwen2.5-coder+smollm2"].other_tokenizer
    r = resolve("smollm2")
    assert r.kind == "gguf" and r.path.resolve() == smollm2_gguf.resolve()
    assert other_tokenizer_pair("qwen2.5-coder:target", "smollm2")
    assert other_tokenizer_pair("qwen2.5-coder+smollm2:target", "qwen2.5-coder+smollm2:draft")
    assert not other_tokenizer_pair("qwen2.5-coder:target", "qwen2.5-coder:draft")
    assert not other_tokenizer_pair("some/target", "smollm2")  # only the preset's own pairing
    row = next(r for r in list_presets() if r["name"] == "qwen2.5-coder+smollm2")
    assert row["other_tokenizer"] and row["draft"] == "smollm2" and row["draft_params"] == 134_515_008
    assert not next(r for r in list_presets() if r["name"] == "qwen2.5-coder")["other_tokenizer"]


def test_models_command_marks_the_other_tokenizer_preset():
    from specdec.entrypoints.cli import register_subcommands

    app = register_subcommands()

    out = CliRunner().invoke(app, ["models"]).output
    line = next(x for x in out.splitlines() if x.startswith("qwen2.5-coder+smollm2"))
    assert "(other tokenizer)" in line


def test_load_pair_passes_other_tokenizer_for_a_flagged_preset(tiny_pair, other_draft_dir, monkeypatch):
    from specdec.models import presets
    from specdec.runtimes.compat import IncompatibleTokenizersError
    from specdec.runtimes.loading import load_pair

    target, draft = str(tiny_pair.target_dir), str(other_draft_dir)
    with pytest.raises(IncompatibleTokenizersError):
        load_pair(target, draft)  # no preset says so: refused, as before
    monkeypatch.setitem(presets.PRESETS, "tiny+other", presets.Preset(
        "tiny+other", draft, target, "test pair", offline=True, other_tokenizer=True))
    pair = load_pair(target, draft)
    assert pair.info["vocab_overlap"] and pair.draft.tokenizer.vocab_size != pair.target.tokenizer.vocab_size
    assert pair.eos_ids == pair.target.eos_ids  # target-space stop ids only


# ------------------------------------------------------------------------------------------- the costs


class _Recording:
    """A backend of `vocab` ids that records what it is fed (a draft's forward)."""

    max_length, device = 512, torch.device("cpu")

    def __init__(self, vocab: int) -> None:
        self.vocab_size, self.fed, self.n = vocab, [], 0

    def reset(self):
        self.n = 0

    def forward(self, tokens, *, logits=True, last=None):
        assert all(0 <= t < self.vocab_size for t in tokens)
        self.fed.extend(tokens)
        self.n += len(tokens)
        return torch.zeros(min(last or len(tokens), len(tokens)), self.vocab_size) if logits else None

    def truncate(self, n):
        self.n = n

    def synchronize(self):
        pass


def test_cross_tokenizer_draft_step_is_timed_on_its_own_token_ids():
    from types import SimpleNamespace

    from specdec.measure.timing import context_ids, cross_tokenizer_draft_costs

    tok = build_other_tokenizer()
    backend = _Recording(V_D)
    ticks = iter(range(10_000))
    out = cross_tokenizer_draft_costs(SimpleNamespace(backend=backend, tokenizer=tok), 0.5, repeats=1,
                                      context_tokens=20, clock=lambda: float(next(ticks)))
    own = context_ids(tok, V_D, 20)[:20]
    assert backend.fed[:20] == own  # the warm context: the filler in the DRAFT's tokens
    assert out["draft_step_s"] == 1.0 and out["c"] == 2.0 and out["context_tokens"] == 20
    with pytest.raises(ValueError, match="step time"):
        cross_tokenizer_draft_costs(SimpleNamespace(backend=backend, tokenizer=tok), 0.0)


# ------------------------------------------------------------------------------------------ the sweep


def test_xtok_needs_its_draft_in_one_line(tiny_pair, near_draft_dir, prompt_file, tmp_path):
    with pytest.raises(ValueError, match="needs --xtok-draft"):
        tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,xtok")
    res = subprocess.run([sys.executable, "-m", "specdec", "sweep", "--target", str(tiny_pair.target_dir),
                          "--draft", str(near_draft_dir), "--prompts", str(prompt_file), "--methods",
                          "baseline,xtok", "--db", str(tmp_path / "x.db"), "--dry-run"],
                         capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode != 0 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        ("specdec: error: method xtok needs --xtok-draft: a draft model with another tokenizer "
         "(smollm2, a .gguf file or a checkpoint directory)")]
    assert not (tmp_path / "x.db").exists()


def test_sweep_refuses_a_cross_family_pair_as_its_pair():
    with pytest.raises(ValueError, match="--xtok-draft smollm2"):
        S.make_config({"pair": "qwen2.5-coder+smollm2"})


def test_plan_times_xtok_at_its_fixed_k_never_best(tiny_pair, near_draft_dir, other_draft_dir, prompt_file):
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,draft,xtok,suffix_corpus",
                            xtok_draft=str(other_draft_dir), ks="", secondary_ks="", policies="best,cost",
                            xtok_ks="3")
    plan = S.build_plan(cfg, S.select_prompts(cfg))
    xtok = {(c.k, c.policy) for c in plan if c.method == "xtok"}
    assert xtok == {(3, "fixed"), (64, "cost")}  # best dropped: no trace of it is recorded; cost at its own K
    assert {c.policy for c in plan if c.method == "suffix_corpus"} == {"best", "cost"}
    assert S.plan_summary(plan)["xtok K=3"] == len(S.select_prompts(cfg))
    assert METHODS["xtok"].drafts_with_model and not METHODS["xtok"].default


@pytest.fixture(scope="module")
def xtok_sweep(tmp_path_factory, tiny_pair, near_draft_dir, other_draft_dir, prompt_file):
    db = tmp_path_factory.mktemp("xsweep") / "x.db"
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file,
                            methods="baseline,draft,xtok,ngram,suffix,suffix_corpus",
                            xtok_draft=str(other_draft_dir), ks="", secondary_ks="", policies="best",
                            secondary_policies="best", xtok_ks="2", max_new_tokens=12, calibration_repeats=1)
    lines: list[str] = []
    result = S.run_sweep(cfg, db=db, progress=False, echo=lines.append)
    with Store(db) as st:
        runs = st.runs(result.sweep_id)
    return cfg, db, result, runs, lines


def test_xtok_sweep_stores_exact_runs(xtok_sweep, other_draft_dir, near_draft_dir):
    cfg, _db, result, runs, lines = xtok_sweep
    assert result.status == "done" and result.failed == 0 and result.skipped == 0, lines
    assert all(r["error"] is None for r in runs), [r["error"] for r in runs if r["error"]]
    xt = [r for r in runs if r["method"] == "xtok"]
    assert len(xt) == len(S.select_prompts(cfg)) and {r["k"] for r in xt} == {2}
    base = {r["prompt_id"]: r["token_ids"] for r in runs if r["method"] == "baseline" and r["repeat"] == 0}
    for r in xt:
        assert r["token_ids"] == base[r["prompt_id"]] and r["matches_baseline"] == 1
        assert r["num_rounds"] > 0 and r["num_drafted"] > 0 and r["draft_s"] > 0
        assert r["draft"] == str(other_draft_dir)  # the row names the draft that drafted it
    assert {r["draft"] for r in runs if r["method"] == "draft"} == {str(near_draft_dir)}
    assert any("cross-tokenizer draft" in x and "own tokens, c = " in x for x in lines), lines
    # the per-prompt and the corpus suffix drafters: exact, at their trace's best K, stored apart
    for m in ("suffix", "suffix_corpus", "draft", "ngram"):
        rows = [r for r in runs if r["method"] == m]
        assert rows and all(r["matches_baseline"] == 1 for r in rows), m
        assert all(r["cell_key"].split("|")[5] == "best" and r["policy"] == "fixed" for r in rows)


def test_xtok_draft_that_shares_the_tokenizer_is_fine(tiny_pair, near_draft_dir, prompt_file, tmp_path):
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,xtok",
                            xtok_draft=str(tiny_pair.draft_dir), ks="", secondary_ks="", max_new_tokens=6,
                            prompt_types="repetitive")
    result = S.run_sweep(cfg, db=tmp_path / "same.db", progress=False, echo=lambda _: None)
    with Store(tmp_path / "same.db") as st:
        runs = st.runs(result.sweep_id)
    xt = [r for r in runs if r["method"] == "xtok"]
    assert result.failed == 0 and xt and all(r["matches_baseline"] == 1 for r in xt)


def test_suffix_corpus_never_sees_its_own_prompts_output(tiny_pair, near_draft_dir, prompt_file):
    from types import SimpleNamespace

    from specdec.bench.config import RUNTIME_CONFIGS
    from specdec.bench.loaded import LoadedConfig

    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,suffix_corpus")
    loaded = LoadedConfig(cfg, RUNTIME_CONFIGS["transformers-eager"], SimpleNamespace(tokenizer=None),
                          outputs={"a": [1, 2, 3], "b": [4, 5], "c": []})
    assert loaded.runtime("a", "suffix_corpus").corpus == ((4, 5),)
    assert loaded.runtime("z", "suffix_corpus").corpus == ((1, 2, 3), (4, 5))
    assert loaded.runtime("a", "suffix").corpus == ()  # the per-prompt drafter has none
    with pytest.raises(ValueError, match="--xtok-draft"):
        loaded.runtime("a", "xtok")


# ------------------------------------------------------------------------------------------- the report


def test_drafter_table_per_type_from_the_sweep(xtok_sweep):
    from specdec.report import analyze, load_store
    from specdec.report.drafters import drafter_ratio_table, drafter_table
    from specdec.report.vocab import ALL_PROMPTS

    cfg, db, _result, runs, _lines = xtok_sweep
    data = load_store(db)
    table = drafter_table(data.runs, data.rounds)
    types = {p.type for p in S.select_prompts(cfg)}
    got = {(r.prompt_type, r.method, r.k) for r in table.itertuples()}
    for t in [*types, ALL_PROMPTS]:
        for m in ("draft", "ngram", "suffix", "suffix_corpus"):
            assert (t, m, "best") in got, (t, m)
        assert (t, "xtok", "2") in got
    # best-K cells pool every K the traces chose into one row per type; tokens per target forward >= 1
    assert len(table) == len(got) and (table["tokens_per_forward"] >= 1).all()
    assert (table["n_prompts"] >= 1).all() and table["speedup"].gt(0).all()
    pooled = table[(table["prompt_type"] == ALL_PROMPTS) & (table["method"] == "draft")].iloc[0]
    assert pooled["n_prompts"] == len(S.select_prompts(cfg))
    ks = {int(r["k"]) for r in runs if r["method"] == "draft"}
    assert pooled["ks"] == (str(min(ks)) if len(ks) == 1 else f"{min(ks)}-{max(ks)}")
    ratios = drafter_ratio_table(data.runs)
    line = ratios[(ratios["comparison"] == "suffix vs prompt lookup") & (ratios["prompt_type"] == ALL_PROMPTS)]
    assert len(line) == 1 and line.iloc[0]["k"] == "best" and line.iloc[0]["ratio"] > 0
    assert line.iloc[0]["n_prompts"] == len(S.select_prompts(cfg))
    assert set(ratios["comparison"]) == {"suffix vs prompt lookup", "suffix with corpus vs suffix"}
    a = analyze(data)
    assert len(a.table("drafters")) == len(table)


def test_drafter_ratio_is_paired_per_prompt():
    """Suffix twice as fast as its baselines and prompt lookup as fast as its own (on a machine twice as
    slow): paired, the ratio is 2 on every prompt whatever the drift between the two."""
    from specdec.report.drafters import drafter_ratio_table

    rows, rid = [], 0
    for p in ("p1", "p2", "p3"):
        for method, tps, base in (("suffix", 20.0, 10.0), ("ngram", 5.0, 5.0)):
            for m, v in (("baseline", base), (method, tps), ("baseline", base)):
                rid += 1
                policy = None if m == "baseline" else "fixed"
                rows.append({"run_id": rid, "sweep_id": "s", "config_label": "c", "pair": "x", "target": "t",
                             "prompt_id": p, "prompt_type": "code", "method": m, "policy": policy,
                             "k": None if m == "baseline" else 4, "repeat": 0, "tokens_per_s": v, "error": None,
                             "cell_key": f"s|c|{p}|{m}|{'-' if m == 'baseline' else 4}|{policy or '-'}|0"})
    import pandas as pd

    out = drafter_ratio_table(pd.DataFrame(rows))
    r = out[(out["prompt_type"] == "code")].iloc[0]
    assert r["k"] == "4" and r["n_prompts"] == 3 and abs(r["ratio"] - 2.0) < 1e-9


def test_suffix_corpus_in_the_sweep_holds_the_other_prompts_outputs_only(tiny_pair, near_draft_dir, prompt_file,
                                                                         tmp_path, monkeypatch):
    """Every suffix_corpus drafter the sweep builds gets, as corpus, target-only outputs of prompts other than
    the one it drafts for; the later prompts get the earlier ones'."""
    import specdec.drafters.suffix as SX

    seen: list[tuple[tuple, list]] = []  # (corpus, first prefill context) per drafter

    class Recording(SX.SuffixDrafter):
        def __init__(self, cost=None, **kw):
            self._rec = (tuple(tuple(c) for c in kw.get("corpus", ())), [])
            seen.append(self._rec)
            super().__init__(cost, **kw)

        def prefill(self, context):
            if not self._rec[1]:
                self._rec[1].extend(context)
            return super().prefill(context)

    monkeypatch.setattr(SX, "SuffixDrafter", Recording)
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,suffix_corpus", ks="2",
                            secondary_ks="2", max_new_tokens=8)
    result = S.run_sweep(cfg, db=tmp_path / "c.db", progress=False, echo=lambda _: None)
    with Store(tmp_path / "c.db") as st:
        runs = st.runs(result.sweep_id)
    from transformers import AutoTokenizer

    from specdec.prompts import encode_prompt

    tok = AutoTokenizer.from_pretrained(str(tiny_pair.target_dir))
    # the engine prefills the drafter with the prompt minus its last token
    prompt_of = {tuple(encode_prompt(tok, p.text, chat_template=False)[:-1]): p.id for p in S.select_prompts(cfg)}
    assert result.failed == 0, [r["error"] for r in runs if r["error"]]
    base = {r["prompt_id"]: tuple(json.loads(r["token_ids"]) if isinstance(r["token_ids"], str) else r["token_ids"])
            for r in runs if r["method"] == "baseline" and r["repeat"] == 0}
    assert set(base) == set(prompt_of.values())
    timed = [(corpus, prompt_of[tuple(ctx)]) for corpus, ctx in seen if tuple(ctx) in prompt_of]
    assert len(timed) >= len(base) and any(corpus for corpus, _ in timed)  # later prompts drafted from a corpus
    for corpus, pid in timed:
        assert set(corpus) <= {out for q, out in base.items() if q != pid}, pid  # never its own output


def test_api_drafts_text_with_a_flagged_preset_pair(tiny_pair, other_draft_dir, monkeypatch):
    """load_pair of a preset flagged other_tokenizer, then generate(): the draft drafts text (string-level
    match), fixed K by default, the greedy output is the target's own; the cost policy is refused."""
    import specdec
    from specdec.models import presets

    target, draft = str(tiny_pair.target_dir), str(other_draft_dir)
    monkeypatch.setitem(presets.PRESETS, "tiny+other", presets.Preset(
        "tiny+other", draft, target, "test pair", offline=True, other_tokenizer=True))
    pair = specdec.load_pair("tiny+other", dtype="float32", threads=1)
    ref = specdec.generate(pair, "hello world the quick brown fox", max_new_tokens=16, drafter="ngram", k=1)
    g = specdec.generate(pair, "hello world the quick brown fox", max_new_tokens=16)
    assert g.policy == "fixed" and g.k == 4 and g.num_drafted > 0
    assert g.token_ids == ref.token_ids
    with pytest.raises(ValueError, match="one vocabulary"):
        specdec.generate(pair, "hello", max_new_tokens=4, policy="cost")


def test_cli_generate_drafts_text_with_a_flagged_preset_pair(tiny_pair, other_draft_dir, monkeypatch):
    """``specdec generate --pair <preset flagged other_tokenizer>`` without --other-tokenizer: the draft
    drafts text, the output is target-only decoding's."""
    from specdec.entrypoints.cli import register_subcommands

    app = register_subcommands()
    from specdec.models import presets

    monkeypatch.setitem(presets.PRESETS, "tiny+other", presets.Preset(
        "tiny+other", str(other_draft_dir), str(tiny_pair.target_dir), "test pair", offline=True,
        other_tokenizer=True))
    res = CliRunner().invoke(app, ["generate", "--pair", "tiny+other", "--prompt", "hello world the quick brown fox",
                                   "--max-new-tokens", "16", "--baseline", "--json", "--threads", "1",
                                   "--dtype", "float32"])
    assert res.exit_code == 0, res.output
    out = one_row(json.loads(res.stdout[res.stdout.index("{"):]))
    assert out["identical_to_baseline"] and out["num_drafted"] > 0


def test_suffix_corpus_added_on_resume_drafts_from_every_other_stored_output(tiny_pair, near_draft_dir,
                                                                             prompt_file, tmp_path, monkeypatch):
    """``--resume`` with suffix_corpus added: its corpus holds every other prompt's stored target-only output."""
    import specdec.drafters.suffix as SX

    seen: list[tuple] = []

    class Recording(SX.SuffixDrafter):
        def __init__(self, cost=None, **kw):
            seen.append(tuple(tuple(c) for c in kw.get("corpus", ())))
            super().__init__(cost, **kw)

    db = tmp_path / "r.db"
    first = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,ngram", ks="1",
                              secondary_ks="1", max_new_tokens=6)
    S.run_sweep(first, db=db, progress=False, echo=lambda _: None)
    monkeypatch.setattr(SX, "SuffixDrafter", Recording)
    more = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,ngram,suffix_corpus", ks="1",
                             secondary_ks="1", max_new_tokens=6)
    result = S.run_sweep(more, db=db, resume=True, progress=False, echo=lambda _: None)
    with Store(db) as st:
        runs = st.runs(result.sweep_id)
    outs = {r["prompt_id"]: tuple(json.loads(r["token_ids"])) for r in runs
            if r["method"] == "baseline" and r["repeat"] == 0}
    n = len(S.select_prompts(more))
    assert result.failed == 0 and len(outs) == n
    timed = seen[1:]  # the first is the warm-up
    assert len(timed) == n and all(len(c) == n - 1 and set(c) <= set(outs.values()) for c in timed)
