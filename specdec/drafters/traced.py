"""The draft model read from an acceptance trace: what `specdec.drafters.model.BatchedModelDrafter` proposes
under greedy decoding, without running the model, so that the trace replay (`specdec.engine.traces.replay`) can
drive a drafter that drafts with the draft model on some rounds only (the mixed drafter,
`specdec.drafters.mixed`) through its own choice code.

Under greedy decoding the draft model's proposal of K tokens after prompt + output[:i] is its argmax given that
context, then its argmax given one more token, and so on: as long as its tokens agree with the target's output
they are the trace's teacher-forced tokens ``draft_ids[i], draft_ids[i + 1], ...`` (each computed from the same
context). Past the first disagreement its context leaves the trace and its tokens are unknown; the target
rejects that first disagreeing token, so nothing after it is ever accepted or judged, and a placeholder that
matches no token (`UNKNOWN`) stands for the rest. The accepted and judged tokens of every round, the draft
cache's length after `rollback` (so the next round's catch-up) and every later choice are then the live
drafter's. The confidence stop (`min_confidence`) is read from ``draft_top_prob`` while the drafted tokens agree
with the target; past a disagreement the replay assumes no stop (a K that bounds the live one from above, as
`specdec.engine.traces.replay` says).

Under sampling (`SampledModelDrafter`) a round's fate is a draw: the draft model's j-th token of a round at
output position i is accepted, given those before it were, with probability beta_{i+j-1}, the overlap of the two
models' warped distributions along the sampled trace (`specdec.engine.sampled_traces`). The stand-in draws
that fate when it proposes and writes it into its tokens: the accepted ones are the trace's output tokens,
the first rejected one and those after it `UNKNOWN`. So the drafter that drives it learns from the committed
sequence, which follows the trace, exactly the accepted and judged counts of the draw
(`specdec.drafters.base.verified`), and the simulation reads the draw back from the tokens.
"""

from __future__ import annotations

from specdec.core.sampling import SamplingParams
from specdec.drafters.base import Draft

__all__ = ["UNKNOWN", "SampledModelDrafter", "TracedModelDrafter", "model_on_trace"]

#: The placeholder for a draft token past the first one the target rejects (no token id is negative).
UNKNOWN = -1


