"""Verification: given K draft tokens and the target's scores for K+1 positions, accept a prefix and add one token.

Terms (as vLLM's rejection sampler): draft tokens that pass are **accepted**; at the first rejection one
**recovered** token is drawn from the target (its argmax under greedy, ``norm(max(0, p - q))`` under
sampling); when all K pass, one **bonus** token is drawn from the target's K+1-th row. Either way a round
emits ``num_accepted + 1`` tokens. p is the target distribution and q the draft distribution, as in the
papers (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2).

Both functions are pure: tensors in, a `Verdict` out. The stochastic one consumes random numbers only from
the generator passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specdec.core.sampling import SamplingParams, residual, sample, warp


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification.

    Attributes:
        num_accepted: length of the accepted prefix of the draft (0..K).
        accept_flags: one flag per draft position that was *evaluated*: the accepted ones, then the
            rejected one if any (positions after the first rejection are not evaluated).
        next_token: the recovered token (after a rejection) or the bonus token (all accepted).
        next_kind: ``"recovered"`` or ``"bonus"``. With K = 0 the single token is a ``"bonus"`` of an empty
            draft, i.e. plain target decoding.
    """

    num_accepted: int
    accept_flags: tuple[bool, ...]
    next_token: int
    next_kind: str

    def committed_tokens(self, draft_tokens: list[int]) -> list[int]:
        """The tokens this round commits: ``draft_tokens[:num_accepted] + [next_token]``."""
        return list(draft_tokens[: self.num_accepted]) + [self.next_token]


def accepted_count(flags) -> int:
    """Number of accepted tokens = length of the leading run of true flags (``[1,0,1,1] -> 1``)."""
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def greedy_verify(draft_tokens: list[int], target_logits: torch.Tensor) -> Verdict:
    """Greedy verification: accept the longest prefix of drafts equal to the target's argmax.

    Args:
        draft_tokens: K token ids (K >= 0).
        target_logits: ``[K+1, vocab]``; row i scores the token after draft position i (row 0 follows the
            last committed token).

    Returns:
        A `Verdict` whose committed tokens equal what target-only greedy decoding would emit.

    Raises:
        ValueError: the logits do not have K+1 rows.
    """
    k = len(draft_tokens)
    if target_logits.shape[0] != k + 1:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, expected K+1 = {k + 1}")
    argmax = target_logits.argmax(dim=-1).tolist()  # [K+1]
    flags = []
    for i, d in enumerate(draft_tokens):
        ok = d == argmax[i]
        flags.append(ok)
        if not ok:
            break
    n = accepted_count(flags)
    return Verdict(n, tuple(flags), int(argmax[n]), "bonus" if n == k else "recovered")


def synthetic_verify(draft_tokens: list[int], target_logits: torch.Tensor, probs: Sequence[float],
                     rng: random.Random) -> Verdict:
    """Synthetic verification, for timing the loop at a set acceptance (llama.cpp's ``--spec-synth-rates``):
    draft position i is accepted with probability ``probs[i]`` given that every earlier one was, whatever its
    token, and the target's argmax after the accepted prefix is committed (recovered, or bonus when all pass).
    The forward, the rollback and the bookkeeping are the real ones; the output is not the target's.

    Args:
        draft_tokens: K token ids. target_logits: ``[K+1, vocab]`` as `greedy_verify`.
        probs: at least K conditional acceptance probabilities in [0, 1] (iid acceptance alpha: ``[alpha] * K``).
        rng: the row's generator of uniform draws (one draw per evaluated position).

    Raises:
        ValueError: the logits do not have K+1 rows, or fewer than K probabilities.
    """
    k = len(draft_tokens)
    if target_logits.shape[0] != k + 1:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows, expected K+1 = {k + 1}")
    if len(probs) < k:
        raise ValueError(f"{len(probs)} synthetic acceptance probabilities for K = {k} draft tokens")
    flags: list[bool] = []
    for i in range(k):
        flags.append(rng.random() < probs[i])
        if not flags[-1]:
            break
    n = accepted_count(flags)
    return Verdict(n, tuple(flags), int(target_logits[n].argmax()), "bonus" if n == k else "recovered")


