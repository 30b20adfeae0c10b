"""The catalogue (`specdec.catalogue`): every drafter it offers works at every entry point, and a drafter
registered there alone is offered by the command line, the Python API (one prompt and a batch), the sweep and
the trace replay."""

from __future__ import annotations

import json

import pytest
from conftest import ScriptedDrafter

from specdec.catalogue import drafters as catalogue
from specdec.catalogue import policies as catalogue_policies

TEXTS = ["hello world the quick brown fox", "abc abc abc abc abc abc abc abc", "one two three four five six"]
NEW = 8


@pytest.fixture(scope="module")
def pair(tiny_pair, near_draft_dir):
    from specdec import load_pair

    return load_pair(target=str(tiny_pair.target_dir), draft=str(near_draft_dir), dtype="float32", threads=1)


@pytest.fixture(scope="module")
def singles(pair):
    """Target-only greedy output of each prompt (the oracle)."""
    from specdec.engine.decoding import autoregressive_generate

    loaded = pair.loaded
    return [autoregressive_generate(loaded.target.backend, loaded.tokenizer(t).input_ids, NEW,
                                    eos_ids=loaded.eos_ids, vocab_size=loaded.vocab_size).token_ids for t in TEXTS]


def test_names_and_aliases_resolve_to_one_entry():
    assert catalogue.drafter("model") is catalogue.drafter("draft") is catalogue.drafter("Draft_Model")
    assert catalogue.drafter("prompt_lookup").name == "ngram"
    with pytest.raises(ValueError, match="unknown drafter 'oracle'; choose one of draft, ngram"):
        catalogue.drafter("oracle")
    assert set(catalogue.model_drafters()) == {"draft"} and set(catalogue.free_drafters()) == {"ngram", "ngram_hf"}
    assert catalogue.grid_drafters() == ("draft", "ngram", "suffix", "mixed")
    assert catalogue_policies.resolve_policy(None, None)[0].name == "cost"
    assert catalogue_policies.policy_names(batch=True) == ("fixed", "cost")


@pytest.mark.parametrize("name", [n for n, e in catalogue.DRAFTERS.items() if not e.other_tokenizer])
def test_every_drafter_works_through_the_api_for_one_prompt_and_a_batch(pair, singles, name, tmp_path, monkeypatch):
    """Greedy output equals target-only output, one prompt at a time and in batches of 2, under a fixed K and
    under the default (cost) policy."""
    from specdec import generate

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    for k in (3, None):
        one = [generate(pair, t, max_new_tokens=NEW, k=k, drafter=name).token_ids for t in TEXTS]
        many = generate(pair, TEXTS, batch_size=2, max_new_tokens=NEW, k=k, drafter=name)
        assert one == singles and [g.token_ids for g in many] == singles, (name, k)
        assert {g.drafter for g in many} == {name}


def test_the_draft_of_another_tokenizer_works_one_prompt_at_a_time(tiny_pair, tmp_path):
    """``xtok`` (and ``draft`` on such a pair, which means it) serves one prompt, and a list one prompt at a
    time; a batch of more is refused before anything runs."""
    from conftest import V_D, build_other_tokenizer, build_tiny_model

    from specdec import generate, load_pair
    from specdec.engine.decoding import autoregressive_generate

    path = tmp_path / "other"
    build_tiny_model(3, vocab_size=V_D).save_pretrained(path, safe_serialization=True)
    build_other_tokenizer().save_pretrained(path)
    p = load_pair(target=str(tiny_pair.target_dir), draft=str(path), dtype="float32", threads=1,
                  other_tokenizer=True)
    loaded = p.loaded
    want = [autoregressive_generate(loaded.target.backend, loaded.tokenizer(t).input_ids, NEW,
                                    eos_ids=loaded.eos_ids, vocab_size=loaded.vocab_size).token_ids for t in TEXTS]
    for name in ("xtok", "draft"):
        assert generate(p, TEXTS[0], max_new_tokens=NEW, drafter=name).token_ids == want[0]
        assert [g.token_ids for g in generate(p, TEXTS, batch_size=1, max_new_tokens=NEW, drafter=name)] == want
    with pytest.raises(ValueError, match="drafts 1 prompt at a time"):
        generate(p, TEXTS, batch_size=2, max_new_tokens=NEW, drafter="xtok")
    with pytest.raises(ValueError, match="cost"):
        generate(p, TEXTS[0], max_new_tokens=NEW, policy="cost")


