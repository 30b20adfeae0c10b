"""The transformers backend: a `PreTrainedModel` for causal LM plus a `DynamicCache` cropped in place."""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import DynamicCache

from specdec.backends.base import BackendError, ContextOverflowError


def _context_length(config) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise BackendError(f"cannot find the context length in the {type(config).__name__} config")


class HFBackend:
    """A transformers causal LM behind the `Backend` interface.

    Rollback is ``DynamicCache.crop(-n)`` (transformers 5 takes the number of tokens to *remove*; 4.x took
    the length to keep). Models whose cache cannot be cropped exactly (sliding-window layers that evicted
    states, linear attention) are refused at construction.

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
        self.max_length = int(max_length or _context_length(self.config))
        self._length = 0
        self.cache = self._new_cache()
        # transformers >= 5.24 names the cache argument `cache`; earlier 5.x releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        window = getattr(self.config, "sliding_window", None)
        if window and getattr(self.config, "use_sliding_window", False) and window < self.max_length:
            raise BackendError("sliding-window attention evicts cache entries that a rollback would need")

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @property
    def cache_length(self) -> int:
        return self._length

    @torch.inference_mode()
    def forward(self, tokens: list[int], *, logits: bool = True) -> torch.Tensor | None:
        """See `Backend.forward`: returns float32 ``[n, vocab_size]`` or None (prefill)."""
        n = len(tokens)
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
            logits_to_keep=0 if logits else 1,
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
