"""The timed methods, one registry entry each, behind one contract: ``run(runtime, request) -> RunRecord``.

As Spec-Bench gives every method one forward function, every method the sweep times (ours and the library
peers) is a `Method` in `METHODS`: its name (stored in ``runs.method``), its run function, and the facts the
planner, the runner and the estimate need (does it take K, does it draft with the draft model, where does it
apply, is it recorded as skipped). Nothing else in the bench half dispatches on a method's name. Which of ours
each peer is compared with is `specdec.catalogue.peers.PEER_PAIRS` (the report reads it without importing the bench).

Every drafter of the catalogue (`specdec.catalogue.drafters`) is one speculative method of the same name:
adding a drafter there makes ``--methods ...,NAME`` plan it over the K grid and the policies, and the runner
time it. A method with a batched form (`Method.batch`: target-only, the A/A run, and every drafter of one
target tokenizer whose rows draft on their own) also runs in batches of B > 1 prompts,
``batch(batch_runtime, batch_request) -> [RunRecord per row]`` through `specdec.engine.decoding.generate_batch`.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specdec.bench import native_peers
from specdec.bench.peers import hf_peer_generate
from specdec.bench.requests import BatchRequest, BatchRuntime, RunRecord, RunRequest, Runtime
from specdec.catalogue import drafters as catalogue_drafters
from specdec.catalogue import policies as catalogue_policies
from specdec.engine.decoding import autoregressive_generate, speculative_generate

if TYPE_CHECKING:
    from specdec.catalogue.runtimes import RuntimeConfig

__all__ = [
    "LLAMA_PROMPT_LOOKUP_SKIP",
    "METHODS",
    "Method",
    "our_methods",
    "peer_methods",
    "peers_for",
    "reference_method",
    "register",
    "speculative",
    "speculative_batch",
]

LLAMA_PROMPT_LOOKUP_SKIP = (
    "skipped: llama-cpp-python 0.3.36's Llama class, which LlamaPromptLookupDecoding needs, cannot set "
    "n_outputs_max_per_seq (so a batch returns logits for one position only) nor turn off the AMX weight "
    "repack that segfaults on some CPUs (see specdec/runtimes/llamacpp.py)"
)


@dataclass(frozen=True)
class Method:
    """One timed method.

    Attributes:
        name: stored in ``runs.method``; the name on the command line (``--methods``).
        run: ``run(runtime, request) -> RunRecord``; raises on failure (the runner records the error).
        peer: a library's implementation measured next to ours (planned on primary prompts with ``--peers``).
        takes_k: K is a parameter: ours run over the K grid and the adaptive policies, peers at ``peer_ks``.
        drafts_with_model: each drafted token costs a draft-model step (duration estimate, cost policy).
        reference: the target-only baseline every speedup divides by (exactly one method).
        applies: which runtime configurations the method can run on.
        skip: planned but recorded as skipped with this reason (``runs.error``), never run; or a function of
            the sweep's settings (`specdec.bench.config.SweepConfig`, or None where they are not at hand)
            giving that reason when the method cannot run here (None: it runs), asked at each run
            (`skip_reason`).
        default: planned when ``--methods`` is not given.
        aa: a target-only run timed as if it were a method (A/A): its paired ratio to the neighbouring
            baselines measures the noise floor of every speedup.
        cross_tokenizer: drafts with the sweep's cross-tokenizer draft (``--xtok-draft``) instead of the
            pair's draft: the runner hands it a `Runtime` holding that draft; no acceptance trace of it is
            recorded, so policy ``best`` is not planned for it (it runs at ``--xtok-ks``).
        uses_corpus: its drafter matches the target-only outputs of the sweep's other prompts
            (`Runtime.corpus`).
        replay_as: the drafter whose trace replay chooses this method's K under policy ``best``
            (`specdec.catalogue.drafters.DRAFTERS`); None: the method's own name.
        batch: ``batch(batch_runtime, batch_request) -> [RunRecord per row]``: its batched form (planned at
            B > 1), or None.
        runtime_record: what the method's own runtime says of itself (a peer's build), merged into the runtime
            record of each configuration where it is planned and not skipped (``roofline.runtime_json``), or
            None.
    """

    name: str
    run: Callable[[Runtime, RunRequest], RunRecord]
    peer: bool = False
    takes_k: bool = False
    drafts_with_model: bool = False
    reference: bool = False
    applies: Callable[[RuntimeConfig], bool] = lambda rc: True
    skip: str | Callable[[Any], str | None] | None = None
    default: bool = True
    aa: bool = False
    cross_tokenizer: bool = False
    uses_corpus: bool = False
    replay_as: str | None = None
    batch: Callable[[BatchRuntime, BatchRequest], list[RunRecord]] | None = None
    runtime_record: Callable[[], dict[str, Any]] | None = None

    def skip_reason(self, cfg: Any = None) -> str | None:
        """Why this method is recorded as skipped instead of run (`skip`) in a sweep of settings `cfg`, or
        None when it runs."""
        return self.skip(cfg) if callable(self.skip) else self.skip


def _drafter_method(e: catalogue_drafters.DrafterEntry) -> Method:
    """The speculative method of catalogue drafter `e` (same name)."""
    return Method(e.name, speculative(e.name), takes_k=True, drafts_with_model=e.needs_model, default=e.in_sweep,
                  cross_tokenizer=e.other_tokenizer, uses_corpus=e.uses_corpus, replay_as=e.replay_as,
                  batch=speculative_batch(e.name) if _batched(e) else None)


class _Methods(MutableMapping[str, Method]):
    """Every timed method by name, in plan order: target-only and its variants (`register`ed), then one
    speculative method per drafter of the catalogue (`specdec.catalogue.drafters.DRAFTERS`, read on each
    access, so a drafter registered there is a method here), then the peers (`register`ed).

    Setting a name replaces that method in place (a test double for one run); deleting a name drops the
    replacement or the registered method (a catalogue drafter stays while the catalogue names it)."""

    def __init__(self) -> None:
        self._own: dict[str, Method] = {}
        self._drafters: dict[str, tuple[catalogue_drafters.DrafterEntry, Method]] = {}
        self._replaced: dict[str, Method] = {}

    def __setitem__(self, name: str, method: Method) -> None:
        if name in catalogue_drafters.DRAFTERS:
            self._replaced.pop(name, None)
            if self._all()[name] is not method:  # setting the catalogue's own method back ends a replacement
                self._replaced[name] = method
        else:
            self._own[name] = method

    def __delitem__(self, name: str) -> None:
        if name in self._replaced:
            del self._replaced[name]
        else:
            del self._own[name]

    def _all(self) -> dict[str, Method]:
        drafters = {}
        for name, e in catalogue_drafters.DRAFTERS.items():
            if name not in self._drafters or self._drafters[name][0] is not e:
                self._drafters[name] = (e, _drafter_method(e))
            drafters[name] = self._drafters[name][1]
        ours = {n: m for n, m in self._own.items() if not m.peer}
        every = {**ours, **drafters, **{n: m for n, m in self._own.items() if m.peer}}
        return {n: self._replaced.get(n, m) for n, m in every.items()}

    def __getitem__(self, name: str) -> Method:
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


METHODS = _Methods()


def register(method: Method) -> Method:
    """Add a method that is not a catalogue drafter (target-only variants, peers) to `METHODS` (returns it).

    Raises:
        ValueError: the name is taken, or a second reference method.
    """
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    if method.reference and any(m.reference for m in METHODS.values()):
        raise ValueError("there is exactly one reference (baseline) method")
    METHODS._own[method.name] = method
    return method


def our_methods() -> tuple[Method, ...]:
    """Our methods (through our engine and backends), in plan order."""
    return tuple(m for m in METHODS.values() if not m.peer)


def peer_methods() -> tuple[Method, ...]:
    """The library peers, in plan order."""
    return tuple(m for m in METHODS.values() if m.peer)


def reference_method() -> Method:
    """The target-only baseline."""
    return next(m for m in METHODS.values() if m.reference)


# ------------------------------------------------------------------------------------------- ours


def _common(rt: Runtime, req: RunRequest) -> dict[str, Any]:
    return {"sampling": rt.sampling, "eos_ids": rt.stop_ids, "vocab_size": rt.pair.vocab_size,
            "seed": req.seed}


def _baseline(rt: Runtime, req: RunRequest) -> RunRecord:
    target = rt.pair.target.backend
    res = autoregressive_generate(target, req.prompt_ids, req.max_new_tokens, **_common(rt, req))
    return RunRecord.from_result(res)


def _baseline_padded(rt: Runtime, req: RunRequest) -> RunRecord:
    """Target-only decoding with each step padded to the cheapest shape of the configuration's measured
    curve (``autoregressive_generate(pad_to=costs.padded_n)``): where a 2-token forward costs less than a
    1-token one (bf16 on CPUs whose single-row kernel is slow), this is the faster target-only decoder a fair
    comparison must also beat.

    Raises:
        ValueError: the configuration has no measured costs.
    """
    if rt.costs is None:
        raise ValueError("padded target-only decoding needs measured costs for this configuration")
    target = rt.pair.target.backend
    res = autoregressive_generate(target, req.prompt_ids, req.max_new_tokens, pad_to=rt.costs.padded_n,
                                  **_common(rt, req))
    return RunRecord.from_result(res)


def _pad_to(rt: Runtime):
    """``pad_to`` for `speculative_generate`: the measured curve's `CostCurve.padded_n`, or None."""
    if not rt.pad_verify:
        return None
    if rt.costs is None:
        raise ValueError("padded verification needs measured costs for this configuration")
    return rt.costs.padded_n


