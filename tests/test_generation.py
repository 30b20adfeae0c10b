"""The front door's assembler (`specdec.entrypoints.generation`) through ``specdec generate`` and
``specdec.generate``: one prompt and many (``--prompts-file F --batch-size B``, a list of prompts), and
`specdec.runtimes.batched_loading` (the batched backends of a loaded model).
The oracle for every greedy row is the single-prompt greedy output of the same prompt (`specdec.generate`
with one prompt, the code of ``specdec generate --prompt``), in float32 where it is exact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from specdec.catalogue.drafters import DEFAULT_DRAFTER
from specdec.catalogue.drafters import drafter as drafter_entry
from specdec.entrypoints import generation as g
from specdec.entrypoints.generation import LLAMACPP_MAX_ROWS
from specdec.entrypoints.output import report
from specdec.policies.batch import batch_k_max

#: Prompts of different lengths (1 to 20 tokens), one repetitive enough for prompt lookup to draft.
TEXTS = ["hello world the quick brown fox", "abc abc abc abc abc abc abc abc", "zq",
         "one two three four five six seven eight nine ten", "the the the"]
NEW = 10


def cli(argv, capsys) -> tuple[int, str, str]:
    """Run ``specdec`` in-process: (exit code, stdout, stderr)."""
    from specdec.entrypoints.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def api_pair(tiny_pair, near_draft_dir):
    """TINY's target with the near draft, float32, through the public API."""
    from specdec import load_pair

    return load_pair(target=str(tiny_pair.target_dir), draft=str(near_draft_dir), dtype="float32", threads=1)


@pytest.fixture(scope="module")
def singles(api_pair):
    """Each prompt's single-prompt greedy output (token ids), per drafter, with fixed K = 3."""
    from specdec import generate

    out = {d: [generate(api_pair, t, max_new_tokens=NEW, k=3, drafter=d).token_ids for t in TEXTS]
           for d in ("model", "ngram")}
    assert out["model"] == out["ngram"]  # greedy output does not depend on the drafter
    return out["model"]


