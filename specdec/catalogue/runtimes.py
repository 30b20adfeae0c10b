"""The runtime configurations a sweep can run (``config_label``): which runtime runs the target and the
draft, at which precision, compiled or not, and which aliases name them on the command line."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["CONFIG_ALIASES", "RUNTIME_CONFIGS", "RuntimeConfig", "check_available", "config_for_backends"]



@dataclass(frozen=True)
class RuntimeConfig:
    """One runtime configuration (``config_label``): which runtime runs the target and the draft.

    Attributes:
        label: the ``config_label`` stored with every run.
        target_backend, draft_backend: ``"transformers"`` or ``"llamacpp"``.
        compile: transformers only: the compiled static-cache backend (`specdec.runtimes.compiled`).
        dtype: transformers dtype of both models (None: the sweep's ``dtype``).
        quant: transformers weight quantization of both models (`specdec.runtimes.precision`; None: full weights).
        self_draft_quant: draft with a copy of the TARGET quantized this way (e.g. ``"int8"``) instead of
            the sweep's draft model: same tokenizer, cost set by bytes read.
        pad_verify: our speculative methods pad each verification forward to the cheapest shape on the
            configuration's measured cost curve (`specdec.core.costs.CostCurve.padded_n`; output unchanged),
            and the cost policy prices K with the padded cost. Loading is unchanged.
        gguf_type: llama.cpp target only: the target's GGUF requantized (pure) to this ggml weight type,
            made once into the model cache (`specdec.models.requant`). The draft keeps its shipped GGUF, so the
            configuration differs from ``llamacpp`` by one thing, the target: the draft's proposals and step
            cost are the same in every ``llamacpp*`` configuration, and a change in acceptance or speed is the
            target's (requantizing the draft too would change both at once).
        compile_mode: with `compile`, the target's `specdec.runtimes.compiled` mode (None: ``onednn``);
            ``frozen`` compiles the draft frozen too (`specdec.runtimes.loading.draft_compile_args`).
    """

    label: str
    target_backend: str
    draft_backend: str
    compile: bool = False
    dtype: str | None = None
    quant: str | None = None
    self_draft_quant: str | None = None
    pad_verify: bool = False
    gguf_type: str | None = None
    compile_mode: str | None = None

    def load_kwargs(self, sweep_dtype: str) -> dict:
        """The `specdec.runtimes.loading.load_pair` arguments this configuration sets beyond the runtimes (only those
        it changes, so that loaders that know none of them keep working)."""
        kw: dict = {"dtype": self.dtype or sweep_dtype}
        if self.quant is not None:
            kw["quant"] = self.quant
        if self.self_draft_quant is not None:
            kw["draft_quant"] = self.self_draft_quant
        if self.gguf_type is not None:
            kw["gguf_type"] = self.gguf_type
        if self.compile_mode is not None:
            kw["compile_mode"] = self.compile_mode
        return kw

    def target_precision(self, sweep_dtype: str) -> str:
        """What the target's weights run in, as stored in ``runs.dtype``: the transformers dtype
        (``"bfloat16"``; ``"float32+int8"`` with int8 weight-only quantization) or ``"gguf"`` on llama.cpp
        (the GGUF's own quantization, e.g. Q4_K_M), ``"gguf:Q4_0"`` for a target requantized to Q4_0.
        `sweep_dtype` is the sweep's ``--dtype``."""
        if self.target_backend == "llamacpp":
            return f"gguf:{self.gguf_type}" if self.gguf_type else "gguf"
        dtype = self.dtype or sweep_dtype
        return f"{dtype}+{self.quant}" if self.quant else dtype


RUNTIME_CONFIGS: dict[str, RuntimeConfig] = {
    c.label: c
    for c in (
        RuntimeConfig("transformers-eager", "transformers", "transformers"),
        RuntimeConfig("transformers-compiled", "transformers", "transformers", compile=True),
        RuntimeConfig("llamacpp", "llamacpp", "llamacpp"),
        RuntimeConfig("mixed:llamacpp-draft", "transformers", "llamacpp"),
        RuntimeConfig("mixed:transformers-draft", "llamacpp", "transformers"),
        # a bf16 transformers target drafted by the Q4_K_M GGUF draft on llama.cpp: the target's output
        # is bf16 target-only decoding's; the draft costs llama.cpp's step (c ~ 0.1 here instead of 0.35)
        RuntimeConfig("mixed:llamacpp-draft-bf16", "transformers", "llamacpp", dtype="bfloat16"),
        # The fast CPU configurations; bf16 needs native bf16 kernels (refused in one line otherwise).
        RuntimeConfig("transformers-bf16", "transformers", "transformers", dtype="bfloat16"),
        RuntimeConfig("transformers-bf16-compiled", "transformers", "transformers", compile=True,
                      dtype="bfloat16"),
        # bf16 with the weights folded into the compiled graphs (~3x faster steps, one weight copy per
        # graph: FROZEN_BUCKETS for the target, FROZEN_DRAFT_BUCKETS for the draft)
        RuntimeConfig("transformers-bf16-frozen", "transformers", "transformers", compile=True, dtype="bfloat16",
                      compile_mode="frozen"),
        RuntimeConfig("transformers-int8", "transformers", "transformers", quant="int8"),
        RuntimeConfig("transformers-bf16-int8", "transformers", "transformers", dtype="bfloat16", quant="int8"),
        RuntimeConfig("self-draft:bf16-int8", "transformers", "transformers", dtype="bfloat16",
                      self_draft_quant="int8"),
        # fp32 eager with verification padded to the cheapest measured shape
        RuntimeConfig("transformers-padded", "transformers", "transformers", pad_verify=True),
        # llama.cpp with verification padded the same way: exact there too (the filler's logits are not
        # read and ``llama_memory_seq_rm`` drops its cache entries with the rejected drafts)
        RuntimeConfig("llamacpp-padded", "llamacpp", "llamacpp", pad_verify=True),
        # llama.cpp with the target requantized to a type whose verification forward runs repacked GEMM kernels
        RuntimeConfig("llamacpp-q4_0", "llamacpp", "llamacpp", gguf_type="Q4_0"),
        RuntimeConfig("llamacpp-iq4_nl", "llamacpp", "llamacpp", gguf_type="IQ4_NL"),
        RuntimeConfig("llamacpp-q8_0", "llamacpp", "llamacpp", gguf_type="Q8_0"),
        # the same targets verifying at the cheapest measured shape: their repacked GEMM runs rows in groups
        # of 4, so 4 tokens can cost less than 3 (a K = 2 round padded to 4 rows)
        RuntimeConfig("llamacpp-q4_0-padded", "llamacpp", "llamacpp", gguf_type="Q4_0", pad_verify=True),
        RuntimeConfig("llamacpp-iq4_nl-padded", "llamacpp", "llamacpp", gguf_type="IQ4_NL", pad_verify=True),
    )
}
CONFIG_ALIASES = {
    "eager": "transformers-eager",
    "transformers": "transformers-eager",
    "compiled": "transformers-compiled",
    "llama.cpp": "llamacpp",
    "mixed": "mixed:llamacpp-draft",
}


def config_for_backends(target_backend: str, draft_backend: str) -> str:
    """The label of the uncompiled configuration running the target on `target_backend` and the draft on
    `draft_backend` (``--backend`` / ``--draft-backend``).

    Raises:
        ValueError: no configuration runs that combination.
    """
    for c in RUNTIME_CONFIGS.values():
        if (c.target_backend, c.draft_backend, c.compile) == (target_backend, draft_backend, False):
            return c.label
    raise ValueError(
        f"unknown backend combination target={target_backend!r}, draft={draft_backend!r}; "
        f"backends: transformers, llamacpp"
    )


def check_available(rc: RuntimeConfig) -> None:
    """Refuse, before any model loads, a configuration whose optional library (llama-cpp-python) is
    missing."""
    if "llamacpp" in (rc.target_backend, rc.draft_backend) and importlib.util.find_spec("llama_cpp") is None:
        raise ValueError(f"config {rc.label} needs llama-cpp-python: pip install 'specdec[llamacpp]'")
