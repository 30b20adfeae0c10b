"""Drafters for a draft model whose tokenizer is not the target's (universal assisted generation).

Speculative decoding verifies *target* ids, so a draft of another model family (another vocabulary) must
translate between the two id spaces; the target still checks every proposed id itself, so the output stays
exact. Two algorithms of Timor, Mamou et al. (ICML 2025, arXiv 2502.05202), as transformers' universal
assisted generation implements the first:

- `StringMatchDrafter` (string-level exact match): the draft continues the committed text in its own
  tokens; the drafted tokens are decoded to text and the target's tokenizer re-tokenizes the committed tail
  plus that text; the target ids after the committed ones are the proposal. Deterministic proposal
  (``Draft.probs`` None, a one-hot q), so greedy output is the target's and sampled output follows the
  target's distribution through the engine's rejection rule, whatever the draft's vocabulary.
- `IntersectionDrafter` (token-level intersection): the draft's distribution is restricted to the tokens
  that spell the same bytes in both vocabularies (`specdec.runtimes.compat.vocab_overlap`), renormalised and mapped
  to target ids; standard speculative sampling then uses that q (``Draft.probs`` over the TARGET
  vocabulary), which accepts more than a one-hot q where the distributions agree.

Both keep the draft's cache in step with the committed sequence as `specdec.drafters.model.ModelDrafter` does,
but in the draft's own token space: each round the committed target ids are decoded to text and
re-tokenized with the draft's tokenizer (`StringMatchDrafter.draft_context`), the draft's cache is truncated
to the longest prefix it shares with that sequence and the rest is fed. Pitfalls handled (reported against
transformers' implementation): special tokens are never re-added by a re-tokenization
(``add_special_tokens=False``; the draft's BOS is put first exactly once when its tokenizer adds one), nor
parsed out of text (``split_special_tokens=True``: a literal ``<s>`` in HTML stays characters); text is
decoded with ``skip_special_tokens=False, clean_up_tokenization_spaces=False`` so that spaces survive the
round trip; special tokens travel between the vocabularies by name (``<|im_end|>`` in both) or not at all,
never as text.
"""

from __future__ import annotations

import torch

from specdec.core.sampling import SamplingParams, sample, warp
from specdec.drafters.base import Draft
from specdec.runtimes.base import Backend
from specdec.runtimes.compat import real_vocab_size, vocab_overlap

#: committed target tokens re-tokenized with the drafted text (the rest of the sequence is left alone)
TAIL_TOKENS = 32
#: draft tokens decoded before the drafted ones, so that a leading space of the first one survives decoding
DECODE_WINDOW = 8
_DECODE = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
#: text is re-tokenized as text: no BOS added, and a literal "<s>" in it (HTML, code) stays characters
_ENCODE = {"add_special_tokens": False, "split_special_tokens": True}


