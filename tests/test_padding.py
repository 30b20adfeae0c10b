"""Issue 19, part A: verification padded to the cheapest measured shape.

`CostCurve.padded_n` picks the shape; `speculative_generate(pad_to=...)` runs it (filler after the real
tokens, first K + 1 logits rows kept, filler dropped from the cache by the round's truncate); the cost
policy prices rounds with the padded cost (`pad_verify`). Greedy output must equal target-only decoding,
sampled output must keep the target's joint law (the chi-square test of tests/test_joint.py, through the
engine), and the padded shape is recorded per round (``RoundRecord.n_forward``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import pytest
import torch
from conftest import CountingBackend, load_backend, one_row
from test_joint import CHI2_CRIT_DF26_A001, VOCAB, p_of, q_of

from specdec.catalogue.policies import make_policy
from specdec.core import theory
from specdec.core.costs import CostCurve
from specdec.core.sampling import SamplingParams
from specdec.drafters.base import Draft
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.policies.cost import CostPolicy

V = 1000
#: An fp32 staircase measured on a 2-vCPU AMD EPYC (Qwen2.5 1.5B target), in target steps; n = 4 and
#: 6..8 interpolated from neighbours measured at the same time.
AMD = {1: 1.0, 2: 2.10, 3: 3.02, 4: 2.4, 5: 1.87, 6: 2.0, 7: 2.1, 8: 2.15, 9: 2.20, 17: 2.43}

# -- CostCurve.padded_n --------------------------------------------------------------------------------


def test_padded_n_picks_the_cheapest_measured_shape():
    curve = CostCurve(AMD)
    # n = 2, 3, 4: the cheapest forward that holds them is the 5-token one (1.87 steps)
    assert [curve.padded_n(n) for n in (1, 2, 3, 4, 5)] == [1, 5, 5, 5, 5]
    assert curve.padded_value(3) == pytest.approx(1.87) and curve.forward_s(3) == pytest.approx(3.02)
    # past 5 the curve rises: no padding; interpolated points (10..16) are never cheaper than 9
    assert [curve.padded_n(n) for n in range(6, 18)] == list(range(6, 18))
    # never beyond the measured range, even where the extrapolation would be cheaper
    falling = CostCurve({1: 1.0, 2: 3.0, 3: 0.5})
    assert falling.forward_s(30) == falling.forward_s(3)  # a falling curve extrapolates flat
    assert falling.padded_n(1) == 3 and falling.padded_n(2) == 3 and falling.padded_n(3) == 3
    assert falling.padded_n(4) == 4 and falling.padded_n(30) == 30
    # the cap (room in the context): never past it; below n means no padding
    assert curve.padded_n(2, max_n=4) == 2 and curve.padded_n(2, max_n=1) == 2
    assert curve.padded_n(3, max_n=5) == 5


def test_padded_n_ties_go_to_the_smaller_shape_and_value_never_exceeds_the_plain_cost():
    flat = CostCurve({1: 0.5, 2: 0.5, 3: 0.5, 4: 0.4, 5: 0.4})
    assert flat.padded_n(1) == 4 and flat.padded_n(4) == 4 and flat.padded_n(5) == 5
    assert CostCurve({1: 1.0, 2: 1.0, 3: 1.0}).padded_n(1) == 1  # equal costs: no padding
    curve = CostCurve(AMD)
    for n in range(1, 25):
        assert curve.padded_value(n) <= curve.forward_s(n)
        m = curve.padded_n(n)
        assert m >= n and curve.forward_s(m) == curve.padded_value(n)
        # brute force over the measured range as the oracle
        cands = [n] + list(range(n + 1, curve.max_n + 1))
        assert curve.padded_value(n) == min(curve.forward_s(c) for c in cands)
    with pytest.raises(ValueError, match="at least one token"):
        curve.padded_n(0)


def test_padded_v_is_a_theory_cost_model():
    curve = CostCurve({n: 0.3 * v for n, v in AMD.items()}, 0.1)
    assert curve.padded_v(3) == pytest.approx(1.87)
    # the analytical model with the padded curve: E / (K c + v'(K + 1))
    a, k = 0.7, 2
    expected = (1 - a ** (k + 1)) / (1 - a) / (k * curve.c + 1.87)
    assert theory.refined_speedup(a, k, curve.c, curve.padded_v) == pytest.approx(expected)
    assert curve.round_s(2, padded=True) == pytest.approx(2 * 0.1 + 0.3 * 1.87)
    assert curve.round_s(2) == pytest.approx(2 * 0.1 + 0.3 * 3.02)


# -- the engine, greedy, on the tiny models --------------------------------------------------------------

PROMPTS = ["abc abc abc abc abc abc", "hello world the quick brown fox jumps over"]
NEW = 24
#: Pad rules: none, one extra token, double, a fixed 9-token shape (capped to the context), a staircase.
RULES = {
    "identity": lambda m: m,
    "plus1": lambda m: m + 1,
    "double": lambda m: 2 * m,
    "to9": lambda m: max(m, 9),
    "staircase": CostCurve(AMD).padded_n,
}


@pytest.fixture(scope="module")
def refs(tiny_tokenizer, target):
    out = {}
    for text in PROMPTS:
        ids = tiny_tokenizer(text).input_ids
        out[text] = (ids, autoregressive_generate(target, ids, NEW).token_ids)
    return out


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_padded_equals_target_only(refs, target, near_draft, k, rule):
    pad = RULES[rule]
    counting = CountingBackend(target)
    prefills = forwarded = rejections = 0
    for text, (prompt, ref) in refs.items():
        out = speculative_generate(counting, ModelDrafter(near_draft, V), prompt, NEW, k=k, vocab_size=V,
                                   pad_to=pad)
        assert out.token_ids == ref, (text, k, rule)
        # the shape run is recorded: pad_to(K + 1) (the context is far away here)
        assert all(r.n_forward == pad(r.k + 1) for r in out.rounds)
        # the cache ends as without padding: the committed sequence minus its last token
        assert target.cache_length == len(prompt) + len(out.token_ids) - 1
        prefills += len(prompt) - 1
        forwarded += sum(r.n_forward for r in out.rounds)
        rejections += out.num_rejections
    assert counting.tokens == prefills + forwarded  # the target saw exactly the recorded shapes
    assert rejections > 0  # rollback of rejected drafts and filler together was exercised


@pytest.mark.parametrize("rule", ["plus1", "double", "to9"])
def test_padded_target_only_equals_target_only(refs, target, rule):
    """Target-only decoding with each 1-token step padded (`autoregressive_generate(pad_to=)`, the
    ``baseline_padded`` method): same tokens, the shape recorded per step, the filler never left in the cache,
    and the target sees exactly prefill + the recorded shapes."""
    pad = RULES[rule]
    counting = CountingBackend(target)
    for text, (prompt, ref) in refs.items():
        before = counting.tokens
        out = autoregressive_generate(counting, prompt, NEW, pad_to=pad)
        assert out.token_ids == ref, (text, rule)
        assert [r.n_forward for r in out.rounds] == [pad(1)] * len(out.rounds)
        assert target.cache_length == len(prompt) + len(out.token_ids) - 1
        assert counting.tokens - before == len(prompt) - 1 + pad(1) * len(out.rounds)
    plain = autoregressive_generate(target, refs[PROMPTS[0]][0], 4)
    assert all(r.n_forward is None for r in plain.rounds)
    with pytest.raises(ValueError, match=r"pad_to\(1\) = 0"):
        autoregressive_generate(target, refs[PROMPTS[0]][0], 4, pad_to=lambda m: 0)


def test_padded_target_only_never_passes_the_context(tiny_tokenizer, tiny_pair):
    short = load_backend(tiny_pair.target_dir, max_length=40)
    prompt = tiny_tokenizer("abc abc abc abc abc abc abc abc abc abc").input_ids
    budget = 40 - len(prompt)
    ref = autoregressive_generate(short, prompt, budget).token_ids
    out = autoregressive_generate(short, prompt, budget, pad_to=lambda m: m + 5)
    assert out.token_ids == ref
    # the step at cache length c pads to min(6, 40 - c); the last step has c = 38: the last four are cut
    assert [r.n_forward for r in out.rounds][-5:] == [6, 5, 4, 3, 2]


def test_padding_off_records_nothing_and_bad_rules_are_refused(refs, target, near_draft):
    prompt, _ = refs[PROMPTS[0]]
    out = speculative_generate(target, ModelDrafter(near_draft, V), prompt, 8, k=2, vocab_size=V)
    assert all(r.n_forward is None for r in out.rounds)
    with pytest.raises(ValueError, match=r"pad_to\(3\) = 2"):
        speculative_generate(target, ModelDrafter(near_draft, V), prompt, 8, k=2, vocab_size=V,
                             pad_to=lambda m: m - 1)


def test_padding_never_passes_the_context(tiny_tokenizer, tiny_pair, near_draft):
    """A target with a 40-token context: generation runs to the last position; the filler is cut to fit."""
    short = load_backend(tiny_pair.target_dir, max_length=40)
    prompt = tiny_tokenizer("abc abc abc abc abc abc abc abc abc abc").input_ids
    budget = 40 - len(prompt)
    ref = autoregressive_generate(short, prompt, budget).token_ids
    out = speculative_generate(short, ModelDrafter(near_draft, V), prompt, budget, k=4, vocab_size=V,
                               pad_to=lambda m: m + 30)
    assert out.token_ids == ref
    cached = len(prompt) - 1
    for r in out.rounds:  # each forward: pad_to's shape, cut to the room left in the context
        assert r.n_forward == min(r.k + 1 + 30, 40 - cached)
        cached += r.num_emitted
    assert out.rounds[-1].n_forward < out.rounds[-1].k + 1 + 30


def test_padding_with_prompt_lookup_and_the_cost_policy_is_exact(refs, target):
    curve = CostCurve({n: 0.01 * v for n, v in AMD.items()}, 0.0)
    for prompt, ref in refs.values():
        policy = CostPolicy.from_costs(curve, max_k=8, pad_verify=True)
        out = speculative_generate(target, PromptLookupDrafter(), prompt, NEW, policy=policy, vocab_size=V,
                                   pad_to=curve.padded_n)
        assert out.token_ids == ref
        assert all(r.n_forward == curve.padded_n(r.k + 1) for r in out.rounds)


def test_compiled_backend_eager_mode_padded_is_exact(tiny_pair, refs, near_draft):
    """The static-cache backend (buckets, its own pads on top of ours) rolls the filler back too."""
    from specdec.runtimes.compiled import CompiledHFBackend

    compiled = CompiledHFBackend(load_backend(tiny_pair.target_dir).model, mode="eager", buckets=(1, 2, 5, 8))
    for prompt, ref in refs.values():
        base = autoregressive_generate(compiled, prompt, NEW).token_ids
        assert base == ref
        for k, rule in ((1, "staircase"), (3, "double"), (4, "to9")):
            out = speculative_generate(compiled, ModelDrafter(near_draft, V), prompt, NEW, k=k, vocab_size=V,
                                       pad_to=RULES[rule])
            assert out.token_ids == base, (k, rule)
            assert compiled.cache_length == len(prompt) + NEW - 1


# -- the engine, sampled: the joint law of three tokens (tests/test_joint.py's machinery) ----------------


class TableLM:
    """A `Backend` over test_joint's context-dependent target law p_of: row i of a forward is
    log p(. | cache + tokens[:i + 1]). Records its cache before every forward (to check the filler is
    always gone)."""

    name = "table"
    vocab_size = VOCAB
    max_length = 64
    device = torch.device("cpu")

    def __init__(self):
        self.cache: list[int] = []
        self.seen: list[tuple[list[int], int]] = []

    @property
    def cache_length(self):
        return len(self.cache)

    def forward(self, tokens, *, logits=True, last=None):
        self.seen.append((list(self.cache), len(tokens)))
        rows = []
        for t in tokens:
            self.cache.append(int(t))
            rows.append(torch.log(p_of(self.cache)))
        return torch.stack(rows) if logits and rows else None

    def truncate(self, length):
        del self.cache[length:]

    def reset(self):
        self.cache = []

    def synchronize(self):
        pass


class TableDrafter:
    """Draws each draft token from test_joint's q_of and reports that q."""

    name = "table"

    def prefill(self, context):
        pass

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        tokens, qs = [], []
        for _ in range(k):
            q = q_of(list(committed) + tokens)
            tokens.append(int(torch.multinomial(q, 1, generator=generator)))
            qs.append(q)
        return Draft(tokens, torch.stack(qs) if qs else None)

    def rollback(self, committed):
        pass

    def max_k(self, committed_len):
        return 64


