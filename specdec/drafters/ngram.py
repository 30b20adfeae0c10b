"""Prompt lookup: `PromptLookupDrafter`, n-gram matching against the prompt and the text generated so far; no
model (Saxena 2023, "prompt lookup decoding"; transformers' ``prompt_lookup_num_tokens``; vLLM's ``ngram``)."""

from __future__ import annotations

from specdec.drafters.base import Draft


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
