"""The one assembler of a generation, for one prompt and for many: check the settings, price them, build the
drafter and the K policy from the catalogue, decode, and compare with target-only decoding when asked.

`check_settings` decides everything the arguments alone decide, before any model loads; every message names
the caller's own spelling (``--k`` on the command line, ``k`` in Python). `run` takes a loaded pair
(`specdec.entrypoints.api.Pair`) and prompts as token ids: one prompt runs through
`specdec.engine.decoding.speculative_generate`; a list runs B = ``batch_size`` rows at a time through
`specdec.engine.decoding.generate_batch`, every row committing its own accepted length (greedy rows equal
single-prompt greedy decoding; row i samples with seed ``seed + i``). The costs that price K and the suffix
drafter's draft length come from the one cost cache (`specdec.measure.cost_cache.cached_costs`).
"""

from __future__ import annotations

import math
import numbers
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specdec.catalogue import drafters as catalogue_drafters
from specdec.catalogue import policies as catalogue_policies
from specdec.core.metrics import GenerationResult
from specdec.core.sampling import SamplingParams
from specdec.policies.batch import batch_k_max

__all__ = ["FLAGS", "KEYWORDS", "LLAMACPP_MAX_ROWS", "Run", "Settings", "budgets_of",
           "check_settings", "encode_prompts", "first_differences", "replace_budgets", "run"]

#: llama.cpp serves at most this many sequences in one context (its ``LLAMA_MAX_SEQ``), so a batch on
#: llama.cpp has at most this many rows.
LLAMACPP_MAX_ROWS = 256

#: How each setting is spelled in messages: on the command line, and in Python.
FLAGS = {"drafter": "--drafter", "policy": "--policy", "k": "--k", "max_new_tokens": "--max-new-tokens",
         "batch_size": "--batch-size", "pad_verify": "--pad-verify", "other_tokenizer": "--other-tokenizer",
         "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed"}
KEYWORDS = {name: name for name in FLAGS}


@dataclass(frozen=True)
class Settings:
    """A generation's checked settings (`check_settings`).

    Attributes:
        drafter: a `specdec.catalogue.drafters` name. policy: a `specdec.catalogue.policies` name.
        k: the fixed K, the heuristic's start or the largest K; k_given: K as the caller gave it (None: the
            policy's default, which a batch's cost policy caps by its width, `batch_k_max`).
        max_new_tokens: one budget, or one per prompt. sampling, seed, chat_template: as given.
        pad_verify: pad verification to the cheapest measured shape. many: a list of prompts.
        batch_size: rows per batch (None: every prompt at once). costs: given costs (None: measured).
        remeasure_costs: measure again instead of reusing the cache.
    """

    drafter: str
    policy: str
    k: int
    k_given: int | None
    max_new_tokens: int | tuple[int, ...]
    sampling: SamplingParams
    seed: int = 0
    chat_template: bool = False
    pad_verify: bool = False
    many: bool = False
    batch_size: int | None = None
    costs: dict | None = None
    remeasure_costs: bool = False
    spelling: dict[str, str] = field(default_factory=lambda: dict(KEYWORDS), compare=False)