PROMPT = [0]  # p_of depends on the last two tokens: p(x1 | [0]), p(x2 | [0, x1]), p(x3 | [x1, x2])
N_DRAWS = 30_000  # as tests/test_joint.py


def _chi_square(pad_to, n_draws=N_DRAWS) -> float:
    lm, drafter = TableLM(), TableDrafter()
    counts = dict.fromkeys(itertools.product(range(VOCAB), repeat=3), 0)
    for seed in range(n_draws):
        lm.seen = []
        out = speculative_generate(lm, drafter, PROMPT, 4, k=3, sampling=SamplingParams(temperature=1.0),
                                   seed=seed, vocab_size=VOCAB, pad_to=pad_to)
        counts[tuple(out.token_ids[:3])] += 1
        # before every round's forward the cache held the committed sequence minus its last token: no filler
        seq, cached = PROMPT + out.token_ids, len(PROMPT) - 1
        for (cache, n), r in zip(lm.seen[1:], out.rounds, strict=True):
            assert cache == seq[:cached] and n == pad_to(r.k + 1) == r.n_forward
            cached += r.num_emitted
    stat = 0.0
    for (a, b, c), n in counts.items():
        expected = n_draws * float(p_of(PROMPT)[a] * p_of(PROMPT + [a])[b] * p_of(PROMPT + [a, b])[c])
        stat += (n - expected) ** 2 / expected
    return stat


