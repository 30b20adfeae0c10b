"""A property-based search for disagreements between speculative decoding and its oracle (target-only decoding).

Hypothesis draws random tiny models and everything the engine takes: vocabulary, depth and context of the
models, the prompt, K and the K policy (fixed, heuristic, confidence, cost with a random cost curve), the
drafter (a draft model equal to, near or far from the target, with its own context; prompt lookup with
every rule; a scripted drafter), padded verification, the EOS set, the budget (max_new_tokens) and greedy or
sampled decoding. Properties:

- greedy output equals target-only greedy output (tokens and finish reason), and a prompt + budget past the
  target's context is refused alike;
- after every round the target's cache holds the committed sequence minus its last token, and the draft
  model's cache a prefix of that;
- per round: accepted <= drafted <= K, emitted = accepted + 1 except in a last round cut by an EOS (then
  emitted <= accepted + 1 and the drafts after the cut are not counted); rates in [0, 1], block efficiency
  >= 1; the budget and the EOS are honoured;
- the trace replay (`specdec.engine.traces.replay`) reproduces the real rounds (greedy), and `draft_pending` the
  tokens the draft model feeds at the start of each round;
- `warp` (temperature, top-k, top-p) equals a literal reading of its definition, ties included;
- sampled output follows the exact target law (chi-square over every output sequence, with a negative
  control that must fail it).

Model families: random GPT-2 and sliding-window Mistral checkpoints built from a config in-process (float64, so that a batched
verification forward and one-token steps give the same argmax except at exact ties; builds cached per
vocabulary, depth, context and seed), and `TableLM`, a backend whose next-token law is a fixed random
function of the last tokens (no network: fast enough for the thousands of generations of a sampled case).

Profiles (tests/conftest.py): ``ci`` by default (derandomized, a few hundred examples), ``long`` with
``--hypothesis-profile=long`` (a benchmark-size random search).
"""

from __future__ import annotations

import functools
import math

import pytest

hypothesis = pytest.importorskip("hypothesis")

import torch
from conftest import ScriptedDrafter, build_tiny_model
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from specdec.catalogue.policies import make_policy
from specdec.core.costs import CostCurve
from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.base import Draft
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate
from specdec.engine.traces import compare_rounds, draft_pending, record_trace, replay
from specdec.runtimes.base import ContextOverflowError
from specdec.runtimes.hf import HFBackend


def examples(share: float) -> settings:
    """`share` of the active profile's max_examples (at least 2) for one property."""
    return settings(max_examples=max(2, int(settings.default.max_examples * share)))


# -- models ------------------------------------------------------------------------------------------------


class TableLM:
    """A `Backend` whose next-token logits are a fixed random function of the last `order` tokens.

    Causal by construction (row i depends on the tokens up to i only), with an exact rollback, so it obeys
    the backend contract the engine relies on, and its law is known exactly.

    Args:
        vocab: vocabulary size. seed: the table's seed. max_length: context in tokens.
        scale: logits standard deviation (larger: peakier laws). order: tokens of context the law reads.
    """

    name = "table"

    def __init__(self, vocab: int, seed: int, max_length: int = 64, scale: float = 1.5, order: int = 2):
        self.vocab_size = vocab
        self.seed = seed
        self.max_length = max_length
        self.scale = scale
        self.order = order
        self.device = torch.device("cpu")
        self.seq: list[int] = []

    @property
    def cache_length(self) -> int:
        return len(self.seq)

    def row(self, ctx) -> torch.Tensor:
        """``[vocab]`` float32 logits of the token after `ctx`."""
        return _table_row(self.vocab_size, self.seed, self.scale, tuple(ctx[-self.order:]))

    def forward(self, tokens, *, logits=True, last=None):
        if last is not None and last < 1:
            raise ValueError("last must be >= 1")
        if len(self.seq) + len(tokens) > self.max_length:
            raise ContextOverflowError(f"{len(self.seq)} + {len(tokens)} > {self.max_length}")
        rows = []
        for t in tokens:
            self.seq.append(int(t))
            rows.append(self.row(self.seq))
        if not logits:
            return None
        out = torch.stack(rows) if rows else torch.empty(0, self.vocab_size)
        return out if last is None else out[-last:]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= len(self.seq):
            raise ValueError(f"cannot truncate {len(self.seq)} to {length}")
        del self.seq[length:]

    def reset(self) -> None:
        self.seq = []

    def synchronize(self) -> None:
        pass