@pytest.fixture
def toy(monkeypatch):
    """A drafter registered in the catalogue only: it proposes the last committed token K times."""
    entry = catalogue.DrafterEntry("toy", "last token repeated", "the last token, K times",
                                   lambda source: ScriptedDrafter(lambda seq, k: [seq[-1]] * k))
    monkeypatch.setitem(catalogue.DRAFTERS, "toy", entry)
    return entry


def test_a_drafter_registered_in_the_catalogue_runs_at_every_entry_point(toy, pair, singles, tiny_pair,
                                                                        near_draft_dir, prompt_file, tmp_path,
                                                                        capsys):
    from specdec import generate
    from specdec.bench import sweep as S
    from specdec.bench.methods import METHODS
    from specdec.bench.store import Store
    from specdec.core.costs import CostCurve
    from specdec.engine.traces import record_trace
    from specdec.entrypoints.cli import main
    from specdec.measure.pricing import TraceModel

    # the Python API, one prompt and a batch
    assert [generate(pair, t, max_new_tokens=NEW, k=2, drafter="toy").token_ids for t in TEXTS] == singles
    assert [g.token_ids for g in generate(pair, TEXTS, batch_size=3, max_new_tokens=NEW, k=2, drafter="toy")] == singles
    # the command line
    with pytest.raises(SystemExit) as done:
        main(["generate", "--target", str(tiny_pair.target_dir), "--prompt", TEXTS[1], "--drafter", "toy", "--k", "2",
              "--max-new-tokens", str(NEW), "--dtype", "float32", "--threads", "1", "--json"])
    assert done.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["drafter"] == "toy" and doc["rows"][0]["token_ids"] == singles[1]
    # the sweep: a method of the same name, planned and timed
    assert "toy" in METHODS
    from conftest import tiny_sweep_config

    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,toy", ks="2", secondary_ks="")
    res = S.run_sweep(cfg, db=tmp_path / "toy.db", progress=False, echo=lambda _: None)
    with Store(tmp_path / "toy.db") as st:
        runs = st.runs(res.sweep_id, method="toy")
    assert res.failed == 0 and runs and all(r["matches_baseline"] == 1 for r in runs)
    # the trace replay: a model-free drafter is asked each round, as the engine asks it
    ids = pair.loaded.tokenizer(TEXTS[1]).input_ids
    trace = record_trace(ids, singles[1], NEW)
    model = TraceModel(trace, CostCurve({1: 0.01, 3: 0.012}, 0.0))
    rounds = model.rounds("toy", 2)
    assert sum(r.num_emitted for r in rounds) == len(singles[1]) and any(r.k > 0 for r in rounds)


@pytest.mark.parametrize("timed, expected", [
    (["draft"], "draft"),  # a store that timed only the draft model's cost policy keeps it as its default
    (["model", "ngram"], "draft"),  # aliases name their drafter; the first in catalogue order
    (["suffix", catalogue.DEFAULT_DRAFTER], catalogue.DEFAULT_DRAFTER),  # the catalogue's default where timed
    (["baseline", "hf_generate"], catalogue.DEFAULT_DRAFTER),  # no drafter's cost policy timed
    (None, catalogue.DEFAULT_DRAFTER),
])
def test_a_store_keeps_the_default_policy_it_timed(timed, expected):
    assert catalogue.default_policy(timed) == (expected, "cost")


def test_the_main_job_times_the_default_drafters_cost_policy_and_the_draft_models():
    from specdec.bench.config import SweepConfig

    policies = SweepConfig().policies
    assert f"{catalogue.DEFAULT_DRAFTER}:cost" in policies and f"{catalogue.DRAFT_MODEL}:cost" in policies
    assert len(set(policies)) == len(policies)
