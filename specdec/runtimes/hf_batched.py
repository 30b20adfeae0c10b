"""A transformers causal LM serving B sequences at once: one `DynamicCache` of B rows, a validity mask per slot.

Layout. The cache holds ``[B, heads, L, head_dim]`` keys/values: L *physical* slots shared by every row.
Each row i has its own *logical* length (its committed tokens minus the last, the decoding loop's invariant)
and a boolean mask ``valid[i, :L]`` of the slots holding those tokens, in order. A forward appends the same
number n of slots to every row (n = the longest row's token count; shorter rows get filler slots that are
marked invalid at once) and gives every real token its row's own position ids (``length_i + j``), so keys
are written with their logical positions whatever their physical slot. The 2-D attention mask passed to
the model is ``valid`` plus the new slots: a token attends to its own row's valid slots before it and to
the real tokens of its own forward before it (the causal mask runs on physical slots, whose order within a
row is the logical order). Rejected drafts are dropped per row by clearing their valid bits (a cumulative
count over the row's valid slots: logical position p is the p-th valid slot); the physical tail no row
needs is cropped, and when holes make L exceed the longest row by `COMPACT_SLACK` slots, every row's
valid slots are gathered to the front (`_compact`), so attention over holes stays bounded.

Why this and not left padding: a `DynamicCache` has one length for every row, so per-row cropping is
impossible; masking by slot keeps one batched forward per round and makes rollback a mask update. Per-row
caches stacked for every forward would be exact too, but copy the whole cache each round.

Exactness: a row's logits depend only on its own valid keys/values at their logical positions, as in a
single-sequence forward; the remaining difference is the kernels' rounding of a larger matrix product.
Models whose attention pattern depends on slot distances (sliding-window, chunked) would see physical
distances, so they are refused.
"""

from __future__ import annotations

import inspect

import torch

from specdec.runtimes.base import BackendError, ContextOverflowError
from specdec.runtimes.hf import cache_layer_kinds, context_length, rollback_cache

#: Physical slots allowed beyond the longest row before the cache is compacted.
COMPACT_SLACK = 64


