"""Batched backends for a loaded pair: the `specdec.runtimes.base.BatchedBackend` of its target and draft.

One rule for every caller that decodes B prompts at once (``specdec generate --batch-size``, the public API
with a list of prompts, the batch sweep): a transformers model is wrapped as it is loaded (the same weights,
`specdec.runtimes.hf_batched.BatchedHFBackend`); a GGUF on llama.cpp gets a second context over the same
file with `max_rows` sequences (`specdec.runtimes.llamacpp_batched.BatchedLlamaCppBackend`; the weights are
memory-mapped, so the second context shares their pages), with the single-sequence backend's threads and
repacking setting so both run the same kernels.
"""

from __future__ import annotations

from pathlib import Path

from specdec.runtimes.base import BatchedBackend
from specdec.runtimes.loading import LoadedModel

__all__ = ["batched_backend", "check_kv_fits"]


def batched_backend(model: LoadedModel, max_rows: int, *, row_tokens: int | None = None) -> BatchedBackend:
    """The batched backend of one loaded model, for at most `max_rows` rows at once, each row holding at most
    `row_tokens` tokens (its prompt, budget and a verification's width; None: the runtime's default). On
    llama.cpp every row reserves KV cells for `row_tokens` (rounded up to 256), so the cache follows the
    work instead of a default context per row.

    Raises:
        ValueError: ``max_rows < 1``; a compiled transformers model (static cache: batched decoding needs the
            dynamic one); an unknown runtime.
        specdec.runtimes.base.BackendError: a model whose cache layers are not all full attention.
    """
    if int(max_rows) < 1:
        raise ValueError(f"the batch size must be >= 1, got {max_rows}")
    if model.runtime == "transformers":
        if model.compiled or model.hf_model is None:
            raise ValueError("batched decoding runs the eager transformers backend, not the compiled one")
        from specdec.runtimes.hf_batched import BatchedHFBackend

        return BatchedHFBackend(model.hf_model, max_length=model.backend.max_length)
    if model.runtime == "llamacpp":
        from specdec.runtimes.llamacpp_batched import DEFAULT_ROW_CTX, BatchedLlamaCppBackend

        single = model.backend
        n_ctx = min(single.max_length, int(row_tokens) if row_tokens else DEFAULT_ROW_CTX)
        check_kv_fits(single.model_path, int(max_rows), n_ctx)
        return BatchedLlamaCppBackend(single.model_path, max_rows=int(max_rows), n_ctx=n_ctx,
                                      n_threads=single.n_threads, extra_buffers=single.extra_buffers)
    raise ValueError(f"no batched backend for runtime {model.runtime!r}")


def check_kv_fits(model_path, rows: int, row_ctx: int, *, available: int | None = None) -> None:
    """Refuse, before llama.cpp allocates it, a batch whose KV cache cannot fit in memory: `rows` streams of
    `row_ctx` tokens each (rounded up to llama.cpp's 256 cells) at `specdec.runtimes.gguf.kv_bytes_per_token`,
    against `available` bytes (default: the machine's available memory, ``MemAvailable`` of /proc/meminfo;
    no check where it cannot be read).

    Raises:
        ValueError: one line with the sizes and what to change.
    """
    from specdec.runtimes.gguf import kv_bytes_per_token

    if available is None:
        available = _available_memory()
        if available is None:
            return
    cells = -(-int(row_ctx) // 256) * 256
    need = rows * cells * kv_bytes_per_token(model_path)
    if need > 0.8 * available:
        raise ValueError(f"a llama.cpp batch of {rows} rows of {cells} KV cells needs {need / 2**30:.1f} GiB of KV "
                         f"cache and {available / 2**30:.1f} GiB of memory is available: lower the batch size or the "
                         "rows' budgets")


def _available_memory() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
        line = next(x for x in text.splitlines() if x.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError, StopIteration):
        return None