def speculative(drafter: str):
    """The run function of the speculative method of catalogue drafter `drafter`
    (`specdec.catalogue.drafters`), built fresh per run for the runtime's pair, sampling, costs, n-gram sizes
    and corpus: fixed K (policy None/``"fixed"``) or an adaptive policy with K as its starting/maximum K; the
    cost policy prices a model-free drafter's tokens at 0 s."""
    entry = catalogue_drafters.drafter(drafter)

    def run(rt: Runtime, req: RunRequest) -> RunRecord:
        source = catalogue_drafters.DraftSource(rt.pair, rt.sampling, rt.costs, (rt.ngram_max, rt.ngram_min),
                                                rt.corpus, budget=max(1, int(req.max_new_tokens)))
        the_drafter = catalogue_drafters.single_drafter(entry.name, source)
        target = rt.pair.target.backend
        common = {**_common(rt, req), "pad_to": _pad_to(rt)}
        if req.policy in (None, "fixed"):
            res = speculative_generate(target, the_drafter, req.prompt_ids, req.max_new_tokens, k=req.k, **common)
        else:
            if catalogue_policies.policy(req.policy).needs_costs and rt.costs is None:
                raise ValueError(f"the {req.policy} policy needs measured costs for this configuration")
            policy = catalogue_policies.make_policy(req.policy, int(req.k), costs=rt.costs, pad_verify=rt.pad_verify,
                                                    free_drafts=entry.k_is_cap)
            res = speculative_generate(target, the_drafter, req.prompt_ids, req.max_new_tokens, policy=policy,
                                       **common)
        return RunRecord.from_result(res)

    return run