@functools.cache
def _table_row(vocab: int, seed: int, scale: float, key: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((vocab, seed, key)) & 0x7FFFFFFF)
    return torch.randn(vocab, generator=g) * scale


@functools.cache
def tiny_lm(arch: str, vocab: int, depth: int, ctx: int, seed: int, kind: str = "plain"):
    """A float64 random causal LM (width 16) with context `ctx`: ``arch`` "gpt2" (`build_tiny_model`) or
    "mistral" (sliding window of 4 tokens, grouped-query attention); ``kind="near"``: the ``seed`` model plus
    noise (a draft that often agrees with it)."""
    if arch == "gpt2":
        model = build_tiny_model(seed, n_layer=depth, n_embd=16, vocab_size=vocab, n_positions=ctx,
                                 initializer_range=0.4)
    else:
        from transformers import MistralConfig, MistralForCausalLM

        torch.manual_seed(seed)
        model = MistralForCausalLM(MistralConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=depth, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=ctx, sliding_window=4, tie_word_embeddings=False,
            initializer_range=0.4,
        )).eval()
    model = model.double()
    if kind == "near":
        gen = torch.Generator().manual_seed(seed + 77)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.1 * p.std().clamp(min=1e-3))
    return model


def make_backend(family: str, vocab: int, depth: int, ctx: int, seed: int, kind: str = "plain",
                 max_length: int | None = None):
    """A fresh backend (its own cache) on a cached model; `max_length` <= `ctx` shortens its context."""
    if family == "table":
        if kind == "near":  # the same law on most contexts: the target's table with some rows redrawn
            return NearTable(vocab, seed, max_length or ctx, order=depth)
        return TableLM(vocab, seed, max_length or ctx, order=depth)
    return HFBackend(tiny_lm(family, vocab, depth, ctx, seed, kind), max_length=max_length)


class NearTable(TableLM):
    """`TableLM` that follows the `seed` table except on about a third of the contexts."""

    def row(self, ctx):
        key = tuple(ctx[-self.order:])
        if hash((self.seed, key, 7919)) % 3 == 0:
            return _table_row(self.vocab_size, self.seed + 1000, self.scale, key)
        return _table_row(self.vocab_size, self.seed, self.scale, key)


# -- what a case is made of --------------------------------------------------------------------------------

PAD_RULES = {"none": None, "plus1": lambda m: m + 1, "double": lambda m: 2 * m, "to9": lambda m: max(m, 9)}
DRAFTERS = ("same", "near", "far", "ngram", "scripted", "suffix")


class _Curve:
    """A verification cost curve v(n) = 1 + slope (n - 1) for the suffix drafter's draft length."""

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def v(self, n: int) -> float:
        return 1.0 + self.slope * (n - 1)


#: The suffix drafter's cost curves: none (flat), flat, a mild slope, a steep one (nothing pays).
SUFFIX_COSTS = {"none": None, "flat": _Curve(0.0), "sloped": _Curve(0.3), "steep": _Curve(1.0)}


@st.composite
def cost_curves(draw):
    ns = sorted(set(draw(st.lists(st.integers(2, 12), max_size=4))) | {1})
    vals = draw(st.lists(st.floats(0.05, 3.0), min_size=len(ns), max_size=len(ns)))
    return {"draft_step_s": draw(st.floats(0.0, 1.0)), "target_forward_s": dict(zip(ns, vals, strict=True))}


@st.composite
def policies(draw):
    """``(name, kwargs)`` for `make_policy` (rebuilt fresh for the replay)."""
    name = draw(st.sampled_from(["fixed", "heuristic", "confidence", "cost"]))
    kw = {"k": draw(st.integers(1, 8))}
    if name == "heuristic":
        kw["max_k"] = draw(st.one_of(st.none(), st.integers(kw["k"], 12)))
    elif name == "confidence":
        kw["confidence_threshold"] = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.5]))
    elif name == "cost":
        kw["costs"] = CostCurve(**_curve_kw(draw(cost_curves())))
        kw["pad_verify"] = draw(st.booleans())
    return name, kw


