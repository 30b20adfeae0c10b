"""The mixed drafter (`specdec.drafters.mixed`): the suffix drafter's proposal, the draft model's or none, by
expected tokens per second on the measured costs; exact like either drafter alone."""

from __future__ import annotations

import pytest
import torch

from specdec.core.costs import CostCurve
from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.mixed import MixedDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.engine.decoding import autoregressive_generate, speculative_generate

V = 1000
#: A flat verification curve and a cheap draft step (bf16-like): the draft model pays at its prior.
FLAT = CostCurve({1: 0.10, 2: 0.10, 4: 0.105, 8: 0.11, 17: 0.12}, draft_step_s=0.01)
#: A steep curve and a dear draft step (llama.cpp on a CPU): no K of the draft model pays at its prior.
STEEP = CostCurve({1: 0.03, 2: 0.055, 4: 0.09, 8: 0.17, 17: 0.36}, draft_step_s=0.012)
PROMPTS = ["abc abc abc abc abc", "hello world, the quick brown fox", "x = [1, 2, 3]; y = [1, 2, 3]; z = ["]


def tv_critical(p: torch.Tensor, n: int, quantile: float = 0.999, reps: int = 2000) -> float:
    """The `quantile` of the total-variation distance between p and the histogram of n exact draws from p
    (simulated with a fixed seed): what sampling noise alone reaches at this support and n."""
    g = torch.Generator().manual_seed(0)
    draws = torch.multinomial(p.expand(reps, -1), n, replacement=True, generator=g)
    hist = torch.zeros(reps, p.numel()).scatter_add_(1, draws, torch.ones(reps, n)) / n
    return float(torch.quantile(0.5 * (hist - p).abs().sum(1), quantile))


def _mixed(draft, cost, **kw) -> MixedDrafter:
    return MixedDrafter(SuffixDrafter(cost), draft, V, cost, **kw)


@pytest.mark.parametrize("cost", [FLAT, STEEP], ids=["flat", "steep"])
def test_greedy_output_equals_target_only(tiny_tokenizer, target, near_draft, cost):
    """Greedy mixed drafting commits the target's own tokens, whichever drafter each round used."""
    used = {"suffix": 0, "model": 0, "none": 0}
    for text in PROMPTS:
        prompt = tiny_tokenizer(text).input_ids
        want = autoregressive_generate(target, prompt, 40, vocab_size=V).token_ids
        d = _mixed(near_draft, cost)
        got = speculative_generate(target, d, prompt, 40, k=8, vocab_size=V)
        assert got.token_ids == want, text
        # every round records the drafter it chose, in order (a last round left no room to draft: none)
        sources = [r.draft_source for r in got.rounds]
        n = len(d.stats.choices)
        assert sources[:n] == d.stats.choices and set(sources[n:]) <= {"none"}, text
        assert all(r.k == 0 for r in got.rounds if r.draft_source == "none"), text
        for kind, n in d.stats.rounds.items():
            used[kind] += n
    if cost is FLAT:
        assert used["model"] > 0 and used["suffix"] > 0  # both drafters took rounds
    else:
        assert used["model"] == 0


def test_the_draft_model_never_runs_where_it_cannot_pay(tiny_tokenizer, target, near_draft):
    """On a steep curve the draft model is never run (its deferred prefill included): the rounds and output
    are the suffix drafter's alone."""
    calls = []
    real = near_draft.forward

    def counted(tokens, **kw):
        calls.append(len(tokens))
        return real(tokens, **kw)

    near_draft.forward = counted
    try:
        for text in PROMPTS:
            prompt = tiny_tokenizer(text).input_ids
            mixed = speculative_generate(target, _mixed(near_draft, STEEP), prompt, 40, k=8, vocab_size=V)
            alone = speculative_generate(target, SuffixDrafter(STEEP), prompt, 40, k=8, vocab_size=V)
            assert [(r.k, r.num_accepted) for r in mixed.rounds] == [(r.k, r.num_accepted) for r in alone.rounds]
    finally:
        near_draft.forward = real
    assert sum(calls) == 0  # no token ever fed (an empty forward is the row's deferred prefill)


