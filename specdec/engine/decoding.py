"""The decoding loop: B >= 1 prompts at once, target-only or speculative, every row with its own accepted
length (`generate_batch`); one sequence is B = 1 of it (`speculative_generate`, `autoregressive_generate`).

Each round: the K policy chooses one K for the batch (`specdec.policies.batch.BatchKPolicy`; a
single-sequence `specdec.policies.base.KPolicy` is its one-row form, `RowPolicy`), clamped per row to the
row's budget, context and drafter supply; the drafter proposes per row; ONE target forward scores every
row's ``[last, d1 .. dK_i]``; each row is verified on its own (greedy, or speculative sampling: Leviathan et
al. 2023, Alg. 1; Chen et al. 2023, Alg. 2) and commits its own block; ONE ``truncate`` call rolls every row
back to its committed length minus the last token. A row that ends (EOS or its budget) leaves both caches
(`BatchedBackend.keep`), and the others go on. With K = 0 a round is one ordinary decoding step, which is all
the baseline does: the baseline runs exactly the target code the speculative loop runs.

Cache invariant (llama.cpp ``speculative-simple``): each cache holds the committed sequence minus its last
token. Prefill feeds ``prompt[:-1]``; every round feeds ``[last, d1 .. dK]``; after verification
``truncate(len(committed) - 1)`` is the single rollback call.

Per row, the result is what single-sequence decoding gives: greedy tokens equal target-only greedy decoding
(up to the kernels' rounding of a larger batch), and with per-row seeds sampled tokens equal the
single-sequence run's (each row has its own `torch.Generator`, drawn in the single-sequence order). Round
timings (``draft_s``, ``forward_s``, ``verify_s``, ``other_s``) are those of the batch round the row took part
in: shared by every row of that round, so they must not be summed across rows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import torch

from specdec.core.metrics import GenerationResult, RoundRecord
from specdec.core.sampling import SamplingParams, sample, warp
from specdec.core.verification import greedy_verify, stochastic_verify_logits, synthetic_verify
from specdec.drafters.base import BatchedDrafter, Draft, Drafter, PerRowDrafters
from specdec.policies.base import FixedK, KPolicy, RoundPlan
from specdec.policies.batch import BatchKPolicy, FixedBatchK
from specdec.runtimes.base import Backend, BatchedBackend, ContextOverflowError, OneRow

__all__ = ["GREEDY", "RowPolicy", "autoregressive_generate", "check_inputs", "cut_block", "generate_batch",
           "speculative_generate"]

Clock = Callable[[], float]
GREEDY = SamplingParams()


def check_inputs(prompt_ids: Sequence[int], max_new_tokens: int, max_length: int) -> None:
    """Refuse a prompt the target cannot continue.

    Raises:
        ValueError: an empty prompt or a negative budget. ContextOverflowError: prompt + budget exceed
            `max_length`.
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: nothing to continue from")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if len(prompt_ids) + max_new_tokens > max_length:
        raise ContextOverflowError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
            f"context of {max_length} tokens"
        )


def cut_block(block: list[int], eos_ids: frozenset[int], remaining: int) -> tuple[list[int], bool]:
    """Cut a round's committed block at the first EOS (kept) and at the token budget."""
    out = []
    for t in block[:remaining]:
        out.append(t)
        if t in eos_ids:
            return out, True
    return out, False


class RowPolicy:
    """A single-sequence `KPolicy` as the `BatchKPolicy` of its one row: the policy the loop runs at B = 1.

    `start` passes the row's deferred draft prefill (its context length, when the loop says the drafter
    defers it) and its budget; `next_round` is the policy's own plan (K and its confidence stop); `observe`
    gives it the row's record; `note` is the policy's note."""

    def __init__(self, policy: KPolicy) -> None:
        self.policy = policy

    def start(self, n_rows: int, *, context_lens: Sequence[int] | None = None,
              budgets: Sequence[int] | None = None, timed: bool = False) -> None:
        if n_rows != 1:
            raise ValueError(f"a single-sequence policy runs one row, got {n_rows}")
        self.policy.start(prefill_tokens=context_lens[0] if context_lens else None,
                          budget=budgets[0] if budgets else None)

    def next_round(self, rows: Sequence[int], available: Sequence[int] | None = None) -> RoundPlan:
        return self.policy.next_round()

    def alpha_estimate(self, rows: Sequence[int]) -> float | None:
        return self.policy.alpha_estimate()

    def observe(self, row: int, record: RoundRecord) -> None:
        self.policy.observe(record)

    def note(self) -> str | None:
        note = getattr(self.policy, "note", None)
        return note() if callable(note) else None