def _batch_common(rt: BatchRuntime, req: BatchRequest) -> dict[str, Any]:
    return {"sampling": rt.runtime.sampling, "eos_ids": rt.runtime.stop_ids, "vocab_size": rt.runtime.pair.vocab_size,
            "seed": [req.seed] * len(req.prompt_ids)}


def _batch_baseline(rt: BatchRuntime, req: BatchRequest) -> list[RunRecord]:
    """Batched target-only decoding of the rows (every row with the run's seed)."""
    from specdec.engine.decoding import generate_batch

    res = generate_batch(rt.target, req.prompt_ids, req.max_new_tokens, **_batch_common(rt, req))
    return [RunRecord.from_result(r) for r in res]


def speculative_batch(drafter: str):
    """The batched run function of catalogue drafter `drafter`: its batched drafter (`BatchRuntime.drafter`) at
    a fixed K or under a policy's batch form (`specdec.catalogue.policies.batch_policy`, priced by the batch
    costs; a model-free drafter's tokens cost nothing)."""
    entry = catalogue_drafters.drafter(drafter)

    def run(rt: BatchRuntime, req: BatchRequest) -> list[RunRecord]:
        from specdec.engine.decoding import generate_batch

        if req.policy in (None, "fixed"):
            how: dict[str, Any] = {"k": req.k}
        else:
            how = {"policy": catalogue_policies.batch_policy(
                req.policy, int(req.k), curve=rt.costs, draft_cost=rt.draft_cost if entry.needs_model else None)}
        res = generate_batch(rt.target, req.prompt_ids, req.max_new_tokens, drafter=rt.drafter(entry.name), **how,
                             **_batch_common(rt, req))
        return [RunRecord.from_result(r) for r in res]

    return run