def test_the_draft_models_estimate_learns_from_its_verified_tokens(tiny_tokenizer, target, far_draft):
    """A draft that rarely agrees lowers its own estimate below the prior, and the mixed drafter then stops
    giving it rounds (no draft or the suffix drafter's instead)."""
    prompt = tiny_tokenizer("hello world, the quick brown fox").input_ids
    d = _mixed(far_draft, FLAT)
    speculative_generate(target, d, prompt, 60, k=8, vocab_size=V)
    assert d.stats.model_offered > 0 and d.model_alpha() < d.prior_alpha
    first = d.stats.rounds["model"]
    assert first < sum(d.stats.rounds.values())


@pytest.mark.parametrize(("text", "prior", "first"), [("abc abc abc abc", 0.1, "suffix"),
                                                     ("hello world, the quick brown fox", 0.9, "model")])
def test_sampled_first_token_follows_the_target(tiny_tokenizer, target, near_draft, text, prior, first):
    """Under sampling each round's draft is one drafter's ordinary draft (the suffix drafter's one-hot, the
    draft model's with its q), so the first token follows warped p whichever drafter drafted it (a draft
    that often agrees: a q misreported to the verifier would pull the law towards the draft's)."""
    sp = SamplingParams(temperature=0.7, top_k=20, top_p=0.9)
    prompt = tiny_tokenizer(text).input_ids
    target.reset()
    p = warp(target.forward(prompt)[-1, :V], sp)
    target.reset()
    n = 500
    counts = torch.zeros(V)
    rejected = 0
    for seed in range(n):
        d = _mixed(near_draft, FLAT, prior_alpha=prior)
        out = speculative_generate(target, d, prompt, 3, k=4, sampling=sp, seed=seed, vocab_size=V)
        assert d.stats.choices[0] == first and out.rounds[0].k > 0
        counts[out.token_ids[0]] += 1
        rejected += out.rounds[0].num_accepted == 0
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(torch.nonzero(p).flatten().tolist())
    tv = 0.5 * float((counts / n - p).abs().sum())
    assert tv < tv_critical(p, n), tv
    assert rejected > n // 10  # the recovered-token path carried part of the law


def test_refuses_costs_without_a_draft_step(near_draft):
    with pytest.raises(ValueError, match="draft_step_s"):
        MixedDrafter(SuffixDrafter(None), near_draft, V, CostCurve({1: 0.1, 2: 0.1}))


def test_a_batch_of_rows_each_choosing_its_drafter_equals_target_only(tiny_tokenizer, target, near_draft):
    """`BatchedMixedDrafter`: rows that choose the draft model draft in one batched call, the others by their
    suffix drafters or not at all; every greedy row equals its target-only output and the rows' choices
    differ within rounds."""
    from specdec.drafters.mixed import BatchedMixedDrafter
    from specdec.drafters.model import BatchedModelDrafter
    from specdec.engine.decoding import generate_batch
    from specdec.runtimes.hf_batched import BatchedHFBackend

    prompts = [tiny_tokenizer(t).input_ids for t in PROMPTS]
    want = [autoregressive_generate(target, p, 30, vocab_size=V).token_ids for p in prompts]
    d = BatchedMixedDrafter(lambda: SuffixDrafter(FLAT), BatchedModelDrafter(BatchedHFBackend(near_draft.model), V),
                            FLAT)
    out = generate_batch(BatchedHFBackend(target.model), prompts, 30, drafter=d, k=6, vocab_size=V)
    assert [r.token_ids for r in out] == want
    first = [s.choices[0] for s in d.stats]
    assert "model" in first and "suffix" in first  # one round, rows on different drafters


# ------------------------------------------------------------------ the acceptance-trace replay of the mixed drafter

#: A flat curve on which the draft model pays at its prior but a long suffix match pays more: both drafters
#: take rounds on repetitive text.
MIXED = CostCurve({1: 0.10, 2: 0.105, 4: 0.115, 8: 0.13, 17: 0.16}, draft_step_s=0.02)


