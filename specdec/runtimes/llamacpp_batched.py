"""The llama.cpp backend for B sequences at once: each row its own ``seq_id`` in one context.

One context with ``n_seq_max = max_rows`` and one KV stream per sequence (``kv_unified = false``: each row
has its own ``n_ctx`` cells). A forward is one ``llama_decode`` over a batch that holds every row's tokens,
each tagged with its row's sequence id and its row's own positions (``length_i + j``), so llama.cpp's
attention mask keeps every row to its own keys; rollback is one ``llama_memory_seq_rm(mem, seq, length,
-1)`` per row whose length changes, and a finished row's sequence is removed whole, freeing its cells.
Logits come back in batch order for the flagged tokens and are split per row. This is how llama.cpp's
``examples/batched`` and ``llama-server``'s parallel slots decode several sequences.

Why separate streams: in a unified buffer, cells freed by one row (its rejected drafts, or the whole row
when it finishes) are refilled by the next tokens of other rows, so a row's keys no longer sit in position
order and attention sums them in another order. The logits then differ by rounding, which the quantized
matmuls downstream amplify: on SmolLM2-135M Q4_1 a row's logits moved by 0.36 after another row was
removed, enough to flip greedy tokens. With one stream per row a row's cells are its own, in order, as in
the single-sequence backend, and its logits were bitwise equal to single-sequence decoding in that test.
"""

from __future__ import annotations

import ctypes
import os

import torch

from specdec.runtimes.base import BackendError, ContextOverflowError
from specdec.runtimes.llamacpp import DEFAULT_N_BATCH, LlamaCppBackend

#: Per-row context when none is given (tokens).
DEFAULT_ROW_CTX = 2048


