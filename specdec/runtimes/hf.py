"""The transformers backend: a `PreTrainedModel` for causal LM plus a `DynamicCache` cropped in place."""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import DynamicCache

from specdec.runtimes.base import BackendError, ContextOverflowError


def cache_layer_kinds(config) -> list[str]:
    """The kind of KV-cache layer transformers builds for each decoder layer of a model with `config`.

    Read from the cache itself (``DynamicCache(config=config)``, which dispatches on the config's
    ``layer_types`` or, when absent, on its ``sliding_window`` / ``attention_chunk_size`` fields, as
    transformers' ``get_layer_types_and_kwargs``), so every sliding, chunked, linear-attention or hybrid
    layer is seen whatever config field declares it (Mistral has ``sliding_window`` and no
    ``use_sliding_window``; Qwen2 has both; Gemma 2/3 list ``layer_types``).

    Returns:
        one string per layer: ``"full"`` (``DynamicLayer``: keeps every past key/value), ``"sliding"``
        (``DynamicSlidingWindowLayer``: sliding-window or chunked attention, keeps only its window),
        ``"none"`` (``DummyLayer``: no cache of its own) or the layer class name for anything else (linear
        attention, hybrid, indexed, quantized, ...).
    """
    return _layer_kinds(DynamicCache(config=config).layers)


def _layer_kinds(layers) -> list[str]:
    from transformers import cache_utils

    names = {cache_utils.DynamicLayer: "full", cache_utils.DynamicSlidingWindowLayer: "sliding"}
    if hasattr(cache_utils, "DummyLayer"):  # transformers >= 5.2x; earlier 5.x releases have no such layer
        names[cache_utils.DummyLayer] = "none"
    return [names.get(type(layer), type(layer).__name__) for layer in layers]


def rollback_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for `config` that `crop` can roll back exactly, or a one-line `BackendError`.

    Sliding-window and chunked-attention layers get a full ``DynamicLayer`` instead of transformers'
    ``DynamicSlidingWindowLayer``: it keeps every past key/value, so cropping never needs a state the window
    evicted (transformers' layer raises "crop was called, but the current layer does not track past
    states" once its window is full). Attention stays windowed: the model builds its sliding/chunked mask
    from the config and the absolute positions, not from what the cache holds (llama.cpp's ``swa_full``
    does the same). Memory then grows with the sequence on those layers, as on full-attention layers.

    Raises:
        BackendError: a layer whose state cannot be cropped to an arbitrary length (linear attention,
            recurrent/hybrid, indexed or quantized caches), naming the layer kinds.
    """
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    kinds = _layer_kinds(cache.layers)
    bad = sorted({k for k in kinds if k not in ("full", "sliding", "none")})
    if bad:
        raise BackendError(
            f"{type(config).__name__}: cache layers of kind {', '.join(bad)} cannot be rolled back to an "
            "arbitrary length, which speculative decoding needs"
        )
    for i, kind in enumerate(kinds):
        if kind == "sliding":
            cache.layers[i] = DynamicLayer()
    return cache


def _rows_to_keep(n: int, last: int | None) -> int:
    """transformers' ``logits_to_keep`` for `Backend.forward`'s `last` (0 = every row)."""
    if last is None:
        return 0
    if last < 1:
        raise ValueError(f"last must be >= 1 (rows to score), got {last}")
    return 0 if last >= n else int(last)


def context_length(config) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise BackendError(f"cannot find the context length in the {type(config).__name__} config")


class HFBackend:
    """A transformers causal LM behind the `Backend` interface.

    Rollback is ``DynamicCache.crop(-n)`` (transformers 5 takes the number of tokens to *remove*; 4.x took
    the length to keep). The cache comes from `rollback_cache`: sliding-window and chunked-attention layers
    keep every past state (attention stays windowed through the mask), so their rollback is exact too;
    models with layers that cannot be cropped (linear attention, recurrent/hybrid) are refused at
    construction.

    Args:
        model: a causal LM in eval mode, on its device and dtype.
        max_length: context window in tokens (default: the config's position limit).

    Raises:
        BackendError: the model's cache cannot be rolled back.
    """

    name = "transformers"

    def __init__(self, model, *, max_length: int | None = None) -> None:
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_length = int(max_length or context_length(self.config))
        self._length = 0
        self.cache = self._new_cache()  # raises BackendError for layers that cannot be rolled back
        # transformers >= 5.24 names the cache argument `cache`; earlier 5.x releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _new_cache(self) -> DynamicCache:
        return rollback_cache(self.config)

    @property
    def cache_length(self) -> int:
        return self._length

    @torch.inference_mode()
    def forward(self, tokens: list[int], *, logits: bool = True, last: int | None = None) -> torch.Tensor | None:
        """See `Backend.forward`: returns float32 ``[n, vocab_size]`` (``[min(last, n), vocab_size]``) or
        None (prefill); the LM head runs on the returned rows only (``logits_to_keep``)."""
        n = len(tokens)
        keep = _rows_to_keep(n, last)
        if n == 0:
            return None if not logits else torch.empty(0, self.vocab_size, device=self.device)
        if self._length + n > self.max_length:
            raise ContextOverflowError(
                f"{self._length} cached + {n} new tokens exceed the context of {self.max_length}"
            )
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(self._length, self._length + n, device=self.device).unsqueeze(0)
        out = self.model(
            input_ids=ids,
            position_ids=positions,
            **{self._cache_kw: self.cache},
            use_cache=True,
            logits_to_keep=keep if logits else 1,
        )
        self._length += n
        if not logits:
            return None
        return out.logits[0].float()

    def truncate(self, length: int) -> None:
        """See `Backend.truncate`: one ``DynamicCache.crop`` call."""
        if length < 0 or length > self._length:
            raise ValueError(f"cannot truncate a cache of {self._length} tokens to {length}")
        if length == self._length:
            return
        if length == 0:
            self.reset()
            return
        self.cache.crop(length - self._length)
        self._length = length

    def reset(self) -> None:
        self.cache = self._new_cache()
        self._length = 0

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