class _PendingSpy:
    """Wraps a batched model drafter of one row and records, each round, the catch-up the mixed drafter's choice
    priced (committed length minus cached length: ``seen``) and, on the rounds it drafted, what it fed
    (``fed``); a round asked for K = 0 is recorded in ``seen`` too."""

    def __init__(self, inner):
        self.inner, self.seen, self.fed = inner, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, committed, ks, *args, **kw):
        (c,), (n,), (k,) = committed, self.inner.cached_lens, ks
        self.seen.append(len(c) - n)
        self.fed += [len(c) - n] if k > 0 else []
        return self.inner.propose(committed, ks, *args, **kw)


def _live_and_replayed(tiny_tokenizer, target, draft, cost, text, *, k=8, policy=None, new=40):
    """A live greedy run of the mixed drafter and the replay of its trace on the same cost curve: ``(live
    rounds, live drafter, live spy, PromptModel, replayed rounds, replay spy)``; the replay is
    `PromptModel.rounds` (the catalogue's), and once more on a spied `TracedModelDrafter`."""
    from specdec.catalogue.policies import make_policy
    from specdec.drafters.model import BatchedModelDrafter
    from specdec.drafters.traced import TracedModelDrafter
    from specdec.engine.traces import record_trace, replay
    from specdec.report.predicted import PromptModel
    from specdec.runtimes.base import OneRow

    def plan():
        return {"k": k} if policy is None else {"policy": make_policy(policy, k, costs=cost, free_drafts=True)}

    prompt = tiny_tokenizer(text).input_ids
    want = autoregressive_generate(target, prompt, new, vocab_size=V).token_ids
    spy = _PendingSpy(BatchedModelDrafter(OneRow(draft), V))
    live = MixedDrafter.on_model_drafter(SuffixDrafter(cost), spy, cost)
    out = speculative_generate(target, live, prompt, new, vocab_size=V, **plan())
    assert out.token_ids == want
    trace = record_trace(prompt, want, new, draft, vocab_size=V)
    m = PromptModel(("c", "p", ""), "t", trace, cost, 0.0, 0.0, 0.0, (3, 1), draft.max_length)
    rspy = _PendingSpy(TracedModelDrafter(trace, draft.max_length))
    again = replay(trace, drafter=MixedDrafter.on_model_drafter(SuffixDrafter(cost), rspy, cost), **plan())
    replayed = m.rounds("mixed", k, policy or "fixed")
    assert again == replayed
    return out.rounds, live, spy, m, replayed, rspy


@pytest.mark.parametrize("policy", [None, "cost", "confidence"])
def test_the_trace_replay_reproduces_the_live_mixed_drafters_rounds(tiny_tokenizer, target, near_draft, policy):
    """The replay of the mixed drafter (its own choice code on the trace's draft tokens) reproduces every
    round the live drafter ran (a confidence stop's K from above, `replay`), its per-round choice, the
    draft model's catch-up each choice priced, and what the draft fed on each round it drafted (the tokens the
    suffix drafter's rounds committed included: `draft_pending`); on this curve both drafters take rounds."""
    from specdec.engine.traces import compare_rounds, draft_pending

    used = set()
    for text in PROMPTS:
        timed, live, spy, m, replayed, rspy = _live_and_replayed(tiny_tokenizer, target, near_draft, MIXED, text,
                                                                 policy=policy)
        assert compare_rounds(timed, replayed, k_upper_bound=policy == "confidence") == [], text
        choices = [c for c in live.stats.choices if c != "none"]
        assert [r.by_model for r in replayed if r.k > 0] == [c == "model" for c in choices], text
        # a choice is priced on every round asked for K > 0 (the live loop also calls with K = 0 at the budget)
        assert rspy.seen == spy.seen[:len(live.stats.choices)] and rspy.fed == spy.fed, text
        used |= set(live.stats.choices)
        prompt_len = len(m.trace.prompt_ids)
        assert [p for p, r in zip(draft_pending(replayed, prompt_len), replayed, strict=True) if r.by_model] == spy.fed
    assert {"model", "suffix"} <= used


