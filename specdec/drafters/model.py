"""The draft model as a drafter: `ModelDrafter`, a smaller causal LM behind a `Backend` (Leviathan et al.
2023's M_q)."""

from __future__ import annotations

import torch

from specdec.core.sampling import sample, warp
from specdec.drafters.base import Draft
from specdec.runtimes.base import Backend, BatchedBackend


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
    The threshold comes with each call (from the policy's `specdec.policies.base.RoundPlan`): a probability in
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


class BatchedModelDrafter:
    """A draft model on a `BatchedBackend`: `specdec.drafters.model.ModelDrafter` for B rows in batched forwards.

    The draft's prefill is deferred, as `specdec.drafters.model.ModelDrafter` defers it: `prefill` starts every
    row empty and runs nothing, so a batch whose K policy never drafts never pays for the draft model.
    Per round: one forward catches every drafting row up on its committed tokens not yet cached (the whole
    prompt in the row's first drafting round; then 1, 2 after an all-accepted round, more after rounds
    where the row did not draft), scoring only the last one; then
    ``max(ks) - 1`` single-token forwards, row i feeding its previous draft token while it has fewer than
    ``ks[i]`` (rows that are done feed nothing). Greedy drafts take the argmax; sampled drafts draw from
    ``warp(logits)`` with the row's generator, in the order `ModelDrafter` draws them, so a row's drafts
    are the single-sequence ones for the same generator state. `rollback` truncates each row to the
    longest prefix its cache shares with its committed sequence, in one call. The round's confidence stop
    (`min_confidence`) stops a row as `ModelDrafter` stops.

    Args:
        backend: the draft model's batched backend.
        vocab_size: shared vocabulary; logits are sliced to it.
    """

    name = "model"
    #: `prefill` caches nothing: a row's first drafting round feeds its whole context (cost policies price it)
    defers_prefill = True

    def __init__(self, backend: BatchedBackend, vocab_size: int) -> None:
        self.backend = backend
        self.vocab_size = vocab_size
        self._cached: list[list[int]] = []

    def prefill(self, contexts):
        """Start one empty row per context; nothing runs (the first drafting round of a row feeds its whole
        committed sequence). A row whose context plus the last prompt token does not fit the draft's context
        never drafts (`max_k` <= 0), as `ModelDrafter.prefill`."""
        self._cached = [[] for _ in contexts]
        self.backend.prefill([[] for _ in contexts])

    @property
    def cached_lens(self) -> list[int]:
        """Committed tokens in each row's draft cache (a prefix of its committed sequence after `rollback`):
        the row's next drafting round first feeds the committed tokens past it."""
        return [len(c) for c in self._cached]

    def max_k(self, committed_lens):
        return [self.backend.max_length - n + 1 for n in committed_lens]

    def propose(self, committed, ks, sampling, generators, min_confidence=None):
        b = len(committed)
        drafts: list[list[int]] = [[] for _ in range(b)]
        probs: list[list[torch.Tensor]] = [[] for _ in range(b)]
        stopped = [False] * b
        if max(ks, default=0) <= 0:
            return [Draft([], None) for _ in range(b)]
        pending = [c[len(cached):] if k > 0 else [] for c, cached, k in zip(committed, self._cached, ks,
                                                                               strict=True)]
        out = self.backend.forward(pending, last=1)
        for i in range(b):
            self._cached[i].extend(pending[i])
        for step in range(max(ks)):
            feed: list[list[int]] = [[] for _ in range(b)]
            for i in range(b):
                if step >= ks[i] or stopped[i]:
                    continue
                logits = out[i][-1, : self.vocab_size]
                q = None if sampling.greedy else warp(logits, sampling)
                if step >= 1 and min_confidence is not None:  # `ModelDrafter`'s confidence stop, per row
                    dist = q if q is not None else torch.softmax(logits.float(), dim=-1)
                    if float(dist.max()) < min_confidence:
                        stopped[i] = True  # its last draft token is already cached; rollback trims as usual
                        continue
                if sampling.greedy:
                    t = int(logits.argmax())
                else:
                    g = generators[i]
                    if g is not None and q.device != g.device:
                        q = q.to(g.device)
                    t = sample(q, g)
                    probs[i].append(q)
                drafts[i].append(t)
                if step < ks[i] - 1:
                    feed[i] = [t]
            if not any(feed):
                break
            out = self.backend.forward(feed, last=1)
            for i in range(b):
                self._cached[i].extend(feed[i])
        return [Draft(d, torch.stack(p) if p else None, st) for d, p, st in zip(drafts, probs, stopped, strict=True)]

    def rollback(self, committed):
        lengths = []
        for i, c in enumerate(committed):
            cached = self._cached[i]
            limit = min(len(cached), len(c) - 1)
            # only the tail can differ: everything before the previous round's start was verified equal
            start = max(0, limit - 64)
            n = start if cached[:start] == c[:start] else 0
            while n < limit and cached[n] == c[n]:
                n += 1
            del cached[n:]
            lengths.append(n)
        self.backend.truncate(lengths)

    def keep(self, rows):
        self.backend.keep(rows)
        self._cached = [self._cached[r] for r in rows]