def _curve_kw(c):
    return {"target_forward_s": c["target_forward_s"], "draft_step_s": c["draft_step_s"]}


@st.composite
def prompts(draw, vocab: int, max_len: int):
    """Random token lists, or a short pattern repeated (what prompt lookup drafts from)."""
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_len))
    pattern = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4))
    return (pattern * draw(st.integers(1, 10)))[:max_len]


@st.composite
def drafters(draw, vocab: int):
    """``(kind, options)``; model drafters get an optional shorter context (None: the target's)."""
    kind = draw(st.sampled_from(DRAFTERS))
    opts = {}
    if kind == "ngram":
        hi = draw(st.integers(1, 4))
        opts = {"max_ngram": hi, "min_ngram": draw(st.integers(1, hi)),
                "match": draw(st.sampled_from(["recent", "earliest"])), "continue_past_end": draw(st.booleans())}
    elif kind == "scripted":
        opts = {"salt": draw(st.integers(0, 5)), "right": draw(st.integers(0, 3))}
    elif kind == "suffix":
        opts = {"curve": draw(st.sampled_from(list(SUFFIX_COSTS))), "min_match": draw(st.integers(1, 3))}
    else:
        opts = {"draft_ctx_cut": draw(st.one_of(st.none(), st.integers(0, 20)))}
    return kind, opts


@st.composite
def greedy_cases(draw, family: str):
    vocab = draw(st.sampled_from([2, 3, 5, 16, 200] if family == "table" else [3, 5, 16, 61]))
    depth = draw(st.integers(1, 3))
    ctx = draw(st.sampled_from([12, 24, 40]))
    seed = draw(st.integers(0, 2))
    prompt = draw(prompts(vocab, min(ctx, 16)))
    room = ctx - len(prompt)
    pick = draw(st.integers(0, 9))  # mostly a budget that fits; sometimes 0, or past the context
    if pick == 9:
        budget = draw(st.integers(room + 1, room + 3))
    elif pick == 8 or room == 0:
        budget = 0
    else:
        budget = draw(st.integers(1, min(room, 24)))
    eos = frozenset(draw(st.lists(st.integers(0, vocab - 1), max_size=2)))
    return {
        "family": family, "vocab": vocab, "depth": depth, "ctx": ctx, "seed": seed, "prompt": prompt,
        "budget": budget, "eos": eos, "policy": draw(policies()), "drafter": draw(drafters(vocab)),
        "pad": draw(st.sampled_from(list(PAD_RULES))),
        "extra_rows": draw(st.sampled_from([0, 0, 3])),
    }


def model_vocab(case) -> int:
    """Logits columns of the case's models: the shared vocabulary plus ``extra_rows`` padding rows (as real
    checkpoints pad their embeddings), which the engine must never choose."""
    return case["vocab"] + case.get("extra_rows", 0)


def build_drafter(case, oracle_ids=None):
    """``(drafter, draft backend or None, draft context or None)`` for a case."""
    kind, opts = case["drafter"]
    vocab = case["vocab"]
    if kind == "ngram":
        return PromptLookupDrafter(**opts), None, None
    if kind == "suffix":
        return SuffixDrafter(SUFFIX_COSTS[opts["curve"]], min_match=opts["min_match"]), None, None
    if kind == "scripted":
        salt, right = opts["salt"], opts["right"]

        def fn(committed, k):  # deterministic in the committed text; right on its first `right` tokens
            # when the target's output is known (oracle_ids), wrong after them
            out = []
            for i in range(k):
                pos = len(committed) + i
                if oracle_ids is not None and i < right and pos < len(oracle_ids):
                    out.append(oracle_ids[pos])
                else:
                    out.append((sum(committed) * 31 + salt * 7 + i * 3) % vocab)
            return out

        return ScriptedDrafter(fn), None, None
    ctx = case["ctx"]
    draft_ctx = None if opts["draft_ctx_cut"] is None else max(1, ctx - opts["draft_ctx_cut"])
    seed = case["seed"] if kind in ("same", "near") else case["seed"] + 10
    backend = FirstFeeds(make_backend(case["family"], model_vocab(case), case["depth"], ctx, seed,
                                      "near" if kind == "near" else "plain", max_length=draft_ctx))
    return ModelDrafter(backend, vocab), backend, draft_ctx