def _batched(e: catalogue_drafters.DrafterEntry) -> bool:
    """Whether drafter `e` runs in a batch: one tokenizer, no per-row corpus, no row limit."""
    return e.max_rows is None and not e.other_tokenizer and not e.uses_corpus


# ------------------------------------------------------------------------------------------- peers


def _hf_peer(name: str) -> Callable[[Runtime, RunRequest], RunRecord]:
    def run(rt: Runtime, req: RunRequest) -> RunRecord:
        out = hf_peer_generate(rt.pair, name, req.prompt_ids, req.max_new_tokens, k=req.k,
                               sampling=rt.sampling, seed=req.seed, ignore_eos=rt.ignore_eos)
        return RunRecord.timed(out.token_ids, out.total_s, out.finish_reason)

    return run


def _skipped(rt: Runtime, req: RunRequest) -> RunRecord:
    raise RuntimeError("a skipped method is never run")  # the runner records `Method.skip` instead


def _eager_transformers_target(rc: RuntimeConfig) -> bool:
    # The transformers peers run the model as users run it: eager (the compiled backend repacks the model's
    # linear layers in place, so its generate() would no longer be transformers' own).
    return rc.target_backend == "transformers" and not rc.compile


def _llamacpp_target(rc: RuntimeConfig) -> bool:
    return rc.target_backend == "llamacpp"


def _native(method: str, **kw: Any) -> Method:
    """The peer method of llama.cpp's own native `method` (`specdec.bench.native_peers`): on a llama.cpp
    target (and, for the draft model, a llama.cpp draft), skipped where the binaries or the drafter are
    missing or the sweep samples."""
    kw.setdefault("applies", _llamacpp_target)
    return Method(native_peers.native_name(method), native_peers.run_native(method), peer=True,
                  skip=native_peers.skip_reason(method), runtime_record=native_peers.runtime_record, **kw)


for _m in (
    Method("baseline", _baseline, reference=True, batch=_batch_baseline),
    Method("aa", _baseline, aa=True, batch=_batch_baseline),
    Method("baseline_padded", _baseline_padded, default=False),
    Method("hf_generate", _hf_peer("hf_generate"), peer=True, applies=_eager_transformers_target),
    Method("hf_assisted", _hf_peer("hf_assisted"), peer=True, takes_k=True, drafts_with_model=True,
           applies=lambda rc: _eager_transformers_target(rc) and rc.draft_backend == "transformers"),
    Method("hf_prompt_lookup", _hf_peer("hf_prompt_lookup"), peer=True, takes_k=True,
           applies=_eager_transformers_target),
    Method("llama_prompt_lookup", _skipped, peer=True, takes_k=True,
           applies=_llamacpp_target, skip=LLAMA_PROMPT_LOOKUP_SKIP),
    _native("target"),
    _native("draft-simple", takes_k=True, drafts_with_model=True,
            applies=lambda rc: _llamacpp_target(rc) and rc.draft_backend == "llamacpp"),
    *(_native(m) for m in native_peers.MODEL_FREE),
):
    register(_m)


def peers_for(rc: RuntimeConfig) -> tuple[str, ...]:
    """Names of the peers that apply to runtime configuration `rc`, in plan order."""
    return tuple(m.name for m in peer_methods() if m.applies(rc))


def chain_drafter_names(methods) -> list[str]:
    """The model-free drafters that `methods` (a sweep's) replay from a sampled trace by their chains (the
    catalogue's ``sampled_replay == "chain"``, and the `DrafterEntry.chain` of a ``"drafter+overlap"`` one),
    sorted: each costs the trace its chain forwards."""
    from specdec.catalogue.drafters import DRAFTERS

    names = {METHODS[m].replay_as or m for m in methods if m in METHODS}
    names |= {DRAFTERS[n].chain for n in names if n in DRAFTERS and DRAFTERS[n].sampled_replay == "drafter+overlap"}
    return sorted(n for n in names if n in DRAFTERS and DRAFTERS[n].sampled_replay == "chain")
