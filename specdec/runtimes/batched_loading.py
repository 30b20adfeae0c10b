"""Batched backends for a loaded pair: the `specdec.runtimes.base.BatchedBackend` of its target and draft.

One rule for every caller that decodes B prompts at once (``specdec generate --batch-size``, the public API
with a list of prompts, the batch sweep): a transformers model is wrapped as it is loaded (the same weights,
`specdec.runtimes.hf_batched.BatchedHFBackend`); a GGUF on llama.cpp gets a second context over the same
file with `max_rows` sequences (`specdec.runtimes.llamacpp_batched.BatchedLlamaCppBackend`; the weights are
memory-mapped, so the second context shares their pages), with the single-sequence backend's threads and
repacking setting so both run the same kernels.
"""

from __future__ import annotations

from specdec.drafters.model import BatchedModelDrafter
from specdec.runtimes.base import BatchedBackend
from specdec.runtimes.loading import LoadedModel, LoadedPair

__all__ = ["batched_backend", "batched_pair"]


def batched_backend(model: LoadedModel, max_rows: int) -> BatchedBackend:
    """The batched backend of one loaded model, for at most `max_rows` rows at once.

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
        return BatchedLlamaCppBackend(single.model_path, max_rows=int(max_rows), n_ctx=min(single.max_length, DEFAULT_ROW_CTX),
                                      n_threads=single.n_threads, extra_buffers=single.extra_buffers)
    raise ValueError(f"no batched backend for runtime {model.runtime!r}")


def batched_pair(loaded: LoadedPair, max_rows: int) -> tuple[BatchedBackend, BatchedModelDrafter | None]:
    """``(target, draft)``: the target's batched backend and, when the pair has a draft model, a
    `specdec.drafters.model.BatchedModelDrafter` over the draft's batched backend (None without a draft).

    Raises:
        as `batched_backend`.
    """
    target = batched_backend(loaded.target, max_rows)
    draft = None
    if loaded.draft is not None:
        draft = BatchedModelDrafter(batched_backend(loaded.draft, max_rows), loaded.vocab_size)
    return target, draft
