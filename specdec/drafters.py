"""Drafters: anything that proposes K tokens for the target to verify.

One small interface (as transformers' candidate generators, with the field's names): `prefill` once per
generation, `propose` each round, `rollback` after each verification. Two real drafters:

- `ModelDrafter`: a smaller causal LM behind a `Backend` (the classic draft model).
- `PromptLookupDrafter`: n-gram matching against the prompt and the text generated so far; no model
  (Saxena 2023, "prompt lookup decoding"; transformers' ``prompt_lookup_num_tokens``; vLLM's ``ngram``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.backends.base import Backend
from specdec.sampling import SamplingParams, sample, warp


@dataclass
class Draft:
    """A proposal: ``tokens`` (length <= K) and, for drafters that sample, ``probs`` ``[len(tokens), vocab]``
    — the warped distributions each token was drawn from (None for deterministic drafters).

    ``stopped``: the draft model stopped on its confidence before K tokens; it then fed its last token
    to decide so (one more draft step than an unstopped round of as many tokens, and its cache holds every
    drafted token: `specdec.traces.draft_pending`)."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    stopped: bool = False


class Drafter(Protocol):
    """What the speculative loop needs from a drafter."""

    name: str

    def prefill(self, context: list[int]) -> None:
        """Start a generation; `context` is the prompt minus its last token (the loop's cache invariant)."""
        ...

    def propose(
        self, committed: list[int], k: int, sampling: SamplingParams, generator: torch.Generator | None,
        min_confidence: float | None = None,
    ) -> Draft:
        """Propose up to `k` tokens to follow `committed` (prompt + generated, last token included).

        `min_confidence` is this round's confidence stop (`specdec.policies.RoundPlan`); drafters without
        probabilities ignore it."""
        ...

    def rollback(self, committed: list[int]) -> None:
        """Called once after each round with the new committed sequence; drop any state past it."""
        ...

    def max_k(self, committed_len: int) -> int:
        """Largest K this drafter can propose without overflowing its own context."""
        ...


class ModelDrafter:
    """Draft with a causal LM (Leviathan et al. 2023's M_q).

    Keeps the same invariant as the target: its cache holds committed tokens, possibly minus some at the
    end. `propose` first feeds every committed token that is not yet cached (at least the last one; two after
    an all-accepted round, when the draft never saw its K-th token; the whole prompt and output in the first
    round that drafts, since `prefill` defers the prompt), then drafts autoregressively.
    `rollback` truncates the cache once, to the longest prefix shared with the committed sequence.

    Optional confidence stop (llama.cpp's ``--draft-p-min``; transformers'
    ``assistant_confidence_threshold``): when `propose` gets a `min_confidence`, drafting stops *before* token
    i >= 1 if the largest probability of the draft distribution at that step is below the threshold (the
    softmax of the draft logits under greedy decoding, the warped q under sampling). At least one token is
    always proposed, so a round proposes between 1 and K tokens. The decision depends only on q_i (itself a
    function of the tokens already drafted), never on the token sampled from it, so speculative sampling stays
    exact (the stop is a stopping time of the draft prefix); greedy output is the target's in any case.
    The threshold comes with each call (from the policy's `specdec.policies.RoundPlan`): a probability in
    [0, 1] (values > 1 mean "never confident": 1 token per round), None for no stop.

    Args:
        backend: the draft model and its cache.
        vocab_size: shared vocabulary size; logits are sliced to it (embedding padding rows masked out).
    """

    name = "model"
    #: `prefill` caches nothing: the first drafting round feeds the whole prompt (cost policies price it).
    defers_prefill = True

    def __init__(self, backend: Backend, vocab_size: int) -> None:
        self.backend = backend
        self.vocab_size = vocab_size
        self._cached: list[int] = []

    def prefill(self, context: list[int]) -> None:
        """Start a generation with an empty draft cache: the prefill is deferred to the first `propose` that
        drafts (its catch-up then feeds the whole committed sequence in one forward), so a generation that
        never drafts (a cost policy that decodes plainly throughout) never runs the draft model, and its
        time to first token holds no draft prefill. When the draft's own context cannot hold the prompt,
        `max_k` <= 0 keeps the loop from ever asking it."""
        self.backend.reset()
        self._cached = []

    def max_k(self, committed_len: int) -> int:
        """Largest K that fits the draft's context: a round ends with committed[:-1] + last + d1..d_{k-1}
        = committed_len + k - 1 tokens in its cache. <= 0 once the committed sequence outgrows the draft's
        context: those rounds are plain target steps (K = 0)."""
        return self.backend.max_length - committed_len + 1

    def propose(self, committed, k, sampling, generator, min_confidence=None) -> Draft:
        if k <= 0:
            return Draft([], None)
        pending = committed[len(self._cached):]
        # only the last pending row's distribution is used: the LM head runs on that row alone
        logits = self.backend.forward(pending, last=1)[-1, : self.vocab_size]  # [vocab]
        self._cached.extend(pending)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        threshold = min_confidence
        stopped = False
        for i in range(k):
            q = None if sampling.greedy else warp(logits, sampling)
            if i >= 1 and threshold is not None:
                dist = q if q is not None else torch.softmax(logits.float(), dim=-1)
                if float(dist.max()) < threshold:
                    stopped = True
                    break  # tokens[-1] is already cached; rollback() trims the cache as usual
            if sampling.greedy:
                t = int(logits.argmax())
            else:
                if generator is not None and q.device != generator.device:
                    q = q.to(generator.device)
                t = sample(q, generator)
                probs.append(q)
            tokens.append(t)
            if i < k - 1:
                logits = self.backend.forward([t])[-1, : self.vocab_size]
                self._cached.append(t)
        return Draft(tokens, torch.stack(probs) if probs else None, stopped)

    def rollback(self, committed) -> None:
        limit = min(len(self._cached), len(committed) - 1)
        n = 0
        # Only the tail can differ: everything before the previous round's start was verified equal.
        start = max(0, limit - 64)
        if self._cached[:start] == committed[:start]:
            n = start
        while n < limit and self._cached[n] == committed[n]:
            n += 1
        if n < len(self._cached):
            self.backend.truncate(n)
            del self._cached[n:]