def _seeds(seed, n: int) -> list[int]:
    """Row seeds: an int (or None, 0) s gives row i the seed s + i; a sequence gives one per row."""
    seeds = [int(seed or 0) + i for i in range(n)] if seed is None or isinstance(seed, int) else list(seed)
    if len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
    return seeds


def _generators(sampling: SamplingParams, seed, n: int, device) -> list[torch.Generator | None]:
    if sampling.greedy:
        return [None] * n
    out = []
    for s in _seeds(seed, n):
        g = torch.Generator(device=device)
        g.manual_seed(int(s))
        out.append(g)
    return out


def _checked(target: BatchedBackend, prompts, max_new_tokens, drafter, k, policy):
    """The budgets and the policy of a call to `generate_batch`, its arguments checked."""
    b = len(prompts)
    if b == 0:
        raise ValueError("no prompts: a batch needs at least one")
    if target.max_rows is not None and b > target.max_rows:
        raise ValueError(f"{b} prompts exceed the {target.max_rows} rows the target backend was built for")
    budgets = [int(max_new_tokens)] * b if isinstance(max_new_tokens, int) else [int(n) for n in max_new_tokens]
    if len(budgets) != b:
        raise ValueError(f"got {len(budgets)} budgets for {b} prompts")
    for i, (p, n) in enumerate(zip(prompts, budgets, strict=True)):
        try:
            check_inputs(p, n, target.max_length)
        except ValueError as exc:
            raise type(exc)(f"prompt {i}: {exc}" if b > 1 else str(exc)) from None
    if drafter is None:
        if k is not None or policy is not None:
            raise ValueError("k and policy need a drafter")
        return budgets, FixedBatchK(1)  # never consulted
    if (k is None) == (policy is None):
        raise ValueError("give exactly one of k and policy")
    return budgets, policy if policy is not None else FixedBatchK(k)