@pytest.fixture()
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_jsonl(path, texts, budgets=None):
    rows = [{"prompt": t, **({"max_new_tokens": budgets[i]} if budgets and budgets[i] is not None else {})}
            for i, t in enumerate(texts)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# -- prompts files and K_max ------------------------------------------------------------------------------

def test_batch_k_max_keeps_a_round_within_128_tokens():
    assert batch_k_max(1) == 16 and batch_k_max(2) == 16  # 2 x 17 = 34 tokens
    assert batch_k_max(8) == 15 and 8 * (15 + 1) == 128
    assert batch_k_max(7) == 16 and batch_k_max(10) == 11  # 7 x 17 = 119; 10 x 12 = 120
    assert batch_k_max(64) == 1 and batch_k_max(200) == 1  # never below 1
    assert batch_k_max(4, context=41) == 9  # 4 x 10 = 40 tokens fit a 41-token context
    for b in range(1, 65):
        assert b * (batch_k_max(b) + 1) <= 128 < b * (batch_k_max(b) + 2) or batch_k_max(b) == 16


# -- the CLI ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_cli_batched_greedy_equals_single_prompt_output(tiny_pair, near_draft_dir, singles, tmp_path, capsys,
                                                        cache_env, drafter):
    """B in {1, 2, 3} over 5 prompts of different lengths (last batch smaller): every row's tokens are the
    single-prompt greedy output; fixed K and the default batch cost policy; the per-row figures add up."""
    pf = write_jsonl(tmp_path / "p.jsonl", TEXTS)
    base = ["generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompts-file",
            str(pf), "--max-new-tokens", str(NEW), "--drafter", drafter, "--dtype", "float32", "--threads", "1",
            "--json"]
    for b in (1, 2, 3):
        for extra in (["--k", "3"], []):
            code, out, err = cli([*base, "--batch-size", str(b), *extra], capsys)
            assert code == 0, err
            doc = json.loads(out)
            assert [r["token_ids"] for r in doc["rows"]] == singles, (b, extra)
            assert [r["batch"] for r in doc["rows"]] == [i // b for i in range(len(TEXTS))]
            assert [x["rows"] for x in doc["batches"]] == [min(b, len(TEXTS) - s) for s in range(0, len(TEXTS), b)]
            assert doc["policy"] == ("fixed" if extra else "cost")
            assert doc["k"] == (3 if extra else batch_k_max(b))
            for r in doc["rows"]:
                assert r["num_tokens"] == len(r["token_ids"]) == NEW or r["finish_reason"] == "eos"
                assert all(k <= doc["k"] for k in r["rounds_k"])
            if extra:
                assert sum(r["num_drafted"] for r in doc["rows"]) > 0
            # texts in file order, then the table, on stderr with --json
            heads = [err.index(f"### prompt {i + 1} ({pf}, line {i + 1})") for i in range(len(TEXTS))]
            assert heads == sorted(heads) and "aggregate" in err and "tok/forward" in err
    assert len(list((cache_env / "costs").glob("batch-*.json"))) == 3  # one cost measurement per batch size


def test_cli_output_and_json_file(tiny_pair, near_draft_dir, singles, tmp_path, capsys, cache_env):
    """Plain output: each text under its header in file order, then the table; --out: the JSON of the per-row
    figures (per-row budgets from the .jsonl), consistent with each row's tokens and rounds."""
    from specdec.prompts import encode_prompt
    from specdec.runtimes.loading import load_pair

    budgets = [None, 4, None, 0, 7]
    pf = write_jsonl(tmp_path / "p.jsonl", TEXTS, budgets)
    out_file = tmp_path / "out.json"
    code, out, err = cli(["generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir),
                          "--prompts-file", str(pf), "--batch-size", "2", "--k", "2", "--max-new-tokens", str(NEW),
                          "--dtype", "float32", "--threads", "1", "--out", str(out_file)], capsys)
    assert code == 0, err
    doc = json.loads(out_file.read_text())
    tok = load_pair(str(tiny_pair.target_dir), None).tokenizer
    assert doc["num_prompts"] == len(TEXTS) and doc["batch_size"] == 2 and doc["drafter"] == DEFAULT_DRAFTER
    assert doc["prompts_file"] == str(pf) and doc["runtime"]["dtype"] == "float32"
    assert doc["runtime"]["backend"] == "transformers"
    for i, r in enumerate(doc["rows"]):
        want = singles[i][: budgets[i] if budgets[i] is not None else NEW]
        assert r["token_ids"] == want and r["line"] == f"{pf}, line {i + 1}"
        assert r["prompt_tokens"] == len(encode_prompt(tok, TEXTS[i]))
        assert r["text"] == tok.decode(want, skip_special_tokens=True)
        assert r["text"] in out  # the texts are printed too
        if r["num_tokens"]:
            assert r["block_efficiency"] == pytest.approx(r["num_tokens"] / r["num_rounds"])
            assert r["tokens_per_s"] == pytest.approx(r["num_tokens"] / r["total_s"])
            assert r["num_drafted"] == sum(r["rounds_k"])
            assert len(r["rounds_source"]) == r["num_rounds"]  # the mixed drafter names each round's part
            assert all(src in ("suffix", "model") for src, k in zip(r["rounds_source"], r["rounds_k"]) if k > 0)
            assert (r["acceptance_rate"] is None) == (r["num_drafted"] == 0)
            acc = r["acceptance"]  # the serving engines' shape: a round drafts when its K > 0
            assert acc["num_drafts"] == sum(1 for k in r["rounds_k"] if k > 0)
            assert acc["num_draft_tokens"] == r["num_drafted"] and acc["num_accepted_tokens"] == r["num_accepted"]
            assert sum(acc["acceptance_histogram"]) == acc["num_drafts"]
            assert sum(acc["accepted_per_position"]) == r["num_accepted"]
        else:
            assert r["finish_reason"] == "empty" and r["tokens_per_s"] is None
    assert doc["total_tokens"] == sum(len(r["token_ids"]) for r in doc["rows"])
    assert doc["wall_s"] == pytest.approx(sum(b["wall_s"] for b in doc["batches"]))
    assert doc["aggregate_tokens_per_s"] == pytest.approx(doc["total_tokens"] / doc["wall_s"])
    assert out.index("### prompt 5") < out.index("tok/forward") < out.index("aggregate")
    # an existing --out is refused without --force (and kept), overwritten with it
    code, _, err = cli(["generate", "--target", str(tiny_pair.target_dir), "--prompts-file", str(pf),
                        "--drafter", "ngram", "--k", "2", "--out", str(out_file)], capsys)
    assert code == 2 and "already exists" in err and json.loads(out_file.read_text()) == doc


def test_cli_subprocess_json_on_stdout_and_text_file(tiny_pair, near_draft_dir, singles, tmp_path):
    """The console entry point: a plain-text prompts file (one prompt per blank-line-separated block), --json
    alone on stdout."""
    pf = tmp_path / "p.txt"
    pf.write_text(TEXTS[0] + "\n\n" + TEXTS[1] + "\n  \n\n" + TEXTS[2] + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", SPECDEC_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-m", "specdec", "generate", "--target", str(tiny_pair.target_dir),
                        "--draft", str(near_draft_dir), "--prompts-file", str(pf), "--batch-size", "2", "--k", "3",
                        "--max-new-tokens", str(NEW), "--dtype", "float32", "--threads", "1", "--json"],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["token_ids"] for r in doc["rows"]] == singles[:3]
    assert [r["line"] for r in doc["rows"]] == [f"{pf}, block {i} (line {n})" for i, n in ((1, 1), (2, 3), (3, 6))]


