"""Load a draft -> target pair onto backends, with the tokenizer compatibility check done at load time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.runtimes.base import Backend
from specdec.runtimes.compat import check_tokenizers, check_vocab_fits, eos_ids_for, real_vocab_size
from specdec.runtimes.precision import apply_quant, check_dtype_supported, resolve_dtype

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    """One model on one runtime: its backend, tokenizer and, for transformers, the model object itself
    (the peers — `generate()`, assisted generation — need it).

    ``eos_ids``: the ids that end generation: the tokenizer's EOS and the generation config's EOS ids, plus,
    on llama.cpp or for a transformers model loaded from a ``.gguf`` file, every token llama.cpp marks
    end-of-generation (`specdec.runtimes.llamacpp.LlamaCppBackend.eog_ids`), so both runtimes of one GGUF
    stop on the same set."""

    spec: str
    runtime: str
    backend: Backend
    tokenizer: Any
    hf_model: Any = None
    eos_ids: frozenset[int] = frozenset()
    load_s: float = 0.0
    compiled: bool = False
    #: seconds spent compiling (`CompiledHFBackend.warmup`, included in load_s; 0 when not compiled)
    compile_s: float = 0.0
    #: the weights' dtype on the transformers runtime (``"auto"`` resolved); None on llama.cpp (the GGUF's)
    dtype: str | None = None
    #: llama.cpp: the weight type the GGUF was requantized to (`specdec.models.requant`); None: as shipped
    gguf_type: str | None = None


@dataclass
class LoadedPair:
    """A target and (optionally) a draft sharing one vocabulary.

    Attributes:
        vocab_size: the shared tokenizer vocabulary; logits columns past it are masked out.
        eos_ids: ids that end generation: the target's and the draft's (`LoadedModel.eos_ids`).
    """

    target: LoadedModel
    draft: LoadedModel | None
    vocab_size: int
    eos_ids: frozenset[int]
    info: dict = field(default_factory=dict)

    @property
    def tokenizer(self):
        return self.target.tokenizer


def set_threads(threads: int | None) -> None:
    """Pin torch's intra-op thread count (recorded with results). None leaves the default.

    Raises:
        ValueError: `threads` < 1.
    """
    if threads is None:
        return
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    torch.set_num_threads(int(threads))


def _source_gguf_eog(spec: str) -> frozenset[int]:
    """llama.cpp's end-of-generation ids of the GGUF a transformers model was converted from (a ``.gguf``
    path, or a GGUF preset member, whose transformers weights are its dequantized GGUF), so both runtimes of
    one model stop on the same set; empty for other specs (hub ids, checkpoint directories), without
    llama-cpp-python, or when the GGUF can no longer be assembled (its chunk packages removed)."""
    from specdec import models
    from specdec.runtimes.base import BackendError

    try:
        path = models.gguf_file(spec)  # a preset member's GGUF is already assembled: it was converted from it
    except (models.ModelNotAvailableError, models.ChunkAssemblyError):
        return frozenset()
    try:
        from specdec.runtimes.gguf import gguf_eog_ids

        return gguf_eog_ids(path)
    except BackendError:
        return frozenset()


def load_model(
    spec: str,
    *,
    runtime: str = "transformers",
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    compile: bool = False,
    n_ctx: int | None = None,
    trust_remote_code: bool = False,
    compile_mode: str = "onednn",
    quant: str | None = None,
    last_row_graphs: bool = False,
    gguf_type: str | None = None,
    buckets: Sequence[int] | None = None,
    max_length: int | None = None,
) -> LoadedModel:
    """Load one model spec (preset member, hub id, local dir or .gguf) on a runtime.

    Args:
        spec: e.g. ``"qwen2.5-coder:target"``, ``"gpt2"``, ``"/path/to/ckpt"``, ``"model.gguf"``.
        runtime: ``"transformers"`` (fp32/fp16/bf16 weights, eager or compiled) or ``"llamacpp"`` (GGUF).
        device, dtype: transformers only; dtype ``"auto"`` is `specdec.runtimes.precision.default_dtype` of the
            device (bfloat16 on a CPU with native bf16 kernels, else float32). threads: intra-op threads for
            either runtime.
        compile: transformers only; use the compiled static-cache backend
            (`specdec.runtimes.compiled.CompiledHFBackend`), compiled here (``warmup``: every shape bucket;
            seconds in ``compile_s``, minutes on a CPU the first time, less with a warm inductor cache).
        compile_mode: `CompiledHFBackend`'s mode when compiling (``onednn`` packs the weights for
            multi-token verification; `load_pair` compiles the draft with ``inductor``; ``frozen`` folds the
            weights into each graph, one weight copy per graph).
        buckets: with `compile`, the compiled token counts (default: `CompiledHFBackend`'s for the mode).
        max_length: with `compile`, the static cache's context in tokens (default: the model's, capped at
            `specdec.runtimes.compiled.DEFAULT_MAX_LENGTH`). Every compiled step attends over all of it,
            so a workload's own bound (prompt + new tokens) makes each step cheaper.
        n_ctx: llama.cpp context size.
        quant: transformers only: ``"int8"`` = int8 weight-only linear layers (`specdec.runtimes.precision`), in the
            model's `dtype`; None keeps the checkpoint's weights.
        last_row_graphs: with `compile`, also compile the graphs that score only the last row of a forward
            (what a draft needs; `CompiledHFBackend`'s argument of that name).
        gguf_type: llama.cpp only: run the GGUF requantized (pure) to this ggml weight type (``Q4_0``,
            ``IQ4_NL``, ``Q8_0``; `specdec.models.requant.requantized_gguf`, made once into the model cache).

    Raises:
        ValueError: unknown runtime, dtype or quantization, options that do not apply, or bfloat16 on a CPU
            without native bf16 kernels (`specdec.runtimes.precision.check_dtype_supported`).
        specdec.runtimes.base.BackendError: compilation failed (one line).
        specdec.models.ModelNotAvailableError: the weights are not available (one-line message).
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown backend {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    dtype = resolve_dtype(dtype, device)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but torch sees no CUDA device")
    if quant is not None and (runtime != "transformers" or compile):
        raise ValueError("--quant applies to the eager transformers backend only (llama.cpp: pick a quantized GGUF)")
    if gguf_type is not None and runtime != "llamacpp":
        raise ValueError("--gguf-type applies to the llama.cpp backend only (--backend llamacpp)")
    if compile and runtime != "transformers":
        raise ValueError("--compile applies to the transformers backend only")
    t0 = time.perf_counter()
    model = RUNTIMES[runtime](spec, device=device, dtype=dtype, threads=threads, compile=compile, n_ctx=n_ctx,
                              trust_remote_code=trust_remote_code, compile_mode=compile_mode, quant=quant,
                              last_row_graphs=last_row_graphs, gguf_type=gguf_type, buckets=buckets,
                              max_length=max_length)
    model.load_s = time.perf_counter() - t0
    return model


def _load_llamacpp(spec: str, *, threads, n_ctx, gguf_type, **_) -> LoadedModel:
    """`load_model` on llama.cpp: the spec's GGUF (requantized when asked), its tokenizer and every token
    llama.cpp itself ends generation on."""
    from specdec import models
    from specdec.runtimes.llamacpp import load_llamacpp

    path = models.gguf_file(spec)
    if gguf_type is not None:
        from specdec.models.requant import check_gguf_type, requantized_gguf

        gguf_type = check_gguf_type(gguf_type)
        path = requantized_gguf(path, gguf_type, threads=threads)
    backend = load_llamacpp(path, n_ctx=n_ctx, n_threads=threads)
    tok = models.hf_tokenizer(spec)
    # every token llama.cpp itself ends generation on, not only the tokenizer's EOS
    return LoadedModel(spec, "llamacpp", backend, tok, None, eos_ids_for(tok) | backend.eog_ids(),
                       gguf_type=gguf_type)


def _load_transformers(spec: str, *, device, dtype, compile, trust_remote_code, compile_mode, quant,
                       last_row_graphs, buckets, max_length, **_) -> LoadedModel:
    """`load_model` on transformers: eager (`specdec.runtimes.hf.HFBackend`) or compiled at load
    (`specdec.runtimes.compiled.CompiledHFBackend.warmup`: compilation never lands inside a timed run)."""
    from specdec import models

    check_dtype_supported(dtype, device)
    model, tok = models.load_hf(spec, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    apply_quant(model, quant)
    compile_s = 0.0
    if compile:
        from specdec.runtimes.compiled import CompiledHFBackend

        backend = CompiledHFBackend(model, mode=compile_mode, last_row_graphs=last_row_graphs, buckets=buckets,
                                    max_length=max_length)
        compile_s = backend.warmup()
    else:
        from specdec.runtimes.hf import HFBackend

        backend = HFBackend(model)
    # the same GGUF on llama.cpp stops on llama.cpp's end-of-generation set: stop on it here too
    eos = eos_ids_for(tok, getattr(model, "generation_config", None)) | _source_gguf_eog(spec)
    return LoadedModel(spec, "transformers", backend, tok, model, eos, 0.0, compile, compile_s, dtype)


#: Every runtime by name: its loader of one model (`load_model`'s arguments by keyword).
RUNTIMES = {"transformers": _load_transformers, "llamacpp": _load_llamacpp}


def draft_compile_args(target_mode: str) -> dict:
    """`load_model`'s compile arguments for a draft whose target compiles in `target_mode`: mode ``inductor``
    (ATen GEMMs, which suit 1-2 token steps) with last-row graphs; mode ``frozen`` on ``FROZEN_DRAFT_BUCKETS``
    without last-row graphs when the target is frozen (a frozen draft steps ~3x faster in bf16, and each
    graph holds its own weight copy, so the LM head's extra rows are cheaper than another graph)."""
    if target_mode == "frozen":
        from specdec.runtimes.compiled import FROZEN_DRAFT_BUCKETS

        return {"compile_mode": "frozen", "last_row_graphs": False, "buckets": FROZEN_DRAFT_BUCKETS}
    return {"compile_mode": "inductor", "last_row_graphs": True}


def load_pair(
    target_spec: str,
    draft_spec: str | None,
    *,
    backend: str = "transformers",
    draft_backend: str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
    compile: bool = False,
    n_ctx: int | None = None,
    trust_remote_code: bool = False,
    quant: str | None = None,
    draft_dtype: str | None = None,
    draft_quant: str | None = "same",
    other_tokenizer: bool = False,
    gguf_type: str | None = None,
    compile_mode: str = "onednn",
    max_length: int | None = None,
) -> LoadedPair:
    """Load target and draft and check that they can be compared token by token.

    Args:
        target_spec, draft_spec: model specs (draft None: target only, e.g. prompt lookup).
        backend: the target's runtime; draft_backend: the draft's (default: the same) — mixed-runtime pairs
            such as a llama.cpp Q4_K_M draft with an fp32 transformers target are allowed when the
            vocabularies match.
        draft_dtype: the draft's dtype (default: `dtype`). draft_quant: the draft's quantization (default
            ``"same"``: `quant`; None: full weights). A quantized copy of the target is a draft of itself:
            ``load_pair(T, T, dtype="bfloat16", draft_quant="int8")``.
        gguf_type: the TARGET's GGUF requantized to this weight type (`load_model`); the draft runs its file
            as shipped (its cost and its proposals stay those of the shipped draft; only the target and
            its verification kernels change).
        other_tokenizer: the draft may have another tokenizer (`specdec.drafters.xtok`): the id check is
            skipped, ``info["vocab_overlap"]`` records what the vocabularies share, the draft keeps its
            own tokenizer (``pair.draft.tokenizer``) and the pair stops on the target's EOS ids only. Set by
            itself for the pair of a preset whose draft has another tokenizer
            (`specdec.models.presets.other_tokenizer_pair`, e.g. ``qwen2.5-coder+smollm2``).
        compile_mode: with `compile`, the target's mode (`specdec.runtimes.compiled.MODES`); the draft is
            compiled in ``inductor`` mode, or in ``frozen`` mode on ``FROZEN_DRAFT_BUCKETS`` when the target is
            frozen (`draft_compile_args`). max_length: with `compile`, both models' static-cache context.
        Other arguments as in `load_model` (`specdec.runtimes.compiled`).

    Returns:
        A `LoadedPair`.

    Raises:
        specdec.runtimes.compat.IncompatibleTokenizersError: the tokenizers differ (one line).
        specdec.models.ModelNotAvailableError, ValueError: as `load_model`.
    """
    from specdec.models.presets import other_tokenizer_pair

    other_tokenizer = other_tokenizer or other_tokenizer_pair(target_spec, draft_spec)
    set_threads(threads)
    kw = {"device": device, "threads": threads, "n_ctx": n_ctx, "trust_remote_code": trust_remote_code}
    if max_length is not None:
        kw["max_length"] = max_length
    target = load_model(target_spec, runtime=backend, compile=compile, dtype=dtype, quant=quant,
                        compile_mode=compile_mode,
                        **({"gguf_type": gguf_type} if gguf_type is not None else {}), **kw)
    if draft_spec is None:
        check_vocab_fits(real_vocab_size(target.tokenizer), target=target.backend)
        return LoadedPair(target, None, real_vocab_size(target.tokenizer), target.eos_ids)
    # The draft's forwards are 1-2 tokens, where MKL's GEMV beats oneDNN's packed GEMM: inductor (ATen
    # GEMMs, compiled elementwise) measured 110 vs 129 ms per draft step against eager; oneDNN 122 vs 120
    # (benchmarks/bench_compiled.py, interleaved, 2 threads, default pair).
    draft = load_model(draft_spec, runtime=draft_backend or backend, compile=compile,
                       **draft_compile_args(compile_mode), dtype=draft_dtype or dtype,
                       quant=quant if draft_quant == "same" else draft_quant, **kw)
    return _paired(target, draft, other_tokenizer)


def _paired(target: LoadedModel, draft: LoadedModel, other_tokenizer: bool) -> LoadedPair:
    """Target and draft as a pair: their shared vocabulary checked (or, with `other_tokenizer`, what their
    vocabularies share recorded) and the ids that end generation."""
    from specdec.runtimes.compat import IncompatibleTokenizersError, vocab_overlap

    vocab = real_vocab_size(target.tokenizer)
    if other_tokenizer:
        check_vocab_fits(vocab, target=target.backend)
        check_vocab_fits(real_vocab_size(draft.tokenizer), draft=draft.backend)
        return LoadedPair(target, draft, vocab, target.eos_ids,  # draft EOS ids are draft-space ids
                          {"vocab_overlap": vocab_overlap(target.tokenizer, draft.tokenizer).summary()})
    try:
        vocab = check_tokenizers(target.tokenizer, draft.tokenizer)
    except IncompatibleTokenizersError as exc:
        raise IncompatibleTokenizersError(f"{exc} (or pass --other-tokenizer / other_tokenizer=True)") from None
    check_vocab_fits(vocab, target=target.backend, draft=draft.backend)
    # A pair stops on every id either model marks end-of-generation on its runtime, so a mixed-runtime pair
    # stops on the same set whichever runtime holds the target.
    return LoadedPair(target, draft, vocab, target.eos_ids | draft.eos_ids)