def generate_batch(
    target: BatchedBackend,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    *,
    drafter: BatchedDrafter | None = None,
    k: int | None = None,
    policy: BatchKPolicy | None = None,
    sampling: SamplingParams = GREEDY,
    eos_ids: frozenset[int] | set[int] = frozenset(),
    vocab_size: int | None = None,
    seed: int | Sequence[int] | None = None,
    clock: Clock = time.perf_counter,
    pad_to: Callable[[int], int] | None = None,
    synthetic: Sequence[float] | None = None,
) -> list[GenerationResult]:
    """Decode B = ``len(prompts)`` prompts of any lengths together: target-only or speculative.

    Without a `drafter` every round is one target forward of one token per live row (the baseline, K = 0,
    method ``"baseline"``). With one, each round drafts up to K tokens per row (K from `k` or `policy`,
    clamped per row to its remaining budget minus the recovered/bonus token, its context and the drafter's
    `max_k`), verifies every row's ``K_i + 1`` positions in one target forward, and commits per row (method
    ``"speculative"``). Rows stop on their own (an id of `eos_ids`, kept in the output, or their budget).

    Args:
        target: the target's `BatchedBackend` (its rows are replaced; a single-sequence backend is
            `specdec.runtimes.base.OneRow`).
        prompts: B >= 1 non-empty token-id lists (B <= ``target.max_rows`` when set).
        max_new_tokens: budget of new tokens, one for every row or one per row (>= 0; a row with 0 runs
            nothing and finishes ``"empty"``).
        drafter: a `BatchedDrafter` (`specdec.drafters.model.BatchedModelDrafter`,
            `specdec.drafters.base.PerRowDrafters`), or None for target-only.
        k, policy: fixed K (>= 1) or a `BatchKPolicy`; exactly one with a drafter, neither without.
        sampling: greedy by default; temperature/top-k/top-p otherwise (the same warp for p and q).
        eos_ids: ids that end a row. vocab_size: shared vocabulary; logits columns past it are never chosen.
        seed: sampling seeds: an int s gives row i the seed s + i, a sequence gives one per row (default 0);
            row i's generator serves its drafts and its verification only.
        clock: seconds; injectable for tests.
        pad_to: each row's forward padded to ``pad_to(m)`` tokens for its m = K_i + 1 real ones (filler:
            copies of the last real token, whose logits are dropped and whose cache entries the round's
            truncate removes; never past the context), for a runtime whose measured curve makes a wider
            forward cheaper (`specdec.core.costs.CostCurve.padded_n`). None: no padding.
        synthetic: timing only, greedy only: draft position i is accepted with conditional probability
            ``synthetic[i]`` whatever its token (`specdec.core.verification.synthetic_verify`, seeded per row
            by `seed`), as llama.cpp's ``--spec-synth-rates``; the rounds cost what real ones do, but the
            output is not the target's. None: real verification.

    Returns:
        One `GenerationResult` per prompt, in prompt order, with one `RoundRecord` per round the row took part
        in (``n_forward`` set when padded). ``prefill_s`` is the batch prefill; ``ttft_s`` and ``total_s`` run
        from the batch start to the row's first token and to its end; ``policy_note`` is the policy's note.

    Raises:
        ValueError: no prompts, an empty prompt, a negative budget, budgets or seeds of the wrong length,
            more rows than ``target.max_rows``, K < 1, `k`/`policy` given wrongly, a `pad_to` that returns
            fewer tokens than it was given, or `synthetic` with sampling or with a probability outside [0, 1].
        ContextOverflowError: a prompt plus its budget exceeds the target's context.
    """
    budgets, policy = _checked(target, prompts, max_new_tokens, drafter, k, policy)
    b = len(prompts)
    rule = None
    if synthetic is not None:
        if not sampling.greedy or not all(0.0 <= float(p) <= 1.0 for p in synthetic):
            raise ValueError("synthetic acceptance takes greedy decoding and probabilities in [0, 1]")
        rule = ([float(p) for p in synthetic], [random.Random(s) for s in _seeds(seed, b)])
    loop = _Loop(target, drafter, policy, sampling, frozenset(eos_ids), vocab_size or target.vocab_size,
                 _generators(sampling, seed, b, target.device), clock, pad_to, rule)
    return loop.run(prompts, budgets)