def check_settings(*, drafter: str = catalogue_drafters.DEFAULT_DRAFTER, policy: str | None = None,
                   k: int | None = None,
                   max_new_tokens: int | Sequence[int] = 128, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, seed: int = 0, chat_template: bool = False, pad_verify: bool = False,
                   batch_size: int | None = None, many: bool = False, costs: dict | None = None,
                   remeasure_costs: bool = False, other_tokenizer: bool = False, backend: str | None = None,
                   spelling: dict[str, str] = KEYWORDS) -> Settings:
    """Check a generation's settings before any model loads.

    A drafter that needs the draft model means, on a pair whose draft has another tokenizer
    (`other_tokenizer`), the cross-tokenizer drafter, whose default policy is fixed (the cost policy's
    measurement assumes one vocabulary).

    Raises:
        ValueError: one line naming the setting as `spelling` spells it: an unknown drafter or policy, a
            policy without a batch form for a list, K < 1, a negative budget, invalid sampling settings, a
            batch size < 1 or above llama.cpp's row limit, ``pad_verify`` or the cost policy with a draft of
            another tokenizer, ``pad_verify`` with a list, a seed that is not an integer.
    """
    s = spelling
    try:
        entry = catalogue_drafters.drafter(drafter)
    except ValueError:
        raise ValueError(f"unknown {s['drafter']} {drafter!r}; choose one of "
                         f"{', '.join(catalogue_drafters.drafter_names())}") from None
    if entry.needs_model and other_tokenizer:
        entry = next(e for e in catalogue_drafters.DRAFTERS.values() if e.needs_model and e.other_tokenizer)
    if entry.other_tokenizer and (pad_verify or (policy or "").strip().lower() == "cost"):
        raise ValueError(f"{s['other_tokenizer']}: a draft with another tokenizer takes neither {s['policy']} cost "
                         f"nor {s['pad_verify']} (their cost measurement assumes one vocabulary)")
    try:
        pol, k_used = catalogue_policies.resolve_policy(policy or ("fixed" if entry.other_tokenizer else None), k,
                                                        batch=many)
    except ValueError as exc:
        raise ValueError(str(exc).replace("policy ", f"{s['policy']} ", 1).replace("K must", f"{s['k']} must")) from None
    budgets = (int(max_new_tokens),) if isinstance(max_new_tokens, int) else tuple(int(n) for n in max_new_tokens)
    if not budgets or min(budgets) < 0:
        raise ValueError(f"{s['max_new_tokens']} must be >= 0, got {max_new_tokens!r}")
    if many and pad_verify:
        raise ValueError(f"{s['pad_verify']} runs one prompt at a time, not a batch")
    if batch_size is not None and int(batch_size) < 1:
        raise ValueError(f"{s['batch_size']} must be >= 1, got {batch_size}")
    if batch_size is not None and backend == "llamacpp" and int(batch_size) > LLAMACPP_MAX_ROWS:
        raise ValueError(f"{s['batch_size']} {batch_size}: llama.cpp runs at most {LLAMACPP_MAX_ROWS} rows at once")
    if batch_size is not None and entry.max_rows is not None and int(batch_size) > entry.max_rows:
        raise ValueError(f"{s['drafter']} {entry.name} drafts {entry.max_rows} prompt at a time: "
                         f"give {s['batch_size']} {entry.max_rows}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Real) or not math.isfinite(seed) or int(seed) != seed:
        raise ValueError(f"{s.get('seed', 'seed')} must be an integer, got {seed!r}")
    try:
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    except ValueError as exc:
        raise ValueError(re.sub(r"\b(temperature|top_k|top_p)\b", lambda m: s.get(m.group(1), m.group(1)),
                                str(exc))) from None
    return Settings(entry.name, pol.name, k_used, None if k is None else int(k),
                    budgets[0] if isinstance(max_new_tokens, int) else budgets, sampling, int(seed),
                    bool(chat_template), bool(pad_verify), bool(many),
                    None if batch_size is None else int(batch_size), costs, bool(remeasure_costs), dict(spelling))


def replace_budgets(settings: Settings, budgets: Sequence[int]) -> Settings:
    """`settings` with one new-token budget per prompt (a prompts file's own budgets).

    Raises:
        ValueError: a negative budget.
    """
    if min(budgets, default=0) < 0:
        raise ValueError(f"budgets must be >= 0, got {list(budgets)}")
    return replace(settings, max_new_tokens=tuple(int(b) for b in budgets))


def budgets_of(settings: Settings, n: int) -> list[int]:
    """The new-token budget of each of `n` prompts.

    Raises:
        ValueError: budgets given for another number of prompts.
    """
    return _budgets(settings.max_new_tokens, n)


def encode_prompts(loaded: Any, prompts: Sequence[str | Sequence[int]], *, chat_template: bool = False
                   ) -> list[list[int]]:
    """Token ids of each prompt: a text encoded by the pair's tokenizer (`specdec.prompts.encode_prompt`),
    token ids checked against the vocabulary.

    Raises:
        ValueError: an empty prompt, or a token id outside ``[0, vocab)`` (naming the prompt and the id).
    """
    from specdec.prompts import encode_prompt

    out = []
    for i, p in enumerate(prompts):
        where = f"prompt {i}" if len(prompts) > 1 else "the prompt"
        if isinstance(p, str):
            if not p.strip():
                raise ValueError(f"{where} is empty")
            out.append(encode_prompt(loaded.tokenizer, p, chat_template=chat_template))
            continue
        ids = []
        for t in p:
            if isinstance(t, bool) or int(t) != t or not 0 <= int(t) < loaded.vocab_size:
                raise ValueError(f"{where}: token id {t!r} is outside the vocabulary [0, {loaded.vocab_size})")
            ids.append(int(t))
        if not ids:
            raise ValueError(f"{where} is empty")
        out.append(ids)
    return out


@dataclass
class Run:
    """What `run` returns.

    Attributes:
        results: one `GenerationResult` per prompt, in prompt order (a batch's times from its start).
        drafter, policy, k: what ran (the catalogue's names; K fixed, or the largest K).
        batch_size: rows per batch (1 for one prompt). batch_of: the batch each prompt ran in.
        batches: one dict per batch: ``{"index", "rows", "tokens", "wall_s", "tokens_per_s"}``.
        baselines: target-only results of the same prompts (with ``baseline``), else None.
        divergences: per prompt, where a greedy output first differs from its target-only output, with the
            target's top-2 margin there (`specdec.engine.traces.divergence_with_margin`), or None.
        notes: one-line notes (where the costs came from).
        padded: verification was padded to the cheapest measured shape.
    """

    results: list[GenerationResult]
    drafter: str
    policy: str
    k: int
    batch_size: int = 1
    batch_of: list[int] = field(default_factory=list)
    batches: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[GenerationResult] | None = None
    divergences: list[dict | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    padded: bool = False

    @property
    def total_tokens(self) -> int:
        return sum(r.num_tokens for r in self.results)

    @property
    def wall_s(self) -> float:
        return sum(b["wall_s"] for b in self.batches)

    @property
    def tokens_per_s(self) -> float | None:
        """Aggregate tokens/s: every prompt's new tokens over the batches' summed wall time (None: nothing)."""
        return _rate(self.total_tokens, self.wall_s)


def _rate(tokens: float, seconds: float) -> float | None:
    return tokens / seconds if tokens and seconds > 0 and math.isfinite(seconds) else None


def run(pair: Any, settings: Settings, prompts: Sequence[Sequence[int]], *, drafter_object: Any = None,
        baseline: bool = False, progress: Callable[[str], None] | None = None) -> Run:
    """Decode `prompts` (token ids) on `pair` with `settings`.

    Args:
        pair: a `specdec.entrypoints.api.Pair`. settings: from `check_settings`.
        prompts: one or more token-id lists (``settings.many`` for a list).
        drafter_object: a `specdec.drafters.base.Drafter` instead of the catalogue's (one prompt only).
        baseline: also decode target-only (warmed up first for one prompt) and record where each greedy
            output first differs from it (`Run.divergences`).
        progress: gets one-line notes (cost measurement).

    Raises:
        ValueError: a drafter the pair cannot draft with, budgets not one per prompt, costs that cannot be
            measured. ContextOverflowError: a prompt plus its budget exceeds the target's context.
    """
    from specdec.engine.decoding import check_inputs

    loaded = pair.loaded
    entry = catalogue_drafters.for_pair(settings.drafter, loaded)
    entry.check_pair(loaded)
    if settings.many and any(m is not None and m.compiled for m in (loaded.target, loaded.draft)):
        raise ValueError("batched decoding runs the eager backend: load the pair without compile=True")
    budgets = budgets_of(settings, len(prompts))
    for i, (ids, n) in enumerate(zip(prompts, budgets, strict=True)):
        try:
            check_inputs(ids, n, loaded.target.backend.max_length)
        except ValueError as exc:
            raise type(exc)(f"prompt {i}: {exc}" if len(prompts) > 1 else str(exc)) from None
    if settings.many:
        return _run_batches(pair, settings, entry, prompts, budgets, baseline, progress)
    return _run_one(pair, settings, entry, list(prompts[0]), budgets[0], drafter_object, baseline, progress)


def _budgets(max_new_tokens, n: int) -> list[int]:
    if isinstance(max_new_tokens, int):
        return [int(max_new_tokens)] * n
    if len(max_new_tokens) == 1:
        return [int(max_new_tokens[0])] * n
    if len(max_new_tokens) != n:
        raise ValueError(f"got {len(max_new_tokens)} budgets for {n} prompts")
    return [int(b) for b in max_new_tokens]


def _costs(pair: Any, settings: Settings, *, timed_draft: bool, plan: str, max_n: int, rows: int = 1,
           progress: Callable[[str], None] | None = None) -> tuple[dict, str]:
    """The setup's costs by `plan` (`specdec.measure.cost_cache.cached_costs`), the draft model timed only when
    the drafter drafts with it (`timed_draft`); given costs as they are."""
    if settings.costs is not None:
        return settings.costs, "costs as given"
    from specdec.measure.cost_cache import cached_costs
    from specdec.runtimes.loading import LoadedPair

    loaded = pair.loaded
    on = loaded if timed_draft else LoadedPair(loaded.target, None, loaded.vocab_size, loaded.eos_ids)
    key = {**pair.cost_key, "draft": pair.cost_key.get("draft") if timed_draft else None}
    try:
        return cached_costs(on, key, plan=plan, max_n=max_n, rows=rows, refresh=settings.remeasure_costs,
                            progress=progress)
    except ValueError as exc:
        if settings.pad_verify:
            raise ValueError(f"{settings.spelling['pad_verify']} needs the target's measured cost curve and none "
                             f"can be measured: {exc}") from None
        raise ValueError(f"the costs that price K cannot be measured on these models: {exc}; give a fixed K") from None


def _run_one(pair, settings: Settings, entry, prompt: list[int], budget: int, drafter_object, baseline: bool,
             progress) -> Run:
    from specdec.core.costs import CostCurve
    from specdec.engine.decoding import autoregressive_generate, speculative_generate

    loaded = pair.loaded
    pol = catalogue_policies.policy(settings.policy)
    free = entry.free if drafter_object is None else bool(getattr(drafter_object, "free", False))
    curve, notes = None, []
    if pol.needs_costs or settings.pad_verify or entry.priced:
        plan = "curve" if settings.pad_verify else "quick"
        max_n = max(settings.k + 1, 17) if settings.pad_verify else settings.k + 1
        costs, note = _costs(pair, settings, timed_draft=not free and not entry.other_tokenizer, plan=plan,
                             max_n=max_n, progress=progress)
        curve = CostCurve.from_costs(costs)
        notes.append(note)
    source = catalogue_drafters.DraftSource(loaded, settings.sampling, curve, budget=max(1, budget))
    drafter = drafter_object if drafter_object is not None else entry.row(source)
    name = entry.name if drafter_object is None else getattr(drafter_object, "name", type(drafter_object).__name__)
    policy = catalogue_policies.make_policy(settings.policy, settings.k, costs=curve, pad_verify=settings.pad_verify,
                                            free_drafts=free or entry.priced)
    pad_to = curve.padded_n if settings.pad_verify else None
    common = {"sampling": settings.sampling, "eos_ids": loaded.eos_ids, "vocab_size": loaded.vocab_size,
              "seed": settings.seed, "pad_to": pad_to}
    target = loaded.target.backend
    if baseline:  # warm both paths up once so that neither timed run pays first-call costs
        warm = min(8, budget)
        speculative_generate(target, drafter, prompt, warm, policy=policy, **common)
        autoregressive_generate(target, prompt, warm, **common)
    t0 = time.perf_counter()
    result = speculative_generate(target, drafter, prompt, budget, policy=policy, **common)
    wall = time.perf_counter() - t0
    out = Run([result], name, settings.policy, settings.k, 1, [0],
              [{"index": 0, "rows": 1, "tokens": result.num_tokens, "wall_s": wall,
                "tokens_per_s": _rate(result.num_tokens, wall)}], notes=notes, padded=settings.pad_verify)
    if baseline:
        # with padding the baseline pads its 1-token steps by the same curve: where a 2-token forward is
        # cheaper (bf16 on some CPUs), plain target-only would be an unfairly slow baseline
        out.baselines = [autoregressive_generate(target, prompt, budget, **common)]
        out.divergences = first_differences(pair, settings, [prompt], out.results, out.baselines)
    return out


def first_differences(pair, settings: Settings, prompts, results, baselines) -> list[dict | None]:
    """Per prompt, where greedy output first differs from target-only output, with the target's top-2 margin
    (single-sequence reference); None where they agree or the run sampled."""
    from specdec.engine.traces import divergence_with_margin, next_token_logits

    loaded = pair.loaded
    out: list[dict | None] = []
    for ids, r, b in zip(prompts, results, baselines, strict=True):
        if not settings.sampling.greedy or r.token_ids == b.token_ids:
            out.append(None)
            continue
        out.append(divergence_with_margin(b.token_ids, r.token_ids,
                                    lambda seq: next_token_logits(loaded.target.backend, seq)[: loaded.vocab_size],
                                    prompt=ids))
    return out


def _run_batches(pair, settings: Settings, entry, prompts, budgets: list[int], baseline: bool, progress) -> Run:
    from specdec.core.costs import CostCurve
    from specdec.engine.decoding import generate_batch
    from specdec.runtimes.batched_loading import batched_backend

    loaded = pair.loaded
    rows = min(settings.batch_size or len(prompts), len(prompts))
    if pair.backend == "llamacpp" and rows > LLAMACPP_MAX_ROWS:
        rows = LLAMACPP_MAX_ROWS  # every prompt at once, in as few batches as llama.cpp serves
    pol = catalogue_policies.policy(settings.policy)
    k = settings.k
    if pol.needs_costs and settings.k_given is None:
        k = batch_k_max(rows, min(m.backend.max_length for m in (loaded.target, loaded.draft if entry.needs_model
                                                                  else None) if m))
    curve, notes = None, []
    if pol.needs_costs or entry.priced:
        costs, note = _costs(pair, settings, timed_draft=entry.needs_model, plan="batch", max_n=rows * (k + 1),
                             rows=rows, progress=progress)
        curve = CostCurve.from_costs(costs)
        notes.append(note)
    row_tokens = max(len(p) + n for p, n in zip(prompts, budgets, strict=True)) + k + 1
    target = batched_backend(loaded.target, rows, row_tokens=row_tokens)
    source = catalogue_drafters.DraftSource(loaded, settings.sampling, curve, rows=rows, row_tokens=row_tokens,
                                            budget=max(1, max(budgets)))
    drafter = catalogue_drafters.batched_drafter(entry.name, source)
    draft_cost = (lambda b, kk: kk * curve.draft_forward(b)) if entry.needs_model and curve is not None else None
    policy = catalogue_policies.batch_policy(settings.policy, k, curve=curve, draft_cost=draft_cost)
    out = Run([], entry.name, settings.policy, k, rows, notes=notes)
    base_results: list[GenerationResult] = []
    for start in range(0, len(prompts), rows):
        idx = list(range(start, min(start + rows, len(prompts))))
        kw = {"sampling": settings.sampling, "eos_ids": loaded.eos_ids, "vocab_size": loaded.vocab_size,
              "seed": [settings.seed + i for i in idx]}
        t0 = time.perf_counter()
        res = generate_batch(target, [prompts[i] for i in idx], [budgets[i] for i in idx], drafter=drafter,
                             policy=policy, **kw)
        wall = time.perf_counter() - t0
        out.results.extend(res)
        out.batch_of.extend([len(out.batches)] * len(idx))
        tokens = sum(r.num_tokens for r in res)
        out.batches.append({"index": len(out.batches), "rows": len(idx), "tokens": tokens, "wall_s": wall,
                            "tokens_per_s": _rate(tokens, wall)})
        if baseline:
            base_results.extend(generate_batch(target, [prompts[i] for i in idx], [budgets[i] for i in idx], **kw))
    if baseline:
        out.baselines = base_results
        out.divergences = first_differences(pair, settings, prompts, out.results, base_results)
    return out


