"""Acceptance traces: what every K and every policy would accept, from one target-only run (greedy).

Under greedy decoding the target's output does not depend on K or on the drafter (it is target-only greedy,
exactly). So from one target-only run and ONE teacher-forced draft forward over prompt + output, the
rounds of every fixed K and of every policy follow without running them:

- the draft model's proposal at output position i, as long as it agrees with the target, is its greedy
  token given prompt + output[:i] - the token the teacher-forced pass computes at that row - so the
  accepted length of a round starting at i is the run of agreements from i, capped at K;
- prompt lookup's proposal depends only on the committed text, so the drafter itself is asked;
- a drafter that chooses per round between a model-free proposal and the draft model's (the mixed drafter) is
  asked too, its draft model reading the trace (`specdec.drafters.traced.TracedModelDrafter`).

Hardware then enters only through the cost curve (`specdec.core.costs`): what the algorithm does is kept apart
from what the hardware costs. The replay is exact when the draft's incremental steps
produce the same greedy tokens as its batched teacher-forced pass; near-ties can flip between those kernels
(more so in bf16), so `compare_rounds` lists every round where a timed run and its replay disagree.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from specdec.core.metrics import RoundRecord
from specdec.drafters.base import Drafter
from specdec.engine.decoding import GREEDY
from specdec.runtimes.base import Backend

__all__ = [
    "AcceptanceTrace",
    "ReplayRound",
    "compare_rounds",
    "divergence_with_margin",
    "draft_pending",
    "first_divergence",
    "next_token_logits",
    "record_trace",
    "replay",
    "stored_json",
    "target_margins",
    "teacher_forced",
]


@dataclass(frozen=True)
class AcceptanceTrace:
    """One prompt's target-only greedy output and, per output position, the draft's greedy token.

    Attributes:
        prompt_ids: the prompt's token ids.
        target_ids: ``[T]`` the target-only greedy output (new tokens; it ends at EOS or the budget).
        draft_ids: ``[T]`` ``draft_ids[i]`` = the draft's argmax given prompt + target_ids[:i] (teacher
            forced), or None when no draft model was traced (prompt lookup only).
        draft_top_prob: ``[T]`` the draft's top probability at each position (None likewise).
        max_new_tokens: the budget the target-only run had (it clamps K near the end).
    """

    prompt_ids: tuple[int, ...]
    target_ids: tuple[int, ...]
    draft_ids: tuple[int, ...] | None
    draft_top_prob: tuple[float, ...] | None
    max_new_tokens: int

    @classmethod
    def from_record(cls, row: Mapping) -> AcceptanceTrace:
        """From a stored ``traces`` row of a greedy sweep (``prompt_ids``, ``target_ids``, ``draft_ids``,
        ``draft_top_prob``, ``max_new_tokens``; JSON columns decoded or as text), as
        `specdec.bench.store_measurements` writes it; ``draft_ids`` and ``draft_top_prob`` NULL (None or NaN):
        None."""
        def opt(x):
            return tuple(x) if isinstance(x := stored_json(x), (list, tuple)) else None

        return cls(tuple(stored_json(row["prompt_ids"])), tuple(stored_json(row["target_ids"])),
                   opt(row["draft_ids"]), opt(row["draft_top_prob"]), int(row["max_new_tokens"]))

    def agreement(self) -> list[bool]:
        """``[T]`` per position: does the draft's greedy token equal the target's?

        Raises:
            ValueError: the trace has no draft tokens.
        """
        if self.draft_ids is None:
            raise ValueError("this trace has no draft tokens (record it with a draft backend)")
        return [d == t for d, t in zip(self.draft_ids, self.target_ids, strict=True)]


def stored_json(x):
    """A stored JSON column's value: text parsed, anything else (already decoded, None, NaN) as it is."""
    return json.loads(x) if isinstance(x, str) else x