def test_cli_sampled_rows_follow_their_seeds(tiny_pair, near_draft_dir, api_pair, tmp_path, capsys):
    """Sampling: prompt i runs with seed + i, so with a fixed K its tokens are the single-prompt run's with
    that seed."""
    from specdec import generate

    pf = write_jsonl(tmp_path / "p.jsonl", TEXTS[:3])
    code, out, err = cli(["generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir),
                          "--prompts-file", str(pf), "--batch-size", "3", "--k", "2", "--max-new-tokens", str(NEW),
                          "--temperature", "1.0", "--top-k", "50", "--seed", "7", "--dtype", "float32",
                          "--threads", "1", "--json"], capsys)
    assert code == 0, err
    rows = [r["token_ids"] for r in json.loads(out)["rows"]]
    want = [generate(api_pair, t, max_new_tokens=NEW, k=2, temperature=1.0, top_k=50, seed=7 + i).token_ids
            for i, t in enumerate(TEXTS[:3])]
    assert rows == want
    assert rows[0] != generate(api_pair, TEXTS[0], max_new_tokens=NEW, k=2, temperature=1.0, top_k=50,
                               seed=8).token_ids  # the seed matters


def _bad_cases(tmp_path, tiny_pair):
    good = write_jsonl(tmp_path / "good.jsonl", TEXTS[:2])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    not_json = tmp_path / "bad1.jsonl"
    not_json.write_text('{"prompt": "a"}\n{"prompt": "b"\n')
    no_prompt = tmp_path / "bad2.jsonl"
    no_prompt.write_text('{"text": "a"}\n')
    bad_budget = tmp_path / "bad3.jsonl"
    bad_budget.write_text('{"prompt": "a", "max_new_tokens": -1}\n')
    not_object = tmp_path / "bad4.jsonl"
    not_object.write_text('["a"]\n')
    long = write_jsonl(tmp_path / "long.jsonl", ["ok", "abc " * 200])
    existing = tmp_path / "existing.json"
    existing.write_text("keep me\n")
    f = str(good)
    return [
        (["--prompts-file", f, "--prompt", "hi"], "not both"),
        (["--prompts-file", str(tmp_path / "missing.jsonl")], "no such prompt file"),
        (["--prompts-file", str(tmp_path)], "is a directory, not a prompt file"),
        (["--prompts-file", str(empty)], "file is empty"),
        (["--prompts-file", str(not_json)], "line 2: invalid JSON"),
        (["--prompts-file", str(no_prompt)], "line 1: unknown record format"),
        (["--prompts-file", str(bad_budget)], "'max_new_tokens' must be an integer >= 0"),
        (["--prompts-file", str(not_object)], "expected a JSON object"),
        (["--prompts-file", f, "--batch-size", "0"], "--batch-size must be >= 1"),
        (["--prompts-file", f, "--batch-size", "abc"], "Invalid value for '--batch-size'"),  # click's usage errors
        (["--prompts-file", f, "--bogus"], "No such option: --bogus"),
        (["--prompts-file", f, "--batch-size", str(LLAMACPP_MAX_ROWS + 1), "--backend", "llamacpp"],
         f"at most {LLAMACPP_MAX_ROWS} rows"),
        (["--prompts-file", f, "--compile"], "eager"),
        (["--prompt", "hi", "--batch-size", "2"], "--batch-size needs --prompts-file"),
        ([], "give --prompt TEXT, or --prompts-file"),
        (["--prompts-file", f, "--policy", "heuristic"], "--policy 'heuristic' is not available"),
        (["--prompts-file", f, "--k", "0"], "--k must be an integer >= 1"),
        (["--prompts-file", f, "--pad-verify"], "--pad-verify runs one prompt at a time"),
        (["--prompts-file", f, "--drafter", "magic"], "unknown --drafter 'magic'"),
        (["--prompts-file", str(long), "--k", "2", "--max-new-tokens", "8"], "long.jsonl, line 2: prompt"),
        (["--prompts-file", f, "--out", str(existing)], "already exists"),
        (["--prompts-file", f, "--out", f], "is also the input"),
    ]


