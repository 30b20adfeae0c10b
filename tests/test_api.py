"""The Python API (`from specdec import load_pair, generate`) on tiny local checkpoints: the README's example
runs as written, greedy output equals target-only decoding, sampling is reproducible, the cost policy's
quick costs are cached, and ``import specdec`` does not import torch."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.catalogue.drafters import DEFAULT_DRAFTER

README = Path(__file__).resolve().parents[1] / "README.md"
PROMPT = "hello world the quick brown fox"


def readme_example() -> str:
    """The first ```python block after the line "## Python API" in README.md."""
    text = README.read_text()
    _, sep, rest = text.partition("\n## Python API\n")
    assert sep, "README.md has no '## Python API' section"
    m = re.search(r"```python\n(.*?)```", rest, re.DOTALL)
    assert m, "no ```python block after '## Python API'"
    return m.group(1)


def test_readme_example_runs_on_tiny_models(tiny_pair, near_draft_dir, tmp_path, monkeypatch):
    code = readme_example()
    preset = re.search(r"load_pair\((\"[^\"]+\")\)", code)
    assert preset, "the README example loads a preset by name: load_pair(\"...\")"
    code = code.replace(preset.group(0),
                        f"load_pair(target={str(tiny_pair.target_dir)!r}, draft={str(near_draft_dir)!r})")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))  # the cost policy's measurement goes here
    namespace: dict = {}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(code, "README.md:Python API", "exec"), namespace)  # noqa: S102 - the README example
    from specdec import Generation

    generations = [v for v in namespace.values() if isinstance(v, Generation)]
    assert generations, "the example produced no Generation"
    for out in generations:
        assert out.num_tokens > 0 and out.text == namespace["pair"].tokenizer.decode(
            out.token_ids, skip_special_tokens=True)
        assert 0 <= out.num_accepted <= out.num_drafted and out.block_efficiency >= 1
        assert out.tokens_per_s > 0 and len(out.rounds) == out.num_rounds
    assert namespace["out"].text in stdout.getvalue()
    assert list((tmp_path / "costs").glob("quick-*.json"))  # the default cost policy timed and cached


@pytest.fixture(scope="module")
def fp32_pair(tiny_pair, near_draft_dir):
    from specdec import load_pair

    return load_pair(target=str(tiny_pair.target_dir), draft=str(near_draft_dir), dtype="float32", threads=1)


def _target_only(pair, n, **kw):
    from specdec.engine.decoding import autoregressive_generate
    from specdec.prompts import encode_prompt

    ids = encode_prompt(pair.tokenizer, PROMPT)
    return autoregressive_generate(pair.loaded.target.backend, ids, n, eos_ids=pair.loaded.eos_ids,
                                   vocab_size=pair.loaded.vocab_size, **kw)


def test_greedy_generation_equals_target_only_for_each_drafter_and_policy(fp32_pair, tmp_path, monkeypatch):
    from specdec import Generation, generate
    from specdec.core.metrics import GenerationResult

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    ref = _target_only(fp32_pair, 24)
    runs = [generate(fp32_pair, PROMPT, max_new_tokens=24, k=3, drafter="model"),
            generate(fp32_pair, PROMPT, max_new_tokens=24, policy="heuristic"),
            generate(fp32_pair, PROMPT, max_new_tokens=24),  # the default drafter, cost policy
            generate(fp32_pair, PROMPT, max_new_tokens=24, drafter="ngram", k=2)]
    for out in runs:
        assert isinstance(out, Generation) and isinstance(out, GenerationResult)
        assert out.token_ids == ref.token_ids and out.finish_reason == ref.finish_reason
        assert out.dtype == "float32" and out.temperature == 0.0
    fixed, heuristic, cost, ngram = runs
    assert (fixed.policy, fixed.k, fixed.drafter) == ("fixed", 3, "draft")  # the catalogue's one name
    assert fixed.num_drafted > 0 and 0 < fixed.num_accepted <= fixed.num_drafted
    assert {r.k for r in fixed.rounds} <= {0, 1, 2, 3}
    assert (heuristic.policy, heuristic.k) == ("heuristic", 4) and (cost.policy, cost.k) == ("cost", 64)
    assert heuristic.drafter == cost.drafter == DEFAULT_DRAFTER
    assert ngram.drafter == "ngram"
    # token ids as the prompt give the same output as its text
    ids = fp32_pair.tokenizer(PROMPT)["input_ids"]
    assert generate(fp32_pair, ids, max_new_tokens=24, k=3).token_ids == ref.token_ids