def test_sampled_joint_law_of_three_tokens_is_the_targets_with_padding():
    stat = _chi_square(lambda m: m + 2)
    print(f"chi2 = {stat:.1f} (df 26, critical {CHI2_CRIT_DF26_A001} at alpha 0.001)")
    assert stat < CHI2_CRIT_DF26_A001, stat


def test_sampled_tokens_equal_the_unpadded_ones_seed_for_seed():
    """The table target's rows are exact, so padding may change nothing at all: same seed, same tokens."""
    lm, drafter = TableLM(), TableDrafter()
    sampling = SamplingParams(temperature=1.0)
    for seed in range(300):
        ref = speculative_generate(lm, drafter, PROMPT, 12, k=3, sampling=sampling, seed=seed, vocab_size=VOCAB)
        for pad in (lambda m: m + 1, lambda m: max(m, 6), CostCurve(AMD).padded_n):
            out = speculative_generate(lm, drafter, PROMPT, 12, k=3, sampling=sampling, seed=seed,
                                       vocab_size=VOCAB, pad_to=pad)
            assert out.token_ids == ref.token_ids, seed


def test_joint_law_check_catches_rows_taken_from_the_filler(monkeypatch):
    """Negative control: a target that returns the LAST rows of a padded forward first (as an engine that
    kept ``logits[-m:]`` would use them) scores the drafts against filler contexts; the same chi-square
    test rejects it."""
    original = TableLM.forward

    def shifted(self, tokens, *, logits=True, last=None):
        out = original(self, tokens, logits=logits, last=last)
        return out if out is None else out.flip(0)

    monkeypatch.setattr(TableLM, "forward", shifted)
    stat = _chi_square(lambda m: m + 2, 3000)
    print(f"chi2 = {stat:.1f}")
    assert stat > CHI2_CRIT_DF26_A001, stat


