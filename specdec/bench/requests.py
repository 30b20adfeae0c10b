"""What a timed method is given and returns: the runtime it runs on (`Runtime`, `BatchRuntime` for a batch),
the generation asked for (`RunRequest`, `BatchRequest`) and what one timed generation measured (`RunRecord`,
the columns of its ``runs`` row). `specdec.bench.methods` holds the methods."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec.catalogue import drafters as catalogue_drafters
from specdec.core.costs import CostCurve
from specdec.core.metrics import RATES, GenerationResult
from specdec.core.sampling import SamplingParams

__all__ = ["BatchRequest", "BatchRuntime", "RunRecord", "RunRequest", "Runtime"]


@dataclass
class Runtime:
    """What a method runs on: one loaded runtime configuration.

    Attributes:
        pair: the loaded models (`specdec.runtimes.loading.LoadedPair`).
        sampling: every generation's sampling settings.
        costs: the configuration's measured costs (the cost policy needs them), or None.
        ngram_max, ngram_min: n-gram sizes of our prompt-lookup drafter.
        ignore_eos: run every generation for its whole budget (EOS is a token like any other): sampled
            sweeps do, so that every run of a prompt does the same work (a run that stopped after
            8 tokens is otherwise compared with one that ran 128, prefill included).
        pad_verify: our speculative methods pad verification to the cheapest shape of `costs`
            (`RuntimeConfig.pad_verify`; ``speculative_generate(pad_to=costs.padded_n)``), and the cost
            policy prices K with the padded cost. The baseline is never padded.
        corpus: earlier target-only outputs (target token ids) a corpus-drafting method matches besides the
            prompt (``suffix_corpus``); never the current prompt's own.

    For a cross-tokenizer method (`Method.cross_tokenizer`), `pair` is the target with the cross-tokenizer
    draft (``load_pair(..., other_tokenizer=True)``'s shape: ``pair.draft.tokenizer`` is the draft's own) and
    `costs` carries that draft's step time, measured on its own token ids.
    """

    pair: Any
    sampling: SamplingParams
    costs: CostCurve | None = None
    ngram_max: int = 3
    ngram_min: int = 1
    ignore_eos: bool = False
    pad_verify: bool = False
    corpus: tuple[tuple[int, ...], ...] = ()

    @property
    def stop_ids(self) -> frozenset[int]:
        """The ids that end a generation: the pair's EOS ids, or none with `ignore_eos`."""
        return frozenset() if self.ignore_eos else frozenset(self.pair.eos_ids)


@dataclass(frozen=True)
class RunRequest:
    """One generation to run: prompt token ids, new-token budget, K (None for target-only methods), policy
    (``"fixed"``/None or an adaptive policy name, for methods that take K) and seed."""

    prompt_ids: list[int]
    max_new_tokens: int
    k: int | None = None
    policy: str | None = None
    seed: int = 0


@dataclass
class BatchRuntime:
    """What a method runs on at B > 1: one loaded configuration's batched backends and batch pricing.

    Attributes:
        target: the target's `specdec.runtimes.base.BatchedBackend` (built for the sweep's largest B).
        runtime: the configuration's `Runtime` (pair, sampling, n-gram sizes, stop ids).
        rows: B. row_tokens: the most tokens a row holds (sizes a batched draft model's cache).
        costs: the batch pricing's `CostCurve` (forwards of B x (K + 1) tokens, the draft's step over B rows),
            or None. drafters: the batched drafters built so far, by (method, B) (built once, reused).
    """

    target: Any
    runtime: Runtime
    rows: int
    row_tokens: int | None = None
    costs: CostCurve | None = None
    drafters: dict[tuple[str, int], Any] = field(default_factory=dict)

    def drafter(self, name: str) -> Any:
        """The batched drafter of catalogue drafter `name` for `rows` rows (`batched_drafter`), built once."""
        if (name, self.rows) not in self.drafters:
            rt = self.runtime
            source = catalogue_drafters.DraftSource(rt.pair, rt.sampling, self.costs, (rt.ngram_max, rt.ngram_min),
                                                    rows=self.rows, row_tokens=self.row_tokens)
            self.drafters[name, self.rows] = catalogue_drafters.batched_drafter(name, source)
        return self.drafters[name, self.rows]

    def draft_cost(self, rows: int, k: int) -> float:
        """Seconds of drafting K tokens for `rows` rows with the draft model: K draft forwards over `rows`
        tokens (one token per row), as ``generate`` prices a batch."""
        return k * self.costs.draft_forward(rows) if self.costs is not None else 0.0


@dataclass(frozen=True)
class BatchRequest:
    """One batched generation: each row's prompt token ids, the new-token budget of every row, K (None for
    target-only), policy (``"fixed"`` or a policy with a batch form) and the seed of every row."""

    prompt_ids: list[list[int]]
    max_new_tokens: int
    k: int | None = None
    policy: str | None = None
    seed: int = 0


@dataclass
class RunRecord:
    """What one timed generation produced: the measured columns of its ``runs`` row and its ``rounds``.

    Our methods fill everything (`from_result`); a peer, timed around a library call, only the tokens and
    the total seconds (`timed`): the other columns stay NULL (prefill is not separable there).
    """

    token_ids: list[int]
    finish_reason: str
    total_s: float
    num_rounds: int | None = None
    num_drafted: int | None = None
    num_accepted: int | None = None
    num_rejections: int | None = None
    prefill_s: float | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    rounds: list[dict] = field(default_factory=list)
    policy_note: str | None = None

    @classmethod
    def from_result(cls, res: GenerationResult) -> RunRecord:
        """From our engine's `GenerationResult` (with its per-round trace)."""
        return cls(
            list(res.token_ids), res.finish_reason, res.total_s, res.num_rounds, res.num_drafted,
            res.num_accepted, res.num_rejections, res.prefill_s, res.ttft_s, res.decode_s, res.draft_s,
            res.verify_s, res.rounds_as_dicts(), res.policy_note,
        )  # fmt: skip

    @classmethod
    def timed(cls, token_ids: list[int], total_s: float, finish_reason: str) -> RunRecord:
        """From a call timed as a whole (a peer)."""
        return cls(list(token_ids), finish_reason, total_s)

    def columns(self) -> dict[str, Any]:
        """The ``runs`` columns this record fills (`specdec.bench.store.TABLES`); ``tokens_per_s`` by
        `specdec.core.metrics.RATES` (NaN, stored as NULL, when nothing was timed)."""
        n = len(self.token_ids)
        return {
            "new_tokens": n, "finish_reason": self.finish_reason, "token_ids": self.token_ids,
            "num_rounds": self.num_rounds, "num_drafted": self.num_drafted, "num_accepted": self.num_accepted,
            "num_rejections": self.num_rejections, "prefill_s": self.prefill_s, "ttft_s": self.ttft_s,
            "decode_s": self.decode_s, "total_s": self.total_s, "draft_s": self.draft_s,
            "verify_s": self.verify_s, "policy_note": self.policy_note,
            "tokens_per_s": RATES["tokens_per_s"].of({"new_tokens": n, "total_s": self.total_s}),
        }  # fmt: skip