def test_bad_input_is_one_line_and_writes_nothing(tiny_pair, tmp_path, capsys, cache_env):
    out = tmp_path / "never.json"
    for extra, needle in _bad_cases(tmp_path, tiny_pair):
        argv = ["generate", "--target", str(tiny_pair.target_dir), "--draft", str(tiny_pair.draft_dir), *extra]
        if "--out" not in extra:
            argv += ["--out", str(out)]
        code, stdout, err = cli(argv, capsys)
        lines = [x for x in err.strip().splitlines() if x.strip()]
        assert code == 2, (extra, err)
        assert len(lines) == 1 and lines[0].startswith("specdec: error:"), (extra, err)
        assert needle in lines[0], (extra, lines[0])
        assert stdout == "" and not out.exists(), extra
    assert (tmp_path / "existing.json").read_text() == "keep me\n"
    assert (tmp_path / "good.jsonl").read_text().count("prompt") == 2
    assert not (cache_env / "costs").exists()  # nothing measured either


def test_one_prompt_and_a_file_of_one_prompt_give_one_document(tiny_pair, tmp_path, capsys):
    """``--prompt`` and ``--batch-size 1`` beside it, and a prompts file holding that prompt: the same JSON
    document shape (one row), the same tokens."""
    args = ["generate", "--target", str(tiny_pair.target_dir), "--drafter", "ngram", "--k", "2",
            "--max-new-tokens", "6", "--dtype", "float32", "--json"]
    pf = write_jsonl(tmp_path / "one.jsonl", [TEXTS[1]])
    docs = []
    for extra in (["--prompt", TEXTS[1]], ["--prompt", TEXTS[1], "--batch-size", "1"], ["--prompts-file", str(pf)]):
        code, out, err = cli([*args, *extra], capsys)
        assert code == 0, err
        docs.append(json.loads(out))
    assert docs[0].keys() == docs[1].keys() == docs[2].keys()
    assert docs[0]["rows"][0]["token_ids"] == docs[1]["rows"][0]["token_ids"] == docs[2]["rows"][0]["token_ids"]


# -- the Python API ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("drafter", ["model", "ngram", "suffix"])
def test_api_list_of_prompts_equals_single_prompt_outputs(api_pair, singles, cache_env, drafter):
    from specdec import Generation, generate

    for b in (1, 2, 3):
        for k in (3, None):
            outs = generate(api_pair, TEXTS, batch_size=b, max_new_tokens=NEW, k=k, drafter=drafter)
            assert isinstance(outs, list) and all(isinstance(o, Generation) for o in outs)
            assert [o.token_ids for o in outs] == singles, (b, k)
            assert all(o.policy == ("fixed" if k else "cost") and o.drafter == drafter_entry(drafter).name
                       for o in outs)
            assert all(o.text == api_pair.tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outs)
    ids = [api_pair.tokenizer(t).input_ids for t in TEXTS[:2]]
    outs = generate(api_pair, ids, max_new_tokens=NEW, k=2, drafter=drafter)  # token-id lists, one batch
    assert [o.token_ids for o in outs] == singles[:2]


def test_api_single_prompt_keeps_its_return_type(api_pair, singles):
    from specdec import Generation, generate

    one = generate(api_pair, TEXTS[0], max_new_tokens=NEW, k=3)
    ids = generate(api_pair, api_pair.tokenizer(TEXTS[0]).input_ids, max_new_tokens=NEW, k=3)
    assert isinstance(one, Generation) and isinstance(ids, Generation)
    assert one.token_ids == ids.token_ids == singles[0]


