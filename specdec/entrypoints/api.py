"""The Python API: load a draft -> target pair, generate with speculative decoding.

    from specdec import load_pair, generate

    pair = load_pair("qwen2.5-coder")          # or load_pair(target="dir, .gguf or hub id", draft="...")
    out = generate(pair, "def fib(n):", max_new_tokens=64)
    print(out.text, out.acceptance_rate, out.block_efficiency, out.tokens_per_s)
    outs = generate(pair, ["def a():", "def b():", "x ="], batch_size=2)  # one Generation per prompt

`load_pair` returns a `Pair` (the loaded models and what they are); `generate` returns a `Generation` (a list
of them, in prompt order, for a list of prompts decoded `batch_size` at a time: `specdec.entrypoints.batch_generate`),
a `specdec.engine.metrics.GenerationResult` (new token ids, one `specdec.engine.metrics.RoundRecord` per target forward,
accepted/drafted counts, acceptance rate, block efficiency, tokens/s, TTFT) with the decoded text and the
settings that produced it. The work is done by the same code as the ``specdec generate`` command:
`specdec.runtimes.loading.load_pair`, `specdec.engine.decoding.speculative_generate` (Leviathan et al. 2023; Chen et al.
2023: greedy output equals target-only greedy decoding, sampled output follows the target's distribution),
the drafters of `specdec.drafters` and the K policies of `specdec.policies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from specdec.engine.metrics import GenerationResult
from specdec.runtimes.loading import LoadedPair

__all__ = ["Generation", "Pair", "generate", "load_pair"]


@dataclass
class Pair:
    """A loaded draft -> target pair (`load_pair`).

    Attributes:
        loaded: the models, tokenizer, shared vocabulary and EOS ids (`specdec.runtimes.loading.LoadedPair`).
        target, draft: the specs they were loaded from (draft None: target only, prompt lookup drafts).
        backend: the target's runtime. device: torch device. dtype: the target's weights' dtype
            (``"auto"`` resolved by `specdec.runtimes.precision.default_dtype`; None on llama.cpp).
        threads: intra-op threads (None: torch's default).
        cost_key: what identifies the setup's cost measurement (`specdec.measure.quick_costs.cached_quick_costs`).
    """

    loaded: LoadedPair
    target: str
    draft: str | None
    backend: str
    device: str
    dtype: str | None
    threads: int | None
    cost_key: dict = field(default_factory=dict, repr=False)

    @property
    def tokenizer(self):
        """The pair's (shared) tokenizer."""
        return self.loaded.tokenizer


@dataclass
class Generation(GenerationResult):
    """One speculative generation: a `specdec.engine.metrics.GenerationResult` plus its text and settings.

    Inherited: ``token_ids`` (new tokens only, EOS included when it ended the output), ``prompt_ids``,
    ``finish_reason`` (``"eos"``, ``"length"``, ``"empty"``), ``rounds`` (one `RoundRecord` per target
    forward: K, accepted, bonus/recovered, seconds), and the statistics ``num_drafted``, ``num_accepted``,
    ``acceptance_rate`` (accepted / drafted), ``block_efficiency`` (tokens per target forward),
    ``tokens_per_s``, ``ttft_s``, ``summary()``.

    Attributes:
        text: the new tokens decoded (special tokens skipped).
        k: the fixed K, or the largest K the policy may ask for. policy: ``fixed``, ``heuristic``,
            ``confidence`` or ``cost``. drafter: ``model`` or ``ngram`` (or the drafter object's name).
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
    compile: bool = False,
    trust_remote_code: bool = False,
) -> Pair:
    """Load a draft -> target pair: a preset by name, or target and draft specs.

    Args:
        pair: a preset (``specdec models`` lists them; None with no `target`: the default,
            ``qwen2.5-coder``, which works offline and is assembled and converted on first use).
        target, draft: hub ids, checkpoint directories or ``.gguf`` files instead of a preset; `draft`
            None with a `target`: target only (``generate(..., drafter="ngram")``).
        dtype: ``"auto"`` (default: bfloat16 on a CPU with native bf16 kernels, else float32;
            `specdec.runtimes.precision.default_dtype`), ``"float32"`` (exact everywhere), ``"bfloat16"``,
            ``"float16"``. Transformers only.
        device: ``"cpu"`` or ``"cuda"``. threads: intra-op CPU threads (None: torch's default).
        backend: the target's runtime, ``"transformers"`` or ``"llamacpp"`` (GGUF);
            draft_backend: the draft's (default: the same). draft_dtype: the draft's dtype (default: dtype).
        quant: ``"int8"`` weight-only linears (transformers eager). compile: compiled static-cache forwards.
        trust_remote_code: allow model code from the hub (off by default).

    Returns:
        A `Pair`.

    Raises:
        ValueError: unknown preset, dtype or runtime; bfloat16 on a CPU without bf16 kernels; a draft
            without a target. specdec.models.ModelNotAvailableError: weights not available (one line).
        specdec.runtimes.compat.IncompatibleTokenizersError: target and draft tokenize differently.
    """
    from specdec import models
    from specdec.measure.quick_costs import model_fingerprint
    from specdec.runtimes import loading
    from specdec.runtimes.precision import resolve_dtype

    if draft is not None and target is None:
        raise ValueError("a draft needs a target: load_pair(target=..., draft=...)")
    if target is not None and draft is None and pair is None:
        target_spec, draft_spec = target, None  # target only: prompt lookup drafts
    else:
        target_spec, draft_spec = models.resolve_pair(pair, target, draft)
    dtype = resolve_dtype(dtype, device)
    loaded = loading.load_pair(target_spec, draft_spec, backend=backend, draft_backend=draft_backend,
                               device=device, dtype=dtype, threads=threads, compile=compile,
                               trust_remote_code=trust_remote_code, quant=quant, draft_dtype=draft_dtype)
    cost_key = {"target": model_fingerprint(target_spec), "draft": model_fingerprint(draft_spec),
                "backend": backend, "draft_backend": draft_backend, "device": device, "dtype": dtype,
                "threads": threads, "compile": compile,
                **{n: v for n, v in (("quant", quant), ("draft_dtype", draft_dtype)) if v is not None}}
    return Pair(loaded, target_spec, draft_spec, backend, device, loaded.target.dtype, threads, cost_key)


def generate(
    pair: Pair,
    prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
    *,
    batch_size: int | None = None,
    max_new_tokens: int = 128,
    k: int | None = None,
    policy: str | None = None,
    drafter: Any = "model",
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    chat_template: bool = False,
    costs: dict | None = None,
    remeasure_costs: bool = False,
) -> Generation | list[Generation]:
    """Continue `prompt` with speculative decoding on `pair`; or, given a list of prompts, continue each of
    them, `batch_size` at a time.

    Args:
        pair: from `load_pair`.
        prompt: text (encoded by the pair's tokenizer, its special tokens included) or token ids: returns one
            `Generation`. A list of texts (or of token-id lists): returns a list of `Generation`, one per
            prompt in prompt order, decoded B = `batch_size` at a time (in order; the last batch may be
            smaller) by `specdec.entrypoints.batch_generate.run_batches` (`specdec.engine.batched.generate_batch`: each row
            commits its own accepted length, so a greedy row equals the single-prompt greedy output; prompt
            i samples with seed ``seed + i``). Batches run the eager backends (not ``compile=True``).
        batch_size: rows per batch for a list of prompts (>= 1; None: all of them at once, at most 256 on
            llama.cpp); None or 1 for a single prompt.
        max_new_tokens: budget of new tokens (>= 0; never exceeded).
        k, policy: as ``specdec generate``: `k` alone is a fixed K; neither gives the ``cost`` policy (K
            chosen per round from the measured costs and a running acceptance estimate) with K <= 16;
            ``policy`` is one of ``fixed``, ``heuristic``, ``confidence``, ``cost`` (`specdec.policies`).
            A list of prompts takes ``fixed`` (`specdec.policies.batch.FixedBatchK`) or ``cost``
            (`specdec.policies.batch.BatchCostPolicy`, K <= `k`, or by default the largest K with B x (K + 1) <= 128
            tokens, priced by `specdec.entrypoints.batch_generate.batch_costs`).
        drafter: ``"model"`` (the pair's draft model), ``"ngram"`` (prompt lookup, no draft model), or a
            `specdec.drafters.base.Drafter` object; a list of prompts takes ``"model"``, ``"ngram"`` or
            ``"suffix"`` (`specdec.drafters.suffix.SuffixDrafter`, one per row). A draft with another tokenizer (a pair
            loaded with ``other_tokenizer``, e.g. preset ``qwen2.5-coder+smollm2``) drafts text through
            `specdec.drafters.xtok.cross_tokenizer_drafter`, one prompt at a time, at fixed K = 4 unless told
            otherwise (not the cost policy, whose measurement assumes one vocabulary).
        temperature, top_k, top_p: sampling (temperature 0 = greedy); seed: the sampler's seed (same seed,
            same tokens).
        chat_template: wrap a text prompt in the tokenizer's chat template (one user turn).
        costs: for the ``cost`` policy: measured costs (``{"draft_step_s": s, "target_forward_s": {n: s}}``,
            e.g. from ``specdec costs --json``); None: a quick measurement of this setup on this machine,
            cached (`specdec.measure.quick_costs.cached_quick_costs`, seconds on first use).
        remeasure_costs: measure them again instead of reusing the cached measurement.

    Returns:
        A `Generation`, or a list of them for a list of prompts.

    Raises:
        ValueError: an empty prompt, negative budget, K < 1, an unknown policy or drafter, ``"model"``
            drafting on a pair loaded without a draft, invalid sampling settings, the cost policy with a
            draft of another tokenizer; for a list: a batch size < 1 (or > 256 on llama.cpp), a policy other
            than fixed and cost, a compiled pair, a draft of another tokenizer; `batch_size` other than 1
            with a single prompt.
        TypeError: a drafter object with a list of prompts.
        specdec.runtimes.base.ContextOverflowError: prompt + budget exceed the target's context.
    """
    from specdec.bench.prompts import encode_prompt
    from specdec.drafters.model import ModelDrafter
    from specdec.drafters.ngram import PromptLookupDrafter
    from specdec.engine.decoding import speculative_generate
    from specdec.engine.sampling import SamplingParams
    from specdec.measure.quick_costs import cached_quick_costs
    from specdec.policies import base as policies

    loaded = pair.loaded
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    # a draft with another tokenizer (e.g. preset qwen2.5-coder+smollm2) drafts text; its default is fixed K
    cross = drafter == "model" and loaded.info.get("vocab_overlap") is not None
    if _is_prompt_list(prompt):
        if cross:
            raise ValueError("a draft with another tokenizer drafts one prompt at a time; pass one prompt, or "
                             "drafter='ngram' / 'suffix' for a list")
        return _generate_list(pair, list(prompt), batch_size=batch_size, max_new_tokens=max_new_tokens, k=k,
                              policy=policy, drafter=drafter, sampling=sampling, seed=seed,
                              chat_template=chat_template, costs=costs, remeasure_costs=remeasure_costs)
    if batch_size not in (None, 1):
        raise ValueError(f"batch_size {batch_size} needs a list of prompts; one prompt runs alone")
    policy, k = _default_policy(policy or ("fixed" if cross else None), k)
    if cross and policy == "cost":
        raise ValueError("the cost policy's measurement assumes one vocabulary; with a draft of another "
                         "tokenizer use policy fixed, heuristic or confidence")
    if policy not in policies.POLICY_NAMES:
        raise ValueError(f"unknown policy {policy!r}; choose one of: {', '.join(policies.POLICY_NAMES)}")
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    if drafter == "model":
        if loaded.draft is None:
            raise ValueError("this pair has no draft model: load one, or use drafter='ngram'")
        if cross:
            from specdec.drafters.xtok import cross_tokenizer_drafter

            the_drafter = cross_tokenizer_drafter(loaded, sampling)
        else:
            the_drafter = ModelDrafter(loaded.draft.backend, loaded.vocab_size)
    elif drafter == "ngram":
        the_drafter = PromptLookupDrafter()
    elif isinstance(drafter, str):
        raise ValueError(f"unknown drafter {drafter!r}; choose 'model', 'ngram' or pass a Drafter")
    else:
        the_drafter = drafter
    drafter_name = drafter if isinstance(drafter, str) else getattr(drafter, "name", type(drafter).__name__)
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        prompt_ids = encode_prompt(loaded.tokenizer, prompt, chat_template=chat_template)
    else:
        prompt_ids = [int(t) for t in prompt]
    if policy == "cost":
        from specdec.engine.decoding import _check_inputs

        _check_inputs(prompt_ids, max_new_tokens, loaded.target.backend.max_length)  # before timing
        if costs is None:
            key = {**pair.cost_key, "draft": pair.cost_key.get("draft") if drafter == "model" else None}
            measured_on = pair.loaded if drafter == "model" else LoadedPair(loaded.target, None,
                                                                              loaded.vocab_size, loaded.eos_ids)
            costs, _ = cached_quick_costs(measured_on, key, max_n=k + 1, refresh=remeasure_costs)
        if drafter_name != "model":
            costs = {**costs, "draft_step_s": 0.0}  # prompt lookup drafts for free (no model step)
    the_policy = policies.make_policy(policy, k, costs=costs)
    result = speculative_generate(loaded.target.backend, the_drafter, prompt_ids, max_new_tokens,
                                  policy=the_policy, sampling=sampling, eos_ids=loaded.eos_ids,
                                  vocab_size=loaded.vocab_size, seed=seed)
    text = loaded.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return Generation(**{f.name: getattr(result, f.name) for f in fields(GenerationResult)}, text=text, k=k,
                      policy=policy, drafter=drafter_name, dtype=pair.dtype, temperature=temperature)


def _is_prompt_list(prompt) -> bool:
    """Whether `prompt` is a list of prompts (texts or token-id lists) rather than one prompt.

    Raises:
        ValueError: a list mixing token ids with texts or token-id lists.
    """
    if isinstance(prompt, str) or not isinstance(prompt, Sequence) or len(prompt) == 0:
        return False
    nested = [isinstance(p, Sequence) for p in prompt]  # a str is a Sequence too
    if any(nested) and not all(nested):
        raise ValueError("a prompt list holds texts or token-id lists, not single token ids among them")
    return all(nested)


def _generate_list(pair: Pair, prompts: list, *, batch_size: int | None, max_new_tokens: int, k, policy,
                   drafter, sampling, seed: int, chat_template: bool, costs, remeasure_costs: bool
                   ) -> list[Generation]:
    """`generate` for a list of prompts: `specdec.entrypoints.batch_generate.run_batches`, one `Generation` each."""
    from specdec.bench.prompts import encode_prompt
    from specdec.entrypoints.batch_generate import LLAMACPP_MAX_ROWS, run_batches

    loaded = pair.loaded
    if not isinstance(drafter, str):
        raise TypeError("a list of prompts drafts with 'model', 'ngram' or 'suffix' (one drafter object cannot "
                         "serve every row)")
    if any(m is not None and m.compiled for m in (loaded.target, loaded.draft)):
        raise ValueError("batched decoding runs the eager backend: load the pair without compile=True")
    ids = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p.strip():
                raise ValueError(f"prompt {i} is empty")
            ids.append(encode_prompt(loaded.tokenizer, p, chat_template=chat_template))
        else:
            ids.append([int(t) for t in p])
    if batch_size is None:
        batch_size = min(len(ids), LLAMACPP_MAX_ROWS) if pair.backend == "llamacpp" else len(ids)
    run = run_batches(loaded, ids, max_new_tokens, batch_size=batch_size, drafter=drafter, policy=policy, k=k,
                      sampling=sampling, seed=seed, cost_key=pair.cost_key, costs=costs,
                      refresh_costs=remeasure_costs)
    out = []
    for r in run.results:
        text = loaded.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        out.append(Generation(**{f.name: getattr(r, f.name) for f in fields(GenerationResult)}, text=text,
                              k=run.k, policy=run.policy, drafter=run.drafter, dtype=pair.dtype,
                              temperature=sampling.temperature))
    return out


def _default_policy(policy: str | None, k: int | None) -> tuple[str, int]:
    """``(policy, K)`` from the options: `k` alone is a fixed K; neither gives ``cost`` with K <= 16; a policy
    alone gets K = 4 (fixed, heuristic) or 16 (confidence, cost). The ``specdec generate`` defaults."""
    if policy is None:
        policy = "fixed" if k is not None else "cost"
    policy = str(policy).strip().lower()
    if k is None:
        k = 4 if policy in ("fixed", "heuristic") else 16
    return policy, int(k)
