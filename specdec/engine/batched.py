"""Batched decoding: B prompts at once, target-only or speculative, every row with its own accepted length.

The loop is `specdec.engine.decoding`'s, run for B rows in lockstep: each round, one K for the whole batch (a
`specdec.policies.batch.BatchKPolicy`), clamped per row to the row's budget, context and drafter supply; the
drafter proposes per row; ONE target forward scores every row's ``[last, d1 .. dK_i]``; each row is
verified on its own (greedy or speculative sampling, Leviathan et al. 2023, Alg. 1) and commits its own
block; ONE ``truncate`` call rolls every row back to its committed length minus the last token (the cache
invariant of `specdec.runtimes.base`). A row that ends (EOS or its budget) is dropped from both caches
(`BatchedBackend.keep`), freeing its slot, and the others go on.

Per row, the result is the `GenerationResult` single-sequence decoding would give: greedy tokens equal
`specdec.engine.decoding.autoregressive_generate`'s on the same target (up to the kernels' rounding of a larger
batch), and with per-row seeds sampled tokens equal `specdec.engine.decoding.speculative_generate`'s (each row
has its own `torch.Generator`, drawn in the single-sequence order). Round timings (``draft_s``,
``forward_s``, ``verify_s``, ``other_s``) are those of the batch round the row took part in: they are
shared by every row of that round, so per-row times must not be summed across rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdec.drafters.base import BatchedDrafter, Draft
from specdec.engine.decoding import cut_block  # one rule for where a round's block ends (EOS kept, budget)
from specdec.engine.metrics import GenerationResult, RoundRecord
from specdec.engine.sampling import SamplingParams, sample, warp
from specdec.engine.verification import greedy_verify, stochastic_verify_logits
from specdec.policies.batch import BatchKPolicy, FixedBatchK
from specdec.runtimes.base import BatchedBackend, ContextOverflowError

__all__ = ["generate_batch"]

Clock = Callable[[], float]
GREEDY = SamplingParams()


def _generators(sampling: SamplingParams, seed, n: int, device) -> list[torch.Generator | None]:
    if sampling.greedy:
        return [None] * n
    seeds = [int(seed or 0) + i for i in range(n)] if seed is None or isinstance(seed, int) else list(seed)
    if len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
    out = []
    for s in seeds:
        g = torch.Generator(device=device)
        g.manual_seed(int(s))
        out.append(g)
    return out


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
) -> list[GenerationResult]:
    """Decode B = ``len(prompts)`` prompts of any lengths together: target-only or speculative.

    Without a `drafter` every round is one target forward of one token per live row (the batched
    baseline, K = 0, method ``"baseline"``). With one, each round drafts up to K tokens per row (K from `k`
    or `policy`, clamped per row to its remaining budget minus the recovered/bonus token, its context and
    the drafter's `max_k`), verifies every row's ``K_i + 1`` positions in one target forward, and commits
    per row (method ``"speculative"``). Rows stop on their own (an id of `eos_ids`, kept in the output, or
    their budget) and leave the batch at once.

    Args:
        target: the target's `BatchedBackend` (its rows are replaced).
        prompts: B >= 1 non-empty token-id lists (B <= ``target.max_rows`` when set).
        max_new_tokens: budget of new tokens, one for every row or one per row (>= 0; a row with 0 runs
            nothing and finishes ``"empty"``).
        drafter: a `BatchedDrafter` (`BatchedModelDrafter`, `PerRowDrafters`), or None for target-only.
        k, policy: fixed K (>= 1) or a `specdec.policies.batch.BatchKPolicy`; exactly one with a drafter, neither
            without.
        sampling: greedy by default; temperature/top-k/top-p otherwise (the same warp for p and q).
        eos_ids: ids that end a row.
        vocab_size: shared vocabulary; logits columns past it are never chosen.
        seed: sampling seeds: an int s gives row i the seed s + i, a sequence gives one per row (default 0).
            Row i's `torch.Generator` is used for its drafts and its verification only, in the order of
            `specdec.engine.decoding.speculative_generate` (and `autoregressive_generate` without a drafter), so
            a row with seed s samples what a single-sequence run with seed s samples.
        clock: seconds; injectable for tests.

    Returns:
        One `GenerationResult` per prompt, in prompt order, with one `RoundRecord` per batch round the row
        took part in. ``prefill_s`` is the batch prefill; ``ttft_s`` and ``total_s`` run from the batch
        start to the row's first token and to the row's end; round times are the batch round's.

    Raises:
        ValueError: no prompts, an empty prompt, a negative budget, budgets or seeds of the wrong length,
            more rows than ``target.max_rows``, K < 1, or `k`/`policy` given wrongly.
        ContextOverflowError: a prompt plus its budget exceeds the target's context.
    """
    b = len(prompts)
    if b == 0:
        raise ValueError("no prompts: a batch needs at least one")
    if target.max_rows is not None and b > target.max_rows:
        raise ValueError(f"{b} prompts exceed the {target.max_rows} rows the target backend was built for")
    budgets = [int(max_new_tokens)] * b if isinstance(max_new_tokens, int) else [int(n) for n in max_new_tokens]
    if len(budgets) != b:
        raise ValueError(f"got {len(budgets)} budgets for {b} prompts")
    for i, (p, n) in enumerate(zip(prompts, budgets, strict=True)):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: nothing to continue from")
        if n < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {n} for prompt {i}")
        if len(p) + n > target.max_length:
            raise ContextOverflowError(
                f"prompt {i} ({len(p)} tokens) + max_new_tokens ({n}) exceeds the target's context of "
                f"{target.max_length} tokens"
            )
    if drafter is None:
        if k is not None or policy is not None:
            raise ValueError("k and policy need a drafter")
        policy = FixedBatchK(1)  # never consulted
    else:
        if (k is None) == (policy is None):
            raise ValueError("give exactly one of k and policy")
        if policy is None:
            policy = FixedBatchK(k)
    eos = frozenset(eos_ids)
    vocab = vocab_size or target.vocab_size
    gens = _generators(sampling, seed, b, target.device)
    method = "baseline" if drafter is None else "speculative"
    results = [GenerationResult(method, list(p), [], "empty") for p in prompts]
    live = [i for i in range(b) if budgets[i] > 0]  # original row ids, in batch order
    if not live:
        return results

    def now() -> float:
        target.synchronize()
        return clock()

    t0 = now()
    policy.start(b, context_lens=[len(p) for p in prompts], budgets=budgets, timed=True)
    committed = {i: list(prompts[i]) for i in live}
    target.prefill([committed[i][:-1] for i in live])
    if drafter is not None:
        drafter.prefill([committed[i][:-1] for i in live])
    t_prefill = now()
    for i in live:
        results[i].prefill_s = t_prefill - t0
    while live:
        t_start = now()
        remaining = [budgets[i] - len(results[i].token_ids) for i in live]
        if drafter is None:
            k_req, alpha_est = 0, None
            ks = [0] * len(live)
            drafts = [Draft([], None) for _ in live]
        else:
            supply = drafter.max_k([len(committed[i]) for i in live])
            caps = [max(0, min(rem - 1, target.max_length - len(committed[i]), s))
                    for i, rem, s in zip(live, remaining, supply, strict=True)]
            # a free drafter says what each row has to draft before the policy chooses K (policies with a max_k)
            policy_max = getattr(policy, "max_k", None)
            available = None
            if policy_max is not None and getattr(drafter, "free", False):
                available = drafter.preview([committed[i] for i in live], [min(c, policy_max) for c in caps],
                                            sampling)
            k_req = max(0, int(policy.next_k(live, available)))
            alpha_est = policy.alpha_estimate(live)
            ks = [min(k_req, c) for c in caps]
            drafts = drafter.propose([committed[i] for i in live], ks, sampling, [gens[i] for i in live])
        t_draft = now()
        logits = target.forward([[committed[i][-1]] + d.tokens for i, d in zip(live, drafts, strict=True)])
        t_forward = now()
        verdicts = []
        for j, i in enumerate(live):
            rows = logits[j][:, :vocab]
            d = drafts[j]
            if sampling.greedy:
                verdicts.append(greedy_verify(d.tokens, rows))
            elif drafter is None:
                verdicts.append(None)
            else:
                verdicts.append(stochastic_verify_logits(d.tokens, d.probs, rows, sampling, gens[i]))
        t_verify = now()
        blocks, ended = [], []
        for j, i in enumerate(live):
            v = verdicts[j]
            if v is None:  # target-only sampling: one token from the row's generator, as the baseline
                block_raw = [sample(warp(logits[j][0, :vocab], sampling), gens[i])]
            else:
                block_raw = v.committed_tokens(drafts[j].tokens)
            block, hit_eos = cut_block(block_raw, eos, remaining[j])
            committed[i].extend(block)
            results[i].token_ids.extend(block)
            blocks.append(block)
            ended.append("eos" if hit_eos else ("length" if len(results[i].token_ids) >= budgets[i] else None))
        target.truncate([len(committed[i]) - 1 for i in live])
        if drafter is not None:
            drafter.rollback([committed[i] for i in live])
        t_end = now()
        for j, i in enumerate(live):
            v, block = verdicts[j], blocks[j]
            if v is None:
                v_acc, flags, kind = 0, (), "bonus"
            else:
                v_acc, flags, kind = v.num_accepted, v.accept_flags, v.next_kind
            record = RoundRecord(
                k=len(drafts[j].tokens),
                num_accepted=min(v_acc, len(block)),
                num_accepted_raw=v_acc,
                accept_flags=flags,
                next_kind=kind,
                num_emitted=len(block),
                draft_s=t_draft - t_start,
                verify_s=t_verify - t_draft,
                forward_s=t_forward - t_draft,
                other_s=t_end - t_verify,
                k_requested=k_req if drafter is not None else 0,
                alpha_estimate=alpha_est,
            )
            results[i].rounds.append(record)
            if drafter is not None:
                policy.observe(i, record)
            if len(results[i].rounds) == 1:
                results[i].ttft_s = t_end - t0
            if ended[j]:
                results[i].finish_reason = ended[j]
                results[i].total_s = t_end - t0
        keep = [j for j in range(len(live)) if not ended[j]]
        if len(keep) < len(live):
            live = [live[j] for j in keep]
            target.keep(keep)
            if drafter is not None:
                drafter.keep(keep)
    return results