def test_api_bad_input(api_pair):
    from specdec import generate
    from specdec.drafters.ngram import PromptLookupDrafter

    with pytest.raises(ValueError, match="needs a list of prompts"):
        generate(api_pair, "hi", batch_size=2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        generate(api_pair, ["a", "b"], batch_size=0, k=2)
    with pytest.raises(ValueError, match="not available"):
        generate(api_pair, ["a", "b"], policy="confidence")
    with pytest.raises(TypeError, match="drafter object"):
        generate(api_pair, ["a", "b"], drafter=PromptLookupDrafter(), k=2)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(api_pair, ["a", " "], k=2)
    with pytest.raises(ValueError, match="not single token ids"):
        generate(api_pair, [[5, 6], 7], k=2)
    with pytest.raises(ValueError, match="prompt 1: .* exceeds the target's context"):
        generate(api_pair, ["a", "abc " * 200], k=2, max_new_tokens=8)
    with pytest.raises(ValueError, match="prompt 1: token id 999999 is outside the vocabulary"):
        generate(api_pair, [[5, 6], [7, 999999]], k=2)
    with pytest.raises(ValueError, match="token id -1 is outside the vocabulary"):
        generate(api_pair, [5, -1], k=2)
    with pytest.raises(ValueError, match="no prompt"):
        generate(api_pair, [], k=2)


def test_run_report_of_zero_budgets(api_pair):
    """Rows with no budget finish "empty"; the aggregate rate is None when nothing was generated."""
    ids = [api_pair.tokenizer(t).input_ids for t in TEXTS[:3]]
    settings = g.check_settings(drafter="ngram", k=2, max_new_tokens=0, batch_size=2, many=True)
    run = g.run(api_pair, settings, ids)
    assert isinstance(run, g.Run) and [r.finish_reason for r in run.results] == ["empty"] * 3
    doc = report(run, ["", "", ""], runtime=api_pair.runtime)
    assert doc["aggregate_tokens_per_s"] is None and doc["total_tokens"] == 0
    json.dumps(doc, allow_nan=False)


# -- specdec.runtimes.batched_loading ------------------------------------------------------------------------------

def test_batched_loading_transformers(tiny_pair, near_draft_dir):
    from specdec.catalogue.drafters import DraftSource, batched_drafter
    from specdec.drafters.model import BatchedModelDrafter
    from specdec.engine.decoding import autoregressive_generate, generate_batch
    from specdec.runtimes.batched_loading import batched_backend
    from specdec.runtimes.hf_batched import BatchedHFBackend
    from specdec.runtimes.loading import LoadedPair, load_pair

    loaded = load_pair(str(tiny_pair.target_dir), str(near_draft_dir), dtype="float32", threads=1)
    target, drafter = batched_backend(loaded.target, 3), batched_drafter("draft", DraftSource(loaded, rows=3))
    assert isinstance(target, BatchedHFBackend) and isinstance(drafter, BatchedModelDrafter)
    assert target.model is loaded.target.hf_model and drafter.backend.model is loaded.draft.hf_model  # same weights
    assert target.max_length == loaded.target.backend.max_length and drafter.vocab_size == loaded.vocab_size
    ids = [loaded.tokenizer(t).input_ids for t in TEXTS[:3]]
    out = generate_batch(target, ids, 8, drafter=drafter, k=2, eos_ids=loaded.eos_ids, vocab_size=loaded.vocab_size)
    for o, p in zip(out, ids, strict=True):
        ref = autoregressive_generate(loaded.target.backend, p, 8, eos_ids=loaded.eos_ids, vocab_size=loaded.vocab_size)
        assert o.token_ids == ref.token_ids
    alone = LoadedPair(loaded.target, None, loaded.vocab_size, loaded.eos_ids)
    with pytest.raises(ValueError, match="needs a draft model"):
        batched_drafter("draft", DraftSource(alone, rows=2))
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch size must be >= 1"):
            batched_backend(loaded.target, bad)
    compiled = dataclasses.replace(loaded.target, compiled=True)
    with pytest.raises(ValueError, match="eager"):
        batched_backend(compiled, 2)
    with pytest.raises(ValueError, match="eager"):
        batched_drafter("draft", DraftSource(LoadedPair(loaded.target, compiled, loaded.vocab_size, loaded.eos_ids),
                                             rows=2))
    with pytest.raises(ValueError, match="no batched backend"):
        batched_backend(dataclasses.replace(loaded.target, runtime="onnx"), 2)
    # through the API a compiled pair is refused before any batch runs
    from specdec.entrypoints.api import Pair, generate

    pair = Pair(LoadedPair(compiled, None, loaded.vocab_size, loaded.eos_ids), "t", None, "transformers", "cpu",
                "float32", 1)
    with pytest.raises(ValueError, match="eager"):
        generate(pair, ["a", "b"], drafter="ngram", k=2)


LLAMA_TEXTS = ["The capital of France is", "def fib(n):\n    ", "one two three four five six", "Hello"]


@pytest.fixture(scope="module")
def llama_loaded(smollm2_gguf):
    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from specdec.runtimes.loading import load_pair

    return load_pair(str(smollm2_gguf), str(smollm2_gguf), backend="llamacpp", threads=1)


def test_batched_loading_llamacpp(llama_loaded, smollm2_gguf):
    """A second context over the same GGUF with the single backend's threads and repacking, `max_rows` rows,
    a row context of at most 2048 tokens; its greedy rows equal single-sequence decoding."""
    from specdec.catalogue.drafters import DraftSource, batched_drafter
    from specdec.drafters.model import BatchedModelDrafter
    from specdec.engine.decoding import autoregressive_generate, generate_batch
    from specdec.runtimes.batched_loading import batched_backend
    from specdec.runtimes.llamacpp_batched import DEFAULT_ROW_CTX, BatchedLlamaCppBackend

    single = llama_loaded.target.backend
    target = batched_backend(llama_loaded.target, 2)
    drafter = batched_drafter("draft", DraftSource(llama_loaded, rows=2))
    try:
        assert isinstance(target, BatchedLlamaCppBackend) and isinstance(drafter, BatchedModelDrafter)
        assert target.max_rows == 2 and target.max_length == min(single.max_length, DEFAULT_ROW_CTX)
        assert target._llama.n_threads == single.n_threads
        assert target._llama.extra_buffers == single.extra_buffers
        assert str(target._llama.model_path) == str(single.model_path) == str(smollm2_gguf)
        ids = [single.tokenize(t) for t in LLAMA_TEXTS[:2]]
        out = generate_batch(target, ids, 6, drafter=drafter, k=2, eos_ids=llama_loaded.eos_ids,
                             vocab_size=llama_loaded.vocab_size)
        for o, p in zip(out, ids, strict=True):
            assert o.token_ids == autoregressive_generate(single, p, 6, eos_ids=llama_loaded.eos_ids,
                                                          vocab_size=llama_loaded.vocab_size).token_ids
        with pytest.raises(ValueError, match="rows"):
            generate_batch(target, ids + ids[:1], 2)  # 3 rows on a 2-row backend
        with pytest.raises(ValueError, match="batch size must be >= 1"):
            batched_backend(llama_loaded.target, 0)
    finally:
        target.close()
        drafter.backend.close()


def test_cli_llamacpp_batched_greedy_equals_single_prompt_output(llama_loaded, smollm2_gguf, tmp_path, capsys):
    from specdec import generate
    from specdec.entrypoints.api import Pair

    pair = Pair(llama_loaded, str(smollm2_gguf), str(smollm2_gguf), "llamacpp", "cpu", None, 1,
                runtime={"backend": "llamacpp"})
    want = {d: [generate(pair, t, max_new_tokens=8, k=2, drafter=d).token_ids for t in LLAMA_TEXTS]
            for d in ("model", "ngram")}
    pf = write_jsonl(tmp_path / "p.jsonl", LLAMA_TEXTS)
    for drafter in ("model", "ngram"):
        code, out, err = cli(["generate", "--target", str(smollm2_gguf), "--draft", str(smollm2_gguf),
                              "--backend", "llamacpp", "--prompts-file", str(pf), "--batch-size", "3", "--k", "2",
                              "--max-new-tokens", "8", "--threads", "1", "--drafter", drafter, "--json"], capsys)
        assert code == 0, err
        doc = json.loads(out)
        assert [r["token_ids"] for r in doc["rows"]] == want[drafter], drafter
        assert doc["runtime"]["backend"] == "llamacpp" and doc["runtime"]["dtype"] is None
        if drafter == "model":  # the draft is the target itself: every draft is accepted
            assert all(r["num_accepted"] == r["num_drafted"] > 0 for r in doc["rows"])


# -- the batch cost policy's pricing ----------------------------------------------------------------------

def test_batch_costs_time_the_batch_shapes(api_pair):
    from specdec.core.costs import CostCurve
    from specdec.measure.timing import batch_ns, measure_forwards

    assert batch_ns(3, 51) == ([1, 3, 6, 9, 15, 27, 51], [1, 3]) and batch_ns(1, 17)[0] == [1, 2, 3, 5, 9, 17]
    assert batch_ns(8, 128)[0] == [1, 8, 16, 24, 40, 72, 128]
    ticks = iter(range(10**6))
    costs = measure_forwards(api_pair.loaded, *batch_ns(3, 51), repeats=1, context_tokens=32,
                             clock=lambda: float(next(ticks)))
    assert sorted(int(n) for n in costs["target_forward_s"]) == [1, 3, 6, 9, 15, 27, 51]
    assert sorted(int(n) for n in costs["draft_forward_s"]) == [1, 3]
    curve = CostCurve.from_costs(costs)
    assert curve.draft_forward(3) > 0 and curve.forward_s(51) > 0


@pytest.mark.parametrize("cheap", [True, False])
def test_batch_cost_policy_follows_the_prices(api_pair, singles, cheap):
    """Flat target costs and free drafting: after its timed reference rounds the policy drafts its largest K;
    costs linear in the tokens with a dear draft: it never drafts. Either way the rows are the single-prompt
    output."""
    ns = [1, 2, 3, 4, 6, 8, 10, 12, 16, 18]
    costs = {"target_forward_s": {n: (1.0 if cheap else float(n)) for n in ns},
             "draft_step_s": 0.0 if cheap else 5.0, "draft_forward_s": None if cheap else {1: 5.0, 2: 10.0}}
    ids = [api_pair.tokenizer(t).input_ids for t in TEXTS[:2]]
    settings = g.check_settings(drafter="draft", policy="cost", k=5, max_new_tokens=NEW, batch_size=2, many=True,
                                costs=costs)
    run = g.run(api_pair, settings, ids)
    assert [r.token_ids for r in run.results] == singles[:2] and run.k == 5 and run.policy == "cost"
    asked = [x.k_requested for x in run.results[0].rounds]
    # three timed plain rounds (the measured reference), then the priced choice; later rounds are priced at
    # the overhead the loop measured, which these made-up prices do not predict
    assert asked[:3] == [0, 0, 0] and asked[3] == (5 if cheap else 0)
    if not cheap:
        assert set(asked) == {0}


def test_out_into_a_missing_folder_is_made_before_anything_runs(tiny_pair, tmp_path, capsys):
    """``--out`` into a folder that does not exist yet: made before the models load, so the run's JSON lands."""
    out = tmp_path / "new" / "deeper" / "run.json"
    code, _, err = cli(["generate", "--target", str(tiny_pair.target_dir), "--prompt", TEXTS[1], "--drafter",
                        "ngram", "--k", "2", "--max-new-tokens", "4", "--dtype", "float32", "--out", str(out)],
                            capsys)
    assert code == 0, err
    assert json.loads(out.read_text())["rows"][0]["num_tokens"] == 4


def test_batched_baseline_reports_each_rows_agreement(tiny_pair, near_draft_dir, singles, tmp_path, capsys):
    """``--baseline`` with a prompts file: batched target-only decoding of the same rows, per row the speedup
    and whether greedy output equals target-only output (fp32: every row does)."""
    pf = write_jsonl(tmp_path / "p.jsonl", TEXTS[:3])
    code, out, err = cli(["generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir),
                          "--prompts-file", str(pf), "--batch-size", "2", "--k", "2", "--max-new-tokens", str(NEW),
                          "--dtype", "float32", "--threads", "1", "--baseline", "--json"], capsys)
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["baseline_token_ids"] for r in rows] == singles[:3]
    assert all(r["identical_to_baseline"] and r["divergence"] is None and r["speedup"] > 0 for r in rows)
    assert "same as target-only" in err