class TracedModelDrafter:
    """The draft model of one traced sequence as `BatchedModelDrafter`'s batch of one row (module docstring):
    deferred prefill, `cached_lens`, `max_k`, `propose`, `rollback`, `keep`, greedy only.

    Args:
        trace: the sequence's `specdec.engine.traces.AcceptanceTrace` (with draft tokens).
        draft_context: the draft model's context length, which caps K as `BatchedModelDrafter.max_k` does
            (None: no cap).

    Raises:
        ValueError: a trace without draft tokens.
    """

    name = "model"
    defers_prefill = True
    greedy = True

    def __init__(self, trace, draft_context: int | None = None) -> None:
        if trace.draft_ids is None:
            raise ValueError("this trace has no draft tokens (record it with a draft backend)")
        self.trace, self.draft_context = trace, draft_context
        self._cached: list[list[int]] = []

    def prefill(self, contexts: list[list[int]]) -> None:
        """Start the one row empty (the live draft defers its prefill to its first drafting round).

        Raises:
            ValueError: other than one context (a trace is one sequence).
        """
        if len(contexts) != 1:
            raise ValueError(f"a trace is one sequence: got {len(contexts)} rows")
        self._cached = [[]]

    @property
    def cached_lens(self) -> list[int]:
        """Committed tokens the live draft's cache would hold (its next drafting round feeds those past it)."""
        return [len(c) for c in self._cached]

    def max_k(self, committed_lens: list[int]) -> list[int]:
        if self.draft_context is None:
            return [1 << 30 for _ in committed_lens]
        return [self.draft_context - n + 1 for n in committed_lens]

    def propose(self, committed: list[list[int]], ks: list[int], sampling: SamplingParams, generators,
                min_confidence: float | None = None) -> list[Draft]:
        """The live draft's greedy proposal of ``ks[i]`` tokens (`UNKNOWN` past the first disagreement), its
        cache then holding the committed sequence and the draft tokens it fed (all but the last; all of them
        when the confidence stop fed the last to decide).

        Raises:
            ValueError: sampled decoding, or a committed sequence that is not the trace's prompt + output.
        """
        if sampling.greedy != self.greedy:
            raise ValueError(f"this trace replays {'greedy' if self.greedy else 'sampled'} decoding only")
        out = []
        for i, (c, k) in enumerate(zip(committed, ks, strict=True)):
            if k <= 0:
                out.append(Draft([], None))
                continue
            tokens, stopped = self._read(c, k, min_confidence)
            self._cached[i] = list(c) + tokens[:len(tokens) if stopped else k - 1]
            out.append(Draft(tokens, None, stopped))
        return out

    def _read(self, committed: list[int], k: int, stop: float | None) -> tuple[list[int], bool]:
        """Up to `k` draft tokens after `committed` from the trace, and whether the confidence stop ended them."""
        t = self.trace
        pos = self._on_trace(committed)
        tokens: list[int] = []
        known = True  # every token drafted so far agrees with the target: the draft's context is on the trace
        for j in range(pos, pos + k):
            probs = t.draft_top_prob
            if stop is not None and j > pos and known and probs is not None and j < len(probs) and probs[j] < stop:
                return tokens, True
            tok = t.draft_ids[j] if known and j < len(t.draft_ids) else UNKNOWN
            tokens.append(tok)
            known = known and j < len(t.target_ids) and tok == t.target_ids[j]
        return tokens, False

    def _on_trace(self, committed: list[int]) -> int:
        """The output position `committed` reaches on the trace.

        Raises:
            ValueError: a committed sequence that is not the trace's prompt + output.
        """
        t = self.trace
        n_prompt = len(t.prompt_ids)
        pos = len(committed) - n_prompt
        if pos < 0 or tuple(committed[:n_prompt]) != t.prompt_ids or tuple(committed[n_prompt:]) != t.target_ids[:pos]:
            raise ValueError("the committed sequence is not the trace's prompt + target-only output: the replay "
                             "left the trace")
        return pos

    def rollback(self, committed: list[list[int]]) -> None:
        """Keep each row's cached prefix that agrees with its committed sequence (at most all but its last
        token), as `BatchedModelDrafter.rollback`."""
        for i, c in enumerate(committed):
            cached = self._cached[i]
            limit = min(len(cached), len(c) - 1)
            n = 0
            while n < limit and cached[n] == c[n]:
                n += 1
            del cached[n:]

    def keep(self, rows: list[int]) -> None:
        self._cached = [self._cached[r] for r in rows]


class SampledModelDrafter(TracedModelDrafter):
    """The draft model of one sampled trace (`specdec.engine.sampled_traces.SampledTrace`, with its overlap) as
    `BatchedModelDrafter`'s batch of one row, its rounds' fates drawn from `rng` (module docstring): a proposal
    of K tokens at output position i is the output's tokens while each is accepted with probability
    ``overlap[i + j]`` in turn, then `UNKNOWN`; no proposal runs past the output's end. Sampled only; the
    confidence stop is not applied.

    Raises:
        ValueError: a trace without the draft model's overlap.
    """

    greedy = False

    def __init__(self, trace, rng, draft_context: int | None = None) -> None:
        if getattr(trace, "overlap", None) is None:
            raise ValueError("this sampled trace has no draft model's overlap (record it with a draft backend)")
        self.trace, self.rng, self.draft_context = trace, rng, draft_context
        self._cached = []

    def _read(self, committed: list[int], k: int, stop: float | None) -> tuple[list[int], bool]:
        t = self.trace
        pos = self._on_trace(committed)
        tokens: list[int] = []
        accepted = True
        for j in range(pos, min(pos + k, len(t.target_ids))):
            accepted = accepted and self.rng.random() < t.overlap[j]
            tokens.append(t.target_ids[j] if accepted else UNKNOWN)
        return tokens, False


def model_on_trace(trace, draft_context: int | None = None, rng=None) -> TracedModelDrafter:
    """The draft model read from `trace`: `SampledModelDrafter` (fates drawn from `rng`) for a sampled trace,
    `TracedModelDrafter` for a greedy one.

    Raises:
        ValueError: a sampled trace without `rng` or overlap; a greedy one without draft tokens.
    """
    if getattr(trace, "sampling", None) is not None:
        if rng is None:
            raise ValueError("a sampled trace's draft model draws its rounds' fates: give a random source")
        return SampledModelDrafter(trace, rng, draft_context)
    return TracedModelDrafter(trace, draft_context)