class FirstFeeds:
    """Wraps a draft backend and records how many tokens each round's first draft forward feeds (the one
    `ModelDrafter.propose` scores with ``last=1``)."""

    def __init__(self, inner):
        self.inner = inner
        self.feeds: list[int] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def cache_length(self):
        return self.inner.cache_length

    def forward(self, tokens, *, logits=True, last=None):
        if last is not None:
            self.feeds.append(len(tokens))
        return self.inner.forward(tokens, logits=logits, last=last)


class CheckedPolicy:
    """Wraps a policy; after every round (`observe`) records the caches' lengths and the draft's cached tokens,
    so the test can check them against the committed sequence."""

    def __init__(self, inner, target, drafter, prompt_len):
        self.inner, self.target, self.drafter, self.prompt_len = inner, target, drafter, prompt_len
        self.name = inner.name
        self.seen: list[tuple] = []

    def start(self, prefill_tokens=None, budget=None):
        self.inner.start(prefill_tokens, budget)
        self.seen = []
        self.committed = self.prompt_len

    def next_round(self):
        return self.inner.next_round()

    def next_k(self):
        return self.inner.next_k()

    def alpha_estimate(self):
        return self.inner.alpha_estimate()

    def observe(self, record):
        self.committed += record.num_emitted
        cached = None
        if isinstance(self.drafter, ModelDrafter):
            cached = (self.drafter.backend.cache_length, list(self.drafter._cached))
        self.seen.append((self.committed, self.target.cache_length, cached))
        self.inner.observe(record)


def check_counts(out, budget, eos):
    """The count properties of one `GenerationResult` (greedy or sampled)."""
    toks = out.token_ids
    assert len(toks) <= budget
    assert sum(r.num_emitted for r in out.rounds) == len(toks)
    if budget == 0:
        assert out.finish_reason == "empty" and not out.rounds and not toks
        return
    assert all(t not in eos for t in toks[:-1])  # generation stops at the first EOS
    assert out.finish_reason == ("eos" if toks[-1] in eos else "length")
    if out.finish_reason == "length":
        assert len(toks) == budget
    for i, r in enumerate(out.rounds):
        last = i == len(out.rounds) - 1
        assert 0 <= r.num_accepted <= r.num_drafted <= r.k, r
        assert r.num_emitted >= 1
        raw = r.num_accepted_raw if r.num_accepted_raw is not None else r.num_accepted
        assert r.num_accepted == min(raw, r.num_emitted)
        if last and out.finish_reason == "eos":
            assert r.num_emitted <= raw + 1
            if r.num_emitted <= raw:  # cut inside the drafted block: only the drafts up to the cut count
                assert r.num_drafted == r.num_accepted == r.num_emitted and not r.rejected
        else:
            assert r.num_emitted == r.num_accepted + 1 == raw + 1, r
            assert r.num_drafted == r.k
        assert r.rejected == (r.num_accepted < r.num_drafted), r
        assert r.k_requested is None or r.k <= r.k_requested
        if r.n_forward is not None:
            assert r.n_forward >= r.k + 1
    for name in ("acceptance_rate", "alpha_hat"):
        v = getattr(out, name)
        assert math.isnan(v) or 0.0 <= v <= 1.0, (name, v)
    assert out.block_efficiency >= 1.0
    assert out.num_accepted <= out.num_drafted