def test_a_divergent_row_is_reported_with_its_margin(api_pair):
    """A row whose output leaves target-only output: the first differing token and the target's top-2 margin
    there are recorded for that row (here made to differ by a drafter whose row reads another model)."""
    from specdec.core.metrics import GenerationResult
    from specdec.entrypoints.generation import Run, first_differences

    settings = g.check_settings(drafter="ngram", k=2, many=True)
    ids = [api_pair.tokenizer(t).input_ids for t in TEXTS[:2]]
    base = [GenerationResult("baseline", p, list(s[:4]), "length") for p, s in zip(ids, [[1, 2, 3, 4], [5, 6, 7, 8]])]
    spec = [GenerationResult("speculative", ids[0], [1, 2, 3, 4], "length"),
            GenerationResult("speculative", ids[1], [5, 6, 9, 8], "length")]
    div = first_differences(api_pair, settings, ids, spec, base)
    assert div[0] is None and div[1]["step"] == 2 and div[1]["compiled_token"] == 9 and div[1]["margin"] >= 0
    assert isinstance(Run(spec, "ngram", "fixed", 2).divergences, list)


def test_llamacpp_batch_kv_follows_the_work_and_a_batch_that_cannot_fit_is_refused(llama_loaded, smollm2_gguf):
    """C31/C32: a batch's rows are sized from its own prompts and budgets (not a default context per row), a
    row longer than the default row context still runs when the model's context holds it, and a batch whose KV
    cache cannot fit the memory is refused in one line before llama.cpp allocates it."""
    from specdec.runtimes.batched_loading import batched_backend, check_kv_fits
    from specdec.runtimes.gguf import kv_bytes_per_token
    from specdec.runtimes.llamacpp_batched import DEFAULT_ROW_CTX

    short = batched_backend(llama_loaded.target, 4, row_tokens=40)
    try:
        assert short.max_length == 40  # 40 tokens a row, not DEFAULT_ROW_CTX
    finally:
        short.close()
    single = llama_loaded.target.backend.max_length
    if single > DEFAULT_ROW_CTX:
        long = batched_backend(llama_loaded.target, 1, row_tokens=DEFAULT_ROW_CTX + 8)
        try:
            assert long.max_length == DEFAULT_ROW_CTX + 8
        finally:
            long.close()
    per_token = kv_bytes_per_token(smollm2_gguf)
    assert per_token == 30 * 3 * (64 + 64) * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64, f16
    check_kv_fits(smollm2_gguf, 4, 40, available=2**30)  # 4 x 256 cells: 23 MiB
    with pytest.raises(ValueError, match=r"256 rows of 8192 KV cells needs 45\.0 GiB"):
        check_kv_fits(smollm2_gguf, 256, 8192, available=2**30)


