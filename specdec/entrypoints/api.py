"""The Python API: load a draft -> target pair, generate with speculative decoding.

    from specdec import load_pair, generate

    pair = load_pair("qwen2.5-coder")          # or load_pair(target="dir, .gguf or hub id", draft="...")
    out = generate(pair, "def fib(n):", max_new_tokens=64)
    print(out.text, out.acceptance_rate, out.block_efficiency, out.tokens_per_s)
    outs = generate(pair, ["def a():", "def b():", "x ="], batch_size=2)  # one Generation per prompt

`load_pair` returns a `Pair` (the loaded models and what they are); `generate` returns a `Generation` (a list
of them, in prompt order, for a list of prompts decoded `batch_size` at a time), a
`specdec.core.metrics.GenerationResult` (new token ids, one `specdec.core.metrics.RoundRecord` per target
forward, accepted/drafted counts, acceptance rate, block efficiency, tokens/s, TTFT) with the decoded text
and the settings that produced it. The command line's ``specdec generate`` runs the same code: the settings
are checked by `specdec.entrypoints.generation.check_settings` and assembled and run by
`specdec.entrypoints.generation.run` (Leviathan et al. 2023; Chen et al. 2023: greedy output equals
target-only greedy decoding, sampled output follows the target's distribution); the drafters and K policies
are those of `specdec.catalogue`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from specdec.catalogue.drafters import DEFAULT_DRAFTER, DRAFT_MODEL
from specdec.core.metrics import GenerationResult
from specdec.runtimes.loading import LoadedPair

__all__ = ["Generation", "Pair", "generate", "load_pair"]


@dataclass
class Pair:
    """A loaded draft -> target pair (`load_pair`).

    Attributes:
        loaded: the models, tokenizer, shared vocabulary and EOS ids (`specdec.runtimes.loading.LoadedPair`).
        target, draft: the specs they were loaded from (draft None: target only; model-free drafters).
        backend: the target's runtime. device: torch device. dtype: the target's weights' dtype
            (``"auto"`` resolved by `specdec.runtimes.precision.default_dtype`; None on llama.cpp).
        threads: intra-op threads (None: torch's default).
        cost_key: what identifies the setup's cost measurement (`specdec.measure.cost_cache.cached_costs`).
        runtime: what ran, recorded with every generation: backend, dtype, quantization, requantized GGUF
            type, the draft's dtype.
    """

    loaded: LoadedPair
    target: str
    draft: str | None
    backend: str
    device: str
    dtype: str | None
    threads: int | None
    cost_key: dict = field(default_factory=dict, repr=False)
    runtime: dict = field(default_factory=dict, repr=False)

    @property
    def tokenizer(self):
        """The pair's (shared) tokenizer."""
        return self.loaded.tokenizer


@dataclass
class Generation(GenerationResult):
    """One speculative generation: a `specdec.core.metrics.GenerationResult` plus its text and settings.

    Inherited: ``token_ids`` (new tokens only, EOS included when it ended the output), ``prompt_ids``,
    ``finish_reason`` (``"eos"``, ``"length"``, ``"empty"``), ``rounds`` (one `RoundRecord` per target
    forward: K, accepted, bonus/recovered, seconds), and the statistics ``num_drafted``, ``num_accepted``,
    ``acceptance_rate`` (accepted / drafted), ``block_efficiency`` (tokens per target forward),
    ``tokens_per_s``, ``ttft_s``, ``summary()``.

    Attributes:
        text: the new tokens decoded (special tokens skipped).
        k: the fixed K, or the largest K the policy may ask for. policy: the K policy's name
            (`specdec.catalogue.policies`). drafter: the drafter's name (`specdec.catalogue.drafters`).
        dtype: the target's dtype that ran (None on llama.cpp). temperature: 0 = greedy.
    """

    text: str = ""
    k: int = 0
    policy: str = ""
    drafter: str = ""
    dtype: str | None = None
    temperature: float = 0.0


def load_pair(
    pair: str | None = None,
    *,
    target: str | None = None,
    draft: str | None = None,
    dtype: str = "auto",
    device: str = "cpu",
    threads: int | None = None,
    backend: str = "transformers",
    draft_backend: str | None = None,
    draft_dtype: str | None = None,
    quant: str | None = None,
    draft_quant: str | None = None,
    gguf_type: str | None = None,
    compile: bool = False,
    other_tokenizer: bool = False,
    with_draft: bool = True,
    trust_remote_code: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Pair:
    """Load a draft -> target pair: a preset by name, or target and draft specs.

    Args:
        pair: a preset (``specdec models`` lists them; None with no `target`: the default,
            ``qwen2.5-coder``, which works offline and is assembled and converted on first use).
        target, draft: hub ids, checkpoint directories or ``.gguf`` files instead of a preset; `draft`
            None with a `target`: target only (model-free drafters such as ``drafter="ngram"``).
        dtype: ``"auto"`` (default: bfloat16 on a CPU with native bf16 kernels, else float32;
            `specdec.runtimes.precision.default_dtype`), ``"float32"`` (exact everywhere), ``"bfloat16"``,
            ``"float16"``. Transformers only.
        device: ``"cpu"`` or ``"cuda"``. threads: intra-op CPU threads (None: torch's default).
        backend: the target's runtime, ``"transformers"`` or ``"llamacpp"`` (GGUF);
            draft_backend: the draft's (default: the same). draft_dtype: the draft's dtype (default: dtype).
        quant: ``"int8"`` weight-only linears (transformers eager); draft_quant: the draft's (default:
            `quant`). gguf_type: the target's GGUF requantized to this ggml type (llama.cpp only).
        compile: compiled static-cache forwards (one prompt at a time).
        other_tokenizer: the draft has another tokenizer than the target (set by itself for a preset such as
            ``qwen2.5-coder+smollm2``): it drafts text that the target re-tokenizes.
        with_draft: load the draft model (False: target only, for model-free drafters).
        trust_remote_code: allow model code from the hub (off by default).
        progress: gets one-line progress messages (loading, converting); None: silent.

    Returns:
        A `Pair`.

    Raises:
        ValueError: unknown preset, dtype or runtime; bfloat16 on a CPU without bf16 kernels; a draft
            without a target; options that do not apply to the runtime.
        specdec.models.ModelNotAvailableError: weights not available (one line).
        specdec.runtimes.compat.IncompatibleTokenizersError: target and draft tokenize differently.
    """
    import time

    from specdec.runtimes import loading
    from specdec.runtimes.precision import draft_quant_arg, resolve_dtype

    target_spec, draft_spec = _specs(pair, target, draft, with_draft)
    dtype = resolve_dtype(dtype, device)
    if gguf_type is not None:
        from specdec.models.requant import check_gguf_type

        if backend != "llamacpp":
            raise ValueError("--gguf-type applies to the llama.cpp backend only (add --backend llamacpp)")
        gguf_type = check_gguf_type(gguf_type)
    slow = progress is not None and any(_large_weights(s) for s in (target_spec, draft_spec) if s)
    t0 = time.perf_counter()
    if slow:
        names = target_spec + (f" and {draft_spec}" if draft_spec else "")
        label = runtime_label({"backend": backend, "dtype": dtype, "quant": quant, "gguf_type": gguf_type})
        progress(f"loading {names} ({label}) ...")
    loaded = loading.load_pair(target_spec, draft_spec, backend=backend, draft_backend=draft_backend,
                               device=device, dtype=dtype, threads=threads, compile=compile,
                               trust_remote_code=trust_remote_code, quant=quant, draft_dtype=draft_dtype,
                               draft_quant=draft_quant_arg(draft_quant), other_tokenizer=other_tokenizer,
                               **({"gguf_type": gguf_type} if gguf_type is not None else {}))
    if slow:
        progress(f"loaded in {time.perf_counter() - t0:.1f} s")
    settings = {"backend": backend, "draft_backend": draft_backend, "device": device, "dtype": dtype,
                "threads": threads, "compile": compile, "quant": quant, "draft_dtype": draft_dtype,
                "draft_quant": draft_quant, "gguf_type": gguf_type}
    return Pair(loaded, target_spec, draft_spec, backend, device, loaded.target.dtype, threads,
                _cost_key(target_spec, draft_spec, settings), _runtime_record(loaded, settings))


def _cost_key(target_spec: str, draft_spec: str | None, settings: dict) -> dict:
    """What identifies the setup's cost measurement: the models' files and every setting that changes a
    forward's time (the optional ones only when set, so that full-precision setups keep their keys)."""
    from specdec.measure.cost_cache import model_fingerprint

    optional = ("quant", "draft_dtype", "draft_quant", "gguf_type")
    return {"target": model_fingerprint(target_spec), "draft": model_fingerprint(draft_spec),
            **{n: v for n, v in settings.items() if n not in optional or v is not None}}


def _runtime_record(loaded: LoadedPair, settings: dict) -> dict:
    """What ran, recorded with every generation (`Pair.runtime`)."""
    draft = loaded.draft
    return {"backend": settings["backend"], "dtype": loaded.target.dtype, "quant": settings["quant"],
            "gguf_type": settings["gguf_type"],
            "draft_backend": (settings["draft_backend"] or settings["backend"]) if draft is not None else None,
            "draft_dtype": draft.dtype if draft is not None else None}


def _specs(pair: str | None, target: str | None, draft: str | None, with_draft: bool) -> tuple[str, str | None]:
    """``(target spec, draft spec or None)`` from a preset or specs (a target alone: target only).

    Raises:
        ValueError: a draft without a target, an unknown preset.
    """
    from specdec import models

    if draft is not None and target is None:
        raise ValueError("a draft needs a target: load_pair(target=..., draft=...)")
    if target is not None and draft is None and pair is None:
        return target, None  # target only: model-free drafters
    target_spec, draft_spec = models.resolve_pair(pair, target, draft)
    return target_spec, draft_spec if with_draft else None


def runtime_label(runtime: dict) -> str:
    """What ran, in words: ``transformers bfloat16``, ``llama.cpp GGUF``, ``llama.cpp GGUF requantized to
    Q4_0`` (`Pair.runtime`)."""
    if runtime.get("backend") == "llamacpp":
        gguf_type = runtime.get("gguf_type")
        return "llama.cpp GGUF" + (f" requantized to {gguf_type}" if gguf_type else "")
    quant = runtime.get("quant")
    return f"{runtime.get('backend')} {runtime.get('dtype')}{' ' + quant if quant else ''}"


def _large_weights(spec: str, limit_bytes: int = 200_000_000) -> bool:
    """Whether loading `spec` is a long step worth a progress line: a preset's GGUF, a ``.gguf`` file, a hub
    id, or a checkpoint directory whose safetensors exceed `limit_bytes`. Never raises (unknown: True)."""
    from specdec.models import resolve

    try:
        r = resolve(spec)
        if r.kind == "dir":
            return sum(p.stat().st_size for p in r.path.glob("*.safetensors")) > limit_bytes
        return r.kind != "missing"
    except (OSError, ValueError):
        return True


def generate(
    pair: Pair,
    prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
    *,
    batch_size: int | None = None,
    max_new_tokens: int | Sequence[int] = 128,
    k: int | None = None,
    policy: str | None = None,
    drafter: Any = DEFAULT_DRAFTER,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    chat_template: bool = False,
    pad_verify: bool = False,
    costs: dict | None = None,
    remeasure_costs: bool = False,
) -> Generation | list[Generation]:
    """Continue `prompt` with speculative decoding on `pair`; or, given a list of prompts, continue each of
    them, `batch_size` at a time.

    Args:
        pair: from `load_pair`.
        prompt: text (encoded by the pair's tokenizer, its special tokens included) or token ids: returns one
            `Generation`. A list of texts (or of token-id lists): returns a list of `Generation`, one per
            prompt in prompt order, decoded B = `batch_size` at a time (`specdec.engine.decoding`: each row
            commits its own accepted length, so a greedy row equals the single-prompt greedy output; prompt i
            samples with seed ``seed + i``). Batches run the eager backends (not ``compile=True``).
        batch_size: rows per batch for a list of prompts (>= 1; None: all of them at once, at most 256 on
            llama.cpp); None or 1 for a single prompt.
        max_new_tokens: budget of new tokens (>= 0; never exceeded); for a list, one for all or one each.
        k, policy: `k` alone is a fixed K; neither gives the ``cost`` policy (K chosen per round from the
            measured costs and a running acceptance estimate) with K <= 64 (a list of prompts: <= 16, fewer
            for wide batches); a policy alone gets its default K. Policies: `specdec.catalogue.policies` (a
            list of prompts takes those with a batch form, ``fixed`` and ``cost``).
        drafter: a name of `specdec.catalogue.drafters` (``"draft"``, alias ``"model"``: the pair's draft
            model; ``"ngram"``: prompt lookup; ``"suffix"``: the suffix drafter; ...), or a
            `specdec.drafters.base.Drafter` object (one prompt only). On a pair whose draft has another
            tokenizer (preset ``qwen2.5-coder+smollm2``), ``"draft"`` drafts its text (``"xtok"``) at a fixed
            K = 4 unless told otherwise (the cost policy's measurement assumes one vocabulary).
        temperature, top_k, top_p: sampling (temperature 0 = greedy); seed: the sampler's seed (same seed,
            same tokens).
        chat_template: wrap a text prompt in the tokenizer's chat template (one user turn).
        pad_verify: pad each verification to the cheapest measured shape (one prompt at a time).
        costs: measured costs for the cost policy and the suffix drafter (``{"draft_step_s": s,
            "target_forward_s": {n: s}}``, e.g. from ``specdec costs --json``); None: a quick measurement of
            this setup on this machine, cached (`specdec.measure.cost_cache.cached_costs`).
        remeasure_costs: measure them again instead of reusing the cached measurement.

    Returns:
        A `Generation`, or a list of them for a list of prompts.

    Raises:
        ValueError: an empty prompt or list, a token id outside the vocabulary, a negative budget, K < 1,
            an unknown policy or drafter, a model drafter on a pair without a draft model, invalid sampling
            settings, the cost policy with a draft of another tokenizer, a batch size < 1 (or > 256 on
            llama.cpp), a policy without a batch form for a list, `batch_size` other than 1 with one
            prompt.
        TypeError: a drafter object with a list of prompts.
        specdec.runtimes.base.ContextOverflowError: prompt + budget exceed the target's context.
    """
    from specdec.entrypoints import generation as g

    many = _is_prompt_list(prompt)
    if not many and batch_size not in (None, 1):
        raise ValueError(f"batch_size {batch_size} needs a list of prompts; one prompt runs alone")
    if not isinstance(drafter, str) and many:
        raise TypeError("a list of prompts drafts with a drafter's name (one drafter object cannot serve "
                        "every row)")
    settings = g.check_settings(
        drafter=drafter if isinstance(drafter, str) else DRAFT_MODEL, policy=policy, k=k,
        max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        chat_template=chat_template, pad_verify=pad_verify, batch_size=batch_size, many=many, costs=costs,
        remeasure_costs=remeasure_costs, other_tokenizer=(pair.loaded.info or {}).get("vocab_overlap") is not None,
        backend=pair.backend)
    prompts = list(prompt) if many else [prompt]
    ids = g.encode_prompts(pair.loaded, prompts, chat_template=chat_template)
    run = g.run(pair, settings, ids, drafter_object=None if isinstance(drafter, str) else drafter)
    out = []
    for r in run.results:
        text = pair.loaded.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        out.append(Generation(**{f.name: getattr(r, f.name) for f in fields(GenerationResult)}, text=text,
                              k=run.k, policy=run.policy, drafter=run.drafter, dtype=pair.dtype,
                              temperature=settings.sampling.temperature))
    return out if many else out[0]


def _is_prompt_list(prompt) -> bool:
    """Whether `prompt` is a list of prompts (texts or token-id lists) rather than one prompt.

    Raises:
        ValueError: an empty list, or a list mixing token ids with texts or token-id lists.
    """
    if isinstance(prompt, str) or not isinstance(prompt, Sequence):
        return False
    if len(prompt) == 0:
        raise ValueError("no prompt: give a text, token ids, or a non-empty list of them")
    nested = [isinstance(p, Sequence) for p in prompt]  # a str is a Sequence too
    if any(nested) and not all(nested):
        raise ValueError("a prompt list holds texts or token-id lists, not single token ids among them")
    return all(nested)