def stochastic_verify(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1): the output follows the target distribution.

    Draft token d_i is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection the
    recovered token is sampled from ``norm(max(0, p_i - q_i))``; when all K are accepted the bonus token is
    sampled from ``p_{K+1}``. A token with ``p = 0`` is never accepted.

    Args:
        draft_tokens: K token ids.
        draft_probs: ``[K, vocab]`` the (warped) distributions the draft tokens were sampled from, or None for
            a deterministic drafter (prompt lookup), which is the one-hot q of the token proposed.
        target_probs: ``[K+1, vocab]`` target probabilities after the *same* warping as q.
        generator: source of all random numbers (uniforms and samples), on `target_probs`' device.

    Returns:
        A `Verdict`.

    Raises:
        ValueError: shapes disagree, or a draft token has q = 0 (the drafter reported a distribution it did
            not sample from — the ratio would be meaningless).
    """
    return _stochastic_verify(draft_tokens, draft_probs, target_probs, target_probs.__getitem__, generator)


def stochastic_verify_logits(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None,
) -> Verdict:
    """`stochastic_verify` on raw target logits, warping a row only when verification reaches it.

    Row i is warped (``warp(target_logits[i], sampling)``) just before draft token i is tested, so rows after
    the first rejection are never warped; with K = 16 and a 151,936-token vocabulary under top-p, that is
    most of the K+1 sorts of the eager version. Same random numbers in the same order as
    ``stochastic_verify(draft_tokens, draft_probs, warp(target_logits, sampling), generator)``, hence the
    same verdict for the same generator state.

    Args:
        draft_tokens: K token ids.
        draft_probs: ``[K, vocab]`` or None, as in `stochastic_verify` (warped with the same `sampling`).
        target_logits: ``[K+1, vocab]`` raw target logits.
        sampling: the stochastic `SamplingParams` both p and q are warped with.
        generator: as in `stochastic_verify`, on `target_logits`' device.

    Returns:
        A `Verdict`.

    Raises:
        ValueError: as `stochastic_verify`, or from `warp` (greedy params, a row without finite logits).
    """
    return _stochastic_verify(
        draft_tokens, draft_probs, target_logits, lambda i: warp(target_logits[i], sampling), generator
    )


def _stochastic_verify(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target: torch.Tensor,
    row: Callable[[int], torch.Tensor],
    generator: torch.Generator | None,
) -> Verdict:
    """The rejection loop of `stochastic_verify`; ``row(i)`` gives target probabilities ``[vocab]`` of row i
    of `target` (``[K+1, vocab]``, used for its shape and device only) when the loop first needs them."""
    k = len(draft_tokens)
    if target.shape[0] != k + 1:
        raise ValueError(f"target_probs has {target.shape[0]} rows, expected K+1 = {k + 1}")
    if draft_probs is not None:
        if draft_probs.shape != (k, target.shape[1]):
            raise ValueError(f"draft_probs shape {tuple(draft_probs.shape)} != ({k}, {target.shape[1]})")
        draft_probs = draft_probs.to(target.device, torch.float32)
    flags: list[bool] = []
    for i, d in enumerate(draft_tokens):
        p_row = row(i)
        p_d = float(p_row[d])
        if draft_probs is None:
            q_row = torch.zeros_like(p_row)
            q_row[d] = 1.0
            q_d = 1.0
        else:
            q_row = draft_probs[i]
            q_d = float(q_row[d])
            if q_d <= 0.0:
                raise ValueError(f"draft token {d} at position {i} has q = 0: q is not the distribution it was drawn from")
        u = float(torch.rand((), generator=generator, device=target.device))
        if p_d > 0.0 and u * q_d < p_d:  # u < min(1, p/q), without dividing
            flags.append(True)
            continue
        flags.append(False)
        token = sample(residual(p_row, q_row), generator)
        return Verdict(i, tuple(flags), token, "recovered")
    token = sample(row(k), generator)
    return Verdict(k, tuple(flags), token, "bonus")
