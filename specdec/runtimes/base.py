"""The backend interface: one model plus its KV cache, behind `forward(tokens)` and `truncate(length)`.

Every decoding method in specdec (target-only baseline, speculative decoding with any drafter) talks to
models only through this interface, so the baseline and the speculative loop run the very same model,
cache and kernel code. A backend never samples and never times anything: it turns token ids into logits.

Cache invariant (as llama.cpp's `speculative-simple`): the decoding loop keeps the *last committed token*
out of the cache. A round feeds `[last, d1 .. dK]` and gets logits for K+1 positions; afterwards the
loop calls `truncate(n)` once to drop the rejected suffix. `truncate` is the one rollback call.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specdec.errors import SetupError


class BackendError(SetupError):
    """A backend cannot do what was asked (cache cannot be cropped, context overflow, ...)."""


class ContextOverflowError(BackendError, ValueError):
    """The tokens asked for do not fit in the model's context window."""


@runtime_checkable
class Backend(Protocol):
    """One causal LM with a KV cache.

    Attributes:
        name: runtime name, ``"transformers"`` or ``"llamacpp"``.
        vocab_size: width of the logits rows this backend returns (the embedding rows; may exceed the
            tokenizer's vocabulary because of padding, the engine slices to the shared vocabulary).
        max_length: context window in tokens; `forward` raises `ContextOverflowError` beyond it.
        device: where returned logits live.
    """

    name: str
    vocab_size: int
    max_length: int
    device: torch.device

    @property
    def cache_length(self) -> int:
        """Number of tokens whose keys/values are in the cache."""
        ...

    def forward(self, tokens: list[int], *, logits: bool = True, last: int | None = None) -> torch.Tensor | None:
        """Append `tokens` to the cache and score them.

        Args:
            tokens: ``n >= 0`` token ids; ``n == 0`` is a no-op returning an empty ``[0, vocab_size]``.
            logits: when False (prefill), skip the LM head and return None.
            last: score only the last `last` tokens (1 <= last; values >= n mean all): the LM head runs on
                those rows alone (transformers' ``logits_to_keep``, llama.cpp's per-token logits flag), as a
                draft needs after feeding several committed tokens (C22). None: every row.

        Returns:
            float32 logits ``[n, vocab_size]`` (``[min(last, n), vocab_size]`` with `last`) on `device`: row
            i is the next-token distribution after the i-th token scored.

        Raises:
            ContextOverflowError: ``cache_length + n > max_length``.
            ValueError: ``last < 1``.
        """
        ...

    def truncate(self, length: int) -> None:
        """Roll the cache back so that it holds exactly its first `length` tokens (one call).

        Raises:
            ValueError: ``length`` is negative or above `cache_length`.
        """
        ...

    def reset(self) -> None:
        """Empty the cache (``truncate(0)``)."""
        ...

    def synchronize(self) -> None:
        """Wait for queued device work (CUDA) so that a clock read after it is honest; no-op on CPU."""
        ...


class BatchedBackend(Protocol):
    """One causal LM serving B rows (sequences), each with its own KV cache length.

    Same cache invariant as `specdec.runtimes.base.Backend`, per row. Rows are addressed by their index in
    the current batch (0 .. rows - 1); `keep` renumbers them.

    Attributes:
        name, vocab_size, device: as `Backend`. max_length: context window of EACH row, in tokens.
        max_rows: most rows at once (llama.cpp's ``n_seq_max``), None for no fixed limit.
    """

    name: str
    vocab_size: int
    max_length: int
    max_rows: int | None
    device: torch.device

    @property
    def rows(self) -> int:
        """Live rows."""
        ...

    @property
    def cache_lengths(self) -> list[int]:
        """Tokens in each live row's cache."""
        ...

    def prefill(self, contexts: list[list[int]]) -> None:
        """Drop every row and start ``len(contexts)`` rows, row i caching ``contexts[i]`` (may be empty)."""
        ...

    def forward(self, tokens: list[list[int]], *, last: int | None = None) -> list[torch.Tensor]:
        """Append ``tokens[i]`` to row i (``n_i >= 0``, rows may differ) and return per-row float32 logits
        ``[n_i, vocab]`` (``[min(last, n_i), vocab]`` with `last`). Raises ContextOverflowError past
        `max_length`."""
        ...

    def truncate(self, lengths: list[int]) -> None:
        """Roll row i back to its first ``lengths[i]`` tokens (one call for the batch)."""
        ...

    def keep(self, rows: list[int]) -> None:
        """Keep only rows `rows`, renumbered 0.. in that order; the others are freed."""
        ...

    def synchronize(self) -> None:
        """Wait for queued device work before a clock read."""
        ...


class OneRow:
    """A single-sequence `Backend` as a `BatchedBackend` of one row: the decoding loop serves B = 1 through the
    same code as any B, on the backend that decodes one sequence (no row masks, no per-row positions).

    `prefill` with one context resets the cache and feeds it; `forward` takes one row's tokens and returns
    its logits in a one-element list; `truncate` acts on that row; `keep` of no row ends it, leaving the cache
    as the row's last round left it (the committed sequence minus its last token).

    Raises:
        ValueError: more than one row asked for.
    """

    max_rows = 1

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name, self.vocab_size, self.max_length = backend.name, backend.vocab_size, backend.max_length
        self.device = backend.device
        self._rows = 0

    @property
    def rows(self) -> int:
        return self._rows

    @property
    def cache_lengths(self) -> list[int]:
        return [self.backend.cache_length] * self._rows

    def prefill(self, contexts: list[list[int]]) -> None:
        if len(contexts) != 1:
            raise ValueError(f"a single-sequence backend serves one row, got {len(contexts)}")
        self.backend.reset()
        self.backend.forward(list(contexts[0]), logits=False)
        self._rows = 1

    def forward(self, tokens: list[list[int]], *, last: int | None = None) -> list[torch.Tensor]:
        if len(tokens) != self._rows:
            raise ValueError(f"got {len(tokens)} rows of tokens for {self._rows} live rows")
        return [self.backend.forward(list(tokens[0]), last=last)]

    def truncate(self, lengths: list[int]) -> None:
        self.backend.truncate(int(lengths[0]))

    def keep(self, rows: list[int]) -> None:
        self._rows = len(rows)

    def synchronize(self) -> None:
        self.backend.synchronize()