class BatchedHFBackend:
    """A transformers causal LM behind the `specdec.runtimes.base.BatchedBackend` interface.

    Args:
        model: a causal LM in eval mode, on its device and dtype; every cache layer must be a full-attention
            ``DynamicLayer`` (GPT-2, Llama, Qwen2 without sliding window, ...).
        max_length: context window per row in tokens (default: the config's position limit).

    Attributes:
        name: ``"transformers"``. vocab_size: logits row width. max_length: per-row context.
        device: where logits live. max_rows: None (no limit but memory).

    Raises:
        BackendError: a cache layer that is not full attention (sliding-window, chunked, linear, ...): the
            mask would measure window distances in physical slots, not positions.
    """

    name = "transformers"
    max_rows = None

    def __init__(self, model, *, max_length: int | None = None) -> None:
        self.model = model
        self.config = model.config
        kinds = cache_layer_kinds(self.config)
        bad = sorted({k for k in kinds if k != "full"})
        if bad:
            raise BackendError(
                f"{type(self.config).__name__}: batched decoding needs full-attention cache layers only, "
                f"this model has {', '.join(bad)}"
            )
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_length = int(max_length or context_length(self.config))
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._lengths: list[int] = []
        self._valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        self.cache = rollback_cache(self.config)

    # -- state ----------------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """Number of live rows."""
        return len(self._lengths)

    @property
    def cache_lengths(self) -> list[int]:
        """Logical cache length of each live row (tokens whose keys/values it attends to)."""
        return list(self._lengths)

    @property
    def physical_length(self) -> int:
        """Slots per row in the cache tensors (>= every row's length; the excess is masked)."""
        return int(self._valid.shape[1])

    def valid_counts(self) -> list[int]:
        """Valid slots per row as the mask holds them (equal to `cache_lengths`; exposed for tests)."""
        return [int(x) for x in self._valid.sum(dim=1).tolist()]

    # -- interface ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, contexts: list[list[int]]) -> None:
        """Start B = ``len(contexts)`` rows whose caches hold `contexts` (no logits).

        Each row is prefilled by its own single-sequence forward (the exact computation of
        `specdec.runtimes.hf.HFBackend`), then the rows are stacked right-padded with zero slots that the
        mask excludes.

        Raises:
            ValueError: no rows. ContextOverflowError: a context longer than `max_length`.
        """
        if not contexts:
            raise ValueError("a batch needs at least one row")
        for i, ctx in enumerate(contexts):
            if len(ctx) > self.max_length:
                raise ContextOverflowError(f"row {i}: {len(ctx)} tokens exceed the context of {self.max_length}")
        caches = []
        for ctx in contexts:
            cache = rollback_cache(self.config)
            if ctx:
                self.model(
                    input_ids=torch.tensor([ctx], dtype=torch.long, device=self.device),
                    position_ids=torch.arange(len(ctx), device=self.device).unsqueeze(0),
                    **{self._cache_kw: cache}, use_cache=True, logits_to_keep=1,
                )
            caches.append(cache)
        width = max(len(c) for c in contexts)
        self.cache = rollback_cache(self.config)
        if width:
            ref = next(c for c, ctx in zip(caches, contexts, strict=True) if ctx)
            for li, layer in enumerate(self.cache.layers):
                keys, values = [], []
                for cache, ctx in zip(caches, contexts, strict=True):
                    like = ref.layers[li]
                    if ctx:
                        k, v = cache.layers[li].keys, cache.layers[li].values
                    else:
                        k = like.keys.new_zeros(like.keys.shape[:2] + (0,) + like.keys.shape[3:])
                        v = like.values.new_zeros(like.values.shape[:2] + (0,) + like.values.shape[3:])
                    pad = width - len(ctx)
                    keys.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
                    values.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
                layer.update(torch.cat(keys), torch.cat(values))
        self._lengths = [len(c) for c in contexts]
        self._valid = torch.zeros(len(contexts), width, dtype=torch.bool, device=self.device)
        for i, ctx in enumerate(contexts):
            self._valid[i, : len(ctx)] = True

    @torch.inference_mode()
    def forward(self, tokens: list[list[int]], *, last: int | None = None) -> list[torch.Tensor]:
        """Append ``tokens[i]`` (``n_i >= 0`` ids) to row i at positions ``length_i ..`` and score them.

        Returns:
            per row float32 logits ``[n_i, vocab_size]`` (``[min(last, n_i), vocab_size]`` with `last`):
            row j is the next-token distribution after the row's j-th token scored.

        Raises:
            ValueError: ``len(tokens) != rows`` or ``last < 1``.
            ContextOverflowError: a row would exceed `max_length` (nothing is evaluated).
        """
        b = self.rows
        if len(tokens) != b:
            raise ValueError(f"got tokens for {len(tokens)} rows, the batch has {b}")
        if last is not None and last < 1:
            raise ValueError(f"last must be >= 1 (rows to score), got {last}")
        counts = [len(t) for t in tokens]
        n = max(counts, default=0)
        if n == 0:
            return [torch.empty(0, self.vocab_size, device=self.device) for _ in range(b)]
        for i, c in enumerate(counts):
            if self._lengths[i] + c > self.max_length:
                raise ContextOverflowError(
                    f"row {i}: {self._lengths[i]} cached + {c} new tokens exceed the context of {self.max_length}"
                )
        ids = torch.zeros(b, n, dtype=torch.long)
        pos = torch.zeros(b, n, dtype=torch.long)
        new = torch.zeros(b, n, dtype=torch.bool)
        for i, row in enumerate(tokens):
            c, start = counts[i], self._lengths[i]
            if c:
                ids[i, :c] = torch.tensor(row, dtype=torch.long)
                ids[i, c:] = row[-1]
                new[i, :c] = True
            # filler slots repeat a legal position (never past the context); their keys are masked out
            pos[i] = min(start + max(c - 1, 0), self.max_length - 1)
            pos[i, :c] = torch.arange(start, start + c)
        keep = sorted({j for c in counts if c for j in range(c - (min(last, c) if last else c), c)})
        new = new.to(self.device)
        mask = torch.cat([self._valid, new], dim=1)
        out = self.model(
            input_ids=ids.to(self.device),
            position_ids=pos.to(self.device),
            attention_mask=mask.long(),
            **{self._cache_kw: self.cache},
            use_cache=True,
            logits_to_keep=torch.tensor(keep, device=self.device),
        )
        if not bool(new.all()):
            # Filler slots hold whatever their queries computed; a row that feeds nothing and has nothing
            # cached has every key masked, which some attention kernels turn into NaN. Masked keys get weight
            # 0, but 0 x NaN is NaN, so the filler slots are zeroed before any later forward reads them.
            fill = new[:, None, :, None]
            for layer in self.cache.layers:
                layer.keys[:, :, -n:] = torch.where(fill, layer.keys[:, :, -n:], 0)
                layer.values[:, :, -n:] = torch.where(fill, layer.values[:, :, -n:], 0)
        self._valid = mask
        logits = out.logits.float()  # [B, len(keep), vocab]
        col = {j: x for x, j in enumerate(keep)}
        result = []
        for i, c in enumerate(counts):
            first = c - min(last, c) if last else 0
            idx = [col[j] for j in range(first, c)]
            result.append(logits[i, idx])
            self._lengths[i] += c
        self._crop_tail()
        return result

    def truncate(self, lengths: list[int]) -> None:
        """Roll row i back to its first ``lengths[i]`` tokens (one mask update; the unused tail is cropped).

        Raises:
            ValueError: wrong number of rows, or a length negative or above the row's `cache_lengths`.
        """
        if len(lengths) != self.rows:
            raise ValueError(f"got lengths for {len(lengths)} rows, the batch has {self.rows}")
        for i, (want, have) in enumerate(zip(lengths, self._lengths, strict=True)):
            if want < 0 or want > have:
                raise ValueError(f"row {i}: cannot truncate a cache of {have} tokens to {want}")
        if list(lengths) == self._lengths:
            return
        limit = torch.tensor(lengths, dtype=torch.long, device=self.device).unsqueeze(1)
        self._valid = self._valid & (self._valid.long().cumsum(dim=1) <= limit)
        self._lengths = [int(x) for x in lengths]
        self._crop_tail()

    def keep(self, rows: list[int]) -> None:
        """Keep only the live rows `rows` (indices into the current rows, in the new order); the others'
        slots are freed.

        Raises:
            ValueError: an index out of range or repeated.
        """
        if len(set(rows)) != len(rows) or any(not 0 <= r < self.rows for r in rows):
            raise ValueError(f"rows to keep must be distinct indices below {self.rows}, got {rows}")
        if list(rows) == list(range(self.rows)):
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        if self.physical_length and rows:
            self.cache.batch_select_indices(index)
        elif not rows:
            self.cache = rollback_cache(self.config)
        self._valid = self._valid[index]
        self._lengths = [self._lengths[r] for r in rows]
        self._crop_tail()

    def reset(self) -> None:
        """Drop every row."""
        self.cache = rollback_cache(self.config)
        self._lengths = []
        self._valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- layout ---------------------------------------------------------------------------------------

    def _crop_tail(self) -> None:
        """Crop physical slots after the last valid one of every row; compact when holes grow too many."""
        width = self.physical_length
        if width == 0:
            return
        used = self._valid.any(dim=0).nonzero()
        end = int(used.max()) + 1 if used.numel() else 0
        if end < width:
            if end == 0:
                self.cache = rollback_cache(self.config)
            else:
                self.cache.crop(end - width)
            self._valid = self._valid[:, :end]
        if self.physical_length > max(self._lengths, default=0) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Gather every row's valid slots to the front (a stable sort of the mask), then crop."""
        order = torch.argsort((~self._valid).to(torch.int8), dim=1, stable=True)  # valid slots first, in order
        width = max(self._lengths)
        order = order[:, :width]
        for layer in self.cache.layers:
            idx = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = torch.gather(layer.keys, 2, idx)
            layer.values = torch.gather(layer.values, 2, idx)
        lengths = torch.tensor(self._lengths, device=self.device).unsqueeze(1)
        self._valid = torch.arange(width, device=self.device).unsqueeze(0) < lengths