class PromptLookupDrafter:
    """Propose the continuation of the most recent earlier occurrence of the sequence's last n-gram.

    For n from `max_ngram` down to `min_ngram`, the last n committed tokens are searched for earlier in the
    committed sequence (prompt + generated); the first hit, scanning from the most recent occurrence
    backwards, proposes the K tokens that followed it. When that continuation runs into the end of the
    sequence, it goes on by copying its own proposal (an overlapping copy, as LZ77): a match at distance p
    from the end means the sequence repeats with period p, and the proposal continues that period, so
    ``[5, 6] * 10`` proposes ``[5, 6, 5, 6, ...]`` and ``[7] * 12`` proposes ``[7] * K`` (K tokens, not one
    period). No match proposes nothing (a plain target step). Deterministic: its q is the one-hot of the
    proposed token, so greedy and sampled outputs are exact whatever it proposes.

    Differences from transformers' prompt lookup (``PromptLookupCandidateGenerator``, used by
    ``generate(prompt_lookup_num_tokens=...)``): transformers tries n-grams of at most
    ``max_matching_ngram_size = 2`` tokens (down to 1), takes the *earliest* occurrence in the sequence that has
    a continuation, and never continues past the end of the sequence. The defaults here are 3-grams down to
    1-grams and the *most recent* occurrence (a 3-gram seen twice in the generated text usually continues
    as it did last time).

    ``PromptLookupDrafter(2, 1, match="earliest", continue_past_end=False)`` is transformers' rule exactly
    (its proposals equal ``PromptLookupCandidateGenerator``'s: a test checks them), so our engine can be
    timed against ``generate(prompt_lookup_num_tokens=K)`` like for like (the sweep's ``ngram_hf`` method).

    Args:
        max_ngram, min_ngram: n-gram sizes tried, longest first (defaults 3 and 1).
        match: ``"recent"`` (default: the latest earlier occurrence) or ``"earliest"`` (transformers').
        continue_past_end: continue a short period past the end of the sequence (default) or stop there.

    Raises:
        ValueError: unless ``1 <= min_ngram <= max_ngram``, or an unknown `match`.
    """

    name = "ngram"
    free = True  # no model: a batch may ask what each row would draft before choosing K
    prefix_drafts = True  # the proposal at a smaller K is the prefix of the one at a larger K

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, *, match: str = "recent",
                 continue_past_end: bool = True) -> None:
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if match not in ("recent", "earliest"):
            raise ValueError(f"match must be 'recent' or 'earliest', got {match!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.match = match
        self.continue_past_end = continue_past_end

    def prefill(self, context) -> None:
        pass

    def max_k(self, committed_len: int) -> int:
        return 1 << 30

    def propose(self, committed, k, sampling, generator, min_confidence=None) -> Draft:
        if k <= 0:
            return Draft([], None)
        seq = committed
        n_total = len(seq)
        for n in range(min(self.max_ngram, n_total - 1), self.min_ngram - 1, -1):
            pattern = seq[n_total - n:]
            # candidate start positions i with seq[i:i+n] == pattern and i + n < n_total (something follows)
            starts = range(n_total - n - 1, -1, -1) if self.match == "recent" else range(n_total - n)
            for i in starts:
                if seq[i:i + n] == pattern:
                    if not self.continue_past_end:
                        return Draft(list(seq[i + n:i + n + k]), None)
                    return Draft(_continue(seq, i + n, k), None)
        return Draft([], None)

    def rollback(self, committed) -> None:
        pass


def _continue(seq: list[int], start: int, k: int) -> list[int]:
    """``k`` tokens copied from ``seq[start:]``, continuing into the copy itself past the end of `seq`.

    With ``start < len(seq)`` this is ``(seq + out)[start + j]`` for j = 0..k-1: a copy at distance
    ``p = len(seq) - start`` that repeats the last p tokens periodically once it reaches the end.
    """
    n_total = len(seq)
    out: list[int] = []
    for j in range(k):
        pos = start + j
        out.append(seq[pos] if pos < n_total else out[pos - n_total])
    return out