def run_greedy_case(case):
    vocab, prompt, budget, eos = case["vocab"], case["prompt"], case["budget"], case["eos"]
    target = make_backend(case["family"], model_vocab(case), case["depth"], case["ctx"], case["seed"])
    pad = PAD_RULES[case["pad"]]
    name, kw = case["policy"]
    try:
        ref = autoregressive_generate(target, prompt, budget, eos_ids=eos, vocab_size=vocab)
    except ContextOverflowError:
        assert len(prompt) + budget > case["ctx"]
        drafter, _, _ = build_drafter(case)
        with pytest.raises(ContextOverflowError):
            speculative_generate(target, drafter, prompt, budget, policy=make_policy(name, **kw), eos_ids=eos,
                                 vocab_size=vocab, pad_to=pad)
        return
    assert len(prompt) + budget <= case["ctx"]
    drafter, draft_backend, draft_ctx = build_drafter(case, list(prompt) + ref.token_ids)
    policy = CheckedPolicy(make_policy(name, **kw), target, drafter, len(prompt))
    out = speculative_generate(target, drafter, prompt, budget, policy=policy, eos_ids=eos, vocab_size=vocab,
                               pad_to=pad)
    event(f"finish: {out.finish_reason}")
    event(f"drafter: {case['drafter'][0]}, policy: {name}")
    if any(r.num_drafted < r.k for r in out.rounds):
        event("drafts cut at an EOS")
    if draft_ctx is not None and any(r.k < (r.k_requested or 0) for r in out.rounds):
        event("K clamped (budget or draft context)")
    # the oracle: target-only greedy decoding; never a padding row of the logits
    assert out.token_ids == ref.token_ids
    assert all(0 <= t < vocab for t in out.token_ids)
    assert out.finish_reason == ref.finish_reason
    check_counts(out, budget, eos)
    # the caches after every round: the target holds the committed sequence minus its last token, the draft
    # a prefix of it
    full = list(prompt) + out.token_ids
    assert len(policy.seen) == len(out.rounds)
    for committed, target_len, cached in policy.seen:
        assert target_len == committed - 1
        if cached is not None:
            draft_len, draft_ids = cached
            assert draft_len == len(draft_ids) <= committed - 1
            assert draft_ids == full[: len(draft_ids)]
    if draft_backend is not None:  # the draft's catch-up per round, as the time model predicts it
        pending = draft_pending(out.rounds, prompt_len=len(prompt))  # the draft's prefill is deferred
        assert draft_backend.feeds == [n for n, r in zip(pending, out.rounds, strict=True)
                                       if r.k > 0]
    if pad is not None:  # target-only decoding with padded steps is the same oracle
        padded = autoregressive_generate(target, prompt, budget, eos_ids=eos, vocab_size=vocab, pad_to=pad)
        assert padded.token_ids == ref.token_ids
    # the trace replay reproduces the real rounds
    if budget == 0:
        return
    kind = case["drafter"][0]
    if kind in ("same", "near", "far"):
        full_ctx = make_backend(case["family"], model_vocab(case), case["depth"], case["ctx"],
                                case["seed"] if kind in ("same", "near") else case["seed"] + 10,
                                "near" if kind == "near" else "plain")
        trace = record_trace(prompt, ref.token_ids, budget, full_ctx, vocab_size=vocab)
        rep_drafter = None
    else:
        trace = record_trace(prompt, ref.token_ids, budget)
        rep_drafter, _, _ = build_drafter(case, full)
    replayed = replay(trace, policy=make_policy(name, **kw), drafter=rep_drafter, draft_context=draft_ctx)
    upper = name == "confidence" and rep_drafter is None
    assert compare_rounds(out.rounds, replayed, k_upper_bound=upper) == []
    if not upper:
        assert [r.num_drafted for r in replayed] == [r.num_drafted for r in out.rounds]
    if rep_drafter is None:
        assert draft_pending(replayed) == draft_pending(out.rounds)
    assert sum(r.num_emitted for r in replayed) == len(out.token_ids)


@examples(2.0)
@given(case=greedy_cases("table"))
# the replay clamped K one token below the engine where the draft's context ends
@example(case={"family": "table", "vocab": 2, "depth": 1, "ctx": 12, "seed": 0, "prompt": [0] * 6, "budget": 2,
               "eos": frozenset(), "policy": ("fixed", {"k": 1}), "drafter": ("same", {"draft_ctx_cut": 6}),
               "pad": "none"})
# a draft stopped on its confidence has fed its last token: the next round's catch-up is 1 token, not 2
@example(case={"family": "table", "vocab": 2, "depth": 1, "ctx": 12, "seed": 0, "prompt": [0], "budget": 4,
               "eos": frozenset(), "policy": ("confidence", {"k": 2, "confidence_threshold": 1.5}),
               "drafter": ("same", {"draft_ctx_cut": None}), "pad": "none"})
