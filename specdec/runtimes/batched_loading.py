"""Batched backends for a loaded pair: the `specdec.runtimes.base.BatchedBackend` of its target and draft.

One rule for every caller that decodes B prompts at once (``specdec generate --batch-size``, the public API
with a list of prompts, the batch sweep): a transformers model is wrapped as it is loaded (the same weights,
`specdec.runtimes.hf_batched.BatchedHFBackend`); a GGUF on llama.cpp gets a second context over the same
file with `max_rows` sequences (`specdec.runtimes.llamacpp_batched.BatchedLlamaCppBackend`; the weights are
memory-mapped, so the second context shares their pages), with the single-sequence backend's threads and
repacking setting so both run the same kernels.
"""

from __future__ import annotations

from specdec.runtimes.base import BatchedBackend
from specdec.runtimes.loading import LoadedModel

__all__ = ["batched_backend"]


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
        return BatchedLlamaCppBackend(single.model_path, max_rows=int(max_rows), n_ctx=n_ctx,
                                      n_threads=single.n_threads, extra_buffers=single.extra_buffers)
    raise ValueError(f"no batched backend for runtime {model.runtime!r}")