def test_the_replay_never_drafts_with_the_model_where_it_cannot_pay(tiny_tokenizer, target, near_draft):
    """On a steep curve (no K of the draft model pays at its estimate) the replay never gives the draft model
    a round, yet the suffix drafter drafts; the prediction prices no draft step."""
    from specdec.engine.traces import compare_rounds

    drafted = 0
    for text in PROMPTS:
        timed, live, spy, m, replayed, _ = _live_and_replayed(tiny_tokenizer, target, near_draft, STEEP, text)
        assert not any(r.by_model for r in replayed) and spy.fed == [] and live.stats.rounds["model"] == 0
        assert compare_rounds(timed, replayed) == []
        drafted += sum(r.k for r in replayed)
        free = m.decode_s("suffix", m.rounds("suffix", 8))  # the suffix drafter alone: the same rounds and price
        assert m.decode_s("mixed", replayed) == pytest.approx(free)
    assert drafted > 0


def test_mixed_rounds_are_priced_by_the_drafter_that_drafted_them():
    """`PromptModel.speedup("mixed", ...)`: a suffix round costs what a model-free round costs, a draft-model
    round its catch-up over the tokens committed since the draft last fed (the suffix round's included) and
    its K - 1 steps."""
    from specdec.engine.traces import AcceptanceTrace, ReplayRound
    from specdec.report.predicted import PromptModel

    curve = CostCurve({1: 0.10, 17: 0.26}, draft_step_s=0.01, draft_forward_s={1: 0.01, 9: 0.05})
    trace = AcceptanceTrace((5, 6), tuple(range(10, 20)), tuple(range(10, 20)), (1.0,) * 10, 10)
    m = PromptModel(("c", "p", ""), "t", trace, curve, 0.0, 0.0, 0.003, (3, 1), None)
    rounds = [ReplayRound(3, 3, 4, by_model=False), ReplayRound(2, 2, 3, by_model=True),
              ReplayRound(2, 0, 1, by_model=True), ReplayRound(0, 0, 1), ReplayRound(1, 1, 1, by_model=True)]
    f = curve.forward_s
    want = ((0.003 + f(4)) + (curve.draft_forward(5) + 0.01 + f(3)) + (curve.draft_forward(2) + 0.01 + f(3))
            + f(1) + (curve.draft_forward(2) + f(2)))
    assert m.decode_s("mixed", rounds) == pytest.approx(want)
    assert m.speedup("mixed", rounds) == pytest.approx(10 * f(1) / want)


def test_the_predicted_grid_holds_the_mixed_drafter(tiny_tokenizer, target, near_draft):
    """`trace_grid` replays the mixed drafter at every K and with the cost policy (one catalogue entry), next to
    the drafters it chooses between."""
    from specdec.report.predicted import GRID, trace_grid

    _, _, _, m, _, _ = _live_and_replayed(tiny_tokenizer, target, near_draft, MIXED, PROMPTS[0])
    grid = trace_grid([m])
    mixed = grid[grid["method"] == "mixed"]
    assert set(grid["method"]) == {"draft", "ngram", "suffix", "mixed"}
    assert sorted(mixed[mixed["policy"] == "fixed"]["k"]) == list(GRID) and (mixed["policy"] == "cost").sum() == 1
    assert (mixed["predicted"] > 0).all()


