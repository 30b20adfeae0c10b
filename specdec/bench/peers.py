"""The library peers measured next to our methods: transformers ``generate()``, assisted generation and prompt
lookup, on the same loaded model and prompt ids, timed by the wall clock around the library call.

Each call neutralises every logits processor our engine lacks, so greedy peers decode exactly what our
baseline decodes (the sweep records whether they do). The registry entries that run them are in
`specdec.bench.methods`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specdec.core.sampling import SamplingParams
from specdec.engine.decoding import GREEDY

__all__ = ["HF_PEERS", "PeerOutput", "hf_peer_generate"]

#: The transformers peers `hf_peer_generate` runs.
HF_PEERS = ("hf_generate", "hf_assisted", "hf_prompt_lookup")


@dataclass
class PeerOutput:
    """A peer's generation: new token ids, wall seconds around the library call, finish reason."""

    token_ids: list[int]
    total_s: float
    finish_reason: str


def _neutral_generation_config(model, *, max_new_tokens: int, sampling: SamplingParams, eos_ids, pad_id):
    """A copy of the model's generation config with every logits processor our engine does not apply
    turned off, so that ``generate()`` decodes exactly what our engine decodes (greedy: argmax).

    transformers fills the None fields of a passed config from ``model.generation_config``, so the
    neutral values are set explicitly rather than cleared.
    """
    gc_ = copy.deepcopy(model.generation_config)
    eos = sorted(int(e) for e in eos_ids)
    neutral = {
        "max_new_tokens": int(max_new_tokens), "min_new_tokens": None, "min_length": 0,
        "do_sample": not sampling.greedy, "num_beams": 1, "use_cache": True,
        "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
        "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "forced_bos_token_id": None,
        "forced_eos_token_id": None, "suppress_tokens": None, "begin_suppress_tokens": None,
        "sequence_bias": None, "exponential_decay_length_penalty": None, "renormalize_logits": False,
        "remove_invalid_values": False, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
        "min_p": None, "top_h": None, "guidance_scale": None, "watermarking_config": None,
        # no EOS: [] (None would be filled in from the model's own generation config, which stops at EOS)
        "eos_token_id": (eos if len(eos) != 1 else eos[0]) if eos else [], "pad_token_id": pad_id,
        "return_dict_in_generate": False, "output_scores": False, "output_logits": False,
        "prompt_lookup_num_tokens": None, "assistant_early_exit": None,
    }  # fmt: skip
    if sampling.greedy:
        neutral.update(temperature=1.0, top_k=50, top_p=1.0)
    else:
        neutral.update(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    for key, value in neutral.items():
        setattr(gc_, key, value)
    return gc_


@contextlib.contextmanager
def _assistant(pair, k: int | None) -> Iterator[Any]:
    """The draft model set up for assisted generation with a constant K and no confidence stop (transformers
    reads these from the *assistant's* generation config), its own config restored afterwards; None when
    `k` is None (not assisted).

    Raises:
        ValueError: the draft is not on transformers.
    """
    if k is None:
        yield None
        return
    if pair.draft is None or pair.draft.hf_model is None:
        raise ValueError("hf_assisted needs the draft model on transformers")
    assistant = pair.draft.hf_model
    saved = assistant.generation_config
    a_cfg = copy.deepcopy(saved)
    a_cfg.num_assistant_tokens = k
    a_cfg.num_assistant_tokens_schedule = "constant"
    a_cfg.assistant_confidence_threshold = 0.0
    assistant.generation_config = a_cfg
    try:
        yield assistant
    finally:
        assistant.generation_config = saved


def hf_peer_generate(
    pair,
    method: str,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    k: int | None = None,
    sampling: SamplingParams = GREEDY,
    seed: int | None = None,
    ignore_eos: bool = False,
) -> PeerOutput:
    """Run one transformers peer on `pair` (a `specdec.runtimes.loading.LoadedPair`) and time it by the wall clock.

    Methods: ``hf_generate`` (``generate()``, target only); ``hf_assisted`` (``assistant_model=`` the draft
    model, whose generation config is swapped for a copy with ``num_assistant_tokens=K``,
    ``num_assistant_tokens_schedule="constant"`` and ``assistant_confidence_threshold=0`` (off), restored
    afterwards — transformers reads these from the *assistant's* config); ``hf_prompt_lookup``
    (``prompt_lookup_num_tokens=K``, transformers' default n-gram size). Every call uses our EOS ids, an
    attention mask, ``do_sample=False`` under greedy, and no logits processor our engine lacks.
    ``ignore_eos=True`` (sampled sweeps) gives ``generate()`` no EOS id, so it runs the whole budget
    and an EOS is sampled like any token, as our engine does with an empty stop set.

    Returns:
        `PeerOutput` with the new token ids (EOS kept), seconds from just before the call to just after it
        (device synchronized; prefill included and not separable), and ``"eos"``/``"length"``.

    Raises:
        ValueError: unknown method, a peer that needs a transformers target/draft, or K missing.
    """
    if method not in HF_PEERS:
        raise ValueError(f"not a transformers peer: {method!r}")
    model = pair.target.hf_model
    if model is None:
        raise ValueError(f"{method} needs the target on transformers")
    if method != "hf_generate" and not k:
        raise ValueError(f"{method} needs K")
    eos = frozenset() if ignore_eos else frozenset(pair.eos_ids)
    tok = pair.tokenizer
    pad_id = getattr(tok, "pad_token_id", None)
    if pad_id is None:
        pad_id = min(pair.eos_ids) if pair.eos_ids else 0
    gen_cfg = _neutral_generation_config(model, max_new_tokens=max_new_tokens, sampling=sampling,
                                         eos_ids=eos, pad_id=pad_id)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids), "generation_config": gen_cfg}
    if method == "hf_prompt_lookup":
        gen_cfg.prompt_lookup_num_tokens = int(k)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with _assistant(pair, int(k) if method == "hf_assisted" else None) as assistant:
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        if not sampling.greedy:
            torch.manual_seed(0 if seed is None else int(seed))
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, **kwargs)
        sync()
        total = time.perf_counter() - t0
    new = [int(t) for t in out[0, ids.shape[1]:].tolist()]
    # Batch of one: nothing is padded after an EOS, but cut defensively at the first one.
    for i, t in enumerate(new):
        if t in eos:
            return PeerOutput(new[: i + 1], total, "eos")
    return PeerOutput(new, total, "length")
