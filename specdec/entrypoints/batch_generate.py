"""Batched generation for users: ``specdec generate --prompts-file F --batch-size B`` and
``specdec.generate(pair, ["p1", "p2", ...], batch_size=B)``.

Prompts run B at a time, in order (the last batch may be smaller), through the exact batched engine
`specdec.engine.batched.generate_batch` on the pair's batched backends (`specdec.runtimes.batched_loading.batched_pair`):
every row commits its own accepted length, so greedy rows equal single-prompt greedy decoding and sampled
rows (row i seeded ``seed + i``) follow the target's distribution (Leviathan et al. 2023; Chen et al. 2023).

Drafters: the draft model (`specdec.drafters.model.BatchedModelDrafter`), prompt lookup and the suffix drafter
(one `specdec.drafters.ngram.PromptLookupDrafter` / `specdec.drafters.suffix.SuffixDrafter` per row,
`specdec.drafters.base.PerRowDrafters`). K: fixed (`specdec.policies.batch.FixedBatchK`) or, by default, the batch-aware
cost policy (`specdec.policies.batch.BatchCostPolicy`) priced by `batch_costs`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec.engine.metrics import GenerationResult
from specdec.engine.sampling import SamplingParams

__all__ = [
    "BATCH_DRAFTERS", "BATCH_POLICIES", "LLAMACPP_MAX_ROWS", "BatchRun", "PromptEntry", "batch_costs",
    "batch_k_max", "batch_measure", "batch_report", "cli_generate_batch", "print_batch", "read_prompts_file",
    "resolve_batch_policy", "row_figures", "run_batches",
]  # fmt: skip

#: llama.cpp serves at most this many sequences in one context (its ``LLAMA_MAX_SEQ``; a context with
#: ``n_seq_max = 257`` fails to be created), so a batch on llama.cpp has at most this many rows.
LLAMACPP_MAX_ROWS = 256
BATCH_DRAFTERS = ("model", "ngram", "suffix")
#: The K policies a batch can run: one K for the whole batch each round.
BATCH_POLICIES = ("fixed", "cost")
#: The default cost policy's largest K (as the single-prompt default) ...
DEFAULT_K_MAX = 16
#: ... capped so that a batch round's verification, B x (K_max + 1) tokens, stays within this many tokens.
MAX_BATCH_TOKENS = 128


@dataclass(frozen=True)
class PromptEntry:
    """One prompt of a prompts file: its text, its own budget (None: the command's), its line (1-based)."""

    text: str
    max_new_tokens: int | None
    line: int


def read_prompts_file(path: str | Path) -> list[PromptEntry]:
    """The prompts of `path`, in file order.

    A ``.jsonl`` file holds one JSON object per line with a ``"prompt"`` string and optionally an integer
    ``"max_new_tokens"`` >= 0 (blank lines skipped; other fields ignored); any other file holds one prompt
    per line (blank lines skipped, so a prompt cannot span lines: use ``.jsonl`` for that).

    Raises:
        ValueError: one line naming the file (and line): missing or unreadable, not UTF-8, no prompt,
            a line that is not a JSON object, a missing, non-string or blank ``"prompt"``, a
            ``"max_new_tokens"`` that is not an integer >= 0.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"--prompts-file {p}: a directory, not a file")
    if not p.is_file():
        raise ValueError(f"--prompts-file {p}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--prompts-file {p}: not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(f"--prompts-file {p}: cannot read it ({exc.strerror or exc})") from None
    entries: list[PromptEntry] = []
    is_jsonl = p.suffix.lower() == ".jsonl"
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if not is_jsonl:
            entries.append(PromptEntry(raw, None, n))
            continue
        where = f"--prompts-file {p}, line {n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON ({exc.msg})") from None
        problem = _entry_problem(obj)
        if problem:
            raise ValueError(f"{where}: {problem}")
        entries.append(PromptEntry(obj["prompt"], obj.get("max_new_tokens"), n))
    if not entries:
        raise ValueError(f"--prompts-file {p} holds no prompt")
    return entries


def _entry_problem(obj: Any) -> str | None:
    """What is wrong with one decoded ``.jsonl`` line, or None."""
    if not isinstance(obj, dict):
        return 'expected a JSON object with a "prompt" field'
    prompt = obj.get("prompt")
    if not isinstance(prompt, str):
        return '"prompt" must be a string' if "prompt" in obj else 'no "prompt" field'
    if not prompt.strip():
        return "the prompt is empty"
    budget = obj.get("max_new_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        return f'"max_new_tokens" must be an integer >= 0, got {budget!r}'
    return None


def batch_k_max(batch_size: int, context: int | None = None) -> int:
    """The default cost policy's largest K for batches of `batch_size` rows: `DEFAULT_K_MAX`, capped so that
    ``batch_size x (K + 1) <= MAX_BATCH_TOKENS`` (and, with `context`, below the smaller model context, so
    that one forward of that many tokens can be timed), never below 1 (B > 64 rows: K = 1, whose 2 B tokens
    are timed as they are)."""
    cap = MAX_BATCH_TOKENS if context is None else min(MAX_BATCH_TOKENS, int(context) - 1)
    return max(1, min(DEFAULT_K_MAX, cap // int(batch_size) - 1))


def _batch_ns(rows: int, max_n: int) -> list[int]:
    """Target token counts timed for batches of `rows` rows: one plain step (n = 1), the batch's plain step
    (n = rows) and its verifications of K = 1, 2, 4, 8, 16 (n = rows x (K + 1)) up to `max_n`, and `max_n`."""
    return sorted({1, max_n} | {rows * (k + 1) for k in (0, 1, 2, 4, 8, 16) if rows * (k + 1) <= max_n})


def batch_measure(pair, *, max_n: int, rows: int, repeats: int = 2, context_tokens: int = 32,
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Time what a batch round of `rows` rows costs, as `specdec.measure.quick_costs.quick_measure` times a single
    sequence's round: the target's forwards of `_batch_ns(rows, max_n)` tokens and the draft's forwards of
    1 and `rows` tokens, each ONE sequence on a warm cache of `context_tokens` tokens.

    A single sequence of n tokens stands for n rows of a batch (rows x (K + 1) tokens for a verification,
    `rows` tokens for a draft step): the linear layers, which dominate on a CPU, do the same work for both;
    attention, which differs (one long sequence against each row's own cache), is the smaller part there.

    Returns:
        ``{"target_forward_s": {n: s}, "target_step_s", "draft_step_s" (None without a draft),
        "draft_forward_s": {1: s, rows: s} (None without a draft), "rows", "max_n", "ns", ...}`` (seconds),
        readable by `specdec.measure.costs.CostCurve.from_costs`.

    Raises:
        ValueError: `max_n`, `rows`, `repeats` or `context_tokens` < 1, or a context window too short for
            `max_n` tokens.
    """
    from specdec.bench.costs import forward_times
    from specdec.measure.costs import DRAFT_REPEAT_FACTOR
    from specdec.measure.quick_costs import time_target_forwards

    if min(max_n, rows, repeats, context_tokens) < 1:
        raise ValueError("max_n, rows, repeats and context_tokens must be >= 1")
    ns = _batch_ns(rows, max_n)
    ctx_len, context, t_fwd, t_iqr = time_target_forwards(pair, ns, max_n, repeats=repeats,
                                                          context_tokens=context_tokens, clock=clock)
    out: dict[str, Any] = {
        "target_step_s": t_fwd[1], "draft_step_s": None, "draft_forward_s": None, "target_forward_s": t_fwd,
        "target_forward_spread_s": t_iqr, "repeats": repeats, "context_tokens": ctx_len, "max_n": max_n,
        "ns": ns, "rows": rows, "quick": True,
    }  # fmt: skip
    if pair.draft is not None:
        d_fwd, _ = forward_times(pair.draft.backend, context, sorted({1, rows}),
                                 repeats=DRAFT_REPEAT_FACTOR * repeats, clock=clock)
        out.update(draft_step_s=d_fwd[1], draft_forward_s=d_fwd)
    return out


def batch_costs(loaded, cost_key: dict, *, rows: int, max_n: int, with_draft: bool, refresh: bool = False,
                progress: Callable[[str], None] | None = None, cache=None) -> dict[str, Any]:
    """`batch_measure` for batches of `rows` rows up to `max_n` target tokens (rows x (K_max + 1)), cached by
    `specdec.measure.quick_costs.cached_quick_costs` under `cost_key` (fingerprinted model specs, runtimes, dtype,
    threads, ...) plus the row count, so each batch size keeps its own measurement; `refresh` measures again.
    `with_draft`: time the draft model too (False for prompt lookup and suffix drafting, which draft for
    free). `progress` gets a line before a measurement and the cache note after.

    Raises:
        ValueError: the models cannot be timed at `max_n` tokens (context too short).
    """
    from specdec.measure.quick_costs import cached_quick_costs
    from specdec.runtimes.loading import LoadedPair

    measured_on = loaded if with_draft else LoadedPair(loaded.target, None, loaded.vocab_size, loaded.eos_ids)
    key = {**cost_key, "draft": cost_key.get("draft") if with_draft else None, "batch_rows": int(rows)}

    def measure(pair, *, max_n):
        if progress is not None:
            progress(f"measuring the batch cost policy's forward costs ({rows} rows, up to {max_n} tokens in one "
                     "forward; once per machine, models, dtype, threads and batch size) ...")
        return batch_measure(pair, max_n=max_n, rows=rows)

    costs, note = cached_quick_costs(measured_on, key, max_n=max_n, refresh=refresh, cache=cache, measure=measure)
    if progress is not None:
        progress(note)
    return costs


class _RowCost:
    """A row's verification cost in a batch of `rows` rows, for `specdec.drafters.suffix.SuffixDrafter`: ``v(n)``, the
    forward of every row verifying n tokens in units of the batch's plain step, ``t(rows n) / t(rows)``."""

    def __init__(self, curve, rows: int) -> None:
        self.curve, self.rows = curve, int(rows)

    def v(self, n: int) -> float:
        return self.curve.forward_s(self.rows * int(n)) / self.curve.forward_s(self.rows)


@dataclass
class BatchRun:
    """What `run_batches` returns.

    Attributes:
        results: one `GenerationResult` per prompt, in prompt order (times from its batch's start).
        batch_of: the index of the batch each prompt ran in.
        batches: one dict per batch: ``{"index", "rows", "tokens", "wall_s", "tokens_per_s"}`` (wall_s: the
            `generate_batch` call, prefill included).
        policy, k, drafter: the K policy (``fixed`` or ``cost``), its K (fixed) or largest K, the drafter.
        batch_size: B.
    """

    results: list[GenerationResult]
    batch_of: list[int]
    batches: list[dict[str, Any]] = field(default_factory=list)
    policy: str = ""
    k: int = 0
    drafter: str = ""
    batch_size: int = 1

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


def resolve_batch_policy(policy: str | None, k: int | None) -> tuple[str, int | None]:
    """``(policy, K)`` for a batch: `k` alone is a fixed K; neither gives ``cost`` (K None: `batch_k_max`
    decides); ``fixed`` alone gets K = 4 (as one prompt); ``cost`` with `k` uses it as the largest K.

    Raises:
        ValueError: a policy other than ``fixed`` and ``cost``, or K < 1.
    """
    name = ("fixed" if k is not None else "cost") if policy is None else str(policy).strip().lower()
    if name not in BATCH_POLICIES:
        raise ValueError(f"a batch runs one K per round for every row: policy {policy!r} is not available; "
                         f"choose {' or '.join(BATCH_POLICIES)}")
    if k is not None and int(k) < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    if name == "fixed" and k is None:
        k = 4
    return name, None if k is None else int(k)


def run_batches(
    loaded,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    *,
    batch_size: int,
    drafter: str = "model",
    policy: str | None = None,
    k: int | None = None,
    sampling: SamplingParams | None = None,
    seed: int = 0,
    cost_key: dict | None = None,
    costs: dict | None = None,
    refresh_costs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> BatchRun:
    """Decode `prompts` B = `batch_size` at a time (in order; the last batch may be smaller) with
    `specdec.engine.batched.generate_batch` on the pair's batched backends (`specdec.runtimes.batched_loading.batched_pair`).

    Args:
        loaded: a `specdec.runtimes.loading.LoadedPair` (eager transformers or llama.cpp).
        prompts: token ids, non-empty. max_new_tokens: one budget, or one per prompt (>= 0).
        batch_size: rows per batch, >= 1 (llama.cpp: at most `LLAMACPP_MAX_ROWS`).
        drafter: ``"model"`` (the pair's draft model, batched), ``"ngram"`` (prompt lookup per row) or
            ``"suffix"`` (the suffix drafter per row, its K priced by the batch's measured costs).
        policy, k: `resolve_batch_policy`: ``fixed`` K (`specdec.policies.batch.FixedBatchK`) or the ``cost`` policy
            (`specdec.policies.batch.BatchCostPolicy`) up to K_max = `k`, or by default `batch_k_max` (B x (K_max + 1)
            <= 128 tokens). Its target cost is ``t(n)`` and its draft cost ``K x t_draft(B)`` from `costs`
            or `batch_costs`.
        sampling: greedy when None. seed: prompt i (in `prompts` order) samples with seed ``seed + i``.
        cost_key: what identifies this setup's cost measurement (fingerprinted specs, runtimes, dtype,
            threads: `specdec.entrypoints.api.Pair.cost_key`); needed when costs are measured.
        costs: measured costs instead (`batch_measure`'s dict). refresh_costs: measure again.
        progress: gets one-line progress messages (cost measurement).

    Returns:
        A `BatchRun`.

    Raises:
        ValueError: no prompts, an empty prompt, B < 1, B above the llama.cpp row limit, an unknown drafter
            or policy, ``"model"`` without a draft model, a compiled model, costs needed without `cost_key`.
        specdec.runtimes.base.ContextOverflowError: a prompt plus its budget exceeds the target's context.
    """
    from specdec.drafters.base import PerRowDrafters
    from specdec.drafters.ngram import PromptLookupDrafter
    from specdec.engine.batched import generate_batch
    from specdec.engine.decoding import _check_inputs
    from specdec.measure.costs import CostCurve
    from specdec.policies.batch import BatchCostPolicy, FixedBatchK
    from specdec.runtimes.batched_loading import batched_pair

    b = int(batch_size)
    if b < 1:
        raise ValueError(f"the batch size must be >= 1, got {batch_size}")
    if not prompts:
        raise ValueError("no prompts: a batch needs at least one")
    if "llamacpp" in (loaded.target.runtime, getattr(loaded.draft, "runtime", None)) and b > LLAMACPP_MAX_ROWS:
        raise ValueError(f"llama.cpp runs at most {LLAMACPP_MAX_ROWS} rows at once, got a batch size of {b}")
    if drafter not in BATCH_DRAFTERS:
        raise ValueError(f"unknown drafter {drafter!r}; choose {', '.join(BATCH_DRAFTERS)}")
    if drafter == "model" and loaded.draft is None:
        raise ValueError("this pair has no draft model: load one, or draft with 'ngram' or 'suffix'")
    name, k_given = resolve_batch_policy(policy, k)
    budgets = [int(max_new_tokens)] * len(prompts) if isinstance(max_new_tokens, int) else [int(n) for n in max_new_tokens]
    if len(budgets) != len(prompts):
        raise ValueError(f"got {len(budgets)} budgets for {len(prompts)} prompts")
    for ids, n in zip(prompts, budgets, strict=True):
        _check_inputs(ids, n, loaded.target.backend.max_length)
    rows = min(b, len(prompts))
    if name == "cost":
        k_max = k_given if k_given is not None else batch_k_max(rows, min(
            m.backend.max_length for m in (loaded.target, loaded.draft if drafter == "model" else None) if m))
    else:
        k_max = k_given
    target, model_drafter = batched_pair(loaded if drafter == "model" else _target_only(loaded), rows)
    curve = None
    if name == "cost" or drafter == "suffix":
        if costs is None:
            if cost_key is None:
                raise ValueError("the batch cost policy needs measured costs or a cost_key to cache them under")
            costs = batch_costs(loaded, cost_key, rows=rows, max_n=rows * (k_max + 1),
                                with_draft=drafter == "model", refresh=refresh_costs, progress=progress)
        curve = CostCurve.from_costs(costs)
    if drafter == "model":
        the_drafter = model_drafter
    elif drafter == "ngram":
        the_drafter = PerRowDrafters(PromptLookupDrafter)
    else:
        from specdec.drafters.suffix import SuffixDrafter

        row_cost = _RowCost(curve, rows)
        the_drafter = PerRowDrafters(lambda: SuffixDrafter(row_cost))
    if name == "cost":
        draft_cost = (lambda n_rows, kk: kk * curve.draft_forward(n_rows)) if drafter == "model" else None
        the_policy = BatchCostPolicy(curve.forward_s, max_k=k_max, draft_cost=draft_cost)
    else:
        the_policy = FixedBatchK(k_max)
    results: list[GenerationResult] = []
    batch_of: list[int] = []
    run = BatchRun(results, batch_of, policy=name, k=k_max, drafter=drafter, batch_size=b)
    for start in range(0, len(prompts), rows):
        idx = list(range(start, min(start + rows, len(prompts))))
        t0 = time.perf_counter()
        out = generate_batch(target, [prompts[i] for i in idx], [budgets[i] for i in idx], drafter=the_drafter,
                             policy=the_policy, sampling=sampling or SamplingParams(), eos_ids=loaded.eos_ids,
                             vocab_size=loaded.vocab_size, seed=[int(seed) + i for i in idx])
        wall = time.perf_counter() - t0
        results.extend(out)
        batch_of.extend([len(run.batches)] * len(idx))
        tokens = sum(r.num_tokens for r in out)
        run.batches.append({"index": len(run.batches), "rows": len(idx), "tokens": tokens, "wall_s": wall,
                            "tokens_per_s": _rate(tokens, wall)})
    return run


def _target_only(loaded):
    from specdec.runtimes.loading import LoadedPair

    return LoadedPair(loaded.target, None, loaded.vocab_size, loaded.eos_ids)


def _clean(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def row_figures(result: GenerationResult) -> dict[str, Any]:
    """The per-row figures the table and the JSON share: tokens, acceptance rate (accepted / drafted),
    tokens per target forward (block efficiency), tokens/s (new tokens over the seconds from the batch's
    start to the row's end), TTFT; NaN -> None."""
    return {"num_tokens": result.num_tokens, "finish_reason": result.finish_reason,
            "num_drafted": result.num_drafted, "num_accepted": result.num_accepted,
            "acceptance_rate": _clean(result.acceptance_rate), "block_efficiency": _clean(result.block_efficiency),
            "tokens_per_s": _clean(result.tokens_per_s), "ttft_s": result.ttft_s, "total_s": result.total_s,
            "num_rounds": result.num_rounds}


def batch_report(run: BatchRun, texts: Sequence[str], *, lines: Sequence[int] | None = None,
                 extra: dict | None = None) -> dict[str, Any]:
    """The JSON document of a batched run: settings, one entry per prompt (file order: its line, batch,
    prompt tokens, text, token ids, `row_figures`, the K of each of its rounds) and one per batch, and the
    aggregate tokens/s (all new tokens over the batches' summed wall time)."""
    rows = []
    for i, (r, text) in enumerate(zip(run.results, texts, strict=True)):
        rows.append({"index": i, **({"line": lines[i]} if lines is not None else {}), "batch": run.batch_of[i],
                     "prompt_tokens": len(r.prompt_ids), "text": text, "token_ids": list(r.token_ids),
                     **row_figures(r), "rounds_k": [x.k for x in r.rounds]})
    return {**(extra or {}), "batch_size": run.batch_size, "drafter": run.drafter, "policy": run.policy,
            "k": run.k, "num_prompts": len(rows), "total_tokens": run.total_tokens, "wall_s": run.wall_s,
            "aggregate_tokens_per_s": _clean(run.tokens_per_s), "batches": run.batches, "rows": rows}


def _fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def print_batch(report: dict[str, Any], *, file=None, runtime: str = "") -> None:
    """Each prompt's text in file order (under a ``### prompt i`` line), then one table of the per-row figures
    and a line with the aggregate tokens/s."""
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    for row in report["rows"]:
        where = f" (line {row['line']})" if "line" in row else ""
        print(f"### prompt {row['index'] + 1}{where}", file=out)
        print(row["text"], file=out)
    table = Table(title=f"{report['num_prompts']} prompts, batches of {report['batch_size']}, drafter "
                        f"{report['drafter']}, {report['policy']} K{'' if report['policy'] == 'fixed' else ' <='} "
                        f"{report['k']}")
    for col in ("#", "batch", "prompt tok", "new tok", "finish", "acceptance", "tok/forward", "tok/s"):
        table.add_column(col, justify="left" if col == "finish" else "right", no_wrap=True)
    for row in report["rows"]:
        table.add_row(str(row["index"] + 1), str(row["batch"] + 1), str(row["prompt_tokens"]),
                      str(row["num_tokens"]), row["finish_reason"], _fmt(row["acceptance_rate"]),
                      _fmt(row["block_efficiency"]), _fmt(row["tokens_per_s"], 1))
    print(file=out)
    Console(file=out, width=max(100, Console(file=out).width), highlight=False).print(table)
    print(f"[{report['total_tokens']} tokens in {report['wall_s']:.3f} s, {len(report['batches'])} batch(es)] "
          f"aggregate {_fmt(report['aggregate_tokens_per_s'], 1)} tok/s"
          f"{'; ran ' + runtime if runtime else ''} (per-row tok/s: from its batch's start to its end)", file=out)


def cli_generate_batch(**opts) -> None:
    """``specdec generate --prompts-file F --batch-size B``: the options of `specdec.entrypoints.cli.generate`, checked
    here (every bad input a one-line error before any model loads or any file is written), then
    `run_batches`, the texts and the table (`print_batch`; on stderr with ``--json``, whose JSON object goes
    to stdout) and, with ``--out FILE``, the same JSON written to FILE (`specdec.paths.check_output`)."""
    from specdec import models
    from specdec.bench.prompts import encode_prompt
    from specdec.entrypoints.cli import _large_weights, _runtime_label, fail
    from specdec.measure.quick_costs import model_fingerprint
    from specdec.paths import check_output
    from specdec.runtimes.loading import load_pair
    from specdec.runtimes.precision import draft_quant_arg, resolve_dtype

    o = opts
    b = o["batch_size"]
    if o["prompt"] is not None and o["prompts_file"] is not None:
        fail("give either --prompt TEXT or --prompts-file FILE, not both")
    if b < 1:
        fail(f"--batch-size must be >= 1, got {b}")
    if o["prompts_file"] is None:
        fail("--batch-size and --out need --prompts-file FILE (one prompt runs with --prompt TEXT alone)")
    if "llamacpp" in (o["backend"], o["draft_backend"]) and b > LLAMACPP_MAX_ROWS:
        fail(f"--batch-size {b}: llama.cpp runs at most {LLAMACPP_MAX_ROWS} rows at once")
    if o["compile"]:
        fail("--compile: batched decoding runs the eager backend (a compiled static cache holds one sequence)")
    unsupported = [f for f, on in (("--baseline", o["baseline"]), ("--pad-verify", o["pad_verify"]),
                                   ("--other-tokenizer", o["other_tokenizer"])) if on]
    if unsupported:
        fail(f"{', '.join(unsupported)}: run one prompt at a time (--prompt), not with --prompts-file")
    try:
        policy, k = resolve_batch_policy(o["policy"], o["k"])
    except ValueError as exc:
        fail(str(exc).replace("policy ", "--policy ", 1).replace("K must", "--k must"))
    if o["drafter"] not in BATCH_DRAFTERS:
        fail(f"unknown --drafter {o['drafter']!r}; choose model, ngram or suffix")
    if o["max_new_tokens"] < 0:
        fail("--max-new-tokens must be >= 0")
    if o["threads"] is not None and o["threads"] < 1:
        fail(f"--threads must be >= 1, got {o['threads']}")
    gguf_type = o.get("gguf_type")
    if gguf_type is not None:
        from specdec.models.requant import check_gguf_type

        if o["backend"] != "llamacpp":
            fail("--gguf-type applies to the llama.cpp backend only (add --backend llamacpp)")
        try:
            gguf_type = check_gguf_type(gguf_type)
        except ValueError as exc:
            fail(str(exc))
    sampling = SamplingParams(temperature=o["temperature"], top_k=o["top_k"], top_p=o["top_p"])
    out_path = None
    if o["out"] is not None:
        try:
            out_path = check_output(o["out"], inputs=[o["prompts_file"]], force=o["force"], flag="--out")
        except ValueError as exc:
            fail(str(exc))
    try:
        entries = read_prompts_file(o["prompts_file"])
    except ValueError as exc:
        fail(str(exc))
    drafter, backend = o["drafter"], o["backend"]
    dtype = resolve_dtype(o["dtype"], o["device"])
    target, draft = o["target"], o["draft"]
    if drafter != "model" and target and not draft and not o["pair"]:
        target_spec, draft_spec = target, None
    else:
        target_spec, draft_spec = models.resolve_pair(o["pair"], target, draft)
    draft_spec = draft_spec if drafter == "model" else None
    slow = any(_large_weights(s) for s in (target_spec, draft_spec) if s)
    if slow:
        models.progress(f"loading {target_spec}{' and ' + draft_spec if draft_spec else ''} "
                        f"({_runtime_label(backend, dtype, o['quant'])}) ...")
    loaded = load_pair(target_spec, draft_spec, backend=backend, draft_backend=o["draft_backend"],
                       device=o["device"], dtype=dtype, threads=o["threads"], compile=False,
                       trust_remote_code=o["trust_remote_code"], quant=o["quant"], draft_dtype=o["draft_dtype"],
                       draft_quant=draft_quant_arg(o["draft_quant"]),
                       **({"gguf_type": gguf_type} if gguf_type is not None else {}))
    if drafter == "model" and loaded.info.get("vocab_overlap") is not None:
        fail("a draft with another tokenizer drafts one prompt at a time (--prompt); with --prompts-file use "
             "--drafter ngram or suffix, or a draft that shares the target's tokenizer")
    tok = loaded.tokenizer
    ids = [encode_prompt(tok, e.text, chat_template=o["chat_template"]) for e in entries]
    budgets = [o["max_new_tokens"] if e.max_new_tokens is None else e.max_new_tokens for e in entries]
    limit = loaded.target.backend.max_length
    for e, p, n in zip(entries, ids, budgets, strict=True):
        if len(p) + n > limit:
            fail(f"--prompts-file {o['prompts_file']}, line {e.line}: prompt ({len(p)} tokens) + max_new_tokens ({n}) exceeds the "
                 f"target's context of {limit} tokens")
    cost_key = {"target": model_fingerprint(target_spec), "draft": model_fingerprint(draft_spec),
                "backend": backend, "draft_backend": o["draft_backend"], "device": o["device"], "dtype": dtype,
                "threads": o["threads"], "compile": False,
                **{n: o[n] for n in ("quant", "draft_dtype", "draft_quant") if o[n] is not None},
                **({"gguf_type": gguf_type} if gguf_type is not None else {})}
    try:
        run = run_batches(loaded, ids, budgets, batch_size=b, drafter=drafter, policy=policy, k=k,
                          sampling=sampling, seed=o["seed"], cost_key=cost_key,
                          refresh_costs=o["remeasure_costs"], progress=models.progress)
    except ValueError as exc:
        if "context is too short" in str(exc):
            fail(f"the batch cost policy cannot time these models: {exc}; give --k")
        raise
    texts = [tok.decode(r.token_ids, skip_special_tokens=True) for r in run.results]
    report = batch_report(run, texts, lines=[e.line for e in entries], extra={
        "prompts_file": str(o["prompts_file"]), "backend": backend, "dtype": loaded.target.dtype,
        "temperature": o["temperature"], "seed": o["seed"]})
    runtime = _runtime_label(backend, loaded.target.dtype, o["quant"])
    print_batch(report, file=sys.stderr if o["as_json"] else sys.stdout, runtime=runtime)
    doc = json.dumps(report)
    if out_path is not None:
        out_path.write_text(doc + "\n")
    if o["as_json"]:
        print(doc)