# -- the cost policy with padding -----------------------------------------------------------------------


def test_cost_policy_with_padding_prefers_the_k_the_padded_curve_dictates():
    """The issue's fp32 staircase v(2) = 2.1, v(3) = 3.0, v(5) = 1.9 (c = 0.39): unpadded, K = 1..3 verify
    for 2.1..3.0 steps, so with K <= 3 the policy decodes plainly unless acceptance is near 1; padded, each
    of them verifies as a 5-token forward (1.9 steps) and drafting wins from alpha ~0.85. With K <= 8 both
    reach K = 4 (whose forward already is the cheap 5-token one) or more: padding changes K only where the
    curve says a longer shape is cheaper."""
    step, c = 0.3, 0.39
    costs = {n: step * v for n, v in {1: 1.0, 2: 2.1, 3: 3.0, 5: 1.9, 9: 2.2, 17: 2.43}.items()}
    draft = c * step
    curve = CostCurve(costs, draft)

    def oracle(a, max_k, cost):  # argmax of E(a, K) / round cost (ties -> smaller K), by brute force
        rates = [sum(a**i for i in range(k + 1)) / cost(k) for k in range(max_k + 1)]
        return max(range(max_k + 1), key=lambda k: (rates[k], -k))

    differ = 0
    for max_k in (2, 3, 8):
        plain = CostPolicy(draft, costs, max_k=max_k)
        padded = CostPolicy(draft, costs, max_k=max_k, pad_verify=True)
        for k in range(max_k + 1):
            assert plain.round_cost_s[k] == pytest.approx(k * draft + curve.forward_s(k + 1))
            assert padded.round_cost_s[k] == pytest.approx(k * draft + curve.padded_value(k + 1))
        for a in (0.5, 0.7, 0.85, 0.9, 0.95, 0.99):
            b_plain = oracle(a, max_k, lambda k: k * draft + curve.forward_s(k + 1))
            b_pad = oracle(a, max_k, lambda k: k * draft + curve.padded_value(k + 1))
            assert plain.best_k(a) == b_plain and padded.best_k(a) == b_pad, (max_k, a)
            differ += b_plain != b_pad
            if max_k == 8:
                assert b_plain == b_pad, a
    assert differ >= 3
    # K <= 3, alpha 0.9: plain decoding without padding, K = 3 padded to 5 tokens with it
    assert CostPolicy(draft, costs, max_k=3).best_k(0.9) == 0
    assert CostPolicy(draft, costs, max_k=3, pad_verify=True).best_k(0.9) == 3
    # K <= 2: no K can beat plain decoding unpadded (so the policy never probes); padded it can
    assert not CostPolicy(draft, costs, max_k=2).speculation_can_win
    assert CostPolicy(draft, costs, max_k=2, pad_verify=True).speculation_can_win
    # make_policy passes the flag through
    pol = make_policy("cost", 3, costs={"draft_step_s": draft, "target_forward_s": costs}, pad_verify=True)
    assert pol.round_cost_s == CostPolicy(draft, costs, max_k=3, pad_verify=True).round_cost_s
    assert math.isclose(pol.round_cost_s[2], 2 * draft + step * 1.9)


