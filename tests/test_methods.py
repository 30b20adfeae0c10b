"""The method registry (`specdec.bench.methods`): one entry per timed method, one run contract."""

from __future__ import annotations

import math

import pytest

from specdec.bench import methods as M
from specdec.bench.config import RUNTIME_CONFIGS, make_config
from specdec.catalogue.peers import PEER_PAIRS
from specdec.core.metrics import GenerationResult, RoundRecord


def test_registry_holds_every_timed_method_once():
    assert list(M.METHODS) == ["baseline", "aa", "baseline_padded", "draft", "ngram", "ngram_hf", "suffix",
                               "mixed", "xtok", "suffix_corpus", "hf_generate", "hf_assisted", "hf_prompt_lookup", "llama_prompt_lookup",
                               "native_target", "native_draft", "native_ngram_simple", "native_ngram_map_k",
                               "native_ngram_map_k4v", "native_ngram_mod", "native_ngram_cache"]
    assert not M.METHODS["suffix"].default and M.METHODS["suffix"].takes_k
    assert not M.METHODS["baseline_padded"].default and not M.METHODS["baseline_padded"].takes_k
    assert M.reference_method().name == "baseline"
    ours = {m.name for m in M.our_methods()}
    # every peer is compared with one of ours (specdec.catalogue.peers, which the report reads), at the same K
    # when it takes K (a peer without K, as llama.cpp's model-free drafters, against each of our K)
    assert {p for _, p in PEER_PAIRS} == {m.name for m in M.peer_methods()}
    for ours_name, peer in PEER_PAIRS:
        assert ours_name in ours and M.METHODS[peer].takes_k in (False, M.METHODS[ours_name].takes_k), peer
    with pytest.raises(ValueError, match="already registered"):
        M.register(M.Method("draft", M.METHODS["draft"].run))
    with pytest.raises(ValueError, match="exactly one reference"):
        M.register(M.Method("other_baseline", M.METHODS["baseline"].run, reference=True))
    assert "other_baseline" not in M.METHODS
    # the registry is what --methods accepts
    with pytest.raises(ValueError, match="unknown method"):
        make_config({"methods": "baseline,beam"})


def test_peers_apply_by_runtime():
    assert M.peers_for(RUNTIME_CONFIGS["transformers-eager"]) == ("hf_generate", "hf_assisted", "hf_prompt_lookup")
    native = ("native_target", "native_draft", "native_ngram_simple", "native_ngram_map_k", "native_ngram_map_k4v",
              "native_ngram_mod", "native_ngram_cache")
    assert M.peers_for(RUNTIME_CONFIGS["llamacpp"]) == ("llama_prompt_lookup", *native)
    # llama.cpp's own drafting with the draft model needs the draft on llama.cpp too
    assert M.peers_for(RUNTIME_CONFIGS["mixed:transformers-draft"]) == ("llama_prompt_lookup", *native[:1], *native[2:])
    assert M.peers_for(RUNTIME_CONFIGS["transformers-compiled"]) == ()
    assert M.METHODS["llama_prompt_lookup"].skip.startswith("skipped: ")


def test_run_record_fills_the_runs_columns():
    rounds = [RoundRecord(2, 1, (True, False), "recovered", 2, 0.1, 0.2), RoundRecord(2, 2, (True, True), "bonus", 3)]
    res = GenerationResult("speculative", [1, 2], [5, 6, 7, 8, 9], "length", rounds, 0.5, 2.5, 0.8)
    cols = M.RunRecord.from_result(res).columns()
    assert cols["new_tokens"] == 5 and cols["num_drafted"] == 4 and cols["num_accepted"] == 3
    assert cols["num_rejections"] == 1 and cols["tokens_per_s"] == pytest.approx(2.0)
    assert cols["decode_s"] == pytest.approx(2.0) and cols["draft_s"] == pytest.approx(0.1)
    assert len(M.RunRecord.from_result(res).rounds) == 2
    peer = M.RunRecord.timed([5, 6], 0.0, "eos").columns()
    assert peer["prefill_s"] is None and peer["num_rounds"] is None and math.isnan(peer["tokens_per_s"])
