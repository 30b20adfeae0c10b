"""Every drafter, named once: what it is called, how it is built for a loaded pair (one sequence and a batch of
rows), how an acceptance trace replays it, and what it needs.

A drafter is anything that proposes tokens for the target to verify (`specdec.drafters.base.Drafter`). The
command line (``--drafter``), the Python API (``drafter=``), the sweep's methods (``--methods``), the trace
replay (`specdec.measure.pricing`) and the report's names all read this table, so a drafter is offered,
timed, priced and named the same way everywhere. Names are the ones stored in ``runs.method``; aliases are
accepted on input (``model`` and ``draft_model`` for the draft model, ``prompt_lookup`` for n-gram lookup).

Adding a drafter is its class in `specdec.drafters` plus one `register(DrafterEntry(...))` here: the CLI, the
API (one prompt and a batch), the sweep and, if it has a replay, the report's predicted grid then offer it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdec.drafters.base import BatchedDrafter, Drafter

__all__ = [
    "DEFAULT_DRAFTER", "DRAFTERS", "DRAFT_MODEL", "PROMPT_LOOKUP", "DraftSource", "DrafterEntry", "analytic_c", "batched_drafter",
    "default_policy", "drafter", "drafter_names", "free_drafters", "grid_drafters", "model_drafters", "model_free_drafters", "register", "replay_drafter", "single_drafter",
]  # fmt: skip

#: The names of the two classic drafters the analytical model and the report's figures single out.
DRAFT_MODEL = "draft"
PROMPT_LOOKUP = "ngram"
#: The drafter `generate` (command line and API, one prompt and a batch) uses when none is named, and whose
#: cost policy the main job times as the default policy: the mixed drafter (each round the suffix drafter's
#: proposal, the draft model's or none, by expected tokens/s on the measured costs; where no K of the draft
#: model can pay, as on llama.cpp on a CPU, the suffix drafter without running the draft model).
DEFAULT_DRAFTER = "mixed"
#: The mixed drafter's horizon where the generation's budget is not given (the study's 128 new tokens).
MIXED_BUDGET = 128


@dataclass(frozen=True)
class DraftSource:
    """What a drafter is built from.

    Attributes:
        pair: the loaded models (`specdec.runtimes.loading.LoadedPair`): the target, the draft model (or
            None) and the shared vocabulary; a pair loaded with ``other_tokenizer`` holds a draft of another
            tokenizer.
        sampling: the generation's `specdec.core.sampling.SamplingParams` (None: greedy).
        costs: the measured verification costs (anything with ``v(n)``, e.g. a
            `specdec.core.costs.CostCurve`), for drafters that choose their own draft length; None: every
            forward priced as one step.
        ngram: prompt lookup's n-gram sizes (max, min).
        corpus: earlier outputs (target token ids) a corpus drafter matches besides the prompt.
        rows: the batch's rows (1: one sequence). A drafter's costs then price a batch round of `rows`
            rows, ``t(rows n) / t(rows)`` (`row_costs`).
        row_tokens: the most tokens a row of the batch holds (prompt, budget and a verification), which
            sizes a batched draft model's cache (None: the runtime's default).
        trace: an acceptance trace (`specdec.engine.traces.AcceptanceTrace`) that stands in for the pair's
            draft model: a drafter replayed with ``replay="drafter+trace"`` reads its draft model's greedy
            proposals from it (`specdec.drafters.traced.TracedModelDrafter`), or, from a sampled trace, its
            rounds' fates drawn from `rng` (`specdec.drafters.traced.SampledModelDrafter`).
        draft_context: the draft model's context length then (it caps K as the live draft's does; None: no
            cap).
        budget: the new tokens a row is expected to generate (the generation's budget): the horizon over which
            the mixed drafter weighs the draft model's deferred prefill (None: `MIXED_BUDGET`).
        rng: the random source of a sampled trace's draft-model stand-in (`random.Random`).
    """

    pair: Any = None
    sampling: Any = None
    costs: Any = None
    ngram: tuple[int, int] = (3, 1)
    corpus: tuple[tuple[int, ...], ...] = ()
    rows: int = 1
    row_tokens: int | None = None
    trace: Any = None
    draft_context: int | None = None
    budget: int | None = None
    rng: Any = None

    def row_costs(self) -> Any:
        """`costs` as one row of a batch sees them: ``v(n) = t(rows x n) / t(rows)`` on the measured curve
        (`costs` itself for one row or without costs)."""
        if self.costs is None or self.rows == 1 or not hasattr(self.costs, "forward_s"):
            return self.costs
        return _RowCosts(self.costs, self.rows)


class _RowCosts:
    """A row's verification cost in a batch of `rows` rows: ``v(n) = t(rows n) / t(rows)``."""

    def __init__(self, curve: Any, rows: int) -> None:
        self.curve, self.rows = curve, int(rows)

    def v(self, n: int) -> float:
        return self.curve.forward_s(self.rows * int(n)) / self.curve.forward_s(self.rows)


@dataclass(frozen=True)
class DrafterEntry:
    """One drafter.

    Attributes:
        name: the one name (``runs.method``, ``--drafter``, ``drafter=``). label: the report's words.
        help: one line for ``--help``.
        aliases: other names accepted on input.
        row: builds the drafter of one sequence from a `DraftSource` (a fresh object per generation).
        batched: builds its batched form for ``source.rows`` rows when it is not one `row` drafter per row
            (the draft model: one batched forward for every row); None: `specdec.drafters.base.PerRowDrafters`
            of `row`.
        needs_model: drafts with the pair's draft model, so each drafted token costs a draft step (the cost
            policy prices it; a model-free drafter's tokens cost nothing measurable).
        other_tokenizer: drafts with a draft model of another tokenizer than the target's.
        uses_corpus: matches `DraftSource.corpus` (the sweep's other prompts' target-only outputs).
        priced: chooses its own draft length on the measured verification costs (`DraftSource.costs`), so
            it needs them measured.
        replay: how an acceptance trace replays it (`specdec.engine.traces.replay`): ``"trace"`` from the
            trace's teacher-forced draft tokens, ``"drafter"`` by asking a fresh `row` drafter each round,
            ``"drafter+trace"`` likewise with the trace standing in for its draft model (`DraftSource.trace`:
            a drafter that chooses per round whether to draft with the model), None when no trace records
            it. replay_as: a drafter whose replay stands for this one's.
        chain: for a ``"drafter+trace"`` replay, the model-free drafter whose rounds it drafts besides the
            draft model's (its `specdec.drafters.base.Draft.source`), whose chain a sampled trace records for
            them (`sampled_replay`).
        analytic: how the analytical model (Leviathan et al. 2023: fixed K, per-token acceptance) prices its
            drafting: ``"measured"`` at the measured c, ``"free"`` at c = 0; None: the model does not describe
            it (its draft length follows its match, or its tokens are another tokenizer's).
        max_rows: the most rows its batched form serves (None: any).
        in_sweep: planned by the sweep when ``--methods`` is not given.
    """

    name: str
    label: str
    help: str
    row: Callable[[DraftSource], Drafter]
    aliases: tuple[str, ...] = ()
    batched: Callable[[DraftSource], BatchedDrafter] | None = None
    needs_model: bool = False
    other_tokenizer: bool = False
    uses_corpus: bool = False
    priced: bool = False
    replay: str | None = "drafter"
    replay_as: str | None = None
    chain: str | None = None
    analytic: str | None = None
    max_rows: int | None = None
    in_sweep: bool = False
    names: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", (self.name, *self.aliases))

    @property
    def free(self) -> bool:
        """Drafting costs no model step."""
        return not self.needs_model

    @property
    def sampled_replay(self) -> str | None:
        """How a sampled trace (`specdec.engine.sampled_traces`) replays it: ``"overlap"`` (the draft model: its
        overlap with the target along the sampled output), ``"chain"`` (a model-free drafter asked along the
        output, its tokens' acceptance probabilities recorded), ``"drafter+overlap"`` (a drafter that chooses per
        round between the draft model and a model-free drafter: driven along the output, its model rounds drawn
        from the overlap, its other rounds from `chain`'s), None (not recorded: one of another tokenizer, or
        one replayed as another)."""
        if self.replay_as is not None or (self.replay == "drafter+trace" and self.chain is None):
            return None
        return {"trace": "overlap", "drafter": "chain", "drafter+trace": "drafter+overlap"}.get(self.replay or "")

    @property
    def k_is_cap(self) -> bool:
        """A K policy prices this drafter's tokens at 0 s: it drafts with no model, or it chooses its own draft
        length (and source) on the measured costs, so the policy's K only caps it."""
        return self.free or self.priced

    def check_pair(self, pair: Any) -> None:
        """Refuse a pair this drafter cannot draft for, in one line.

        Raises:
            ValueError: a model drafter on a pair without a draft model, or whose draft's tokenizer is not
                the kind this drafter handles.
        """
        if not self.needs_model:
            return
        if pair is None or pair.draft is None:
            raise ValueError(f"drafter {self.name!r} needs a draft model: load a pair with a draft, or draft "
                             f"with {' or '.join(repr(d) for d in model_free_drafters())}")
        other = (getattr(pair, "info", None) or {}).get("vocab_overlap") is not None
        if other != self.other_tokenizer:
            kind = "another tokenizer than the target" if other else "the target's tokenizer"
            raise ValueError(f"drafter {self.name!r} cannot draft with a draft model of {kind}; "
                             f"use {for_pair('draft', pair).name!r}")


#: Every drafter by name, in the order the CLI, the sweep and the report list them (`register` adds one).
DRAFTERS: dict[str, DrafterEntry] = {}


def register(entry: DrafterEntry) -> DrafterEntry:
    """Add `entry` to `DRAFTERS` (returns it).

    Raises:
        ValueError: a name or alias already taken.
    """
    taken = {n for e in DRAFTERS.values() for n in e.names}
    clash = [n for n in entry.names if n in taken]
    if clash:
        raise ValueError(f"drafter name {clash[0]!r} is already registered")
    DRAFTERS[entry.name] = entry
    return entry


def drafter_names() -> tuple[str, ...]:
    """The drafters' names, in catalogue order."""
    return tuple(DRAFTERS)


def drafter(name: str) -> DrafterEntry:
    """The entry a name or alias means (case-insensitive).

    Raises:
        ValueError: an unknown name (the message lists the names).
    """
    entry = _known(name)
    if entry is None:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
    return entry


def default_policy(timed: Any = None) -> tuple[str, str]:
    """The default policy as (drafter name, K policy name) of a store whose runs timed the cost policy of the
    drafters in `timed` (stored method names): `DEFAULT_DRAFTER` where it is among them or none is given (what
    `generate` runs when nothing is named), else the first of them in catalogue order, so a store keeps the
    default it was made with when the catalogue's changes."""
    names = {e.name for e in map(_known, timed if timed is not None else ()) if e is not None}
    if not names or DEFAULT_DRAFTER in names:
        return DEFAULT_DRAFTER, "cost"
    return next(n for n in DRAFTERS if n in names), "cost"


def for_pair(name: str, pair: Any) -> DrafterEntry:
    """The entry `name` means on `pair`: the draft model (``draft``) of a pair whose draft has another
    tokenizer is the cross-tokenizer drafter (``xtok``), and the other way round; every other name is itself.

    Raises:
        ValueError: an unknown name.
    """
    entry = drafter(name)
    if entry.needs_model and pair is not None and pair.draft is not None:
        other = (getattr(pair, "info", None) or {}).get("vocab_overlap") is not None
        if other != entry.other_tokenizer:
            return next(e for e in DRAFTERS.values() if e.needs_model and e.other_tokenizer == other)
    return entry


def single_drafter(name: str, source: DraftSource) -> Drafter:
    """The drafter `name` of one sequence, for `source`'s pair (checked first).

    Raises:
        ValueError: an unknown name, or a pair it cannot draft for (`DrafterEntry.check_pair`).
    """
    entry = drafter(name)
    entry.check_pair(source.pair)
    return entry.row(source)


def batched_drafter(name: str, source: DraftSource) -> BatchedDrafter:
    """The batched drafter `name` for ``source.rows`` rows: its own batched form, or one row drafter per row
    (`specdec.drafters.base.PerRowDrafters`), each pricing its draft length as a row of the batch.

    Raises:
        ValueError: an unknown name, a pair it cannot draft for, or more rows than it serves.
    """
    from specdec.drafters.base import PerRowDrafters

    entry = drafter(name)
    entry.check_pair(source.pair)
    if entry.max_rows is not None and source.rows > entry.max_rows:
        raise ValueError(f"drafter {entry.name!r} drafts {entry.max_rows} prompt at a time, not a batch of "
                         f"{source.rows}")
    if entry.batched is not None:
        return entry.batched(source)
    row_source = replace(source, costs=source.row_costs())
    return PerRowDrafters(lambda: entry.row(row_source))


def _known(name: str) -> DrafterEntry | None:
    """The entry of a stored method name, or None for a method that is no drafter (target-only, peers)."""
    return next((e for e in DRAFTERS.values() if str(name).strip().lower() in e.names), None)


def analytic_c(name: str, c: float | None) -> float | None:
    """The c the analytical model prices method `name` with: the measured `c` for the draft model, 0 for
    prompt lookup, None for a method it does not describe (`DrafterEntry.analytic`)."""
    entry = _known(name)
    kind = entry.analytic if entry is not None else None
    return c if kind == "measured" else (0.0 if kind == "free" else None)


def model_drafters() -> tuple[str, ...]:
    """The drafters that draft every drafting round with the pair's own draft model (same tokenizer): each
    such round costs draft steps and reads the draft's weights (the mixed drafter's rounds may not)."""
    return tuple(n for n, e in DRAFTERS.items() if e.needs_model and not e.other_tokenizer and not e.priced)


def model_free_drafters() -> tuple[str, ...]:
    """The drafters that need no draft model (what a pair without one can draft with), in catalogue order."""
    return tuple(n for n, e in DRAFTERS.items() if not e.needs_model)


def free_drafters() -> tuple[str, ...]:
    """The drafters the analytical model prices at c = 0 (prompt lookup by either rule): a model-free
    drafter's measured seconds per round."""
    return tuple(n for n, e in DRAFTERS.items() if e.analytic == "free")


def grid_drafters() -> tuple[str, ...]:
    """The drafters the report's predicted K grid replays from every trace (a replay of their own)."""
    return tuple(n for n, e in DRAFTERS.items() if e.replay is not None and e.replay_as is None)


def replay_drafter(name: str, *, costs: Any = None, ngram: tuple[int, int] = (3, 1), trace: Any = None,
                   draft_context: int | None = None, rng: Any = None) -> Drafter | None:
    """What `specdec.engine.traces.replay` drives for drafter `name`: None for a drafter replayed from the
    trace's draft tokens (the draft model), else a fresh row drafter (its proposals depend on the committed
    text alone, or on that and its draft model's greedy proposals, read from `trace`).

    Args:
        costs: the cost curve a priced drafter chooses with. ngram: prompt lookup's n-gram sizes.
        trace: the trace being replayed (needed by a ``"drafter+trace"`` replay, `DrafterEntry.replay`): a
            greedy trace with draft tokens, or a sampled one with the draft model's overlap.
        draft_context: the draft model's context length (None: no cap).
        rng: a sampled trace's random source (`DraftSource.rng`).

    Raises:
        ValueError: an unknown name, a drafter no trace records, or a ``"drafter+trace"`` replay without a
            trace with draft tokens.
    """
    entry = drafter(name)
    if entry.replay_as is not None:
        entry = drafter(entry.replay_as)
    if entry.replay == "trace":
        return None
    if entry.replay == "drafter":
        return entry.row(DraftSource(costs=costs, ngram=ngram))
    if entry.replay == "drafter+trace":
        if trace is None:  # a trace without its draft model's record: `model_on_trace` says so
            raise ValueError(f"drafter {name!r} is replayed from a trace's draft model: no trace given")
        return entry.row(DraftSource(costs=costs, ngram=ngram, trace=trace, draft_context=draft_context,
                                     budget=trace.max_new_tokens, rng=rng))
    replayable = ", ".join(n for n, e in DRAFTERS.items() if e.replay is not None)
    raise ValueError(f"no replay for drafter {name!r} (known: {replayable})")


# ------------------------------------------------------------------------------------------- builders


def _draft_model(s: DraftSource) -> Drafter:
    from specdec.drafters.model import ModelDrafter

    return ModelDrafter(s.pair.draft.backend, s.pair.vocab_size)


def _draft_model_batched(s: DraftSource) -> BatchedDrafter:
    from specdec.drafters.model import BatchedModelDrafter
    from specdec.runtimes.batched_loading import batched_backend

    return BatchedModelDrafter(batched_backend(s.pair.draft, s.rows, row_tokens=s.row_tokens), s.pair.vocab_size)


def _prompt_lookup(s: DraftSource) -> Drafter:
    from specdec.drafters.ngram import PromptLookupDrafter

    return PromptLookupDrafter(*s.ngram)


def _prompt_lookup_hf_rule(s: DraftSource) -> Drafter:
    from specdec.drafters.ngram import PromptLookupDrafter

    return PromptLookupDrafter(2, 1, match="earliest", continue_past_end=False)


def _suffix(s: DraftSource) -> Drafter:
    from specdec.drafters.suffix import SuffixDrafter

    return SuffixDrafter(s.costs)


def _suffix_corpus(s: DraftSource) -> Drafter:
    from specdec.drafters.suffix import SuffixDrafter

    return SuffixDrafter(s.costs, corpus=s.corpus)


def _mixed(s: DraftSource) -> Drafter:
    """The mixed drafter on the pair's draft model, or on `DraftSource.trace`'s draft tokens (its replay)."""
    from specdec.drafters.mixed import MixedDrafter
    from specdec.drafters.suffix import SuffixDrafter

    if s.trace is not None:
        from specdec.drafters.traced import model_on_trace

        return MixedDrafter.on_model_drafter(SuffixDrafter(s.costs), model_on_trace(s.trace, s.draft_context, s.rng),
                                             s.costs, budget=s.budget or MIXED_BUDGET)
    return MixedDrafter(SuffixDrafter(s.costs), s.pair.draft.backend, s.pair.vocab_size, s.costs,
                        budget=s.budget or MIXED_BUDGET)


def _mixed_batched(s: DraftSource) -> BatchedDrafter:
    from specdec.drafters.mixed import BatchedMixedDrafter
    from specdec.drafters.suffix import SuffixDrafter

    model = _draft_model_batched(s)
    return BatchedMixedDrafter(lambda: SuffixDrafter(s.costs), model, s.costs, budget=s.budget or MIXED_BUDGET)


def _cross_tokenizer(s: DraftSource) -> Drafter:
    from specdec.core.sampling import SamplingParams
    from specdec.drafters.xtok import cross_tokenizer_drafter

    return cross_tokenizer_drafter(s.pair, s.sampling or SamplingParams())


for _e in (
    DrafterEntry("draft", "draft model", "the pair's draft model (a smaller LM of the same tokenizer)",
                 _draft_model, aliases=("model", "draft_model"), batched=_draft_model_batched, needs_model=True,
                 replay="trace", analytic="measured", in_sweep=True),
    DrafterEntry("ngram", "prompt lookup", "prompt lookup: the continuation of the latest earlier n-gram match",
                 _prompt_lookup, aliases=("prompt_lookup",), analytic="free", in_sweep=True),
    DrafterEntry("ngram_hf", "prompt lookup, transformers' rule",
                 "prompt lookup by transformers' rule (2-grams to 1, earliest match, nothing past the end)",
                 _prompt_lookup_hf_rule, replay=None, analytic="free"),
    DrafterEntry("suffix", "suffix (prompt + output)",
                 "the longest earlier repeat of the text's suffix, its length chosen on the measured costs",
                 _suffix, priced=True),
    DrafterEntry("mixed", "suffix or draft model",
                 "each round the suffix drafter's proposal, the draft model's or none, by expected tokens/s on "
                 "the measured costs", _mixed, batched=_mixed_batched, needs_model=True, priced=True,
                 replay="drafter+trace", chain="suffix", in_sweep=True),
    DrafterEntry("xtok", "draft with another tokenizer",
                 "a draft model of another tokenizer: its text re-tokenized for the target",
                 _cross_tokenizer, aliases=("cross_tokenizer",), needs_model=True, other_tokenizer=True,
                 replay=None, max_rows=1),
    DrafterEntry("suffix_corpus", "suffix + other prompts' outputs",
                 "the suffix drafter matching earlier outputs too (the sweep's other prompts)", _suffix_corpus,
                 uses_corpus=True, priced=True, replay_as="suffix"),
):
    register(_e)