# -- the command line -------------------------------------------------------------------------------------


def test_generate_pad_verify_is_exact_and_pads_as_the_measured_curve_says(tiny_pair, near_draft_dir, tmp_path):
    from test_cli import run

    env = {"SPECDEC_CACHE_DIR": str(tmp_path)}
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompt",
            "hello world the quick brown fox", "--k", "2", "--max-new-tokens", "16", "--baseline", "--json",
            "--threads", "1", "--pad-verify", env=env)
    assert p.returncode == 0, p.stderr
    out = one_row(json.loads(p.stdout))
    assert out["identical_to_baseline"] and out["pad_verify"]
    assert "verification padded in" in p.stderr
    # the padded shapes are the measured curve's: read the costs the command cached
    (cached,) = (tmp_path / "costs").glob("*.json")
    curve = CostCurve.from_costs(json.loads(cached.read_text())["costs"])
    assert curve.max_n == 17
    assert out["rounds_n_forward"] == [curve.padded_n(k + 1) for k in out["rounds_k"]]
    # too large a K for the tiny model's 128-token context: no curve can be measured, one line says so
    p = run("generate", "--target", str(tiny_pair.target_dir), "--draft", str(near_draft_dir), "--prompt",
            "hello", "--k", "200", "--max-new-tokens", "4", "--pad-verify", env=env)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("specdec: error: --pad-verify needs the target's measured")


