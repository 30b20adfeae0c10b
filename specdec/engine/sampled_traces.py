"""Sampled acceptance traces: the expected rounds of every K under sampling, from one seeded target-only run.

Under sampling a drafted token d is accepted with probability min(1, p(d) / q(d)) and, over the draft's own
draw, the draft model's token at a position is accepted with probability beta = sum_x min(p(x), q(x)) of the
target's and the draft's warped distributions there (Leviathan et al. 2023, section 3.1; Chen et al. 2023);
a deterministic drafter (prompt lookup, the suffix drafter) has q one-hot, so its token d is accepted with
probability p(d). A sampled sequence is one draw: another seed's run takes other tokens, so no single run's
rounds can be replayed. What can be replayed without sampling noise is the expectation along one
representative sequence, the seeded target-only run x:

- the draft model: its j-th draft token of a round starting at output position i is accepted, given the
  j - 1 before it were, with probability beta_{i+j-1}, the overlap along x (one teacher-forced pass of each
  model over prompt + x: ``SampledTrace.overlap``);
- a model-free drafter: asked at each position i on prompt + x[:i] for its longest proposal (K = `k_max`;
  its proposal at a smaller K is taken as the first K tokens of it), each token's acceptance probability is
  the target's warped probability of it after prompt + x[:i] and the proposal's tokens before it, read from
  the teacher-forced pass while the proposal follows x and from one target forward over the proposal past
  the first token that leaves x (``SampledTrace.chains``; skipped, the rest recorded as 0, where the tokens
  before it are all accepted with a probability below `CHAIN_FLOOR`).

`expected_run` then gives, for a fixed K, the expected rounds, drafted and accepted tokens and (with a round
cost) decode seconds of a run over x's length, exactly by dynamic programming over the output position (the
distribution of a round's accepted count is the product of the acceptance probabilities above). What it
assumes: a speculative run's rounds start at positions whose acceptance probabilities are those along x (the
accepted tokens are distributed as the target's, but they are another draw, so this holds in expectation
over prompts, not for one run); a drafter's proposal depends on the committed text only (a drafter that learns
from its rounds is driven along x). `docs/METHOD.md` states the check against timed sampled runs.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from specdec.core.sampling import SamplingParams, warp
from specdec.drafters.base import Draft, Drafter
from specdec.engine.traces import AcceptanceTrace, ReplayRound, stored_json, teacher_forced
from specdec.runtimes.base import Backend

__all__ = ["CHAIN_FLOOR", "DRAFT_MODEL", "ExpectedRun", "SampledTrace", "expected_run", "record_sampled_trace",
           "simulate_run", "stored_trace"]

#: The key of the draft model's acceptance probabilities (its overlap) in `expected_run`.
DRAFT_MODEL = "draft"
#: A chain whose tokens so far are all accepted with a probability below this has the rest recorded as 0
#: without the target forward they need: each round's expected accepted tokens move by less than K x this.
CHAIN_FLOOR = 1e-4


@dataclass(frozen=True)
class SampledTrace:
    """One prompt's seeded target-only sampled run and, per output position, what each drafter's tokens would
    be accepted with (module docstring).

    Attributes:
        prompt_ids: the prompt's token ids. target_ids: ``[T]`` the sampled output.
        max_new_tokens: the run's budget (it clamps K near the end). sampling: the warping of both models.
        overlap: ``[T]`` beta_i = sum_x min(p_i(x), q_i(x)) after prompt + target_ids[:i] (None without a
            draft model).
        chains: drafter name -> ``[T]`` per position, the acceptance probability of each token of the
            drafter's longest proposal there, in order (empty where it proposed nothing).
    """

    prompt_ids: tuple[int, ...]
    target_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    overlap: tuple[float, ...] | None = None
    chains: Mapping[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)

    @classmethod
    def from_record(cls, row: Mapping) -> SampledTrace:
        """From a stored ``traces`` row of a sampled sweep (``prompt_ids``, ``target_ids``, ``max_new_tokens``,
        ``sampling_json``, ``overlap``, ``chains``; JSON columns decoded or as text), as
        `specdec.bench.store_measurements` writes it."""
        sp, overlap, chains = (stored_json(row[c]) for c in ("sampling_json", "overlap", "chains"))
        chains = chains if isinstance(chains, dict) else {}  # NULL (a DataFrame NaN): no model-free drafter
        return cls(tuple(stored_json(row["prompt_ids"])), tuple(stored_json(row["target_ids"])),
                   int(row["max_new_tokens"]),
                   SamplingParams(float(sp["temperature"]), int(sp["top_k"]), float(sp["top_p"])),
                   tuple(overlap) if isinstance(overlap, (list, tuple)) else None,  # NULL: no draft model
                   {k: tuple(tuple(c) for c in v) for k, v in chains.items()})

    def acceptance(self, drafter: str, pos: int, k: int) -> list[float]:
        """The acceptance probabilities of `drafter`'s first `k` tokens at output position `pos` (fewer where
        it proposes fewer or the output ends).

        Raises:
            KeyError: a drafter this trace did not record.
        """
        if drafter == DRAFT_MODEL:
            if self.overlap is None:
                raise KeyError("this trace has no draft model's overlap (record it with a draft backend)")
            return list(self.overlap[pos:pos + k])
        if drafter not in self.chains:
            raise KeyError(f"this trace did not record drafter {drafter!r}; it has {sorted(self.chains)}")
        return list(self.chains[drafter][pos][:k])


def stored_trace(row: Mapping) -> AcceptanceTrace | SampledTrace:
    """The trace a stored ``traces`` row holds (JSON columns decoded or as text): a `SampledTrace` where the row
    records its sampling (``sampling_json``), else an `AcceptanceTrace`; each by its ``from_record``.

    Raises:
        ValueError: a row without prompt or target token ids (a store written before traces recorded them).
    """
    for c in ("prompt_ids", "target_ids"):
        if _null(row.get(c)):
            raise ValueError(f"the acceptance trace of {row.get('prompt_id')} ({row.get('config_label')}) has no "
                             f"{c[:-4]} token ids (a store written before traces recorded them): its rounds "
                             "cannot be replayed")
    return (AcceptanceTrace if _null(row.get("sampling_json")) else SampledTrace).from_record(row)


def _null(x) -> bool:
    """A NULL column: None, or NaN (a DataFrame's missing cell)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


@dataclass(frozen=True)
class ExpectedRun:
    """The expectation of a fixed-K run over a sampled trace: rounds (target forwards), drafted and accepted
    tokens, decode seconds (NaN without a round cost), the tokens generated and the rounds that drafted."""

    rounds: float
    drafted: float
    accepted: float
    decode_s: float
    tokens: int
    drafting_rounds: float = 0.0

    @property
    def block_efficiency(self) -> float:
        """Tokens per target forward: tokens / rounds."""
        return self.tokens / self.rounds if self.rounds else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (NaN when nothing is drafted)."""
        return self.accepted / self.drafted if self.drafted else float("nan")


def _chain(target: Backend, seq: list[int], n_prompt: int, p: torch.Tensor, pos: int, tokens: Sequence[int],
           sampling: SamplingParams, vocab_size: int | None, cached: list[int]) -> tuple[float, ...]:
    """The acceptance probabilities of `tokens` proposed at output position `pos`: from the teacher-forced
    rows `p` while they follow the output, from one target forward past the first that leaves it. `cached`
    holds the target cache's length (the committed prefix it holds), advanced here."""
    out: list[float] = []
    target_len = len(seq) - n_prompt
    for j, tok in enumerate(tokens):
        if pos + j >= target_len:
            return tuple(out)
        out.append(float(p[pos + j, tok]))
        if tok != seq[n_prompt + pos + j]:
            break  # the proposal leaves the output here: the tokens after it need their own forward
    if len(out) == len(tokens) or pos + len(out) >= target_len:
        return tuple(out)
    n = min(len(tokens), target_len - pos)
    if math.prod(out) < CHAIN_FLOOR:  # the rest is reached too rarely to count: skip its forward
        return tuple(out) + (0.0,) * (n - len(out))
    # the target after prompt + output[:pos] + tokens[:m] for m = len(out) ..: feed them after the cached prefix
    base = n_prompt + pos - 1  # the cache holds seq[:base]; the next input is seq[base] (the last committed)
    if cached[0] > base:
        target.truncate(base)
        cached[0] = base
    if cached[0] < base:
        with torch.no_grad():
            target.forward(seq[cached[0]:base], logits=False)
        cached[0] = base
    fed = [seq[base], *tokens[:-1]]
    with torch.no_grad():
        logits = target.forward(fed)
    target.truncate(base)
    if vocab_size is not None:
        logits = logits[:, :vocab_size]
    rows = warp(logits.float(), sampling)
    for j in range(len(out), len(tokens)):
        if pos + j >= target_len:
            break
        out.append(float(rows[j, tokens[j]]))
    return tuple(out)


def record_sampled_trace(
    target: Backend,
    prompt_ids: Sequence[int],
    target_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    *,
    draft: Backend | None = None,
    drafters: Mapping[str, Callable[[], Drafter]] | None = None,
    k_max: int = 16,
    vocab_size: int | None = None,
) -> SampledTrace:
    """Record a `SampledTrace` of a seeded target-only sampled run (module docstring).

    Args:
        target: the target's backend (its cache is reset before and after). prompt_ids: ``[P]`` (P >= 1).
        target_ids: ``[T]`` the run's sampled output. max_new_tokens: its budget. sampling: its warping
            (temperature > 0), which the speculative runs the trace stands for use too.
        draft: the draft model's backend, for its overlap (None: none recorded).
        drafters: name -> a factory of a fresh model-free drafter (driven along the output as the engine
            drives it: prefill with the prompt minus its last token, propose, rollback).
        k_max: the longest proposal asked (>= 1). vocab_size: logits columns past it are ignored.

    Returns:
        The trace. Cost: one target forward (and one draft forward) over prompt + output, plus one target
        forward per position where a drafter's proposal leaves the output past its first token.

    Raises:
        ValueError: greedy `sampling`, an empty prompt, more output than the budget, k_max < 1.
        ContextOverflowError: the sequence does not fit a model's context.
    """
    if sampling.greedy:
        raise ValueError("a sampled trace needs temperature > 0 (greedy runs have `record_trace`)")
    if not prompt_ids:
        raise ValueError("empty prompt")
    if len(target_ids) > max_new_tokens:
        raise ValueError(f"{len(target_ids)} output tokens exceed the budget of {max_new_tokens}")
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    prompt, out = list(prompt_ids), list(target_ids)
    if not out:
        return SampledTrace(tuple(prompt), (), max_new_tokens, sampling, () if draft is not None else None,
                            {name: () for name in drafters or {}})
    seq = prompt + out
    p = warp(teacher_forced(target, prompt, out, vocab_size).float(), sampling)  # [T, V]: row i predicts out[i]
    overlap = None
    if draft is not None:
        q = warp(teacher_forced(draft, prompt, out, vocab_size).float(), sampling)
        overlap = tuple(float(x) for x in torch.minimum(p, q).sum(dim=-1).tolist())
    chains: dict[str, tuple[tuple[float, ...], ...]] = {}
    for name, make in (drafters or {}).items():
        d = make()
        d.prefill(prompt[:-1])
        target.reset()
        cached = [0]
        per_pos = []
        for i in range(len(out)):
            committed = seq[:len(prompt) + i]
            k = min(k_max, max_new_tokens - i - 1)
            tokens = list(d.propose(committed, k, sampling, None).tokens) if k > 0 else []
            per_pos.append(_chain(target, seq, len(prompt), p, i, tokens, sampling, vocab_size, cached)
                           if tokens else ())
            d.rollback(seq[:len(prompt) + i + 1])
        target.reset()
        chains[name] = tuple(per_pos)
    return SampledTrace(tuple(prompt), tuple(out), max_new_tokens, sampling, overlap, chains)


def expected_run(trace: SampledTrace, drafter: str, k: int, round_s: Callable[[int], float] | None = None
                 ) -> ExpectedRun:
    """The expected fixed-K run of `drafter` over `trace` (module docstring), by dynamic programming over the
    output position: from position i a round drafts kk = min(K, budget - i - 1, the proposal's length)
    tokens, accepts exactly j of them with probability a_1 ... a_j (1 - a_{j+1}) (all kk: a_1 ... a_kk) and
    moves to i + j + 1.

    Args:
        trace: a `SampledTrace`. drafter: `DRAFT_MODEL` or a recorded drafter's name. k: K >= 1.
        round_s: seconds of a round that drafted kk tokens (``round_s(0)``: a plain step), for the expected
            decode seconds; None: NaN.

    Raises:
        ValueError: k < 1. KeyError: a drafter the trace did not record.
    """
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    n = len(trace.target_ids)
    # value[i] = (rounds, drafted, accepted, seconds, drafting rounds) expected from position i to the end
    value = [(0.0, 0.0, 0.0, 0.0, 0.0)] * (n + 1)
    for i in range(n - 1, -1, -1):
        probs = trace.acceptance(drafter, i, max(0, min(k, trace.max_new_tokens - i - 1)))
        kk = len(probs)
        here = [1.0, float(kk), 0.0, round_s(kk) if round_s is not None else float("nan"), float(kk > 0)]
        survive = 1.0  # P(the first j tokens accepted)
        for j in range(kk + 1):
            stop = survive * (1.0 - probs[j]) if j < kk else survive  # P(exactly j accepted)
            if stop > 0.0:
                later = value[min(n, i + j + 1)]
                here = [h + stop * x for h, x in zip(here, later, strict=True)]
                here[2] += stop * j
            if j < kk:
                survive *= probs[j]
        value[i] = tuple(here)
    r, d, a, s, dr = value[0]
    return ExpectedRun(r, d, a, s, n, dr)


def simulate_run(trace: SampledTrace, drafter: str, policy, rng: random.Random, live: Drafter | None = None
                 ) -> list[ReplayRound]:
    """One draw of a run of `drafter` under K policy `policy` over `trace`, for what an expectation cannot give:
    a policy's K depends on the rounds it has seen. Each round at output position i asks the policy for K,
    drafts kk = min(K, budget - i - 1, the proposal's length) tokens, accepts them in turn with their recorded
    probabilities (`SampledTrace.acceptance`; the first rejection ends the round), commits the accepted tokens
    plus one, feeds the policy the round and moves on along the seeded output (the assumption of
    `expected_run`). Averaged over draws it is the policy's expected run; for a fixed K it converges to
    `expected_run`'s.

    A drafter that chooses per round between the draft model and a model-free drafter (the mixed drafter) is
    driven as the engine drives it (`live`: prefill, propose on prompt + output[:i], rollback with the
    committed sequence along the output), its draft model a `specdec.drafters.traced.SampledModelDrafter` on
    the same `rng`: a round the draft model drafted has its fate drawn there and written into its tokens (the
    output's tokens while accepted), a round of the model-free drafter (its `Draft.source`) reads that
    drafter's recorded chain, cut to the tokens it proposed (a proposal longer than the recorded one is
    drafted as the recorded one's length: the chain holds no more). Its model-free drafter learns from the
    output, as the chain's recording drafter did.

    Args:
        trace: a `SampledTrace`. drafter: `DRAFT_MODEL` or a recorded drafter's name (with `live`: ignored).
        policy: a fresh `specdec.policies` K policy (started here; a confidence stop is not applied).
        rng: the draw's random source.
        live: the driven drafter (None: `drafter`'s recorded probabilities alone).

    Returns:
        The rounds (`specdec.engine.traces.ReplayRound`); their emitted tokens sum to the output's length.

    Raises:
        KeyError: a drafter the trace did not record.
    """
    n = len(trace.target_ids)
    defers = drafter == DRAFT_MODEL if live is None else getattr(live, "defers_prefill", False)
    policy.start(prefill_tokens=len(trace.prompt_ids) if defers else None, budget=trace.max_new_tokens)
    prompt = list(trace.prompt_ids)
    if live is not None:
        live.prefill(prompt[:-1])
    rounds: list[ReplayRound] = []
    pos = 0
    while pos < n:
        kk = max(0, min(int(policy.next_round().k), trace.max_new_tokens - pos - 1))
        by_model = None
        if live is None:
            probs = trace.acceptance(drafter, pos, kk)
        else:
            draft = live.propose(prompt + list(trace.target_ids[:pos]), kk, trace.sampling, None) if kk else Draft([])
            by_model = bool(live.drafted_by_model) if kk else None  # `specdec.engine.traces.ReplayRound.by_model`
            probs = ([float(t == x) for t, x in zip(draft.tokens, trace.target_ids[pos:])] if by_model
                     else trace.acceptance(draft.source, pos, len(draft.tokens)) if draft.tokens else [])
        accepted = 0
        while accepted < len(probs) and rng.random() < probs[accepted]:
            accepted += 1
        emitted = min(accepted + 1, n - pos)
        r = ReplayRound(len(probs), min(accepted, emitted), emitted, by_model=by_model)
        rounds.append(r)
        policy.observe(r.as_record())
        pos += emitted
        if live is not None:
            live.rollback(prompt + list(trace.target_ids[:pos]))
    return rounds