def test_greedy_equals_target_only_table_models(case):
    run_greedy_case(case)


@examples(1.0)
@given(case=greedy_cases("gpt2"))
def test_greedy_equals_target_only_gpt2_models(case):
    run_greedy_case(case)


@examples(0.5)
@given(case=greedy_cases("mistral"))
def test_greedy_equals_target_only_sliding_window_models(case):
    run_greedy_case(case)


@st.composite
def sampled_model_cases(draw):
    case = draw(greedy_cases(draw(st.sampled_from(["gpt2", "table"]))))
    vocab = case["vocab"]
    case["sampling"] = SamplingParams(draw(st.sampled_from([0.3, 1.0, 3.0])), draw(st.integers(0, vocab)),
                                      draw(st.sampled_from([1.0, 0.9, 0.5])))
    return case


@examples(0.5)
@given(case=sampled_model_cases())
def test_sampled_runs_keep_the_counts_and_are_reproducible(case):
    """Sampled decoding on random models: the count properties hold, the same seed gives the same tokens,
    and on `TableLM` (exact rows) padded verification changes nothing at all."""
    vocab, prompt, budget, eos, params = case["vocab"], case["prompt"], case["budget"], case["eos"], case["sampling"]
    hypothesis.assume(len(prompt) + budget <= case["ctx"])
    target = make_backend(case["family"], model_vocab(case), case["depth"], case["ctx"], case["seed"])
    name, kw = case["policy"]
    runs = []
    for pad in (PAD_RULES[case["pad"]], PAD_RULES[case["pad"]], None):
        drafter, _, _ = build_drafter(case)
        policy = CheckedPolicy(make_policy(name, **kw), target, drafter, len(prompt))
        out = speculative_generate(target, drafter, prompt, budget, policy=policy, sampling=params, eos_ids=eos,
                                   vocab_size=vocab, seed=11, pad_to=pad)
        check_counts(out, budget, eos)
        assert all(0 <= t < vocab for t in out.token_ids)
        assert all(target_len == committed - 1 for committed, target_len, _ in policy.seen)
        runs.append(out.token_ids)
    assert runs[0] == runs[1]
    if case["family"] == "table":
        assert runs[0] == runs[2]


# -- warp: temperature, top-k, top-p against a direct reading of their definitions ---------------------------


def reference_warp(row: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, float]:
    """`warp`'s contract read literally, in float64: top-k keeps every token whose logit is >= the k-th
    largest; top-p keeps a token when the tokens strictly more likely than it hold less than top_p. Returns
    the probabilities and the distance of the nearest top-p decision from its threshold."""
    x = row.double() / params.temperature
    vocab = x.numel()
    if 0 < params.top_k < vocab:
        kth = torch.sort(x, descending=True).values[params.top_k - 1]
        x = torch.where(x >= kth, x, torch.full_like(x, -math.inf))
    margin = math.inf
    if params.top_p < 1.0:
        p = torch.softmax(x, dim=-1)
        keep = torch.zeros(vocab, dtype=torch.bool)
        for i in range(vocab):
            above = float(p[x > x[i]].sum())
            if float(p[i]) > 0.0 and float(above) > 0.0:
                margin = min(margin, abs(above - params.top_p))
            keep[i] = above < params.top_p
        x = torch.where(keep, x, torch.full_like(x, -math.inf))
    return torch.softmax(x, dim=-1), margin


@st.composite
def warp_cases(draw):
    vocab = draw(st.sampled_from([1, 2, 3, 5, 8, 30, 1030, 1500]))
    levels = draw(st.sampled_from([0, 2, 3, 6]))  # 0: continuous logits; else that many values (ties)
    g = torch.Generator().manual_seed(draw(st.integers(0, 10**6)))
    if levels:
        row = torch.randint(0, levels, (vocab,), generator=g).float() * draw(st.sampled_from([0.01, 0.5, 2.0]))
    else:
        row = torch.randn(vocab, generator=g) * draw(st.sampled_from([0.01, 1.0, 4.0]))
    n_masked = draw(st.integers(0, vocab - 1))
    row[torch.randperm(vocab, generator=g)[:n_masked]] = -math.inf
    params = SamplingParams(draw(st.sampled_from([0.3, 1.0, 2.5])), draw(st.integers(0, vocab + 1)),
                            draw(st.one_of(st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.2]), st.floats(0.01, 1.0))))
    return row, params