class BatchedLlamaCppBackend:
    """A GGUF causal LM on llama.cpp behind the `specdec.runtimes.base.BatchedBackend` interface.

    Args:
        model_path: a ``.gguf`` file.
        max_rows: most rows at once (llama.cpp's ``n_seq_max``), >= 1.
        n_ctx: context window of each row in tokens (default `DEFAULT_ROW_CTX`, capped by the trained
            context); each row gets its own KV stream of `n_ctx` cells (rounded up to llama.cpp's 256).
        n_threads, n_batch, extra_buffers, verbose: as `specdec.runtimes.llamacpp.LlamaCppBackend`. A
            forward longer than `n_batch` tokens in total is fed in chunks.
        pad_ragged: pad the rows of a forward to the longest row (fillers never scored, removed after the
            decode) when the fillers are at most the real tokens, so llama.cpp runs it as one micro-batch
            instead of one per token depth (`forward`).

    Attributes:
        name: ``"llamacpp"``. vocab_size, device: as the single-sequence backend. max_length: per-row
        context. max_rows: as given.

    Raises:
        GGUFNotFoundError, BackendError: as `LlamaCppBackend`. ValueError: ``max_rows < 1``.
    """

    name = "llamacpp"
    device = torch.device("cpu")

    def __init__(self, model_path: str | os.PathLike, *, max_rows: int, n_ctx: int | None = None,
                 n_threads: int | None = None, n_batch: int = DEFAULT_N_BATCH, extra_buffers: bool | None = None,
                 verbose: bool = False, pad_ragged: bool = True) -> None:
        self.pad_ragged = bool(pad_ragged)
        if int(max_rows) < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = int(max_rows)
        row_ctx = int(n_ctx or DEFAULT_ROW_CTX)
        if row_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        padded = -(-row_ctx // 256) * 256  # llama.cpp pads each sequence's stream to a multiple of 256 cells
        self._llama = LlamaCppBackend(model_path, n_ctx=padded * self.max_rows, n_threads=n_threads,
                                      n_batch=n_batch, extra_buffers=extra_buffers, verbose=verbose,
                                      n_seq_max=self.max_rows)
        ll = self._llama
        if ll.n_ctx_train > 0:
            row_ctx = min(row_ctx, ll.n_ctx_train)
        self.max_length = min(row_ctx, int(ll._lib.llama_n_ctx_seq(ll._ctx.ctx)))
        self.vocab_size = ll.vocab_size
        self.n_batch = ll.n_batch
        self._lib, self._ctx, self._mem = ll._lib, ll._ctx.ctx, ll._ctx.memory
        self._b = ll._batch.batch
        self._seqs: list[int] = []  # llama.cpp sequence id of each live row
        self._lengths: list[int] = []

    @property
    def rows(self) -> int:
        return len(self._lengths)

    @property
    def cache_lengths(self) -> list[int]:
        return list(self._lengths)

    def valid_counts(self) -> list[int]:
        """Tokens each live row holds as llama.cpp reports it (``llama_memory_seq_pos_max + 1``; equal to
        `cache_lengths`, exposed for tests)."""
        return [int(self._lib.llama_memory_seq_pos_max(self._mem, s)) + 1 for s in self._seqs]

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> list[torch.Tensor]:
        """Decode ``(seq, pos, token, want_logits)`` entries in chunks of `n_batch`; the logits rows of the
        flagged entries, in order."""
        out: list[torch.Tensor] = []
        row_bytes = 4 * self.vocab_size
        b = self._b
        for start in range(0, len(entries), self.n_batch):
            chunk = entries[start:start + self.n_batch]
            for j, (seq, pos, tok, flag) in enumerate(chunk):
                b.token[j] = tok
                b.pos[j] = pos
                b.seq_id[j][0] = seq
                b.n_seq_id[j] = 1
                b.logits[j] = 1 if flag else 0
            b.n_tokens = len(chunk)
            rc = self._lib.llama_decode(self._ctx, b)
            if rc != 0:
                raise BackendError(f"llama_decode returned {rc} for a batch of {len(chunk)} tokens")
            n_out = sum(1 for e in chunk if e[3])
            if n_out:
                ptr = self._lib.llama_get_logits(self._ctx)
                if not ptr:
                    raise BackendError("llama_get_logits returned NULL")
                block = torch.empty(n_out, self.vocab_size, dtype=torch.float32)
                ctypes.memmove(block.data_ptr(), ptr, n_out * row_bytes)
                out.extend(block.unbind(0))
        return out

    def prefill(self, contexts: list[list[int]]) -> None:
        """Clear the cache and start one row (sequence ``i``) per context, fed in shared batches.

        Raises:
            ValueError: no rows or more than `max_rows`. ContextOverflowError: a context past `max_length`.
            BackendError: llama.cpp failed (the cache is cleared).
        """
        if not contexts or len(contexts) > self.max_rows:
            raise ValueError(f"a batch holds 1 to {self.max_rows} rows, got {len(contexts)}")
        for i, ctx in enumerate(contexts):
            if len(ctx) > self.max_length:
                raise ContextOverflowError(f"row {i}: {len(ctx)} tokens exceed the context of {self.max_length}")
        self.reset()
        entries = [(i, p, t, False) for i, ctx in enumerate(contexts) for p, t in enumerate(ctx)]
        try:
            self._decode(entries)
        except BackendError:
            self.reset()
            raise
        self._seqs = list(range(len(contexts)))
        self._lengths = [len(c) for c in contexts]

    def forward(self, tokens: list[list[int]], *, last: int | None = None) -> list[torch.Tensor]:
        """See `specdec.runtimes.base.BatchedBackend.forward`: one ``llama_decode`` (per `n_batch` tokens) for
        every row, logits flagged on the rows' scored positions only; rows fed fewer tokens than the longest
        are padded with unscored fillers removed after the decode while the fillers are at most the real
        tokens (`pad_ragged`).

        Raises:
            ValueError: wrong number of rows, ``last < 1``. ContextOverflowError: a row past `max_length`
            (nothing evaluated). BackendError: llama.cpp failed; every row is rolled back to its length
            before the call.
        """
        if len(tokens) != self.rows:
            raise ValueError(f"got tokens for {len(tokens)} rows, the batch has {self.rows}")
        if last is not None and last < 1:
            raise ValueError(f"last must be >= 1 (rows to score), got {last}")
        for i, t in enumerate(tokens):
            if self._lengths[i] + len(t) > self.max_length:
                raise ContextOverflowError(
                    f"row {i}: {self._lengths[i]} cached + {len(t)} new tokens exceed the context of {self.max_length}"
                )
        entries, counts = [], {}
        # Ragged rows are padded to the longest: with one KV stream per row llama.cpp splits a batch into
        # micro-batches of equally many tokens per sequence, so rows of 2 and 1 tokens run as two passes over
        # the weights, and 8 rows of 1..5 tokens as five. Filler tokens (the row's last token repeated) sit
        # after the row's real ones, so causal attention keeps them out of every scored position; their
        # logits are not requested and their cache entries are removed right after the decode.
        # Padding pays while the fillers are at most the real tokens (measured by
        # benchmarks/llamacpp_ragged.py: 8 rows, one of them 2 tokens deep, 151 ms ragged vs 140 ms padded;
        # one 3 deep, 172 ms vs 202 ms).
        width = max((len(t) for t in tokens), default=0)
        real = sum(len(t) for t in tokens)
        fillers = sum(width - len(t) for t in tokens if t)
        pad = self.pad_ragged and 0 < fillers <= real and all(
            not t or start + width <= self.max_length for start, t in zip(self._lengths, tokens, strict=True))
        padded_rows = []
        # entries go in increasing sequence id: with one KV stream per sequence llama.cpp puts only consecutive
        # sequence ids in one micro-batch (`keep` keeps the live ids 0..rows-1), and logits come back in
        # entry order
        order = sorted(range(self.rows), key=self._seqs.__getitem__)
        for i in order:
            seq, start, row = self._seqs[i], self._lengths[i], tokens[i]
            n = len(row)
            first = n - min(last, n) if last else 0
            counts[i] = n - first
            entries.extend((seq, start + j, t, j >= first) for j, t in enumerate(row))
            if pad and 0 < n < width:
                entries.extend((seq, start + j, row[-1], False) for j in range(n, width))
                padded_rows.append((seq, start + n))
        before = list(self._lengths)
        try:
            flat = self._decode(entries)
        except BackendError:
            for seq, n in zip(self._seqs, before, strict=True):
                self._lib.llama_memory_seq_rm(self._mem, seq, n, -1)
            raise
        for seq, end in padded_rows:
            if not self._lib.llama_memory_seq_rm(self._mem, seq, end, -1):
                raise BackendError(f"llama.cpp cannot remove the filler tokens of sequence {seq}")
        self._lengths = [n + len(t) for n, t in zip(before, tokens, strict=True)]
        out: list[torch.Tensor | None] = [None] * self.rows
        at = 0
        for i in order:
            c = counts[i]
            out[i] = torch.stack(flat[at:at + c]) if c else torch.empty(0, self.vocab_size)
            at += c
        return out  # type: ignore[return-value]

    def truncate(self, lengths: list[int]) -> None:
        """Roll row i back to ``lengths[i]`` tokens: ``llama_memory_seq_rm(mem, seq_i, lengths[i], -1)`` for
        each row that changes.

        Raises:
            ValueError: wrong number of rows, a length negative or above the row's. BackendError: llama.cpp
            refused a partial removal.
        """
        if len(lengths) != self.rows:
            raise ValueError(f"got lengths for {len(lengths)} rows, the batch has {self.rows}")
        for i, (want, have) in enumerate(zip(lengths, self._lengths, strict=True)):
            if want < 0 or want > have:
                raise ValueError(f"row {i}: cannot truncate a cache of {have} tokens to {want}")
        for i, (seq, want) in enumerate(zip(self._seqs, lengths, strict=True)):
            if want != self._lengths[i]:
                if not self._lib.llama_memory_seq_rm(self._mem, seq, int(want), -1):
                    raise BackendError(f"llama.cpp cannot roll row {i} back from {self._lengths[i]} to {want}")
                self._lengths[i] = int(want)

    def keep(self, rows: list[int]) -> None:
        """Keep rows `rows` (renumbered in that order); the others' sequences are removed whole, and the live
        rows' sequence ids are kept to ``0..len(rows)-1``: a live sequence above that range moves into a freed
        id (``llama_memory_seq_cp`` across streams copies the whole stream, cell for cell, so the row's keys
        stay in the same cells and its logits are unchanged).

        Why: with one KV stream per sequence, llama.cpp splits a batch into micro-batches of *consecutive*
        sequence ids (``split_equal`` with ``sequential``), so ids 0, 1, 2, 4, 5 would run as two passes over
        the weights every round after row 3 finished.

        Raises:
            ValueError: an index out of range or repeated.
        """
        if len(set(rows)) != len(rows) or any(not 0 <= r < self.rows for r in rows):
            raise ValueError(f"rows to keep must be distinct indices below {self.rows}, got {rows}")
        for r in set(range(self.rows)) - set(rows):
            self._lib.llama_memory_seq_rm(self._mem, self._seqs[r], -1, -1)
        self._seqs = [self._seqs[r] for r in rows]
        self._lengths = [self._lengths[r] for r in rows]
        n = len(rows)
        holes = sorted(set(range(n)) - set(self._seqs))
        for hole, i in zip(holes, sorted((i for i in range(n) if self._seqs[i] >= n), key=self._seqs.__getitem__),
                           strict=True):
            self._lib.llama_memory_seq_cp(self._mem, self._seqs[i], hole, -1, -1)
            self._lib.llama_memory_seq_rm(self._mem, self._seqs[i], -1, -1)
            self._seqs[i] = hole

    def reset(self) -> None:
        """Drop every row (``llama_memory_clear``)."""
        self._lib.llama_memory_clear(self._mem, True)
        self._seqs, self._lengths = [], []

    def synchronize(self) -> None:
        self._lib.llama_synchronize(self._ctx)

    def close(self) -> None:
        """Free the context and model."""
        self._llama.close()