def test_a_batch_records_what_ran_as_one_prompt_does(llama_loaded, smollm2_gguf, tmp_path, capsys):
    """C37: the JSON document of a batch and of one prompt carry the same runtime record (backend, dtype,
    requantized GGUF type)."""
    pf = write_jsonl(tmp_path / "p.jsonl", LLAMA_TEXTS[:2])
    docs = []
    for extra in (["--prompt", LLAMA_TEXTS[0]], ["--prompts-file", str(pf), "--batch-size", "2"]):
        code, out, err = cli(["generate", "--target", str(smollm2_gguf), "--backend", "llamacpp", "--gguf-type",
                              "Q8_0", "--drafter", "ngram", "--k", "2", "--max-new-tokens", "4", "--threads", "1",
                              "--json", *extra], capsys)
        assert code == 0, err
        docs.append(json.loads(out))
        assert "requantized to Q8_0" in err
    assert docs[0]["runtime"] == docs[1]["runtime"] and docs[0]["runtime"]["gguf_type"] == "Q8_0"


def test_a_failed_run_leaves_no_folder_that_out_made(tiny_pair, tmp_path, capsys, cache_env):
    """``--out new/sub/x.json`` makes its folders before the models load; a run that then fails (a bad prompts
    file, a missing model, a prompt past the context) removes them again, and keeps a folder that was there."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff world\n")
    long = tmp_path / "long.txt"
    long.write_text("abc " * 200 + "\n")
    target, draft = str(tiny_pair.target_dir), str(tiny_pair.draft_dir)
    (tmp_path / "kept").mkdir()
    for i, argv in enumerate([["--target", target, "--draft", draft, "--prompts-file", str(bad)],
                              ["--target", str(tmp_path / "nope"), "--draft", draft, "--prompts-file", str(long)],
                              ["--target", target, "--draft", draft, "--prompts-file", str(long), "--k", "2"]]):
        out = tmp_path / f"new{i}" / "sub" / "x.json"
        code, _, err = cli(["generate", *argv, "--max-new-tokens", "4", "--out", str(out)], capsys)
        lines = [x for x in err.strip().splitlines() if x.strip()]
        assert code == 2 and lines[-1].startswith("specdec: error:"), (argv, err)
        assert not (tmp_path / f"new{i}").exists(), argv
        code, _, err = cli(["generate", *argv, "--max-new-tokens", "4", "--out", str(tmp_path / "kept" / "x.json")],
                           capsys)
        assert code == 2 and (tmp_path / "kept").is_dir() and not list((tmp_path / "kept").iterdir())


def test_one_prompts_output_names_the_drafter_and_the_part_of_each_round(capsys):
    from specdec.entrypoints.output import print_single

    row = {"text": "x", "num_tokens": 3, "finish_reason": "length", "tokens_per_s": 1.0, "ttft_s": 0.1,
           "num_rounds": 3, "acceptance_rate": 0.5, "block_efficiency": 1.0, "rounds_k": [2, 0, 3],
           "rounds_source": ["suffix", "none", "model"]}
    print_single({"rows": [row], "drafter": "mixed", "policy": "cost", "pad_verify": False, "runtime": {}},
                 label="transformers")
    out = capsys.readouterr().out
    assert "drafter mixed, ran transformers" in out and "rounds by part: suffix 1, no draft 1, model 1" in out