def test_the_reports_replay_of_stored_mixed_runs_is_exact(tmp_path, tiny_pair, near_draft_dir, prompt_file):
    """A sweep that times the mixed drafter stores runs that the report's replay (`predicted_vs_measured`, from
    the stored trace and the prompt's calibration block) reproduces round for round. (The tiny draft is as
    large as the target, so its measured step costs about a target step and these runs never draft with it:
    the draft model's rounds are checked on the curves above.)"""
    from conftest import tiny_sweep_config

    from specdec.bench import sweep as S
    from specdec.report import tables as T
    from specdec.report.analysis import analyze
    from specdec.report.load import load_store

    cfg = tiny_sweep_config(tiny_pair, near_draft_dir, prompt_file, methods="baseline,mixed", ks="4,8",
                            secondary_ks="4", policies="cost", max_new_tokens=24)
    res = S.run_sweep(cfg, db=tmp_path / "m.db", progress=False, echo=lambda _: None)
    assert res.failed == 0
    a = analyze(load_store(tmp_path / "m.db"))
    pvm = a[T.PREDICTED]
    mixed = pvm[pvm["method"] == "mixed"]
    assert len(mixed) >= 4 and set(mixed["policy"]) == {"fixed", "cost"}
    assert mixed["replay_exact"].all(), mixed[~mixed["replay_exact"]][["prompt_id", "k", "mismatch"]].to_string()
    # each mixed round is stored with the drafter it chose, a target-only round without one; the report shows
    # the mixed drafter's shares
    st = load_store(tmp_path / "m.db")
    runs, rounds = st.runs, st.rounds
    mixed_ids = set(runs.loc[runs["method"] == "mixed", "run_id"])
    src = rounds.loc[rounds["run_id"].isin(mixed_ids), "draft_source"]
    assert src.notna().all() and set(src) <= {"suffix", "model", "none"} and "suffix" in set(src)
    assert rounds.loc[rounds["run_id"].isin(set(runs.loc[runs["method"] == "baseline", "run_id"])),
                      "draft_source"].isna().all()
    table = a[T.DRAFTER_TABLE]
    assert table.loc[table["method"] == "mixed", "sources"].str.contains("suffix").all()


#: FLAT with a draft forward that grows with the tokens fed: the deferred prefill of a 60-token prompt costs
#: ~0.3 s, three target steps, though a drafting round at the prior pays once it is paid.
FLAT_PREFILL = CostCurve({1: 0.10, 2: 0.10, 4: 0.105, 8: 0.11, 17: 0.12}, draft_step_s=0.01,
                         draft_forward_s={1: 0.01, 2: 0.011, 8: 0.04, 32: 0.16, 64: 0.32})


def test_the_deferred_prefill_is_an_investment_paid_where_the_tokens_left_repay_it(tiny_tokenizer, target,
                                                                                   near_draft):
    """The draft model's first round feeds the whole prompt. Priced into that round alone it never pays (the
    model would never be chosen); priced as an investment it is paid where the row's tokens left save twice
    its price at the steady rate, and not where too few tokens are left."""
    prompt = list(range(100, 160))  # 60 distinct tokens: no earlier repeat for the suffix drafter
    committed = list(prompt)
    long = _mixed(near_draft, FLAT_PREFILL, budget=128)
    long.prefill(list(prompt))
    kind, _, k = long.batch._choose(0, committed, 8, SamplingParams())
    assert kind == "model" and k >= 1
    round_alone = FLAT_PREFILL.round_s(k, pending=len(prompt))  # the first round with the prefill in its rate
    assert 1.0 / FLAT_PREFILL.forward_s(1) > 2.18 / round_alone  # would lose to a plain step at the prior
    short = _mixed(near_draft, FLAT_PREFILL, budget=2)
    short.prefill(list(prompt))
    assert short.batch._choose(0, committed, 8, SamplingParams())[0] != "model"
    with pytest.raises(ValueError, match="budget >= 1"):
        _mixed(near_draft, FLAT_PREFILL, budget=0)


def test_the_catalogue_hands_the_generations_budget_to_the_mixed_drafter(near_draft):
    """The deferred prefill is weighed over the generation's own budget (`DraftSource.budget`; the replay: the
    trace's), the study's 128 tokens where none is given."""
    from types import SimpleNamespace

    from specdec.catalogue.drafters import MIXED_BUDGET, DraftSource, replay_drafter, single_drafter
    from specdec.engine.traces import AcceptanceTrace

    pair = SimpleNamespace(draft=SimpleNamespace(backend=near_draft), vocab_size=V, info={})
    assert single_drafter("mixed", DraftSource(pair, costs=FLAT, budget=16)).batch.budget == 16
    assert single_drafter("mixed", DraftSource(pair, costs=FLAT)).batch.budget == MIXED_BUDGET == 128
    trace = AcceptanceTrace((1, 2), (3, 4, 5), (3, 4, 5), (0.9,) * 3, 40)
    assert replay_drafter("mixed", costs=FLAT, trace=trace).batch.budget == 40