class _Loop:
    """One call of `generate_batch`: its settings and the rounds of its live rows."""

    def __init__(self, target, drafter, policy, sampling, eos, vocab, gens, clock, pad_to, synthetic) -> None:
        self.target, self.drafter, self.policy, self.sampling = target, drafter, policy, sampling
        self.eos, self.vocab, self.gens, self.clock, self.pad_to = eos, vocab, gens, clock, pad_to
        self.synthetic: tuple[list[float], list[random.Random]] | None = synthetic  # (probabilities, row rngs)

    def now(self) -> float:
        self.target.synchronize()
        return self.clock()

    def run(self, prompts, budgets: list[int]) -> list[GenerationResult]:
        method = "baseline" if self.drafter is None else "speculative"
        self.results = [GenerationResult(method, list(p), [], "empty") for p in prompts]
        self.budgets = budgets
        live = [i for i in range(len(prompts)) if budgets[i] > 0]  # original row ids, in batch order
        if not live:
            return self.results
        t0 = self.t0 = self.now()
        defers = getattr(self.drafter, "defers_prefill", False)
        self.policy.start(len(prompts), context_lens=[len(p) for p in prompts] if defers else None,
                          budgets=budgets, timed=True)
        self.committed = {i: list(prompts[i]) for i in live}
        self.target.prefill([self.committed[i][:-1] for i in live])
        if self.drafter is not None:
            self.drafter.prefill([self.committed[i][:-1] for i in live])
        t_prefill = self.now()
        for i in live:
            self.results[i].prefill_s = t_prefill - t0
        while live:
            live = self.round(live)
        note = getattr(self.policy, "note", None) if self.drafter is not None else None
        text = note() if callable(note) else None
        for r in self.results:
            r.policy_note = text
        return self.results

    def drafts(self, live: list[int]) -> tuple[int, float | None, float | None, list[Draft]]:
        """``(K asked, alpha estimate, confidence stop, drafts)`` of a round."""
        if self.drafter is None:
            return 0, None, None, [Draft([], None) for _ in live]
        c = self.committed
        remaining = [self.budgets[i] - len(self.results[i].token_ids) for i in live]
        supply = self.drafter.max_k([len(c[i]) for i in live])
        caps = [max(0, min(rem - 1, self.target.max_length - len(c[i]), s))
                for i, rem, s in zip(live, remaining, supply, strict=True)]
        # a free drafter says what each row has to draft before the policy chooses K (policies with a max_k)
        policy_max = getattr(self.policy, "max_k", None)
        available = None
        if policy_max is not None and getattr(self.drafter, "free", False):
            available = self.drafter.preview([c[i] for i in live], [min(x, policy_max) for x in caps], self.sampling)
        plan = self.policy.next_round(live, available)
        k_req = max(0, int(plan.k))
        alpha = self.policy.alpha_estimate(live)
        ks = [min(k_req, x) for x in caps]
        drafts = self.drafter.propose([c[i] for i in live], ks, self.sampling, [self.gens[i] for i in live],
                                      plan.min_confidence)
        return k_req, alpha, plan.min_confidence, drafts

    def fed(self, i: int, d: Draft) -> list[int]:
        """Row i's tokens of this round's forward: ``[last, d1 .. dK]``, padded by `pad_to`."""
        block_in = [self.committed[i][-1]] + d.tokens
        if self.pad_to is None:
            return block_in
        n = int(self.pad_to(len(block_in)))
        if n < len(block_in):
            raise ValueError(f"pad_to({len(block_in)}) = {n}: a padded forward must hold the {len(block_in)} real "
                             "tokens")
        n = min(n, self.target.max_length - (len(self.committed[i]) - 1))  # never past the context
        return block_in + [block_in[-1]] * (n - len(block_in))

    def verdicts(self, live, drafts, logits):
        out = []
        for j, i in enumerate(live):
            rows = logits[j][: len(drafts[j].tokens) + 1, : self.vocab]  # the filler rows dropped
            d = drafts[j]
            if self.synthetic is not None and self.drafter is not None:
                out.append(synthetic_verify(d.tokens, rows, self.synthetic[0], self.synthetic[1][i]))
            elif self.sampling.greedy:
                out.append(greedy_verify(d.tokens, rows))
            elif self.drafter is None:
                out.append(None)
            else:
                out.append(stochastic_verify_logits(d.tokens, d.probs, rows, self.sampling, self.gens[i]))
        return out

    def round(self, live: list[int]) -> list[int]:
        """One round of the `live` rows; returns the rows still live after it."""
        t_start = self.now()
        k_req, alpha, _, drafts = self.drafts(live)
        t_draft = self.now()
        fed = [self.fed(i, d) for i, d in zip(live, drafts, strict=True)]
        logits = self.target.forward(fed)
        t_forward = self.now()
        verdicts = self.verdicts(live, drafts, logits)
        t_verify = self.now()
        blocks, ended = [], []
        for j, i in enumerate(live):
            v = verdicts[j]
            if v is None:  # target-only sampling: one token from the row's generator, as the baseline
                raw = [sample(warp(logits[j][0, : self.vocab], self.sampling), self.gens[i])]
            else:
                raw = v.committed_tokens(drafts[j].tokens)
            remaining = self.budgets[i] - len(self.results[i].token_ids)
            block, hit_eos = cut_block(raw, self.eos, remaining)
            self.committed[i].extend(block)
            self.results[i].token_ids.extend(block)
            blocks.append(block)
            ended.append("eos" if hit_eos else ("length" if len(self.results[i].token_ids) >= self.budgets[i]
                                                else None))
        self.target.truncate([len(self.committed[i]) - 1 for i in live])
        if self.drafter is not None:
            self.drafter.rollback([self.committed[i] for i in live])
        t_end = self.now()
        times = (t_start, t_draft, t_forward, t_verify, t_end)
        for j, i in enumerate(live):
            self.record(i, drafts[j], verdicts[j], blocks[j], len(fed[j]), k_req, alpha, times, ended[j])
        keep = [j for j in range(len(live)) if not ended[j]]
        if len(keep) < len(live):
            self.target.keep(keep)
            if self.drafter is not None:
                self.drafter.keep(keep)
        return [live[j] for j in keep]

    def record(self, i, d: Draft, v, block, n_fed, k_req, alpha, times, ended) -> None:
        t_start, t_draft, t_forward, t_verify, t_end = times
        acc, flags, kind = (0, (), "bonus") if v is None else (v.num_accepted, v.accept_flags, v.next_kind)
        record = RoundRecord(
            k=len(d.tokens),
            # counts stop where the output stops: drafts accepted after an EOS never reached it
            num_accepted=min(acc, len(block)), num_accepted_raw=acc, accept_flags=flags, next_kind=kind,
            num_emitted=len(block), draft_s=t_draft - t_start, verify_s=t_verify - t_draft,
            forward_s=t_forward - t_draft, other_s=t_end - t_verify, k_requested=k_req, alpha_estimate=alpha,
            n_forward=n_fed if self.pad_to is not None else None, draft_stopped=d.stopped, draft_source=d.source,
        )
        r = self.results[i]
        r.rounds.append(record)
        if self.drafter is not None:
            self.policy.observe(i, record)
        if len(r.rounds) == 1:
            r.ttft_s = t_end - self.t0
        if ended:
            r.finish_reason = ended
            r.total_s = t_end - self.t0


