"""A compiled CPU path for transformers models: static KV cache, bucketed shapes, compiled forwards.

Why: speculative decoding pays only when the target scores K+1 tokens for about the price of one. Eager fp32
transformers on a CPU does not give that: MKL's kernels for small row counts scale badly (measured on this
project's 2-core Xeon, one 1536 -> 8960 fp32 matrix streamed from memory, 1 / 4 / 17 rows: 1.8 / 3.7 /
5.2 ms; oneDNN with a prepacked weight: 2.0 / 2.0 / 3.0 ms). This backend runs the model's forwards (draft
steps and target verification) through PyTorch's own machinery instead:

- ``mode="onednn"`` (default): every ``nn.Linear`` (and GPT-2 ``Conv1D``) is replaced *in place* by a
  `PackedLinear` holding a oneDNN-prepacked weight (``torch.ops.mkldnn._reorder_linear_weight``), called
  through ``torch.ops.mkldnn._linear_pointwise`` (the kernel inductor's own CPU weight-prepack pass emits
  for low-precision weights); the dense weights are freed, so memory stays one copy of the model. The
  rest of the forward (norms, rotary, attention, cache writes, mask) is compiled by inductor. The packed
  GEMM is a custom op (``specdec::packed_linear``) because dynamo cannot trace opaque mkldnn tensors.
  Single-row GEMMs are ~10% slower than MKL's GEMV (both stream the weights; oneDNN a little slower).
- ``mode="hybrid"``: as ``onednn`` but the dense weights are kept as well and single-row forwards (the
  ``[1, 1]`` bucket, i.e. plain decoding steps) use them through ATen/MKL (~10% faster per matrix in
  isolation; within run-to-run noise on a whole 1.5B step), at the price of a second copy of every linear
  weight (~2x the model's memory, less where the dense weights are pages of a mapped safetensors file).
- ``mode="inductor"``: ``torch.compile`` (inductor, default options); GEMMs stay ATen/MKL calls, so it
  removes Python/elementwise overhead but keeps MKL's small-row scaling. Good for drafts (1-row steps).
- ``mode="max-autotune"``: inductor with weight freezing and ``max_autotune`` (its C++ GEMM template
  competing with ATen). Frozen weights become per-graph constants, so *each bucket holds its own packed
  copy of the weights* and compiling autotunes every GEMM shape. On this Xeon it picked ATen/MKL anyway;
  use it on small models or with few buckets.
- ``mode="frozen"``: inductor compiled while inductor's ``freezing`` setting is on (switched on only while
  `warmup` compiles): the weights become graph constants, which inductor prepacks for oneDNN (bf16) or MKL
  (fp32) and folds. On a bf16 1.5B target this steps ~3x faster than the uncompiled bf16 path, but, as in
  ``max-autotune``, *each compiled graph holds its own copy of the weights* (plus the model's own copy, which
  stays loaded): memory grows by one model per bucket (and per last-row graph), so give it few
  buckets (`FROZEN_BUCKETS`, `FROZEN_DRAFT_BUCKETS`). Per-call ``options={"freezing": True}`` does not take
  effect on this PyTorch; the global setting, patched for the duration of the compile, does.
- ``mode="eager"``: no compilation; the same static cache and bucketing (a reference for tests).

Shapes (gpt-fast ``generate.py``): a forward of ``n <= max(buckets)`` tokens is padded with dummy tokens to
the smallest bucket ``b >= n``, run through the graph compiled for ``[1, b]``, and the first ``n`` logits rows
are returned. The KV cache is a transformers ``StaticCache`` preallocated for
``max_length + max(buckets) - 1`` slots; a forward writes its ``b`` keys/values at slots
``cache_length .. cache_length + b - 1`` (``index_copy_``) and the position then moves to
``cache_length + n``, so the padded slots are overwritten by later forwards. Rollback (`truncate`) only moves
that position (as ``StaticCache.crop(-n)``); nothing is copied.

Attention: the model's attention implementation is switched to `grouped_sdpa` (registered with transformers
as ``"specdec_sdpa"``), one SDPA call per layer that reads each cached key/value head once for all query
heads of its group, where transformers' ``sdpa`` would copy the cache per query head when given a mask.

Masking: the backend passes its own additive 4-D mask, built inside the graph from the position ids:
row ``i`` (slot ``p_i = cache_length + i``) may attend to slot ``j`` iff ``j <= p_i``. Real tokens precede
the pads in a forward, so a real row never sees a pad slot, nor any stale slot past its own position (stale
slots always hold finite values: zeros or keys of earlier tokens). Pad rows are computed and discarded.

Forwards longer than ``max(buckets)`` and prefill (``logits=False``) run eagerly over the same static cache,
in chunks of `PREFILL_CHUNK` tokens; in mode ``frozen`` they run through the largest bucket's graph instead,
in chunks of ``max(buckets)`` tokens (the eager path there is the uncompiled model: measured on the bf16
1.5B target, ~22 ms a prompt token eager over a 4096-token cache against ~6 in 16-token frozen chunks).

Compilation is paid in `warmup` (one compile per bucket, returns the seconds spent), which must be called
before the first bucketed forward; afterwards every compiled call runs under
``torch.compiler.set_stance("fail_on_recompile")``, so a timed generation can never silently recompile.

Exactness: compiled kernels may round differently from eager ones (and a 1-row GEMM from a 5-row one), so
logits match eager within float tolerance, not bit for bit. Greedy speculative decoding on a compiled
target equals greedy target-only decoding on the same compiled target as long as the target's top-2 logit
margin exceeds that rounding; `first_divergence` locates the first differing token against another path and
reports the target's margin there.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
import time
import types
from collections.abc import Callable, Sequence

import torch

from specdec.errors import one_line
from specdec.runtimes.base import BackendError, ContextOverflowError
from specdec.runtimes.hf import cache_layer_kinds, context_length
from specdec.runtimes.kernels import ATTENTION, pack_linears, register_attention

MODES = ("onednn", "hybrid", "inductor", "max-autotune", "frozen", "eager")
#: K+1 = 5 (K = 4) has its own bucket: oneDNN costs about the same for 1..5 rows, 8 rows cost ~15% more.
DEFAULT_BUCKETS = (1, 2, 5, 8, 17)
#: ``frozen`` target buckets: plain steps, then K <= 7 and K <= 15 verifications. Each bucket is one more copy
#: of the weights (3 GB for the bf16 1.5B target), so three, not five.
FROZEN_BUCKETS = (1, 8, 16)
#: ``frozen`` draft buckets: a draft steps one token at a time and catches up on two after an all-accepted
#: round (the last proposal and the target's bonus token); 16 carries its deferred prefill and the catch-up
#: after plain rounds (committed tokens it has not seen) in 16-token chunks, where a 2-token bucket took 61
#: forwards for a 122-token prompt. Three graphs, three weight copies, no last-row graphs.
FROZEN_DRAFT_BUCKETS = (1, 2, 16)
#: Default cap on the context when `max_length` is not given: the cache is preallocated at this size and
#: every compiled step attends over all of it (masked), so the model's 32k positions would cost memory and time.
DEFAULT_MAX_LENGTH = 4096
#: Eager forwards (prefill, or more tokens than the largest bucket) run in chunks of this many tokens.
PREFILL_CHUNK = 256

_step_ids = itertools.count()


# ------------------------------------------------------------------------------------------------------ backend


class CompiledHFBackend:
    """A transformers causal LM behind the `Backend` interface, with compiled fixed-shape forwards.

    Same contract as `HFBackend` (``forward``/``truncate``/``reset``/``cache_length``/``vocab_size``/
    ``max_length``/``device``), but the KV cache is a preallocated ``StaticCache``, forwards of up to
    ``max(buckets)`` tokens are padded to a bucket and run compiled, and rollback moves the cache position.
    See the module docstring for the shapes, the mask and the modes.

    Args:
        model: a causal LM in eval mode (fp32 on CPU for ``onednn``/``hybrid``/``max-autotune``), with
            ``sdpa`` or ``eager`` attention. It is modified in place: its attention implementation becomes
            `grouped_sdpa`, and the oneDNN modes replace its linear layers by `PackedLinear`; measure
            eager on another instance (or before building this backend).
        max_length: context window in tokens (default: the config's, capped at `DEFAULT_MAX_LENGTH`).
        buckets: token counts with a compiled graph, ascending, >= 1 (default: `FROZEN_BUCKETS` in mode
            ``frozen``, else `DEFAULT_BUCKETS`). A verification of K+1 tokens
            uses the smallest bucket >= K+1; beyond the largest the forward runs eagerly (mode ``frozen``:
            in chunks through the compiled graphs).
        mode: one of `MODES` (module docstring). ``onednn`` keeps one copy of the weights; ``hybrid``
            adds the dense copy for single-row steps; ``inductor`` suits drafts (1-row steps, no repacking);
            ``frozen`` (any dtype) is the fastest per step on bf16 weights and holds one weight copy
            per compiled graph.
        last_row_graphs: also compile, for every bucket > 1, a graph whose LM head scores the last real
            token only (``forward(tokens, last=1)``, what a draft asks after an all-accepted round: C22);
            `warmup` then compiles one more graph per such bucket. Without them such a forward runs the
            bucket's all-rows graph and slices. Eager forwards always score only the rows asked for.

    Raises:
        BackendError: unknown mode, bad buckets, any cache layer other than full attention (sliding-window,
            chunked or linear attention: see `specdec.runtimes.hf.cache_layer_kinds`),
            an attention implementation that ignores 4-D masks, or a mode unsupported on the device/dtype.
    """

    name = "transformers-compiled"

    def __init__(
        self,
        model,
        *,
        max_length: int | None = None,
        buckets: Sequence[int] | None = None,
        mode: str = "onednn",
        last_row_graphs: bool = False,
    ) -> None:
        from transformers.cache_utils import StaticCache

        if mode not in MODES:
            raise BackendError(f"unknown compile mode {mode!r}; expected one of {', '.join(MODES)}")
        if buckets is None:
            buckets = FROZEN_BUCKETS if mode == "frozen" else DEFAULT_BUCKETS
        buckets = tuple(sorted({int(b) for b in buckets}))
        if not buckets or buckets[0] < 1:
            raise BackendError(f"buckets must be positive token counts, got {buckets}")
        self.model = model
        self.config = model.config
        self.mode = mode
        self.buckets = buckets
        self.last_row_graphs = bool(last_row_graphs)
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._context = context_length(self.config)
        self.max_length = int(max_length or min(self._context, DEFAULT_MAX_LENGTH))
        if self.max_length > self._context:
            raise BackendError(f"max_length {self.max_length} exceeds the model's context of {self._context}")
        kinds = cache_layer_kinds(self.config)
        other = sorted({k for k in kinds if k != "full"})
        if other:  # the static cache and this backend's one causal mask know full attention only
            raise BackendError(
                f"{type(model).__name__} has {', '.join(other)} cache layers (sliding/chunked/linear attention), "
                "which the compiled backend does not support; use the eager transformers backend"
            )
        attn = getattr(self.config, "_attn_implementation", None) or "eager"
        if attn not in ("sdpa", "eager", ATTENTION):
            raise BackendError(f"attention implementation {attn!r} is not supported (use sdpa or eager)")
        cpu_fp32 = self.device.type == "cpu" and self.dtype == torch.float32
        if mode in ("onednn", "hybrid", "max-autotune") and not cpu_fp32:
            raise BackendError(f"mode {mode!r} needs an fp32 model on CPU, got {self.dtype} on {self.device}")
        if mode in ("onednn", "hybrid") and not torch.backends.mkldnn.is_available():
            raise BackendError(f"mode {mode!r} needs a PyTorch build with oneDNN (mkldnn)")
        if any(p.requires_grad for p in model.parameters()):
            model.requires_grad_(False)
        if attn != ATTENTION:
            register_attention()
            try:
                model.set_attn_implementation(ATTENTION)
            except Exception as exc:  # one line: this model does not dispatch attention through transformers
                raise BackendError(f"{type(model).__name__} cannot take a custom attention: {one_line(exc, limit=300)}") from exc
        if mode in ("onednn", "hybrid"):
            pack_linears(model, keep_dense=mode == "hybrid")

        # transformers >= 5.24 names the cache argument `cache`; earlier 5.x releases `past_key_values`.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._slots = self.max_length + buckets[-1] - 1  # room for the pads of a forward ending at max_length
        try:
            self.cache = StaticCache(config=self.config, max_cache_len=self._slots)
        except Exception as exc:  # one line, whatever transformers raised
            raise BackendError(f"cannot build a StaticCache for {type(model).__name__}: {exc}") from exc
        self._kv_index = torch.arange(self._slots, device=self.device)
        self._length = 0
        self._warm = False
        self.warmup_s: float | None = None
        self._eager_step = self._make_step()
        self._compiled = None if mode == "eager" else self._compile(self._make_step())
        try:
            with torch.inference_mode():  # allocates the cache tensors (lazy in StaticLayer) outside any graph
                self._run(self._eager_step, [0], 1)
        except Exception as exc:  # one line: this model's forward does not take a static cache + 4-D mask
            raise BackendError(f"{type(model).__name__} cannot run on a static cache: {one_line(exc, limit=300)}") from exc
        self.reset()

    # ---------------------------------------------------------------------------------------------- graphs

    def _make_step(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The function compiled per bucket: ``(ids [1, b], positions [1, b], keep) -> logits [r, vocab]``,
        ``keep`` being transformers' ``logits_to_keep`` (0: r = b rows; a LongTensor of r row indices).

        Each backend gets its own code object, so dynamo's per-code recompile limit counts its buckets only.
        """
        model, cache, cache_kw, kv_index = self.model, self.cache, self._cache_kw, self._kv_index
        min_value = torch.finfo(self.dtype).min

        def step(input_ids: torch.Tensor, position_ids: torch.Tensor, keep=0) -> torch.Tensor:
            # additive mask [1, 1, b, slots]: 0 where slot j <= position of row i, else the dtype's min
            allowed = kv_index[None, :] <= position_ids[0, :, None]
            mask = torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device)
            mask = mask.masked_fill(~allowed, min_value)[None, None]
            out = model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=mask,
                use_cache=True,
                logits_to_keep=keep,  # 0: every row; an int k: the last k; a tensor: those row indices
                **{cache_kw: cache},
            )
            return out.logits[0]

        code = step.__code__.replace(co_name=f"specdec_step_{next(_step_ids)}")
        return types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__, step.__closure__)

    def _compile(self, step):
        # mode "frozen": plain inductor options; freezing is switched on globally while `warmup` compiles
        options = {}
        if self.mode == "max-autotune":
            options = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
        limit = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = max(limit, 2 * len(self.buckets) + 2)
        return torch.compile(step, fullgraph=True, dynamic=False, options=options or None)

    def warmup(self) -> float:
        """Compile (and run twice) the graph of every bucket; returns the wall seconds spent.

        Safe to call again (then it only re-runs the graphs). Leaves the cache empty.

        Raises:
            BackendError: compilation failed (one line; the cause is chained).
        """
        t0 = time.perf_counter()
        if self._compiled is not None:
            try:
                with torch.inference_mode(), self._compile_settings():
                    for b in self.buckets:
                        for _ in range(2):
                            self._length = 0
                            self._run(self._compiled, [0] * b, b)
                        for _ in range(2 if self.last_row_graphs and b > 1 else 0):
                            self._length = 0
                            self._run(self._compiled, [0] * b, b, self._last_row(b))
            except Exception as exc:  # surface one line, chain the cause
                self.reset()
                raise BackendError(f"torch.compile ({self.mode}) failed for {type(self.model).__name__}: "
                                   f"{one_line(exc, limit=300)}") from exc
        self.reset()
        self._warm = True
        self.warmup_s = time.perf_counter() - t0
        return self.warmup_s

    def _compile_settings(self):
        """Inductor settings in force while `warmup` compiles: ``freezing`` on in mode ``frozen`` (restored
        afterwards, so other models compiled in this process are not frozen), nothing otherwise."""
        import contextlib

        if self.mode != "frozen":
            return contextlib.nullcontext()
        import torch._inductor.config as inductor_config

        return inductor_config.patch(freezing=True)

    # ---------------------------------------------------------------------------------------------- cache

    def _set_position(self, position: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(position)

    @property
    def cache_length(self) -> int:
        return self._length

    def truncate(self, length: int) -> None:
        """See `Backend.truncate`: moves the cache position (slots past it are overwritten later)."""
        if length < 0 or length > self._length:
            raise ValueError(f"cannot truncate a cache of {self._length} tokens to {length}")
        self._length = length
        self._set_position(length)

    def reset(self) -> None:
        self.truncate(0)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -------------------------------------------------------------------------------------------- forward

    def _last_row(self, n: int) -> torch.Tensor:
        return torch.tensor([n - 1], dtype=torch.long, device=self.device)

    def _run(self, fn, tokens: list[int], b: int, keep=0) -> torch.Tensor:
        """Feed `tokens` padded to `b` at the current position through `fn`; returns logits ``[b, vocab]``
        (the rows `keep` selects, as transformers' ``logits_to_keep``, when given)."""
        n = len(tokens)
        start = self._length
        ids = torch.tensor([tokens + [tokens[-1]] * (b - n)], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + b, device=self.device).clamp_(max=self._context - 1)
        self._set_position(start)
        out = fn(ids, positions.unsqueeze(0), keep)
        self._length = start + n
        self._set_position(self._length)
        return out

    @torch.inference_mode()
    def forward(self, tokens: list[int], *, logits: bool = True, last: int | None = None) -> torch.Tensor | None:
        """See `Backend.forward`: returns float32 ``[n, vocab_size]`` (``[min(last, n), vocab_size]``) or
        None (prefill).

        ``n <= max(buckets)`` with logits runs the compiled graph of the smallest bucket >= n (with `last`
        = 1 and `last_row_graphs`, the graph that scores the last real row only); otherwise eager chunks of
        `PREFILL_CHUNK` tokens over the same static cache, whose LM head scores only the rows returned
        (one row per chunk when none is: prefill) - in mode ``frozen``, chunks of ``max(buckets)`` tokens
        through the compiled graphs.

        Raises:
            ContextOverflowError: ``cache_length + n > max_length``.
            BackendError: a bucketed forward before `warmup` (compiled modes).
            ValueError: ``last < 1``.
        """
        n = len(tokens)
        if last is not None and last < 1:
            raise ValueError(f"last must be >= 1 (rows to score), got {last}")
        if n == 0:
            return None if not logits else torch.empty(0, self.vocab_size, device=self.device)
        if self._length + n > self.max_length:
            raise ContextOverflowError(
                f"{self._length} cached + {n} new tokens exceed the context of {self.max_length}"
            )
        tokens = [int(t) for t in tokens]
        first = n - min(n, last) if last is not None else 0  # index of the first token scored
        if logits and n <= self.buckets[-1]:
            b = self.buckets[bisect.bisect_left(self.buckets, n)]
            if self._compiled is None:
                rows = torch.arange(first, n, device=self.device)
                return self._run(self._eager_step, tokens, b, rows).float()
            self._check_warm()
            with torch.compiler.set_stance("fail_on_recompile"):
                if first == n - 1 and n > 1 and self.last_row_graphs:
                    return self._run(self._compiled, tokens, b, self._last_row(n)).float()
                return self._run(self._compiled, tokens, b)[first:n].float()
        if self.mode == "frozen":
            return self._chunked(tokens, first, logits)
        rows = []
        for i in range(0, n, PREFILL_CHUNK):
            chunk = tokens[i : i + PREFILL_CHUNK]
            need = len(chunk) - max(0, first - i) if logits else 0  # rows of this chunk to return
            out = self._run(self._eager_step, chunk, len(chunk), max(need, 1))  # the last `need` rows
            if need > 0:
                rows.append(out[-need:].float())
        return torch.cat(rows) if logits else None

    def _check_warm(self) -> None:
        """Refuse a compiled forward before `warmup`: compiling belongs outside timing."""
        if not self._warm:
            raise BackendError("call warmup() before the first forward: compiling belongs outside timing")

    def _chunked(self, tokens: list[int], first: int, logits: bool) -> torch.Tensor | None:
        """Mode ``frozen``: a prefill or a forward longer than the largest bucket, as consecutive forwards of
        ``max(buckets)`` tokens (the last one padded to its bucket) through the compiled graphs; returns
        the rows from `first` on (float32), or None when `logits` is False."""
        self._check_warm()
        size, rows = self.buckets[-1], []
        with torch.compiler.set_stance("fail_on_recompile"):
            for i in range(0, len(tokens), size):
                chunk = tokens[i : i + size]
                b = self.buckets[bisect.bisect_left(self.buckets, len(chunk))]
                out = self._run(self._compiled, chunk, b)
                if logits and first < i + len(chunk):
                    rows.append(out[max(0, first - i) : len(chunk)].float())
        return torch.cat(rows) if logits else None