# -- the sweep: the transformers-padded configuration ----------------------------------------------------


def test_runtime_with_pad_verify_pads_every_speculative_method_and_not_the_baseline(tiny_pair, near_draft_dir):
    from specdec.bench import methods as M
    from specdec.runtimes.loading import load_pair

    pair = load_pair(str(tiny_pair.target_dir), str(near_draft_dir), threads=1)
    curve = CostCurve({n: 0.01 * v for n, v in AMD.items()}, 0.001)  # a staircase: K = 1..3 padded to 5
    plain = M.Runtime(pair, SamplingParams(), costs=curve)
    padded = M.Runtime(pair, SamplingParams(), costs=curve, pad_verify=True)
    req = M.RunRequest(list(range(5, 15)), 16, k=2)
    ref = M.METHODS["baseline"].run(padded, req)
    assert all(r.get("n_forward") is None for r in ref.rounds)
    for name, policy in (("draft", None), ("ngram", None), ("draft", "cost"), ("ngram", "heuristic")):
        r = dataclasses.replace(req, policy=policy)
        base = M.METHODS[name].run(plain, r)
        out = M.METHODS[name].run(padded, r)
        assert out.token_ids == base.token_ids == ref.token_ids, (name, policy)
        assert all(x["n_forward"] is None for x in base.rounds)
        assert [x["n_forward"] for x in out.rounds] == [curve.padded_n(x["k"] + 1) for x in out.rounds]
        assert any(x["n_forward"] > x["k"] + 1 for x in out.rounds), (name, policy)
    with pytest.raises(ValueError, match="padded verification needs measured costs"):
        M.METHODS["draft"].run(M.Runtime(pair, SamplingParams(), pad_verify=True), req)


def test_sweep_with_the_padded_configuration_matches_the_eager_one(tmp_path, tiny_pair, near_draft_dir,
                                                                     prompt_file):
    from conftest import tiny_sweep_config

    from specdec.bench import sweep as S
    from specdec.bench.config import RUNTIME_CONFIGS
    from specdec.bench.store import Store

    rc = RUNTIME_CONFIGS["transformers-padded"]
    assert rc.pad_verify and not rc.compile and rc.load_kwargs("float32") == {"dtype": "float32"}
    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, configs="transformers-eager,transformers-padded",
                            methods="baseline,draft,ngram", policies="cost", policy_k=4, max_new_tokens=10)
    res = S.run_sweep(cfg, db=tmp_path / "pad.db", progress=False, echo=lambda m: None)
    assert res.failed == 0 and not res.failed_configs, res
    with Store(tmp_path / "pad.db") as st:
        runs = st.runs(res.sweep_id)
        costs = {label: st.load_costs(res.sweep_id, label) for label in cfg.configs}
    assert all(costs.values())  # each configuration measured its own curve (the padded one pads by its own)
    tokens = {}
    for r in runs:
        tokens.setdefault((r["prompt_id"], r["method"], r["k"], r["policy"]), {})[r["config_label"]] = r["token_ids"]
    assert len(tokens) > 5
    for key, by_config in tokens.items():
        assert by_config["transformers-padded"] == by_config["transformers-eager"], key
    assert all(r["matches_baseline"] == 1 for r in runs if r["method"] != "baseline")