@examples(4.0)
@given(case=warp_cases())
# two tied most likely tokens and top-p below their mass: both kept (the sort's order decided before)
@example(case=(torch.tensor([1.0, 1.0, 0.0]), SamplingParams(1.0, 0, 0.4)))
@example(case=(torch.tensor([0.0, 1.0, 1.0]), SamplingParams(1.0, 2, 0.4)))
# 1500 equal logits: all tied with the last of the 1024 top-p candidates, so all kept
@example(case=(torch.zeros(1500), SamplingParams(1.0, 0, 0.5)))
def test_warp_matches_its_definition(case):
    row, params = case
    ref, margin = reference_warp(row, params)
    hypothesis.assume(margin > 1e-4)  # a top-p decision within rounding of its threshold is either way
    got = warp(row, params)
    assert got.shape == row.shape and torch.isfinite(got).all()
    assert torch.allclose(got.double(), ref, atol=1e-5), (row, params, got, ref)


# -- sampled: the joint law of the output -----------------------------------------------------------------


def chi2_critical(df: int, z: float = 4.753) -> float:
    """Upper quantile of chi-square with `df` degrees of freedom at the normal quantile `z` (Wilson-Hilferty;
    z = 4.753 is a significance of 1e-6, small enough that a random search over many cases does not fail
    a correct engine by chance)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def exact_law(target: TableLM, prompt, n: int, eos, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """``{output: probability}`` of target-only sampling: every output of `n` tokens, or shorter ending at
    an EOS, with the product of the warped target probabilities."""
    law: dict[tuple[int, ...], float] = {}

    def walk(out: tuple[int, ...], prob: float):
        if len(out) == n or (out and out[-1] in eos):
            law[out] = law.get(out, 0.0) + prob
            return
        p = warp(target.row(list(prompt) + list(out)), params)
        for t in range(target.vocab_size):
            if float(p[t]) > 0.0:
                walk(out + (t,), prob * float(p[t]))

    walk((), 1.0)
    return law


def chi_square(observed: dict, law: dict, draws: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom. The least likely outputs are pooled into one cell, from
    the least likely up, until it expects at least 5 (so no cell expects fewer). An output the law gives
    probability 0 is an infinite statistic."""
    if any(o not in law for o in observed):
        return math.inf, 1
    cells = sorted((draws * prob, observed.get(out, 0)) for out, prob in law.items())
    pool_e, pool_o, i = 0.0, 0, 0
    while i < len(cells) and pool_e < 5.0:
        pool_e += cells[i][0]
        pool_o += cells[i][1]
        i += 1
    merged = ([(pool_e, pool_o)] if i > 0 else []) + cells[i:]
    stat = sum((o - e) ** 2 / e for e, o in merged if e > 0.0)
    return stat, max(len(merged) - 1, 1)


class LyingDrafter:
    """A draft model that reports the distributions it sampled from with half their mass moved to the
    uniform law: the classic fault the joint test must catch (the negative control)."""

    name = "lying"

    def __init__(self, inner: ModelDrafter):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, committed, k, sampling, generator, min_confidence=None):
        d = self.inner.propose(committed, k, sampling, generator, min_confidence)
        if d.probs is None:
            return d
        return Draft(d.tokens, 0.5 * d.probs + 0.5 / d.probs.shape[-1], d.stopped)