def test_sampled_generation_is_reproducible_by_seed(fp32_pair):
    from specdec import generate

    a = generate(fp32_pair, PROMPT, max_new_tokens=20, k=4, temperature=0.9, top_k=50, seed=3, drafter="draft")
    b = generate(fp32_pair, PROMPT, max_new_tokens=20, k=4, temperature=0.9, top_k=50, seed=3, drafter="draft")
    c = generate(fp32_pair, PROMPT, max_new_tokens=20, k=4, temperature=0.9, top_k=50, seed=4, drafter="draft")
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20 and a.temperature == 0.9
    assert c.token_ids != a.token_ids  # another seed, another sample (20 tokens from a 1000-token vocab)
    assert a.num_drafted > 0


def test_the_cost_policy_reuses_its_cached_costs_and_remeasures_on_request(fp32_pair, tmp_path, monkeypatch):
    from specdec import generate
    from specdec.measure import timing

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    calls = []
    real = timing.measure_forwards

    def counting(pair, target_ns, draft_ns, **kw):
        calls.append(max(target_ns))
        return real(pair, target_ns, draft_ns, **kw)

    monkeypatch.setattr(timing, "measure_forwards", counting)
    generate(fp32_pair, PROMPT, max_new_tokens=4)
    generate(fp32_pair, PROMPT, max_new_tokens=4)
    assert calls == [65]  # measured once (verification at the default largest K, 64), then read from the cache
    generate(fp32_pair, PROMPT, max_new_tokens=4, remeasure_costs=True)
    assert calls == [65, 65]
    (stored,) = (tmp_path / "costs").glob("quick-*.json")
    import json

    costs = json.loads(stored.read_text())["costs"]
    assert sorted(int(n) for n in costs["target_forward_s"]) == [1, 2, 3, 5, 9, 16, 17, 32, 33, 48, 49, 64, 65]
    assert costs["draft_step_s"] > 0
    # given costs are used as they are: nothing is measured
    generate(fp32_pair, PROMPT, max_new_tokens=4, costs={"draft_step_s": 0.01, "target_forward_s": {1: 0.02}})
    assert calls == [65, 65]


def test_default_dtype_and_target_only_pairs(tiny_pair):
    from specdec import generate, load_pair
    from specdec.runtimes.precision import default_dtype

    pair = load_pair(target=str(tiny_pair.target_dir), threads=1)  # dtype "auto"
    assert pair.dtype == default_dtype("cpu") and pair.draft is None
    assert next(pair.loaded.target.hf_model.parameters()).dtype.__repr__().endswith(pair.dtype)
    out = generate(pair, "abc abc abc abc abc abc", max_new_tokens=8, drafter="ngram", k=2)
    assert out.dtype == pair.dtype and out.num_tokens > 0
    with pytest.raises(ValueError, match=f"drafter '{DEFAULT_DRAFTER}' needs a draft model"):
        generate(pair, PROMPT, max_new_tokens=4, k=2)


@pytest.mark.parametrize("kwargs,needle", [
    ({"policy": "bandit"}, "unknown policy 'bandit'"),
    ({"k": 0}, "k must be an integer >= 1"),
    ({"drafter": "oracle"}, "unknown drafter 'oracle'"),
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_p": 0.5}, "top_p 0.5 needs temperature > 0"),
    ({"temperature": 0.7, "top_k": 2.5}, "top_k must be an integer >= 0"),
    ({"temperature": 0.7, "seed": 1.5}, "seed must be an integer, got 1.5"),
    ({"max_new_tokens": 100000, "k": 2}, "exceeds the target's context"),
])
def test_bad_arguments_raise_one_line(fp32_pair, kwargs, needle):
    from specdec import generate

    with pytest.raises(ValueError) as err:
        generate(fp32_pair, PROMPT, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_bad_pair_arguments(tiny_pair):
    from specdec import generate, load_pair

    with pytest.raises(ValueError, match="a draft needs a target"):
        load_pair(draft=str(tiny_pair.draft_dir))
    with pytest.raises(ValueError, match="unknown dtype"):
        load_pair(target=str(tiny_pair.target_dir), dtype="int3")
    pair = load_pair(target=str(tiny_pair.target_dir), dtype="float32")
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(pair, "   ", drafter="ngram", k=2)


def test_import_specdec_does_not_import_torch():
    code = ("import sys, specdec; assert 'torch' not in sys.modules, 'torch imported'; "
            "assert {'load_pair', 'generate'} <= set(dir(specdec)); "
            "specdec.load_pair; assert 'torch' in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-c", "import specdec; specdec.nope"], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode != 0 and "has no attribute 'nope'" in p.stderr


