"""One runtime configuration of a sweep, loaded: its models, the prompts that fit them, its measured costs.

`load_config` loads the models once (a self-draft loads the target twice), `fitting` keeps the prompts whose
tokens plus the new-token budget fit both models' contexts, `measure_config_costs` times (or reuses) the
configuration's cost curve, `free` drops the models before the next configuration loads. `measure_here`
does the same loading and timing for ``specdec sweep --dry-run --measure-costs`` without a store.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from specdec.bench.config import RuntimeConfig, SweepConfig
from specdec.bench.estimate import estimate_plan_s, format_duration
from specdec.bench.methods import METHODS
from specdec.bench.plan import PlannedRun, Prepared, cost_max_n
from specdec.bench.requests import Runtime
from specdec.core.costs import DRAFT_PREFILL_NS, CostCurve
from specdec.measure.timing import SWEEP_DRAFT_MAX_N, cross_tokenizer_draft_costs, measure_costs
from specdec.prompts import Prompt, encode_prompt

if TYPE_CHECKING:
    from specdec.bench.state import SweepState

__all__ = [
    "LoadedConfig",
    "PlanDoesNotFitError",
    "announce",
    "fitting",
    "free",
    "free_models",
    "load_config",
    "load_xtok",
    "measure_config_costs",
    "measure_here",
]


class PlanDoesNotFitError(ValueError):
    """Prompts whose tokens plus the new-token budget exceed a model's context: refused before any run, in
    one line naming them, unless the sweep skips them (``--skip-long-prompts``)."""


@dataclass
class LoadedConfig:
    """One runtime configuration, loaded: its models, its measured costs and the prompts' token ids.

    Attributes:
        cfg: the sweep's settings. rc: the runtime configuration. pair: the loaded models
            (`specdec.runtimes.loading.LoadedPair`; anything with a ``tokenizer`` for a skipped method).
        costs: the stored costs dict (`Store.load_costs`), None before they are measured.
        threads: intra-op threads the runs use (recorded per run).
        prompt_costs: prompt id -> the cost curve of its calibration block (timed at its own context).
        baseline_ids: prompt id -> our stored baseline's token ids (None: none yet), for the equality check.
        best_ks: (prompt id, method) -> (K, predicted decode speedup) of policy ``best``
            (`specdec.bench.probes.best_k`).
        xtok: the target with the sweep's cross-tokenizer draft (``--xtok-draft``; `load_xtok`), a
            `specdec.runtimes.loading.LoadedPair` in ``load_pair(..., other_tokenizer=True)``'s shape, or None.
        xtok_costs: that draft's step time and c, timed on its own token ids
            (`specdec.measure.timing.cross_tokenizer_draft_costs`), or None before they are measured.
        outputs: prompt id -> its first target-only output (target ids) stored so far: the corpus of the
            OTHER prompts' runs of a corpus-drafting method (`Runtime.corpus`).
        batch: what its batched runs share (`specdec.bench.batch_runs.BatchState`), None without them.
    """

    cfg: SweepConfig
    rc: RuntimeConfig
    pair: Any
    costs: dict | None = None
    threads: int = 1
    prompt_costs: dict[str, CostCurve] = field(default_factory=dict)
    baseline_ids: dict[str, list[int] | None] = field(default_factory=dict)
    best_ks: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    xtok: Any = None
    xtok_costs: dict | None = None
    outputs: dict[str, list[int]] = field(default_factory=dict)
    batch: Any = None
    _ids: dict[str, list[int]] = field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return self.rc.label

    def runtime(self, prompt_id: str | None = None, method: str | None = None) -> Runtime:
        """What `method` runs on: the pair, the sampling settings, the measured costs (the prompt's own
        calibration block once it has one, else the configuration's), n-gram sizes.

        A cross-tokenizer method (`Method.cross_tokenizer`) gets `xtok` as its pair and the costs with its
        draft's own step time (None while that is not measured); a corpus-drafting method
        (`Method.uses_corpus`) gets the stored target-only outputs of every prompt but `prompt_id`.

        Raises:
            ValueError: a cross-tokenizer method without a loaded cross-tokenizer draft.
        """
        costs = self.prompt_costs.get(prompt_id) if prompt_id is not None else None
        if costs is None:
            costs = CostCurve.from_costs(self.costs) if self.costs else None
        m = METHODS.get(method) if method is not None else None
        pair, corpus = self.pair, ()
        if m is not None and m.cross_tokenizer:
            if self.xtok is None:
                raise ValueError(f"method {method} needs a draft with another tokenizer (--xtok-draft)")
            pair = self.xtok
            step = (self.xtok_costs or {}).get("draft_step_s")
            costs = costs.with_draft_step(step) if costs is not None and step else None
        if m is not None and m.uses_corpus:
            corpus = tuple(tuple(ids) for pid, ids in self.outputs.items() if pid != prompt_id and ids)
        return Runtime(pair, self.cfg.sampling, costs, self.cfg.ngram_max, self.cfg.ngram_min,
                       ignore_eos=not self.cfg.sampling.greedy, pad_verify=self.rc.pad_verify, corpus=corpus)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """`prompt`'s token ids on this configuration's tokenizer (encoded once)."""
        if prompt.id not in self._ids:
            self._ids[prompt.id] = encode_prompt(self.pair.tokenizer, prompt.text,
                                                 chat_template=self.cfg.chat_template)
        return self._ids[prompt.id]


def free(pair) -> None:
    """Drop a loaded pair's models (and llama.cpp contexts) so the next configuration fits in memory."""
    if pair is None:
        return
    free_models(pair.target, pair.draft)


def free_models(*models) -> None:
    """Close the backends of `models` (`specdec.runtimes.loading.LoadedModel`, None skipped: llama.cpp frees its
    context) and collect, so the next configuration fits in memory."""
    for m in models:
        if m is None:
            continue
        close = getattr(m.backend, "close", None)  # llama.cpp frees its context; transformers has none
        if callable(close):
            with contextlib.suppress(Exception):
                close()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


#: A compiled configuration's static cache is sized to the sweep in steps of this many tokens.
CACHE_STEP = 256


def compiled_max_length(cfg: SweepConfig, p: Prepared) -> int | None:
    """The static-cache context of a compiled configuration in this sweep: room for the longest prompt (in
    target tokens) + ``max_new_tokens`` + the largest forward the cost curve times, and for the cost
    measurement's context + its largest forward (the draft's prefill-sized ones included), rounded up to
    `CACHE_STEP`; None (the backend's default) when that exceeds `specdec.runtimes.compiled.DEFAULT_MAX_LENGTH`
    (the sweep then skips or refuses the long prompts as before). Why: a compiled step attends over every slot of its cache, masked, where llama.cpp attends
    over the filled cells only; a cache of the workload's size is what a user of a static cache would set."""
    from specdec import models
    from specdec.runtimes.compiled import DEFAULT_MAX_LENGTH

    tok = models.hf_tokenizer(p.target)
    longest = max((len(encode_prompt(tok, q.text, chat_template=cfg.chat_template)) for q in p.prompts), default=0)
    widest = cost_max_n(cfg)
    need = max(longest + cfg.max_new_tokens + widest, cfg.cost_context_tokens + max(widest, *DRAFT_PREFILL_NS))
    length = -(-need // CACHE_STEP) * CACHE_STEP
    return length if length <= DEFAULT_MAX_LENGTH else None


def _load_pair(cfg: SweepConfig, rc: RuntimeConfig, p: Prepared, loader):
    """The configuration's models, loaded as every timed run sees them (a self-draft loads the target twice);
    a compiled configuration's static caches sized by `compiled_max_length`."""
    draft = p.target if rc.self_draft_quant is not None else p.draft
    kw = rc.load_kwargs(cfg.dtype)
    if rc.compile and (max_length := compiled_max_length(cfg, p)) is not None:
        kw["max_length"] = max_length
    return loader(p.target, draft, backend=rc.target_backend, draft_backend=rc.draft_backend,
                  device=cfg.device, threads=cfg.threads, compile=rc.compile, **kw)


def _sweep_costs(cfg: SweepConfig, pair) -> dict[str, Any]:
    """`measure_costs` with the sweep's settings (target forwards of 1 .. `cost_max_n` tokens and, with a
    draft model, draft forwards of 1 .. `SWEEP_DRAFT_MAX_N` and of `specdec.core.costs.DRAFT_PREFILL_NS` tokens,
    the deferred prefill's size; seconds)."""
    return measure_costs(pair, max_n=cost_max_n(cfg), repeats=cfg.cost_repeats,
                         context_tokens=cfg.cost_context_tokens, draft_max_n=SWEEP_DRAFT_MAX_N,
                         draft_extra_ns=DRAFT_PREFILL_NS)


def load_xtok(cfg: SweepConfig, rc: RuntimeConfig, pair) -> Any:
    """The sweep's cross-tokenizer draft (``cfg.xtok_draft``) loaded beside the loaded `pair`, on the draft's
    backend with the draft's dtype, compiled as a draft is: a `specdec.runtimes.loading.LoadedPair` of the same target
    (not loaded again) in ``load_pair(..., other_tokenizer=True)``'s shape. It stops on the pair's EOS ids
    (target ids), the stop set of the target-only runs it is compared with.

    Raises:
        What `specdec.runtimes.loading.load_model` raises (an unavailable model: one line).
    """
    from specdec.runtimes.compat import check_vocab_fits, real_vocab_size, vocab_overlap
    from specdec.runtimes.loading import LoadedPair, draft_compile_args, load_model

    kw = rc.load_kwargs(cfg.dtype)
    compile_args = draft_compile_args(rc.compile_mode or "onednn") if rc.compile else {}
    draft = load_model(cfg.xtok_draft, runtime=rc.draft_backend, device=cfg.device, dtype=kw["dtype"],
                       threads=cfg.threads, compile=rc.compile, quant=kw.get("quant"), **compile_args)
    check_vocab_fits(real_vocab_size(draft.tokenizer), draft=draft.backend)
    return LoadedPair(pair.target, draft, pair.vocab_size, pair.eos_ids,
                      {"vocab_overlap": vocab_overlap(pair.target.tokenizer, draft.tokenizer).summary()})


def load_config(rc: RuntimeConfig, s: SweepState) -> LoadedConfig:
    """Load configuration `rc`'s models once, and the cross-tokenizer draft when a method of the sweep
    drafts with it (raises what the loader raises)."""
    cfg, p = s.cfg, s.prepared
    s.log(f"[{rc.label}] loading target {p.target} ({rc.target_backend}) and draft "
          f"{p.target + ' quantized ' + rc.self_draft_quant if rc.self_draft_quant else p.draft} "
          f"({rc.draft_backend}){' compiled' if rc.compile else ''} ...")
    t0 = time.perf_counter()
    pair = _load_pair(cfg, rc, p, s.loader)
    loaded = LoadedConfig(cfg, rc, pair, threads=int(cfg.threads or torch.get_num_threads()))
    if cfg.xtok_draft is not None and any(METHODS[m].cross_tokenizer for m in cfg.methods):
        s.log(f"[{rc.label}] loading the cross-tokenizer draft {cfg.xtok_draft} ({rc.draft_backend}) ...")
        try:
            loaded.xtok = load_xtok(cfg, rc, pair)
        except BaseException:
            free(pair)
            raise
        o = loaded.xtok.info["vocab_overlap"]
        s.log(f"[{rc.label}] cross-tokenizer draft: {o['shared']} tokens spelled alike in both vocabularies "
              f"({o['fraction_of_target']:.0%} of the target's {o['target_size']}, {o['fraction_of_draft']:.0%} of "
              f"the draft's {o['draft_size']})")
    compile_s = sum(m.compile_s for m in (pair.target, pair.draft) if m is not None)
    s.log(f"[{rc.label}] loaded in {time.perf_counter() - t0:.1f} s"
          + (f" (of which {compile_s:.1f} s compiling, before any timing)" if rc.compile else ""))
    return loaded


def measure_config_costs(loaded: LoadedConfig, s: SweepState) -> None:
    """Measure (or reuse the stored) costs of the configuration: c and the target's forward-time curve for
    n = 1 .. `cost_max_n` tokens; set ``loaded.costs``."""
    cfg, rc, sid = loaded.cfg, loaded.rc, s.sweep_id
    costs = s.store.load_costs(sid, rc.label)
    max_n = cost_max_n(cfg)
    if costs is None or max(costs["target_forward_s"]) < max_n:
        t0 = time.perf_counter()
        s.store.save_costs(sid, rc.label, _sweep_costs(cfg, loaded.pair))
        costs = s.store.load_costs(sid, rc.label)
        s.log(f"[{rc.label}] costs measured in {time.perf_counter() - t0:.1f} s")
    loaded.costs = costs
    if loaded.xtok is not None:
        try:
            x = cross_tokenizer_draft_costs(loaded.xtok.draft, costs["target_step_s"], repeats=cfg.cost_repeats,
                                            context_tokens=cfg.cost_context_tokens)
        except Exception as exc:  # noqa: BLE001 - xtok then runs without costs (its cost policy fails alone)
            s.log(f"[{rc.label}] cross-tokenizer draft step not timed: {exc}")
        else:
            loaded.xtok_costs = x
            s.log(f"[{rc.label}] cross-tokenizer draft {cfg.xtok_draft}: step {x['draft_step_s'] * 1e3:.1f} ms on "
                  f"its own tokens, c = {x['c']:.3f}")
    curve = CostCurve.from_costs(costs)
    c_txt = f"{curve.c:.3f}" if curve.c is not None else "n/a"
    d_txt = f"{curve.draft_step_s * 1e3:.1f} ms" if curve.draft_step_s is not None else "n/a"
    s.log(f"[{rc.label}] target step {curve.target_step_s * 1e3:.1f} ms, draft step {d_txt}, c = {c_txt}, "
          f"v({max_n}) = {curve.v(max_n):.2f} target steps")


def measure_here(cfg: SweepConfig, rc: RuntimeConfig, prepared: Prepared, *, loader=None,
                 echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Load one configuration's models as the sweep would, time its costs on this machine with the sweep's
    own settings (`measure_costs`: target forwards of 1 .. `cost_max_n` tokens, the draft step; seconds),
    free the models and return the costs (nothing is stored). Used by ``specdec sweep --dry-run
    --measure-costs`` to price a plan on the machine that will run it.

    Args:
        cfg: the sweep. rc: one of its runtime configurations. prepared: `specdec.bench.sweep.prepare` of
            `cfg` (model specs). loader: `specdec.runtimes.loading.load_pair`-compatible (tests). echo: progress lines.

    Raises:
        Whatever loading raises for an unknown or unavailable model (one line at the CLI).
    """
    if loader is None:
        from specdec.runtimes.loading import load_pair as loader
    echo(f"[{rc.label}] loading {prepared.target} and its draft to time this machine's costs ...")
    t0 = time.perf_counter()
    pair = _load_pair(cfg, rc, prepared, loader)
    try:
        costs = _sweep_costs(cfg, pair)
    finally:
        free(pair)
    d = costs["draft_step_s"]
    echo(f"[{rc.label}] target step {costs['target_step_s'] * 1e3:.1f} ms"
         + (f", draft step {d * 1e3:.1f} ms" if d is not None else "")
         + f" (load and measure {time.perf_counter() - t0:.0f} s)")
    return costs


def announce(loaded: LoadedConfig, cells: list[PlannedRun], log: Callable[[str], None]) -> None:
    """Log the configuration's rough duration (from its measured costs and an assumed acceptance)."""
    counts = {}
    for p in {p.id: p for c in cells for p in c.rows or (c.prompt,)}.values():
        with contextlib.suppress(Exception):
            counts[p.id] = len(loaded.prompt_ids(p))
    cfg, label = loaded.cfg, loaded.rc.label
    timed, warm = estimate_plan_s(cells, {label: CostCurve.from_costs(loaded.costs)},
                                  max_new_tokens=cfg.max_new_tokens, warmup_tokens=cfg.warmup_tokens,
                                  prompt_tokens=counts)
    log(f"[{label}] {len(cells)} generations + {len({c.group for c in cells})} warm-ups: rough estimate "
        f"{format_duration(timed + warm)} (from the measured step times and an ASSUMED acceptance "
        f"alpha = 0.5; not a measurement)")


def fitting(loaded: LoadedConfig, cells: list[PlannedRun], s: SweepState) -> list[PlannedRun]:
    """The cells whose prompt (every row's, for a batched run) + `max_new_tokens` fits the target's and (for
    drafting methods) the draft's context; the others are skipped with one line when the sweep says so, else
    refused.

    Raises:
        PlanDoesNotFitError: a prompt does not fit and ``skip_long_prompts`` is off.
    """
    budget = loaded.cfg.max_new_tokens
    limits = {"target": loaded.pair.target.backend.max_length}
    if loaded.pair.draft is not None:
        limits["draft"] = loaded.pair.draft.backend.max_length
    if loaded.xtok is not None:  # counted in target tokens: a rough bound for the draft's own tokens
        limits["cross-tokenizer draft"] = loaded.xtok.draft.backend.max_length
    too_long: dict[str, str] = {}
    for prompt in {p.id: p for c in cells for p in c.rows or (c.prompt,)}.values():
        n = len(loaded.prompt_ids(prompt))
        over = [f"the {role}'s context of {ctx}" for role, ctx in limits.items() if n + budget > ctx]
        if over:
            too_long[prompt.id] = f"{prompt.id} ({n} tokens; over {' and '.join(over)})"
    if not too_long:
        return cells
    names = ", ".join(too_long.values())
    if not loaded.cfg.skip_long_prompts:
        raise PlanDoesNotFitError(
            f"[{loaded.rc.label}] {len(too_long)} prompt(s) + {budget} new tokens do not fit: {names}; "
            "skip them with --skip-long-prompts, or lower --max-new-tokens")
    kept = [c for c in cells if not any(p.id in too_long for p in c.rows or (c.prompt,))]
    s.log(f"[{loaded.rc.label}] skipping {len(cells) - len(kept)} runs of {len(too_long)} prompt(s) that do "
          f"not fit with {budget} new tokens: {names}")
    s.result.skipped += len(cells) - len(kept)
    s.advance(len(cells) - len(kept))
    return kept