def sampled_joint(case, draws: int, *, lie: bool = False) -> tuple[float, float]:
    """``(statistic, critical value)`` of the chi-square test of the engine's sampled outputs on `case`."""
    vocab, prompt, n, eos = case["vocab"], case["prompt"], case["budget"], case["eos"]
    params = case["sampling"]
    target = TableLM(vocab, case["seed"], 64, scale=case["scale"])
    kind, opts = case["drafter"]
    if kind == "ngram":
        drafter = PromptLookupDrafter(**opts)
    else:
        seed = case["seed"] if kind == "same" else case["seed"] + 10
        drafter = ModelDrafter(TableLM(vocab, seed, opts.get("draft_ctx", 64), scale=case["scale"]), vocab)
        if lie:
            drafter = LyingDrafter(drafter)
    name, kw = case["policy"]
    pad = PAD_RULES[case["pad"]]
    observed: dict[tuple[int, ...], int] = {}
    for i in range(draws):
        out = speculative_generate(target, drafter, prompt, n, policy=make_policy(name, **kw), sampling=params,
                                   eos_ids=eos, vocab_size=vocab, seed=i, pad_to=pad)
        check_counts(out, n, eos)
        if kind == "same" and not lie:  # q is p: speculative sampling accepts every draft
            assert out.num_accepted == out.num_drafted, out.rounds
        key = tuple(out.token_ids)
        observed[key] = observed.get(key, 0) + 1
    law = exact_law(target, prompt, n, eos, params)
    stat, df = chi_square(observed, law, draws)
    return stat, chi2_critical(df)


@st.composite
def sampled_cases(draw):
    vocab = draw(st.integers(2, 4))
    kind = draw(st.sampled_from(["same", "far", "far", "ngram"]))
    opts = {}
    if kind == "ngram":
        opts = {"max_ngram": draw(st.integers(1, 3)), "min_ngram": 1}
    elif draw(st.booleans()):
        opts = {"draft_ctx": draw(st.integers(3, 8))}  # a draft context that runs out mid-generation
    top_k = draw(st.integers(0, vocab))
    return {
        "vocab": vocab, "seed": draw(st.integers(0, 50)), "scale": draw(st.sampled_from([0.5, 1.5, 3.0])),
        "prompt": draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4)),
        "budget": draw(st.integers(1, 3)), "eos": frozenset(draw(st.lists(st.integers(0, vocab - 1), max_size=1))),
        "sampling": SamplingParams(draw(st.sampled_from([0.5, 1.0, 2.0])), top_k,
                                   draw(st.sampled_from([1.0, 0.9, 0.6]))),
        "drafter": (kind, opts), "policy": draw(policies()), "pad": draw(st.sampled_from(list(PAD_RULES))),
    }


SAMPLED_DRAWS = 1500


@examples(0.1)
@given(case=sampled_cases())
def test_sampled_output_follows_the_target_law(case):
    stat, crit = sampled_joint(case, SAMPLED_DRAWS)
    assert stat < crit, (stat, crit)


def test_sampled_negative_control_lying_drafter_fails():
    """The same test on a drafter that misreports q (half its mass moved to uniform) must fail it: the test
    has the power to see a wrong acceptance rule at this number of draws."""
    case = {"vocab": 3, "seed": 3, "scale": 3.0, "prompt": [0, 1], "budget": 3, "eos": frozenset(),
            "sampling": SamplingParams(1.0), "drafter": ("far", {}), "policy": ("fixed", {"k": 3}), "pad": "none"}
    good, crit = sampled_joint(case, SAMPLED_DRAWS)
    bad, crit_bad = sampled_joint(case, SAMPLED_DRAWS, lie=True)
    assert good < crit and bad > crit_bad, (good, crit, bad, crit_bad)


def test_exact_law_sums_to_one_and_stops_at_eos():
    t = TableLM(3, 0)
    law = exact_law(t, [1], 3, frozenset({2}), SamplingParams(1.0, 2, 0.9))
    assert math.isclose(sum(law.values()), 1.0, rel_tol=1e-6)
    assert all(len(o) == 3 or o[-1] == 2 for o in law)
    assert all(2 not in o[:-1] for o in law)
    # the pooled chi-square: a rare output seen once is no evidence against the law
    rare = {(0,): 1e-4, (1,): 0.4999, (2,): 0.5}
    stat, df = chi_square({(0,): 1, (1,): 500, (2,): 499}, rare, 1000)
    assert stat < chi2_critical(df)
    assert chi_square({(0,): 1000}, {(1,): 1.0}, 1000)[0] == math.inf
