"""Suffix drafting: propose the continuation of the longest earlier repeat of the text's suffix, as long as
the measured cost curve says it pays.

Prompt lookup (`specdec.drafters.ngram.PromptLookupDrafter`) matches the last 1-3 tokens and always drafts K. The
suffix drafter follows SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975) and SAM-decoding (Hu et al.
2024, arXiv 2411.10666): it keeps a suffix automaton (Blumer et al. 1985) of prompt + output, built online
in amortized O(1) per token, finds the *longest* suffix of the committed text that occurred before, and
proposes what followed its most recent earlier occurrence (the automaton gives the first; the most recent
is found among the last token's earlier positions). How many tokens it proposes depends on how well its
drafts fared: it counts, per match-length bucket, the draft tokens it offered and the ones the target
accepted, estimates a per-token acceptance alpha for the current match length (a Beta(1, 1) prior plus
L - 1 accepted pseudo-counts for a bucket of matches of L tokens or more: the match itself is evidence), and
picks the K that maximizes expected tokens per unit of round time,

    E(K) / v(K + 1),   E(K) = (1 - alpha^(K+1)) / (1 - alpha)      (Leviathan et al. 2023, eq. 1),

with v(n) the target's verification cost in single steps from a measured `specdec.core.costs.CostCurve` (v = 1
without one). K = 0 (a plain target step) wins whenever no K > 0 beats one token per step, e.g. for a short
match on a machine where verifying 2 tokens costs 2 steps. Drafting costs nothing measurable here (a few
dict look-ups per token), so it is left out of the round time.

A bucket whose drafts stop paying stops drafting for the rest of the generation (no exploration): the
statistics start fresh with each generation.

Optionally a corpus of earlier outputs (token lists) is matched too, through a second automaton; the
longer of the two matches drafts, and `stats` counts corpus and per-prompt drafts apart.

The drafter is deterministic given the committed sequence and the rounds so far (its statistics come from
`rollback`), so its output, like every drafter's, cannot change what greedy or sampled decoding emits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from specdec.core.sampling import SamplingParams
from specdec.drafters.base import Draft, verified

__all__ = ["SuffixAutomaton", "SuffixDrafter"]

#: Match-length buckets for the acceptance statistics: lengths 1, 2-3, 4-7, 8-15, 16+.
_BUCKETS = (1, 2, 4, 8, 16)


def _bucket(length: int) -> int:
    b = 0
    for i, lo in enumerate(_BUCKETS):
        if length >= lo:
            b = i
    return b


class SuffixAutomaton:
    """The suffix automaton of a token sequence, extended one token at a time (amortized O(1) per token).

    Each state stands for a set of substrings with the same end positions; ``length[s]`` is the longest of
    them, ``link[s]`` the state of the longest suffix with more end positions, ``first_end[s]`` the index
    of the token that ends their first occurrence.
    """

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]
        self.last = 0
        for t in tokens:
            self.append(t)

    def _new_state(self, length: int, first_end: int, nxt: dict[int, int] | None = None, link: int = -1) -> int:
        self.next.append({} if nxt is None else dict(nxt))
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def append(self, token: int) -> None:
        """Extend the automaton by one token (the standard online construction)."""
        token = int(token)
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, pos)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._new_state(self.length[p] + 1, self.first_end[q], self.next[q], self.link[q])
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        self.last = cur

    def longest_repeat(self) -> tuple[int, int]:
        """(L, e): the longest suffix of the sequence that also ends earlier has L tokens, and its first
        occurrence ends at index e < len - 1 (so ``tokens[e + 1]`` followed it). (0, -1) if none."""
        s = self.link[self.last] if self.last else -1
        if s <= 0:
            return 0, -1
        return self.length[s], self.first_end[s]

    def step(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """Advance a match of some other text against this automaton by one token: from (state, matched
        length) to the longest suffix of the other text that occurs in this sequence."""
        while state != -1 and token not in self.next[state]:
            state = self.link[state]
            matched = self.length[state] if state != -1 else 0
        if state == -1:
            return 0, 0
        return self.next[state][token], matched + 1


def _copy(seq: Sequence[int], start: int, k: int) -> list[int]:
    """k tokens of ``seq[start:]``, continued periodically into the copy itself past the end of `seq`."""
    out: list[int] = []
    n = len(seq)
    for j in range(k):
        pos = start + j
        out.append(seq[pos] if pos < n else out[pos - n])
    return out


@dataclass
class SuffixStats:
    """Draft tokens offered and accepted, per source (``prompt``: the text itself; ``corpus``)."""

    offered: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "corpus": 0})
    accepted: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "corpus": 0})
    rounds: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "corpus": 0})


class SuffixDrafter:
    """The cost-aware suffix drafter (see the module docstring); a `specdec.drafters.base.Drafter`.

    Args:
        cost: the target's measured costs (anything with ``v(n)``, e.g. `specdec.core.costs.CostCurve`); None
            prices every forward as one step (a flat curve, as on a GPU at batch 1).
        min_match: matches shorter than this never draft (default 1: the statistics decide).
        corpus: earlier outputs (token lists) to match as well; their drafts are counted apart.
        prior: Beta prior (accepted, rejected) pseudo-counts of each bucket's acceptance (default 1, 1).
        length_prior: accepted pseudo-counts per token of the match beyond the first, added to the prior of
            the match length's bucket (at the bucket's shortest length): a suffix that already repeated L
            tokens is evidence that the next ones repeat too (default 1: a 16-token match starts at alpha
            16/17; 0: the plain prior for every length).
        occurrence: which earlier occurrence of the matched suffix drafts: ``"recent"`` (the most recent
            one, as prompt lookup takes: generated text repeats what it said last) or ``"first"`` (the
            automaton's first occurrence). Corpus matches always draft from their first occurrence.

    Raises:
        ValueError: min_match < 1, a negative prior or length_prior, or an unknown occurrence.
    """

    #: Earlier occurrences of the last token checked for the most recent match before the first is taken.
    MAX_CANDIDATES = 64

    name = "suffix"
    free = True  # no model: a batch may ask what each row would draft before choosing K

    def __init__(self, cost=None, *, min_match: int = 1, corpus: Iterable[Sequence[int]] = (),
                 prior: tuple[float, float] = (1.0, 1.0), occurrence: str = "recent",
                 length_prior: float = 1.0) -> None:
        if occurrence not in ("recent", "first"):
            raise ValueError(f"occurrence must be 'recent' or 'first', got {occurrence!r}")
        self.occurrence = occurrence
        if not length_prior >= 0.0:
            raise ValueError(f"length_prior must be >= 0, got {length_prior}")
        self.length_prior = float(length_prior)
        if min_match < 1:
            raise ValueError(f"min_match must be >= 1, got {min_match}")
        if min(prior) < 0:
            raise ValueError(f"prior pseudo-counts must be >= 0, got {prior}")
        self.cost = cost
        self.min_match = int(min_match)
        self.prior = (float(prior[0]), float(prior[1]))
        self._corpus: SuffixAutomaton | None = None
        sep = -1  # never a token id: keeps matches from running across two outputs
        corpus = [list(c) for c in corpus]
        if corpus:
            joined: list[int] = []
            for c in corpus:
                joined.extend(c)
                joined.append(sep)
            self._corpus = SuffixAutomaton(joined)
        self.prefill([])

    # -- Drafter contract ---------------------------------------------------------------------------
    def prefill(self, context: list[int]) -> None:
        """Start a generation: the automaton of `context` (the prompt minus its last token) and fresh
        statistics, so a generation's drafts depend on that generation alone (a warm-up run does not change
        the timed one, and a trace replay reproduces it)."""
        self.stats = SuffixStats()
        self._sam = SuffixAutomaton(context)
        self._positions: dict[int, list[int]] = {}  # token -> its indices in the text, ascending
        for i, t in enumerate(self._sam.tokens):
            self._positions.setdefault(t, []).append(i)
        self._cstate, self._cmatched = 0, 0
        if self._corpus is not None:
            for t in context:
                self._cstate, self._cmatched = self._corpus.step(self._cstate, self._cmatched, t)
        self._pending: tuple[int, list[int], int, str] | None = None
        self.proposal_alpha = 0.0
        self._offered = [[0] * len(_BUCKETS) for _ in range(2)]
        self._accepted = [[0] * len(_BUCKETS) for _ in range(2)]

    def max_k(self, committed_len: int) -> int:
        return 1 << 30

    def propose(self, committed: list[int], k: int, sampling: SamplingParams,
                generator: torch.Generator | None, min_confidence: float | None = None) -> Draft:
        """Up to `k` tokens copied after the longest earlier repeat of the text's suffix, as many as the
        costs say pay at the match length's acceptance estimate (set as `proposal_alpha`; 0.0 with no
        draft)."""
        self._catch_up(committed)
        self._pending = None
        self.proposal_alpha = 0.0
        if k <= 0:
            return Draft([], None)
        length, end = self._sam.longest_repeat()
        source, seq, start = "prompt", self._sam.tokens, end + 1
        if self._corpus is not None and self._cmatched > length:
            source, length = "corpus", self._cmatched
            seq = self._corpus.tokens
            start = self._corpus.first_end[self._cstate] + 1
        if length < self.min_match or start <= 0:
            return Draft([], None)
        if source == "prompt" and self.occurrence == "recent":
            start = self._recent_start(length, start)
        want = self._choose_k(length, k)
        if want == 0:
            return Draft([], None)
        tokens = _copy(seq, start, want) if source == "prompt" else self._corpus_copy(start, want)
        if not tokens:
            return Draft([], None)
        self._pending = (len(committed), tokens, _bucket(length), source)
        self.proposal_alpha = self.alpha(length, source)
        return Draft(tokens, None)

    def withdraw(self) -> None:
        """Forget the last proposal: it was not sent for verification (another drafter's ran instead), so
        `rollback` learns nothing from it."""
        self._pending = None

    def rollback(self, committed: list[int]) -> None:
        """Learn from the last proposal: how many of its tokens the committed sequence kept."""
        if self._pending is not None:
            at, tokens, bucket, source = self._pending
            acc, offered = verified(tokens, committed, at)
            s = 0 if source == "prompt" else 1
            self._offered[s][bucket] += offered
            self._accepted[s][bucket] += acc
            self.stats.offered[source] += offered
            self.stats.accepted[source] += acc
            self.stats.rounds[source] += 1
            self._pending = None
        self._catch_up(committed)

    # -- internals ------------------------------------------------------------------------------------
    def _catch_up(self, committed: Sequence[int]) -> None:
        for t in committed[len(self._sam.tokens):]:
            self._positions.setdefault(int(t), []).append(len(self._sam.tokens))
            self._sam.append(t)
            if self._corpus is not None:
                self._cstate, self._cmatched = self._corpus.step(self._cstate, self._cmatched, t)

    def _recent_start(self, length: int, first_start: int) -> int:
        """The index after the most recent earlier occurrence of the text's last `length` tokens (checking at
        most `MAX_CANDIDATES` earlier positions of the last token; else `first_start`)."""
        toks = self._sam.tokens
        n = len(toks)
        suffix = toks[n - length:]
        positions = self._positions.get(toks[-1], [])
        # the last position is the suffix itself
        for j in range(len(positions) - 2, max(-1, len(positions) - 2 - self.MAX_CANDIDATES), -1):
            e = positions[j]
            if e < length - 1:
                break
            if toks[e - length + 1:e + 1] == suffix:
                return e + 1
        return first_start

    def _corpus_copy(self, start: int, k: int) -> list[int]:
        out = []
        for t in self._corpus.tokens[start:start + k]:
            if t < 0:  # the end of that earlier output
                break
            out.append(t)
        return out

    def alpha(self, length: int, source: str = "prompt") -> float:
        """Estimated per-token acceptance of a draft from a match of `length` tokens (posterior mean)."""
        s = 0 if source == "prompt" else 1
        b = _bucket(length)
        a0, r0 = self.prior
        a0 += self.length_prior * (_BUCKETS[b] - 1)  # the match itself: L - 1 tokens already repeated
        acc = self._accepted[s][b]
        rej = self._offered[s][b] - acc
        return (acc + a0) / (acc + rej + a0 + r0)

    def _choose_k(self, length: int, k: int) -> int:
        """The K in 0..k (and <= the match length's worth of evidence) maximizing E(K) / v(K + 1)."""
        alpha = min(self.alpha(length), 0.999)
        best_k, best = 0, 1.0  # K = 0: one token per one-step forward
        e, p = 1.0, 1.0
        for kk in range(1, k + 1):
            p *= alpha
            e += p
            v = 1.0 if self.cost is None else float(self.cost.v(kk + 1))
            if e / v > best * (1 + 1e-9):
                best_k, best = kk, e / v
        return best_k