def record_trace(
    prompt_ids: Sequence[int],
    target_ids: Sequence[int],
    max_new_tokens: int,
    draft: Backend | None = None,
    *,
    vocab_size: int | None = None,
) -> AcceptanceTrace:
    """Teacher-force the draft over prompt + output and keep its greedy token at each output position.

    Args:
        prompt_ids: ``[P]`` the prompt (P >= 1). target_ids: ``[T]`` the target-only greedy output.
        max_new_tokens: the budget of that run. draft: the draft model's backend (its cache is reset before
            and after); None records a trace for prompt lookup only. vocab_size: logits columns past it
            are ignored (as the engine does).

    Returns:
        An `AcceptanceTrace`. One draft forward of ``P + T - 1`` tokens.

    Raises:
        ValueError: empty prompt, or more output tokens than the budget. ContextOverflowError: the
            sequence does not fit the draft's context.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    if len(target_ids) > max_new_tokens:
        raise ValueError(f"{len(target_ids)} output tokens exceed the budget of {max_new_tokens}")
    draft_ids = top = None
    if draft is not None and target_ids:
        logits = teacher_forced(draft, prompt_ids, target_ids, vocab_size)
        probs = torch.softmax(logits.float(), dim=-1)
        top_p = probs.max(dim=-1).values
        draft_ids = tuple(int(x) for x in logits.argmax(dim=-1).tolist())  # argmax of logits, as greedy_verify
        top = tuple(float(x) for x in top_p.tolist())
    elif draft is not None:
        draft_ids, top = (), ()
    return AcceptanceTrace(tuple(prompt_ids), tuple(target_ids), draft_ids, top, max_new_tokens)


def teacher_forced(backend: Backend, prompt_ids: Sequence[int], target_ids: Sequence[int],
                   vocab_size: int | None = None) -> torch.Tensor:
    """``[T, vocab]`` logits of one forward over prompt + target_ids[:-1] from an empty cache (reset before and
    after): row i predicts output token i; columns past `vocab_size` are dropped (as the engine does)."""
    backend.reset()
    with torch.no_grad():
        logits = backend.forward(list(prompt_ids) + list(target_ids[:-1]))[len(prompt_ids) - 1:]
    backend.reset()
    return logits if vocab_size is None else logits[:, :vocab_size]


def target_margins(
    target: Backend, prompt_ids: Sequence[int], target_ids: Sequence[int], *, vocab_size: int | None = None
) -> tuple[list[float], list[int]]:
    """Teacher-force the target over prompt + output: its top-2 probability margin and argmax per position.

    A greedy run of another method (or another numeric path: batched verification, bf16 kernels) can leave
    the target-only output only where the target's two best tokens are nearly tied; the margin at the first
    differing position says how near (case: "a near-tie flipped by batched numerics").

    Args:
        target: the target's backend (its cache is reset before and after). prompt_ids: ``[P]`` (P >= 1).
        target_ids: ``[T]`` the target-only greedy output. vocab_size: logits columns past it are ignored.

    Returns:
        ``(margins, argmax)``: ``[T]`` top-1 minus top-2 probability (softmax of the logits, fp32) and ``[T]``
        the teacher-forced argmax (one forward of ``P + T - 1`` tokens).

    Raises:
        ValueError: empty prompt. ContextOverflowError: the sequence does not fit the target's context.
    """
    if not prompt_ids:
        raise ValueError("empty prompt")
    if not target_ids:
        return [], []
    logits = teacher_forced(target, prompt_ids, target_ids, vocab_size)
    top2 = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1).values  # [T, 2]
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    return [float(m) for m in margins], [int(x) for x in logits.argmax(dim=-1).tolist()]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first output position where two token sequences differ (a length difference counts at the
    shorter one's end), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class ReplayRound:
    """A replayed round: `k` tokens drafted, `num_accepted` of them reached the output, `num_emitted`
    committed (accepted + the recovered or bonus token, cut at the output's end); `draft_stopped`: the
    draft model's confidence stop ended it before the K asked (`RoundRecord.draft_stopped`); `by_model`:
    the draft model drafted this round (True) or did not (False), for a drafter that chooses per round
    whether to draft with it (the mixed drafter); None: as the replayed drafter always does (every drafting
    round the draft model's for the draft model, none for a model-free drafter)."""

    k: int
    num_accepted: int
    num_emitted: int
    draft_stopped: bool = False
    by_model: bool | None = None

    @property
    def num_drafted(self) -> int:
        """Drafts counted as drafted, cut where the output stopped (the rule of `RoundRecord.num_drafted`)."""
        return self.k if self.num_emitted > self.num_accepted else min(self.k, self.num_accepted)

    def as_record(self, clock: RoundRecord | None = None) -> RoundRecord:
        """The `RoundRecord` a real run of this round would carry, for policies: timings zero, or `clock`'s
        (a timed round's draft_s, verify_s and other_s, in seconds)."""
        rejected = self.num_accepted < self.k and self.num_emitted > self.num_accepted
        flags = (True,) * self.num_accepted + ((False,) if rejected else ())
        times = {} if clock is None else {"draft_s": clock.draft_s, "verify_s": clock.verify_s,
                                          "other_s": clock.other_s}
        return RoundRecord(k=self.k, num_accepted=self.num_accepted, accept_flags=flags,
                           next_kind="recovered" if rejected else "bonus", num_emitted=self.num_emitted,
                           draft_stopped=self.draft_stopped, **times)


def _run(proposal: Sequence[int], target: Sequence[int]) -> int:
    n = 0
    for p, t in zip(proposal, target):
        if p != t:
            break
        n += 1
    return n


def _model_round(trace: AcceptanceTrace, agree: list[bool], pos: int, kk: int, stop: float | None
                 ) -> tuple[int, int, bool]:
    """The draft model's round of `kk` tokens at output position `pos`, from the trace's agreement: ``(drafted,
    accepted, stopped)`` (accepted cut at the output's end).

    The confidence stop before draft token i >= 1 reads the draft's top probability given the tokens drafted so
    far: known from the trace while they agree with the target (i <= accepted); past the first rejected token
    the draft's context leaves the trace, and the replay assumes no stop there (an upper bound on K; accepted
    and emitted tokens are exact either way)."""
    target = trace.target_ids
    accepted = 0
    while accepted < kk and pos + accepted < len(target) and agree[pos + accepted]:
        accepted += 1
    if stop is not None and kk > 1:
        probs = trace.draft_top_prob
        for i in range(1, min(kk, accepted + 1)):
            if pos + i < len(probs) and probs[pos + i] < stop:
                return i, min(accepted, i), True
    return kk, accepted, False


def _drafter_round(trace: AcceptanceTrace, drafter: Drafter, pos: int, kk: int, stop: float | None
                   ) -> tuple[int, int, bool, bool | None]:
    """A driven drafter's round of up to `kk` tokens at output position `pos` (no call when kk = 0):
    ``(drafted, accepted, stopped, by_model)``, by_model read from a drafter with ``drafted_by_model``."""
    if not kk:
        return 0, 0, False, None
    committed = list(trace.prompt_ids) + list(trace.target_ids[:pos])
    draft = drafter.propose(committed, kk, GREEDY, None, stop)
    by_model = bool(drafter.drafted_by_model) if hasattr(drafter, "drafted_by_model") else None
    return len(draft.tokens), _run(draft.tokens, trace.target_ids[pos:]), draft.stopped, by_model


def replay(trace: AcceptanceTrace, *, k: int | None = None, policy=None, drafter: Drafter | None = None,
           draft_context: int | None = None, clock: Sequence[RoundRecord] | None = None) -> list[ReplayRound]:
    """The rounds a speculative run would take on this trace.

    Args:
        trace: from `record_trace`.
        k: a fixed K (>= 1); or `policy`: any `specdec.policies` policy (started here, fed each round;
            its confidence stop is applied from the trace's draft probabilities while the drafted tokens agree
            with the target; after a rejected token the replay drafts on to K, so a confidence policy's K can
            be overstated there, never its accepted or emitted tokens).
        drafter: None = the draft model (from ``trace.draft_ids``); a drafter that needs no model (prompt
            lookup, the suffix drafter) is driven as the engine drives it: `prefill` with the prompt minus its
            last token, `propose` each round (with the policy's confidence stop), `rollback` with the new
            committed sequence after it (a drafter that learns from its rounds replays them exactly). So is a
            drafter whose draft model reads this trace (`specdec.drafters.traced.TracedModelDrafter`, in the
            mixed drafter); one with ``drafted_by_model`` says per round whether the draft model drafted
            (`ReplayRound.by_model`), and one that ``defers_prefill`` has its prompt priced by the policy as
            the draft model's is.
        draft_context: the draft model's context length, when it clamps K (the engine's rule,
            `ModelDrafter.max_k`: K <= draft_context - len(committed) + 1, since the draft never caches its
            K-th token); for `drafter` None only (a driven drafter's own draft model caps its K itself).

    Returns:
        The rounds in order; their emitted tokens sum to ``len(trace.target_ids)``.

    Raises:
        ValueError: neither or both of `k` and `policy`; k < 1; a draft-model replay on a trace without draft
            tokens.
    """
    if (k is None) == (policy is None):
        raise ValueError("give exactly one of k and policy")
    if k is not None and k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    agree = trace.agreement() if drafter is None else None
    target = trace.target_ids
    if policy is not None:
        # the draft model defers its prefill to its first drafting round (`ModelDrafter.defers_prefill`), and
        # the engine tells the policy so for any drafter that defers it
        defers = drafter is None or getattr(drafter, "defers_prefill", False)
        policy.start(prefill_tokens=len(trace.prompt_ids) if defers else None, budget=trace.max_new_tokens)
    rounds: list[ReplayRound] = []
    pos = 0
    if drafter is not None:
        drafter.prefill(list(trace.prompt_ids[:-1]))
    while pos < len(target):
        plan = None if policy is None else policy.next_round()
        want = k if policy is None else max(0, int(plan.k))
        stop = None if plan is None else plan.min_confidence
        kk = min(want, trace.max_new_tokens - pos - 1)
        if drafter is None and draft_context is not None:
            # `ModelDrafter.max_k`: a round ends with committed[:-1] + last + d1 .. d_{K-1} in the draft's cache
            kk = min(kk, draft_context - (len(trace.prompt_ids) + pos) + 1)
        kk = max(kk, 0)
        if drafter is None:
            drafted, accepted, stopped = _model_round(trace, agree, pos, kk, stop)
            by_model = None
        else:
            drafted, accepted, stopped, by_model = _drafter_round(trace, drafter, pos, kk, stop)
        emitted = min(accepted + 1, len(target) - pos)
        r = ReplayRound(drafted, min(accepted, emitted), emitted, stopped, by_model)
        rounds.append(r)
        if policy is not None:
            timed = _same_round(clock, len(rounds) - 1, r)
            clock = clock if timed is not None else None  # out of step with the timed run from here on
            policy.observe(r.as_record(timed))
        pos += emitted
        if drafter is not None:
            drafter.rollback(list(trace.prompt_ids) + list(target[:pos]))
    return rounds


def _same_round(clock: Sequence[RoundRecord] | None, i: int, r: ReplayRound) -> RoundRecord | None:
    """`clock`'s round `i` when it is the replayed round `r` (same K, accepted and emitted tokens), else None."""
    if clock is None or i >= len(clock):
        return None
    c = clock[i]
    return c if (c.k, c.num_accepted, c.num_emitted) == (r.k, r.num_accepted, r.num_emitted) else None


def draft_pending(rounds: Sequence, prompt_len: int | None = None) -> list[int]:
    """Tokens the draft model feeds in the first forward of each round: its catch-up (`ModelDrafter.propose`).

    The draft's cache ends a round holding the committed sequence up to its last token plus the draft tokens
    it fed (d_1 .. d_{k-1}; d_k is proposed but never fed, unless the draft stopped on its confidence, which
    fed d_k to read the next token's confidence); `ModelDrafter.rollback` keeps the part that agrees with
    the new committed sequence. So the next round starts by feeding 1 token (the recovered or bonus token)
    after a round with a rejection or a confidence stop, 2 after an all-accepted round that drafted the K
    asked (d_k and the bonus token), and one more for every plain round (k = 0) in between, which feeds the
    draft nothing. The first round feeds the prompt's last token alone when the draft's cache already holds
    the rest (an eager draft prefill, as runs stored before `ModelDrafter.prefill` deferred it), or the
    whole prompt when it is empty (`prompt_len`: `ModelDrafter` defers its prefill to the first round that
    drafts). A round that another drafter drafted (``by_model`` False: the mixed drafter's suffix rounds)
    feeds the draft nothing either, and adds every token it committed. Prompt lookup has no cache: this
    applies to the draft model only.

    Args:
        rounds: `ReplayRound`s or `specdec.core.metrics.RoundRecord`s in order (``k`` drafted, ``num_accepted``,
            ``draft_stopped`` and ``by_model`` when present; ``num_emitted`` for a round with ``by_model``
            False).
        prompt_len: the prompt's tokens when the draft's prefill is deferred (None: prefilled eagerly).

    Returns:
        ``[len(rounds)]`` pending token counts (>= 1; a plain round's entry is what a draft forward would
        have fed there).
    """
    out: list[int] = []
    pending = 1 if prompt_len is None else max(1, int(prompt_len))
    for r in rounds:
        out.append(pending)
        if r.k > 0 and getattr(r, "by_model", None) is False:
            pending += r.num_emitted
        elif r.k > 0:
            full = r.num_accepted >= r.k and not getattr(r, "draft_stopped", False)
            pending = 2 if full else 1
        else:
            pending += 1
    return out


def compare_rounds(timed: Sequence[RoundRecord], replayed: Sequence[ReplayRound], *,
                   k_upper_bound: bool = False) -> list[dict]:
    """Rounds where a timed run and its replay differ: ``[{"round", "position", "timed": (k, accepted,
    emitted), "replayed": (k, accepted, emitted)}]``, empty when the replay reproduces the run exactly.
    Compared round by round until the first difference (after it the two sequences are out of step), plus a
    length mismatch. `k_upper_bound`: the replayed K only bounds the timed one from above (a confidence
    policy's replay, see `replay`); accepted and emitted tokens must still be equal."""
    out = []
    pos = 0
    for i, (a, b) in enumerate(zip(timed, replayed)):
        same_k = a.k <= b.k if k_upper_bound else a.k == b.k
        if not same_k or (a.num_accepted, a.num_emitted) != (b.num_accepted, b.num_emitted):
            out.append({"round": i, "position": pos, "timed": (a.k, a.num_accepted, a.num_emitted),
                        "replayed": (b.k, b.num_accepted, b.num_emitted)})
            return out
        pos += a.num_emitted
    if len(timed) != len(replayed):
        out.append({"round": min(len(timed), len(replayed)), "position": pos, "timed": len(timed),
                    "replayed": len(replayed)})
    return out


def next_token_logits(backend, ids: Sequence[int]) -> torch.Tensor:
    """Next-token logits ``[vocab]`` after `ids` from a fresh cache (``reset``, prefill ``ids[:-1]``,
    then one forward of the last token, as the decoding loops do). Resets `backend` first."""
    backend.reset()
    backend.forward(list(ids[:-1]), logits=False)
    row = backend.forward([ids[-1]])[-1]
    backend.reset()
    return row


def divergence_with_margin(
    eager_ids: Sequence[int],
    compiled_ids: Sequence[int],
    logits_fn: Callable[[list[int]], torch.Tensor],
    *,
    prompt: Sequence[int] = (),
) -> dict | None:
    """The first step where two greedy generations differ, with the target's top-2 margin there.

    Args:
        eager_ids: new tokens from one path (e.g. eager target-only greedy).
        compiled_ids: new tokens from the other path (e.g. compiled).
        logits_fn: ``prefix -> [vocab]`` next-token logits of the reference target after
            ``prompt + prefix`` (e.g. ``lambda p: next_token_logits(eager_target, p)``); it receives the
            full sequence ``list(prompt) + common_prefix``.
        prompt: the prompt both generations continued.

    Returns:
        None when the sequences are identical; otherwise ``{"step": i (0-based new-token index),
        "eager_token", "compiled_token", "top1", "top2" (token ids), "margin" (top1 - top2 logit, same units
        as the logits), "length_only" (True when one sequence is a prefix of the other)}``.
    """
    a, b = list(eager_ids), list(compiled_ids)
    if a == b:
        return None
    step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    logits = logits_fn(list(prompt) + a[:step]).float()
    top = torch.topk(logits, 2)
    return {
        "step": step,
        "eager_token": a[step] if step < len(a) else None,
        "compiled_token": b[step] if step < len(b) else None,
        "top1": int(top.indices[0]),
        "top2": int(top.indices[1]),
        "margin": float(top.values[0] - top.values[1]),
        "length_only": step >= min(len(a), len(b)),
    }
