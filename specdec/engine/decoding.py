"""Decoding loops: target-only (`autoregressive_generate`) and speculative (`speculative_generate`).

Both use the same `Backend` objects and the same cache invariant, so the baseline runs exactly the target
code the speculative loop runs (the fair comparison: the same code, with and without drafting).

Cache invariant (llama.cpp ``speculative-simple``): each cache holds the committed sequence minus its last
token. Prefill feeds ``prompt[:-1]``; every round then feeds ``[last, d1 .. dK]`` to the target in ONE
forward, giving logits ``[K+1, vocab]``; after verification ``truncate(len(committed) - 1)`` is the single
rollback call. With K = 0 a round is one ordinary decoding step, which is all the baseline does.

Speculative decoding follows Leviathan et al. 2023 (Alg. 1) and Chen et al. 2023 (Alg. 2).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from specdec.drafters.base import Drafter
from specdec.engine.metrics import GenerationResult, RoundRecord
from specdec.engine.sampling import SamplingParams, sample, warp
from specdec.engine.verification import greedy_verify, stochastic_verify_logits
from specdec.policies.base import FixedK, KPolicy
from specdec.runtimes.base import Backend, ContextOverflowError

Clock = Callable[[], float]
GREEDY = SamplingParams()


def check_inputs(prompt_ids: Sequence[int], max_new_tokens: int, max_length: int) -> None:
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: nothing to continue from")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if len(prompt_ids) + max_new_tokens > max_length:
        raise ContextOverflowError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the target's "
            f"context of {max_length} tokens"
        )


def _make_generator(sampling: SamplingParams, seed: int | None, device) -> torch.Generator | None:
    if sampling.greedy:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(0 if seed is None else int(seed))
    return g


def cut_block(block: list[int], eos_ids: frozenset[int], remaining: int) -> tuple[list[int], bool]:
    """Cut a round's committed block at the first EOS (kept) and at the token budget."""
    out = []
    for t in block[:remaining]:
        out.append(t)
        if t in eos_ids:
            return out, True
    return out, False


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
    """Target-only decoding, one token per forward: the baseline and the oracle.

    Args:
        target: the target backend (its cache is reset).
        prompt_ids: ``[prompt_len]`` token ids, non-empty.
        max_new_tokens: budget of new tokens (0 -> no forward at all).
        sampling: greedy by default; temperature/top-k/top-p otherwise.
        eos_ids: ids that end generation (the EOS is kept in the output).
        vocab_size: shared vocabulary; logits columns past it are never chosen.
        seed: seeds the `torch.Generator` used for sampling (same seed, same tokens).
        clock: seconds; injectable for tests.
        pad_to: each step's forward padded to ``pad_to(1)`` tokens (the last token repeated as filler; the
            filler rows' logits are dropped and their cache entries truncated), for a runtime whose measured
            cost curve makes a 2-token forward cheaper than a 1-token one (`specdec.measure.costs.CostCurve.padded_n`;
            bf16 on some CPUs). Causal attention keeps the real row's logits those of a 1-token forward up
            to kernel rounding. None: a plain 1-token forward (the baseline).

    Returns:
        A `GenerationResult` with one round (K = 0) per new token (``n_forward`` set when padded).

    Raises:
        ValueError: empty prompt, negative budget, or ``pad_to(1) < 1``. ContextOverflowError: prompt +
        budget > context.
    """
    check_inputs(prompt_ids, max_new_tokens, target.max_length)
    n_step = 1 if pad_to is None else int(pad_to(1))
    if n_step < 1:
        raise ValueError(f"pad_to(1) = {n_step}: a step forward holds at least its one real token")
    eos = frozenset(eos_ids)
    vocab = vocab_size or target.vocab_size
    generator = _make_generator(sampling, seed, target.device)
    prompt = list(prompt_ids)
    result = GenerationResult("baseline", prompt, [], "empty")
    if max_new_tokens == 0:
        return result
    t0 = clock()
    target.reset()
    target.forward(prompt[:-1], logits=False)
    target.synchronize()
    t_prefill = clock()
    result.prefill_s = t_prefill - t0
    last = prompt[-1]
    t_prev = t_prefill
    finish = "length"
    while len(result.token_ids) < max_new_tokens:
        cached = len(prompt) + len(result.token_ids) - 1  # the cache holds everything before `last`
        n_fwd = min(n_step, target.max_length - cached)  # never pad past the context
        logits = target.forward([last] * n_fwd)[:1, :vocab]  # [1, vocab]: filler rows dropped
        if n_fwd > 1:
            target.truncate(cached + 1)
        target.synchronize()
        t_fwd = clock()
        if sampling.greedy:
            token = int(logits[0].argmax())
        else:
            token = sample(warp(logits[0], sampling), generator)
        target.synchronize()
        t_now = clock()
        result.token_ids.append(token)
        result.rounds.append(RoundRecord(0, 0, (), "bonus", 1, 0.0, t_now - t_prev, 0.0, 0,
                                         forward_s=t_fwd - t_prev, n_forward=n_fwd if pad_to else None))
        if len(result.token_ids) == 1:
            result.ttft_s = t_now - t0
        t_prev = t_now
        last = token
        if token in eos:
            finish = "eos"
            break
    result.finish_reason = finish
    result.total_s = clock() - t0
    return result


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
    synchronize: Callable[[], None] | None = None,
    pad_to: Callable[[int], int] | None = None,
) -> GenerationResult:
    """Speculative decoding: draft K, verify K+1 positions in one target forward, commit, roll back.

    Greedy output is token-identical to `autoregressive_generate` on the same target; sampled output follows
    the target's (warped) distribution exactly (Leviathan et al. 2023, Thm. 1).

    Args:
        target: the target backend (its cache is reset).
        drafter: proposes tokens (`ModelDrafter`, `PromptLookupDrafter`, ...).
        prompt_ids: ``[prompt_len]`` token ids, non-empty.
        max_new_tokens: budget of new tokens; never exceeded (K is clamped to what remains minus the
            recovered/bonus token). 0 -> no forward at all.
        k: fixed K (>= 1); or give `policy` instead.
        policy: chooses K per round (see `specdec.policies`).
        sampling, eos_ids, vocab_size, seed, clock: as in `autoregressive_generate`.
        synchronize: called before each clock read (defaults to syncing the target backend).
        pad_to: verification padded to a cheaper shape: ``pad_to(m)`` (>= m) is the number of tokens the
            target forward runs for the m = K + 1 real ones (e.g. `specdec.measure.costs.CostCurve.padded_n`, from
            the measured curve). The real tokens come first, filler tokens (copies of the last real one)
            after them; only the first m logits rows are used, and the round's single ``truncate`` drops the
            filler from the cache with the rejected drafts. Causal attention makes the real rows' logits
            independent of the filler (within the kernels' rounding of a larger batch); never padded past
            the target's context. None: no padding (a forward of exactly K + 1 tokens).

    Returns:
        A `GenerationResult` with one `RoundRecord` per target forward (``n_forward`` = tokens in that
        forward when `pad_to` is given).

    Raises:
        ValueError: empty prompt, negative budget, K < 1, both/neither of `k` and `policy`, or a `pad_to`
            that returns fewer tokens than it was given.
        ContextOverflowError: prompt + budget exceeds the target's context. A draft with a shorter context
            never raises: a round where it has no room (`Drafter.max_k` <= 0) is a plain target step
            (K = 0), and output is unchanged.
    """
    if (k is None) == (policy is None):
        raise ValueError("give exactly one of k and policy")
    if policy is None:
        policy = FixedK(k)
    check_inputs(prompt_ids, max_new_tokens, target.max_length)
    eos = frozenset(eos_ids)
    vocab = vocab_size or target.vocab_size
    generator = _make_generator(sampling, seed, target.device)
    sync = synchronize or target.synchronize
    prompt = list(prompt_ids)
    result = GenerationResult("speculative", prompt, [], "empty")
    if max_new_tokens == 0:
        return result

    def now() -> float:
        sync()
        return clock()

    t0 = now()
    # a draft that defers its prefill feeds the whole prompt in its first drafting round: the policy prices it
    policy.start(prefill_tokens=len(prompt) if getattr(drafter, "defers_prefill", False) else None,
                 budget=max_new_tokens)
    target.reset()
    target.forward(prompt[:-1], logits=False)
    drafter.prefill(prompt[:-1])
    t_prefill = now()
    result.prefill_s = t_prefill - t0
    committed = list(prompt)
    new = result.token_ids
    finish = "length"
    while len(new) < max_new_tokens:
        t_start = now()
        plan = policy.next_round()  # K and this round's confidence stop
        k_req = max(0, int(plan.k))
        alpha_est = policy.alpha_estimate()
        remaining = max_new_tokens - len(new)
        k_round = min(
            k_req,
            remaining - 1,  # room for the recovered/bonus token
            target.max_length - len(committed),  # cache holds len-1, the round adds k+1
            drafter.max_k(len(committed)),
        )
        k_round = max(k_round, 0)
        draft = drafter.propose(committed, k_round, sampling, generator, plan.min_confidence)
        d = draft.tokens
        t_draft = now()
        block_in = [committed[-1]] + d  # the m = len(d) + 1 real tokens
        n_forward = len(block_in)
        if pad_to is not None:
            n_forward = int(pad_to(len(block_in)))
            if n_forward < len(block_in):
                raise ValueError(f"pad_to({len(block_in)}) = {n_forward}: a padded forward must hold the "
                                 f"{len(block_in)} real tokens")
            # the cache holds len(committed) - 1 tokens (the invariant): never pad past the context
            n_forward = min(n_forward, target.max_length - (len(committed) - 1))
        fed = block_in + [block_in[-1]] * (n_forward - len(block_in))
        logits = target.forward(fed)[: len(block_in), :vocab]  # [len(d)+1, vocab]: the filler rows dropped
        t_forward = now()
        if sampling.greedy:
            verdict = greedy_verify(d, logits)
        else:
            verdict = stochastic_verify_logits(d, draft.probs, logits, sampling, generator)  # warps lazily
        t_verify = now()
        block, hit_eos = cut_block(verdict.committed_tokens(d), eos, remaining)
        committed.extend(block)
        new.extend(block)
        target.truncate(len(committed) - 1)
        drafter.rollback(committed)
        record = RoundRecord(
            k=len(d),
            # counts stop where the output stops: drafts accepted after an EOS never reached it (and
            # `RoundRecord.num_drafted` cuts the drafted count at the same place)
            num_accepted=min(verdict.num_accepted, len(block)),
            num_accepted_raw=verdict.num_accepted,
            accept_flags=verdict.accept_flags,
            next_kind=verdict.next_kind,
            num_emitted=len(block),
            draft_s=t_draft - t_start,
            verify_s=t_verify - t_draft,
            forward_s=t_forward - t_draft,
            other_s=now() - t_verify,
            k_requested=k_req,
            alpha_estimate=alpha_est,
            n_forward=n_forward if pad_to is not None else None,
            draft_stopped=draft.stopped,
        )
        result.rounds.append(record)
        policy.observe(record)
        if len(result.rounds) == 1:
            result.ttft_s = now() - t0
        if hit_eos:
            finish = "eos"
            break
    result.finish_reason = finish
    result.total_s = now() - t0
    note = getattr(policy, "note", None)
    result.policy_note = note() if callable(note) else None
    return result
