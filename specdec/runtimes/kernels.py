"""The compiled backend's kernels: transformers' linear layers packed for oneDNN (`pack_linears`: one opaque
custom op per layer, so inductor keeps the packed GEMM) and grouped-query attention without repeated
keys/values (`grouped_sdpa`, registered as transformers attention ``specdec_sdpa``). Used by
`specdec.runtimes.compiled.CompiledHFBackend`."""

from __future__ import annotations

import itertools
import weakref

import torch
from torch import nn

from specdec.runtimes.base import BackendError

__all__ = ["ATTENTION", "PackedLinear", "grouped_sdpa", "pack_linears", "packed_linear", "register_attention"]


# ----------------------------------------------------------------------------------------------- oneDNN linear

_PACKED: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()
_handles = itertools.count()


@torch.library.custom_op("specdec::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, handle: int, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` with the oneDNN-prepacked ``W`` registered under `handle` (a `PackedLinear`).

    Args:
        x: ``[..., in_features]`` float tensor.
        handle: the `PackedLinear.handle` of a live module (a constant in compiled graphs).
        bias: ``[out_features]`` or None.

    Returns:
        ``[..., out_features]``.
    """
    module = _PACKED[handle]
    return torch.ops.mkldnn._linear_pointwise(x, module.packed_weight, bias, "none", [], "")


@packed_linear.register_fake
def _packed_linear_fake(x, handle, bias):
    return x.new_empty((*x.shape[:-1], _PACKED[handle].out_features))


class PackedLinear(nn.Module):
    """A linear layer whose weight is stored prepacked for oneDNN.

    Args:
        weight: dense ``[out_features, in_features]`` weight (``nn.Linear`` layout).
        bias: ``[out_features]`` parameter or None.
        keep_dense: also keep the dense weight and use it (ATen/MKL) for single-row inputs, where MKL's
            GEMV streams the weight faster than oneDNN; otherwise the dense weight is dropped (one copy).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, keep_dense: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = (int(s) for s in weight.shape)
        with torch.no_grad():
            # batch_size None: one blocked layout for every row count (measured best for 2..17 rows).
            self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
            dense = weight.detach().contiguous() if keep_dense else None
        self.weight = None if dense is None else nn.Parameter(dense, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.handle = next(_handles)
        _PACKED[self.handle] = self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the row count is static inside a compiled bucket graph, so this branch is resolved at trace time
        if self.weight is not None and x.numel() == self.in_features:
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.specdec.packed_linear(x, self.handle, self.bias)

    def extra_repr(self) -> str:
        dense = " + dense for 1 row" if self.weight is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, onednn-prepacked{dense}"


def pack_linears(model: nn.Module, *, keep_dense: bool = False) -> int:
    """Replace every ``nn.Linear`` and transformers ``Conv1D`` of `model` in place by a `PackedLinear`.

    Returns:
        the number of layers replaced.
    """
    from transformers.pytorch_utils import Conv1D

    replaced = 0
    for _, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                weight = child.weight
            elif isinstance(child, Conv1D):  # y = x @ W + b with W [in, out]
                weight = child.weight.t()
            else:
                continue
            setattr(parent, child_name, PackedLinear(weight, child.bias, keep_dense=keep_dense))
            replaced += 1
    return replaced


# -------------------------------------------------------------------------------------------------- attention

#: The attention implementation this backend installs on its model (registered with transformers).
ATTENTION = "specdec_sdpa"


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA for grouped-query attention with an explicit mask, without materialising repeated keys/values.

    transformers' ``sdpa`` attention, given a 4-D mask on CPU, repeats each key/value head for every query
    head of its group (``repeat_kv``): over a static cache that copies ``heads / kv_heads`` times the whole
    cache per layer and step (measured: +10% on a 1.5B single step). Here the queries of a group are stacked
    instead: ``[B, H, q, D] -> [B, H_kv, g*q, D]`` (query head ``i*g + j`` uses key/value head ``i``, the
    ``repeat_kv`` order) with the mask rows repeated ``g`` times, so one SDPA call reads each cached key once.

    Args:
        query: ``[B, H, q, D]``; key, value: ``[B, H_kv, S, D]``; attention_mask: additive or boolean
            ``[B or 1, 1, q, S]`` (or None); scaling: softmax scale (default ``D ** -0.5``).

    Returns:
        ``([B, q, H, D], None)`` as transformers' attention functions.
    """
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise BackendError("specdec's grouped SDPA supports neither softcap nor sliding windows")
    b, h, q, d = query.shape
    groups = h // key.shape[1]
    if groups > 1:
        query = query.reshape(b, h // groups, groups * q, d)
        if attention_mask is not None:
            attention_mask = attention_mask.repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=0.0, scale=scaling,
        is_causal=bool(is_causal) and attention_mask is None and q > 1,
    )
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, grouped_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
