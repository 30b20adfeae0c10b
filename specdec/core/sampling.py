"""Sampling math as small pure functions: warp logits into probabilities, sample with an explicit generator.

The same `warp` is applied to the target's logits (p) and to the draft's logits (q), which is what keeps
speculative sampling exact (Leviathan et al. 2023, Sec. 2.3; Chen et al. 2023, Alg. 2): the rejection rule
is only lossless when p and q are the distributions the tokens are actually sampled from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen.

    Attributes:
        temperature: 0 means greedy (argmax); > 0 (finite) divides the logits before softmax.
        top_k: keep the k most likely tokens (an integer; 0 = off).
        top_p: keep the smallest set whose probability reaches top_p (1.0 = off), applied after top-k.

    Top-k and top-p shape a sampling distribution, so greedy decoding (temperature 0) takes neither: setting
    one with temperature 0 raises ValueError instead of being ignored.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be >= 0 and finite, got {self.temperature}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        object.__setattr__(self, "top_k", int(self.top_k))  # 4.0 -> 4: torch.topk takes an int
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        cuts = [f"{name} {value}" for name, value, off in (("top_k", self.top_k, 0), ("top_p", self.top_p, 1.0))
                if value != off]
        if self.temperature == 0.0 and cuts:
            one = len(cuts) == 1
            raise ValueError(f"{' and '.join(cuts)} need{'s' if one else ''} temperature > 0 (temperature 0 is "
                             f"greedy decoding, which takes the argmax and would ignore {'it' if one else 'them'})")

    @property
    def greedy(self) -> bool:
        """True when decoding is argmax (temperature 0)."""
        return self.temperature == 0.0


#: Top-p without top-k first looks at this many most likely tokens (`torch.topk`); a full sort of the
#: vocabulary happens only when their probability does not reach top_p.
TOP_P_CANDIDATES = 1024


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the sampling distribution: temperature, then top-k, then top-p, then softmax.

    Top-k keeps every token whose logit is >= the k-th largest (ties at the k-th are all kept). Top-p keeps
    a token when the tokens strictly more likely than it (in descending order) hold less than top_p of the
    probability; the most likely token is always kept. The kept tokens are renormalised (softmax).

    Work scales with what is kept, not with the vocabulary: with top-k set (and no ties at the k-th
    logit) top-p runs on the k values `torch.topk` returns, already sorted, and nothing of vocabulary width
    is sorted; with top-p alone, the `TOP_P_CANDIDATES` most likely tokens are taken first and the full
    vocabulary is sorted only when their mass does not reach top_p or the last of them is kept (otherwise
    tokens outside them are dropped by the rule above anyway, so the result is the same).

    Args:
        logits: ``[..., vocab]`` any float dtype; ``-inf`` entries are allowed (masked tokens).
        params: a stochastic `SamplingParams` (temperature > 0).

    Returns:
        float32 probabilities ``[..., vocab]``, each row summing to 1, with no NaN: at least the most
        likely token of every row is always kept by top-k/top-p.

    Raises:
        ValueError: `params` is greedy (there is no distribution to warp to), a row has no finite logit, or
            the temperature is so small that a row's largest logit divided by it overflows float32.
    """
    if params.greedy:
        raise ValueError("warp() needs temperature > 0; greedy decoding uses argmax")
    x = logits.float()
    if not torch.isfinite(x.max(dim=-1).values).all():
        raise ValueError("a logits row has no finite entry (or contains NaN/inf)")
    x = x / params.temperature
    if not torch.isfinite(x.max(dim=-1).values).all():
        raise ValueError(f"temperature {params.temperature:g} is too small: the logits divided by it overflow "
                         "float32 (temperature 0 decodes greedily)")
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        vals, idx = torch.topk(x, params.top_k, dim=-1)  # [..., k], sorted descending
        kth = vals[..., -1:]
        if bool(((x >= kth).sum(dim=-1) == params.top_k).all()):  # no tie at the k-th logit
            if params.top_p < 1.0:
                vals = _top_p_sorted(vals, torch.softmax(vals, dim=-1), params.top_p)
            return torch.zeros_like(x).scatter(-1, idx, torch.softmax(vals, dim=-1))
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        m = min(vocab, TOP_P_CANDIDATES)
        if m < vocab:
            vals, idx = torch.topk(x, m, dim=-1)
            p_top = torch.exp(vals - torch.logsumexp(x, dim=-1, keepdim=True))  # full-softmax probabilities
            if bool((p_top.sum(dim=-1) >= params.top_p).all()):
                vals = _top_p_sorted(vals, p_top, params.top_p)
                # exact unless the last candidate is kept: a token outside them tied with it is kept too
                if not bool(torch.isfinite(vals[..., -1]).any()):
                    return torch.zeros_like(x).scatter(-1, idx, torch.softmax(vals, dim=-1))
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        drop_sorted = torch.isneginf(_top_p_sorted(sorted_x, torch.softmax(sorted_x, dim=-1), params.top_p))
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def _top_p_sorted(sorted_x: torch.Tensor, sorted_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p on rows sorted in descending order: ``sorted_x`` with the dropped entries set to ``-inf``.

    A token is dropped when the tokens strictly more likely than it already reach `top_p`; the first token
    is always kept. Tied tokens share one decision (the mass before the first of them), so which of two equal
    logits the sort put first never matters. ``sorted_p`` are the probabilities of ``sorted_x`` under the
    full distribution.
    """
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of the tokens sorted before each one
    pos = torch.arange(sorted_x.shape[-1], device=sorted_x.device).expand(sorted_x.shape)
    new_value = torch.ones(sorted_x.shape, dtype=torch.bool, device=sorted_x.device)
    new_value[..., 1:] = sorted_x[..., 1:] != sorted_x[..., :-1]
    first_of_tie = torch.where(new_value, pos, torch.zeros_like(pos)).cummax(dim=-1).values
    drop = before.gather(-1, first_of_tie) >= top_p
    drop[..., 0] = False
    return sorted_x.masked_fill(drop, float("-inf"))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from ``probs`` ``[vocab]`` (non-negative, positive sum) with `generator`.

    Raises:
        ValueError: the row is not a usable distribution (NaN, negative, or zero mass).
    """
    total = float(probs.sum())
    if not (total > 0.0) or not torch.isfinite(probs).all() or bool((probs < 0).any()):
        raise ValueError("cannot sample from a row with NaN, negative entries or zero mass")
    return int(torch.multinomial(probs, 1, generator=generator).item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The recovered-token distribution ``norm(max(0, p - q))`` (Leviathan et al. 2023, Alg. 1).

    Args:
        p: target probabilities ``[vocab]``.
        q: draft probabilities ``[vocab]`` (a one-hot row for drafters without probabilities).

    Returns:
        ``[vocab]`` probabilities. When the residual has no mass (p == q up to rounding), returns `p`:
        then a rejection has probability ~0 and p is the right distribution to fall back to.
    """
    r = torch.clamp(p - q, min=0.0)
    mass = float(r.sum())
    if mass <= 1e-12:
        return p
    return r / mass