def _added_ids(tokenizer) -> dict[int, str]:
    """Added and special tokens of a tokenizer: id -> content (they are names, not text)."""
    out = {int(i): str(getattr(t, "content", t)) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    for i in tokenizer.all_special_ids:
        out.setdefault(int(i), tokenizer.convert_ids_to_tokens(int(i)))
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class StringMatchDrafter:
    """Draft with a causal LM of another tokenizer; propose the target ids that spell the drafted text.

    Each round: re-tokenize the committed text for the draft (`draft_context`), sync the draft's cache,
    draft up to K draft tokens (argmax, or sampled from the draft's warped distribution), decode them to
    text, and translate that text to target ids (`to_target`). The proposal is cut to K target ids. The
    draft stops at any of its added/special tokens (its EOS among them); when that token's name is also a
    target token (``<|im_end|>``), that target id ends the proposal.

    The proposal is deterministic given the drafted tokens and carries no probabilities: the engine treats
    it as a one-hot q, which keeps sampled decoding exact (for any proposed token d, accepting with
    probability p(d) and otherwise drawing from p without d yields p).

    Args:
        backend: the draft model and its cache (its own vocabulary).
        target_tokenizer, draft_tokenizer: Hugging Face tokenizers of the two models.
        draft_eos_ids: ids (draft space) that end the draft besides its added tokens, e.g. llama.cpp's
            end-of-generation set (`specdec.runtimes.loading.LoadedModel.eos_ids`).

    Raises:
        ValueError: the draft backend scores fewer tokens than its tokenizer has.
    """

    name = "xtok"

    def __init__(self, backend: Backend, target_tokenizer, draft_tokenizer, *,
                 draft_eos_ids: frozenset[int] | set[int] = frozenset()) -> None:
        self.backend = backend
        self.target_tok = target_tokenizer
        self.draft_tok = draft_tokenizer
        self.draft_vocab = real_vocab_size(draft_tokenizer)
        if backend.vocab_size < self.draft_vocab:
            raise ValueError(f"the draft model scores {backend.vocab_size} tokens but its tokenizer has {self.draft_vocab}")
        self._t_added = _added_ids(target_tokenizer)
        self._d_added = _added_ids(draft_tokenizer)
        d_by_name = {name: i for i, name in sorted(self._d_added.items(), reverse=True)}
        t_by_name = {name: i for i, name in sorted(self._t_added.items(), reverse=True)}
        self._t2d_special = {i: d_by_name.get(name) for i, name in self._t_added.items()}
        self._d2t_special = {i: t_by_name.get(name) for i, name in self._d_added.items()}
        self._draft_stop = set(self._d_added) | {int(i) for i in draft_eos_ids}
        bos = getattr(draft_tokenizer, "bos_token_id", None)
        adds_bos = bos is not None and draft_tokenizer("a")["input_ids"][:1] == [bos]
        self._draft_bos = int(bos) if adds_bos else None
        self._cached: list[int] = []

    # -- translation between the two token spaces -------------------------------------------------------

    def _target_text(self, ids: list[int]) -> str:
        return self.target_tok.decode(ids, **_DECODE) if ids else ""

    def draft_context(self, committed: list[int]) -> list[int]:
        """The committed target ids as the draft's tokens: each run of text between target special tokens
        decoded and re-tokenized with the draft's tokenizer (`_ENCODE`: no special tokens added or parsed
        from the text), each special
        token replaced by the draft's token of the same name (dropped when the draft has none), and the
        draft's BOS first, once, when its tokenizer adds one."""
        out: list[int] = []
        run: list[int] = []
        for t in list(committed) + [None]:
            if t is not None and t not in self._t_added:
                run.append(t)
                continue
            if run:
                out.extend(self.draft_tok.encode(self._target_text(run), **_ENCODE))
                run = []
            if t is not None and self._t2d_special[t] is not None:
                out.append(self._t2d_special[t])
        if self._draft_bos is not None and out[:1] != [self._draft_bos]:
            out.insert(0, self._draft_bos)
        return out

    def _tail(self, committed: list[int]) -> list[int]:
        """The last `TAIL_TOKENS` committed ids after the last target special token."""
        start = max(0, len(committed) - TAIL_TOKENS)
        for j in range(len(committed) - 1, start - 1, -1):
            if committed[j] in self._t_added:
                return list(committed[j + 1:])
        return list(committed[start:])

    def draft_text(self, context: list[int], drafted: list[int]) -> str:
        """The text the `drafted` draft tokens add after `context` (draft ids), decoded after a window of
        the context so that a leading space is kept; an incomplete UTF-8 character at its end is dropped."""
        if not drafted:
            return ""
        window = context[-DECODE_WINDOW:]
        prev = self.draft_tok.decode(window, **_DECODE)
        full = self.draft_tok.decode(window + drafted, **_DECODE)
        text = full[len(prev):] if full.startswith(prev) else self.draft_tok.decode(drafted, **_DECODE)
        return text.rstrip("\ufffd")

    def to_target(self, committed: list[int], text: str) -> list[int]:
        """Target ids that extend `committed` by `text`.

        The committed tail (`_tail`) is decoded, ``tail_text + text`` re-tokenized with the target's
        tokenizer (`_ENCODE`); when that reproduces the tail's ids as a prefix, the ids
        after it are returned (what the target's tokenizer makes of the text in context). Otherwise (the
        committed ids are not the tokenizer's own, or the text continues the tail's last word:
        ``"foo" + "bar" -> "foobar"``), the re-tokenization is cut after its longest prefix that spells
        exactly ``tail_text``, when it has one, and the ids after it are returned; failing that, the text
        tokenized alone, if the tail's ids followed by it decode to exactly ``tail_text + text``;
        otherwise nothing is proposed.
        """
        if not text:
            return []
        tail = self._tail(committed)
        tail_text = self._target_text(tail)
        ids = self.target_tok.encode(tail_text + text, **_ENCODE)
        if ids[:len(tail)] == tail:
            return ids[len(tail):]
        for j in range(len(ids) - 1, _common_prefix(ids, tail), -1):
            if self._target_text(ids[:j]) == tail_text:
                return ids[j:]
        alone = self.target_tok.encode(text, **_ENCODE)
        return alone if self._target_text(tail + alone) == tail_text + text else []

    # -- the Drafter protocol ----------------------------------------------------------------------------

    def prefill(self, context: list[int]) -> None:
        """Reset the draft's cache and feed `context` (target ids) as draft tokens (`draft_context`); when
        they do not fit the draft's context nothing is fed (the next `propose` decides again)."""
        self.backend.reset()
        self._cached = []
        ctx = self.draft_context(context)
        if not ctx or len(ctx) + 1 > self.backend.max_length:
            return
        self.backend.forward(ctx, logits=False)
        self._cached = ctx

    def max_k(self, committed_len: int) -> int:
        """Unbounded here: the draft's context is counted in draft tokens, known only once the committed
        text is re-tokenized, so `propose` clamps K to the draft's room itself (0 when full)."""
        return 1 << 30

    def rollback(self, committed) -> None:
        """Nothing: `propose` re-tokenizes the committed text and truncates the draft's cache to the
        longest prefix it shares with it, which drops the rejected drafts."""

    def _sync(self, committed: list[int], k: int) -> tuple[list[int], torch.Tensor, int] | None:
        """Bring the draft's cache to ``draft_context(committed)``, feeding only what differs
        from the cached tokens (at least the last one); returns the context, the draft's next-token
        logits ``[draft_vocab]`` and the draft steps `k` leaves room for, or None when k <= 0 or the context
        is empty or does not fit."""
        if k <= 0:
            return None
        ctx = self.draft_context(committed)
        if not ctx or len(ctx) > self.backend.max_length:
            return None
        n = min(_common_prefix(self._cached, ctx), len(ctx) - 1)
        if n < self.backend.cache_length:
            self.backend.truncate(n)
        del self._cached[n:]
        logits = self.backend.forward(ctx[n:], last=1)[-1, : self.draft_vocab]
        self._cached.extend(ctx[n:])
        return ctx, logits, min(k, self.backend.max_length - len(ctx) + 1)

    def _draw(self, logits: torch.Tensor, sampling: SamplingParams, generator, i: int,
              min_confidence: float | None) -> tuple[int | None, torch.Tensor | None]:
        """One draft step over `logits`: the token (None: the confidence stop ends the draft) and the
        distribution it was drawn from (None under greedy)."""
        q = None if sampling.greedy else warp(logits, sampling)
        if i >= 1 and min_confidence is not None:
            dist = q if q is not None else torch.softmax(logits.float(), dim=-1)
            if float(dist.max()) < min_confidence:
                return None, None
        if q is None:
            return int(logits.argmax()), None
        if generator is not None and q.device != generator.device:
            q = q.to(generator.device)
        return sample(q, generator), q

    def propose(self, committed, k, sampling, generator, min_confidence=None) -> Draft:
        """Up to `k` target ids spelling the draft's continuation of the committed text (see the class)."""
        synced = self._sync(list(committed), k)
        if synced is None:
            return Draft([], None)
        ctx, logits, steps = synced
        drafted: list[int] = []
        end: int | None = None
        for i in range(steps):
            t, _ = self._draw(logits, sampling, generator, i, min_confidence)
            if t is None:
                break
            if t in self._draft_stop:  # the draft's EOS (or another special token) ends the draft
                end = self._d2t_special.get(t)
                break
            drafted.append(t)
            if i < steps - 1:
                logits = self.backend.forward([t])[-1, : self.draft_vocab]
                self._cached.append(t)
        text = self.draft_text(ctx, drafted)
        tokens = self.to_target(list(committed), text)
        if end is not None and (tokens or not text):
            tokens.append(end)
        return Draft(tokens[:k], None)


class IntersectionDrafter(StringMatchDrafter):
    """Draft over the tokens both vocabularies share; report q over the target's vocabulary.

    Each draft step restricts the draft's logits to the draft ids whose token spells the same bytes (or is
    the added token of the same name) in the target's vocabulary (`specdec.runtimes.compat.vocab_overlap`), warps
    them with the run's sampling parameters (argmax under greedy), and maps the resulting distribution to
    target ids (`target_distribution`); the token is drawn there and fed back to the draft as its draft id.
    Speculative sampling with that q is exact (Leviathan et al. 2023, Thm. 1: any q works when it is the
    distribution the token was drawn from); acceptance is what the restriction leaves of the draft's
    agreement with the target. A drafted token whose draft id is a stop token (the draft's EOS) is
    proposed and ends the draft.

    Args:
        backend, target_tokenizer, draft_tokenizer, draft_eos_ids: as `StringMatchDrafter`.
        target_vocab_size: width of ``Draft.probs`` rows: the vocabulary the engine slices the target's
            logits to (`specdec.runtimes.loading.LoadedPair.vocab_size`; default the target tokenizer's real size).

    Raises:
        specdec.runtimes.compat.IncompatibleTokenizersError: the vocabularies share no token.
        ValueError: as `StringMatchDrafter`.
    """

    name = "xtok-tli"

    def __init__(self, backend: Backend, target_tokenizer, draft_tokenizer, *,
                 draft_eos_ids: frozenset[int] | set[int] = frozenset(), target_vocab_size: int | None = None) -> None:
        super().__init__(backend, target_tokenizer, draft_tokenizer, draft_eos_ids=draft_eos_ids)
        self.overlap = vocab_overlap(target_tokenizer, draft_tokenizer)
        self.target_vocab = int(target_vocab_size or real_vocab_size(target_tokenizer))
        d2t = torch.tensor(self.overlap.draft_to_target[: self.draft_vocab], dtype=torch.long)
        d2t[d2t >= self.target_vocab] = -1
        self._shared = d2t >= 0  # [draft_vocab] draft ids with a target twin
        self._d2t = d2t
        self._t2d: dict[int, int] = {}
        for d, t in enumerate(d2t.tolist()):
            if t >= 0:
                self._t2d.setdefault(t, d)

    def target_distribution(self, logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """The draft's next-token distribution restricted to the shared tokens, warped, over TARGET ids.

        Args:
            logits: ``[draft_vocab]`` the draft's logits.
            sampling: a stochastic `SamplingParams`.

        Returns:
            float32 ``[target_vocab]`` probabilities summing to 1 (zero outside the shared tokens).
        """
        shared = self._shared.to(logits.device)
        q_draft = warp(logits.float().masked_fill(~shared, float("-inf")), sampling)
        out = torch.zeros(self.target_vocab, dtype=torch.float32, device=logits.device)
        return out.index_add_(0, self._d2t.to(logits.device)[shared], q_draft[shared])

    def propose(self, committed, k, sampling, generator, min_confidence=None) -> Draft:
        """Up to `k` target ids drawn from the restricted draft distribution, with their q rows."""
        synced = self._sync(list(committed), k)
        if synced is None:
            return Draft([], None)
        _, logits, steps = synced
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(steps):
            if sampling.greedy:
                restricted = logits.float().masked_fill(~self._shared.to(logits.device), float("-inf"))
                q = None
                if i >= 1 and min_confidence is not None and float(torch.softmax(restricted, -1).max()) < min_confidence:
                    break
                t = int(self._d2t[int(restricted.argmax())])
            else:
                q = self.target_distribution(logits, sampling)
                if i >= 1 and min_confidence is not None and float(q.max()) < min_confidence:
                    break
                if generator is not None and q.device != generator.device:
                    q = q.to(generator.device)
                t = sample(q, generator)
                probs.append(q)
            tokens.append(t)
            d = self._t2d[t]
            if d in self._draft_stop:
                break
            if i < steps - 1:
                logits = self.backend.forward([d])[-1, : self.draft_vocab]
                self._cached.append(d)
        return Draft(tokens, torch.stack(probs) if probs else None)


def cross_tokenizer_drafter(pair, sampling: SamplingParams):
    """The drafter for a pair loaded with ``load_pair(..., other_tokenizer=True)``: string-level exact match
    under greedy decoding (it proposes what the target's tokenizer makes of the drafted text), token-level
    intersection under sampling (its q is the draft's real distribution, so more proposals pass than with a
    one-hot q); both exact.

    Raises:
        ValueError: the pair has no draft model.
    """
    if pair.draft is None:
        raise ValueError("a draft with another tokenizer needs a draft model")
    kw = {"draft_eos_ids": pair.draft.eos_ids}
    if sampling.greedy:
        return StringMatchDrafter(pair.draft.backend, pair.target.tokenizer, pair.draft.tokenizer, **kw)
    return IntersectionDrafter(pair.draft.backend, pair.target.tokenizer, pair.draft.tokenizer,
                               target_vocab_size=pair.vocab_size, **kw)
