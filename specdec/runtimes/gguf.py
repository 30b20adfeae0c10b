"""GGUF files as files: their tensors' weight types and FLOPs per token (read through the ``gguf`` package,
memory-mapped), their end-of-generation ids and tokenizer, and requantization with llama.cpp's own quantizer.
The runtime that decodes a GGUF is `specdec.runtimes.llamacpp`."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from specdec.runtimes.base import BackendError
from specdec.runtimes.llamacpp import default_threads, eog_ids_of, init_backend, llama_cpp_lib, require_file

__all__ = [
    "REQUANT_TYPES",
    "gguf_eog_ids",
    "gguf_matmul_flops",
    "gguf_weight_types",
    "hf_tokenizer_from_gguf",
    "kv_bytes_per_token",
    "requantize_gguf",
]


def _gguf_tensors(path: str | os.PathLike) -> tuple[Path, list]:
    """The file's path and its tensor infos (``gguf.ReaderTensor``: name, type, shape, element and byte
    counts), read from the header through the ``gguf`` package (memory-mapped, no weights copied).

    Raises:
        GGUFNotFoundError: `path` does not exist. ValueError: the file is not a readable GGUF.
    """
    from gguf import GGUFReader

    p = require_file(path)
    try:
        return p, list(GGUFReader(p).tensors)
    except Exception as exc:  # gguf raises ValueError/struct errors on a damaged file
        raise ValueError(f"{p}: not a readable GGUF file ({exc})") from exc


def gguf_weight_types(path: str | os.PathLike) -> dict[str, int]:
    """Bytes of tensor data per ggml type in a GGUF file (e.g. ``{"Q4_K": 9.1e8, "Q6_K": 2.1e8, "F32": ...}``),
    read from the header and tensor infos through the ``gguf`` package (memory-mapped, no weights copied).
    Which kernels a forward runs depends on these types (a type without an x86 repack keeps per-row dot
    products), so a cost curve is recorded with them.

    Raises:
        GGUFNotFoundError: `path` does not exist. ValueError: the file is not a readable GGUF.
    """
    _, tensors = _gguf_tensors(path)
    out: dict[str, int] = {}
    for t in tensors:
        name = t.tensor_type.name
        out[name] = out.get(name, 0) + int(t.n_bytes)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def gguf_matmul_flops(path: str | os.PathLike) -> int:
    """Floating-point operations of the weight matrix products one token costs in a forward of this GGUF
    model: 2 (a multiply and an add) per element of every 2-d weight tensor, read from the tensor infos
    through the ``gguf`` package (memory-mapped, no weights copied).

    The token embedding table (``token_embd.weight``) is a row lookup, not a product, and is left out unless
    the file has no ``output.weight`` (tied embeddings: the output layer multiplies by that table). Attention
    over the cache (about 4 x layers x context x hidden FLOPs per token) is not counted: at the contexts a
    verification cost curve is timed on it is under 1% of the total. 1-d tensors (norms, biases) are left out.

    Returns:
        FLOPs per token (int), e.g. about 3.1e9 for a 1.5B-parameter model with tied embeddings.

    Raises:
        GGUFNotFoundError: `path` does not exist. ValueError: the file is not a readable GGUF, or it has no
        2-d weight tensor.
    """
    p, tensors = _gguf_tensors(path)
    tied = "output.weight" not in {t.name for t in tensors}
    total = 0
    for t in tensors:
        if len([d for d in t.shape if int(d) > 1]) < 2:
            continue
        if t.name == "token_embd.weight" and not tied:
            continue
        total += 2 * int(t.n_elements)
    if total == 0:
        raise ValueError(f"{p}: no 2-d weight tensor, so no FLOPs per token")
    return total


#: Target weight types a GGUF can be requantized to (`requantize_gguf`), by llama.cpp's ftype names.
REQUANT_TYPES = {"Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
                 "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def requantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, weight_type: str, *, pure: bool = True,
                    threads: int | None = None) -> Path:
    """Write `src` requantized to `weight_type` at `dst` with llama.cpp's own quantizer
    (``llama_model_quantize`` with ``allow_requantize``; `pure`: every 2-d tensor gets `weight_type`, the
    output layer and embeddings included, so no tensor keeps a type without a repacked kernel).

    Requantizing an already quantized file stacks two rounding errors: the result is a different model, so
    its greedy output is compared with the source's before it is used as a target (`benchmarks/
    llamacpp_candidates.py` prints that agreement). The file is written to ``dst + ".part"`` and renamed, so
    an interrupted call never leaves a truncated `dst`.

    Raises:
        GGUFNotFoundError: `src` is missing. ValueError: unknown `weight_type` (one line, the known ones),
        or `dst` exists. BackendError: llama.cpp's quantizer failed.
    """
    if weight_type not in REQUANT_TYPES:
        raise ValueError(f"unknown weight type {weight_type!r}; known: {', '.join(REQUANT_TYPES)}")
    source = require_file(src)
    out = Path(dst)
    if out.exists():
        raise ValueError(f"{out} exists; remove it or choose another path")
    lib, _ = llama_cpp_lib()
    init_backend(lib, False)
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, REQUANT_TYPES[weight_type])
    params.allow_requantize = True
    params.pure = bool(pure)
    params.nthread = int(threads or default_threads())
    part = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    rc = lib.llama_model_quantize(str(source).encode(), str(part).encode(), ctypes.byref(params))
    if rc != 0 or not part.is_file():
        part.unlink(missing_ok=True)
        raise BackendError(f"llama.cpp could not requantize {source.name} to {weight_type} (status {rc})")
    part.replace(out)
    return out


def gguf_eog_ids(path: str | os.PathLike) -> frozenset[int]:
    """llama.cpp's end-of-generation ids of a GGUF file, read from its vocabulary alone (``vocab_only``: no
    weights, no context), so a transformers model converted from that GGUF stops on the same set as the
    llama.cpp runtime (`LlamaCppBackend.eog_ids`).

    Raises:
        GGUFNotFoundError: the file does not exist. BackendError: llama-cpp-python is missing or llama.cpp
            cannot read the vocabulary.
    """
    p = require_file(path)
    lib, internals = llama_cpp_lib()
    init_backend(lib, False)
    mparams = lib.llama_model_default_params()
    mparams.vocab_only = True
    mparams.n_gpu_layers = 0
    try:
        model = internals.LlamaModel(path_model=str(p), params=mparams, verbose=False)
    except ValueError as exc:
        raise BackendError(f"llama.cpp cannot read the vocabulary of {p.name}: {exc}") from exc
    try:
        return eog_ids_of(lib, model.model)
    finally:
        model.close()


def hf_tokenizer_from_gguf(path: str | os.PathLike):
    """The Hugging Face tokenizer stored in a GGUF file (``AutoTokenizer.from_pretrained(dir, gguf_file=name)``;
    needs the ``gguf`` package). The speculative engine tokenizes with it.

    Raises:
        GGUFNotFoundError: the file does not exist.
    """
    from transformers import AutoTokenizer

    p = require_file(path)
    return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


def kv_bytes_per_token(path: str | os.PathLike) -> int:
    """Bytes of KV cache one token takes in llama.cpp's default (f16) cache for this GGUF model:
    ``2 (keys and values) x layers x kv heads x head size x 2 bytes``, read from the header
    (``<arch>.block_count``, ``.attention.head_count_kv``, ``.attention.key_length`` / ``value_length``, else
    ``embedding_length / head_count``).

    Raises:
        GGUFNotFoundError: `path` does not exist. ValueError: not a readable GGUF, or the fields are missing.
    """
    from gguf import GGUFReader

    p = require_file(path)
    try:
        fields = {k: f.contents() for k, f in GGUFReader(p).fields.items()
                  if k == "general.architecture" or ".attention." in k or k.endswith((".block_count",
                                                                                         ".embedding_length"))}
        arch = fields["general.architecture"]
        heads = int(fields[f"{arch}.attention.head_count"])
        kv_heads = int(fields.get(f"{arch}.attention.head_count_kv", heads))
        head = int(fields[f"{arch}.embedding_length"]) // heads
        k_len = int(fields.get(f"{arch}.attention.key_length", head))
        v_len = int(fields.get(f"{arch}.attention.value_length", head))
        return int(fields[f"{arch}.block_count"]) * kv_heads * (k_len + v_len) * 2
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(f"{p}: the GGUF header does not say its KV size ({exc})") from exc