def speculative_generate(
    target: Backend,
    drafter: Drafter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    k: int | None = None,
    policy: KPolicy | None = None,
    sampling: SamplingParams = GREEDY,
    eos_ids: frozenset[int] | set[int] = frozenset(),
    vocab_size: int | None = None,
    seed: int | None = None,
    clock: Clock = time.perf_counter,
    pad_to: Callable[[int], int] | None = None,
    synthetic: Sequence[float] | None = None,
) -> GenerationResult:
    """Speculative decoding of one sequence: `generate_batch` with B = 1 on the single-sequence backend
    (`specdec.runtimes.base.OneRow`), the drafter as its one row and the policy as its one-row form
    (`RowPolicy`).

    Greedy output is token-identical to `autoregressive_generate` on the same target; sampled output follows
    the target's (warped) distribution exactly (Leviathan et al. 2023, Thm. 1).

    Args:
        target: the target backend (its cache is reset). drafter: proposes tokens (any
            `specdec.drafters.base.Drafter`). prompt_ids: ``[prompt_len]`` token ids, non-empty.
        max_new_tokens: budget of new tokens; never exceeded. 0 -> no forward at all.
        k: fixed K (>= 1); or give `policy` instead (`specdec.policies`).
        sampling, eos_ids, vocab_size, seed, clock, pad_to, synthetic: as `generate_batch`.

    Returns:
        A `GenerationResult` with one `RoundRecord` per target forward.

    Raises:
        ValueError: empty prompt, negative budget, K < 1, both/neither of `k` and `policy`, a bad `pad_to`.
        ContextOverflowError: prompt + budget exceeds the target's context. A draft with a shorter context
            never raises: a round where it has no room is a plain target step (K = 0).
    """
    if (k is None) == (policy is None):
        raise ValueError("give exactly one of k and policy")
    return generate_batch(OneRow(target), [prompt_ids], max_new_tokens, drafter=PerRowDrafters.one(drafter),
                          policy=RowPolicy(policy if policy is not None else FixedK(k)), sampling=sampling,
                          eos_ids=eos_ids, vocab_size=vocab_size, seed=seed, clock=clock, pad_to=pad_to,
                          synthetic=synthetic)[0]


def autoregressive_generate(
    target: Backend,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    sampling: SamplingParams = GREEDY,
    eos_ids: frozenset[int] | set[int] = frozenset(),
    vocab_size: int | None = None,
    seed: int | None = None,
    clock: Clock = time.perf_counter,
    pad_to: Callable[[int], int] | None = None,
) -> GenerationResult:
    """Target-only decoding of one sequence, one token per forward: the baseline and the oracle
    (`generate_batch` without a drafter, B = 1). `pad_to` pads each 1-token step as `generate_batch` pads
    (causal attention keeps the real row's logits those of a 1-token forward, up to kernel rounding).

    Raises:
        ValueError: empty prompt, negative budget, or ``pad_to(1) < 1``. ContextOverflowError: prompt +
            budget > context.
    """
    return generate_batch(OneRow(target), [prompt_ids], max_new_tokens, sampling=sampling, eos_ids=eos_ids,
                          vocab_size=vocab_size, seed=seed, clock=clock, pad_to=pad_to)[0]
