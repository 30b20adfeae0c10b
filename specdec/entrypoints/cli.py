"""The `specdec` command line: generate, models, sweep, costs, export, report.

Every command takes a model pair as ``--pair NAME`` (a preset; default ``qwen2.5-coder``) or
``--target T --draft D`` (hub ids, local checkpoint dirs or .gguf files). Bad input prints one line on
stderr and exits with status 2; nothing is lost (a sweep resumes with ``--resume``).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Annotated

import typer

from specdec.entrypoints.options import (  # the shared option declarations
    BackendOpt,
    CompileOpt,
    DeviceOpt,
    DraftBackendOpt,
    DraftDtypeOpt,
    DraftOpt,
    DraftQuantOpt,
    DtypeOpt,
    GGUFTypeOpt,
    PairOpt,
    QuantOpt,
    RemoteOpt,
    TargetOpt,
    ThreadsOpt,
)
from specdec.errors import one_line

app = typer.Typer(
    help="Speculative decoding, implemented exactly and measured against target-only decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)



def fail(message: str) -> None:
    """Print one line on stderr and exit with status 2."""
    print(f"specdec: error: {one_line(message)}", file=sys.stderr)
    raise SystemExit(2)


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Option("--prompt", help="Text to continue (or --prompts-file).")] = None,
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    k: Annotated[int | None, typer.Option("--k", help="K: draft tokens per round (fixed), or the largest K an "
                                          "adaptive policy may ask for (the heuristic's starting K). Default: 4 fixed/heuristic, 16 otherwise.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens")] = 128,
    drafter: Annotated[str, typer.Option("--drafter", help="model | ngram (prompt lookup) | suffix (longest earlier repeat, cost-aware length).")] = "model",
    policy: Annotated[str | None, typer.Option("--policy", help="fixed | heuristic | confidence | cost. Default: "
                                               "fixed when --k is given, else cost (K chosen per round).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k")] = 0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    chat_template: Annotated[bool, typer.Option("--chat-template", help="Wrap the prompt in the chat template.")] = False,
    baseline: Annotated[bool, typer.Option("--baseline", help="Also run target-only decoding and compare.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout (the text and the "
                                          "statistics go to stderr).")] = False,
    backend: BackendOpt = "transformers",
    draft_backend: DraftBackendOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "auto",
    threads: ThreadsOpt = None,
    compile: CompileOpt = False,
    trust_remote_code: RemoteOpt = False,
    quant: QuantOpt = None,
    draft_dtype: DraftDtypeOpt = None,
    draft_quant: DraftQuantOpt = None,
    pad_verify: Annotated[bool, typer.Option(
        "--pad-verify", help="Pad each verification forward to the cheapest shape on the target's measured "
        "cost curve (the full 1..17-token curve; measured now when not cached); the cost policy prices "
        "K with the padded cost; --baseline pads its target-only steps by the same curve.")] = False,
    other_tokenizer: Annotated[bool, typer.Option(
        "--other-tokenizer", help="The draft model has another tokenizer: draft text, verify target ids "
        "(string-level exact match when greedy, token-level intersection when sampling). K fixed by default.")] = False,
    remeasure_costs: Annotated[bool, typer.Option(
        "--remeasure-costs", help="Time the cost policy's forward shapes again instead of reusing the "
        "measurement cached for this machine, models, dtype and threads (a few seconds).")] = False,
    prompts_file: Annotated[str | None, typer.Option(
        "--prompts-file", help="Many prompts instead of --prompt: a .jsonl file (one object per line with a "
        "\"prompt\" string and optionally \"max_new_tokens\") or a text file with one prompt per line (blank "
        "lines skipped). Prints each text in file order, then a table of per-row figures.")] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="With --prompts-file: decode this many prompts at once (in file order; the last "
        "batch may be smaller), each row with its own accepted length. Eager backends only.")] = 1,
    out: Annotated[str | None, typer.Option("--out", help="With --prompts-file: also write the JSON of the "
                                            "per-row figures to this file.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out file.")] = False,
    gguf_type: GGUFTypeOpt = None,
) -> None:
    """Generate from one prompt (or, with --prompts-file, many, --batch-size at a time) with speculative
    decoding and print the text and its statistics.

    The default dtype is `specdec.runtimes.precision.default_dtype` (``--dtype auto``); the statistics name the dtype
    that ran. On a first run the default pair's GGUFs are assembled and converted in that dtype (a progress
    line on stderr for each step). With ``--prompts-file``: `specdec.entrypoints.batch_generate.cli_generate_batch`."""
    from specdec.runtimes.loading import RUNTIMES

    for flag, runtime in (("--backend", backend), ("--draft-backend", draft_backend)):
        if runtime is not None and runtime not in RUNTIMES:  # before any model loads or a progress line
            fail(f"unknown {flag} {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if prompts_file is not None or batch_size != 1 or out is not None or prompt is None:
        if prompt is None and prompts_file is None:
            fail("give --prompt TEXT, or --prompts-file FILE for many prompts")
        from specdec.entrypoints.batch_generate import cli_generate_batch

        return cli_generate_batch(**{n: v for n, v in locals().items() if n != "cli_generate_batch"})
    import time

    from specdec import models
    from specdec.bench.prompts import encode_prompt
    from specdec.drafters.model import ModelDrafter
    from specdec.drafters.ngram import PromptLookupDrafter
    from specdec.engine.decoding import autoregressive_generate, speculative_generate
    from specdec.engine.sampling import SamplingParams
    from specdec.runtimes.loading import load_pair
    from specdec.runtimes.precision import draft_quant_arg, resolve_dtype

    # A preset whose draft has another tokenizer (qwen2.5-coder+smollm2) drafts text without the flag.
    if not other_tokenizer and drafter == "model":
        try:
            other_tokenizer = models.other_tokenizer_pair(*models.resolve_pair(pair, target, draft))
        except ValueError:
            pass  # reported below, where the pair is resolved for loading
    # Validate everything cheap before any model loads.
    if other_tokenizer and ((policy or "").strip().lower() == "cost" or drafter != "model" or pad_verify):
        fail("--other-tokenizer needs --drafter model, and neither --policy cost nor --pad-verify (their cost "
             "measurement assumes one vocabulary)")
    policy, k = default_policy(policy or ("fixed" if other_tokenizer else None), k)
    from specdec.policies.base import POLICY_NAMES

    if policy not in POLICY_NAMES:
        fail(f"unknown --policy {policy!r}; choose one of: {', '.join(POLICY_NAMES)}")
    if k < 1:
        fail(f"--k must be >= 1, got {k}")
    if not prompt.strip():
        fail("the prompt is empty")
    if drafter not in ("model", "ngram", "suffix"):
        fail(f"unknown --drafter {drafter!r}; choose model, ngram or suffix")
    if max_new_tokens < 0:
        fail("--max-new-tokens must be >= 0")
    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    if gguf_type is not None:
        from specdec.models.requant import check_gguf_type

        if backend != "llamacpp":
            fail("--gguf-type applies to the llama.cpp backend only (add --backend llamacpp)")
        try:
            gguf_type = check_gguf_type(gguf_type)
        except ValueError as exc:
            fail(str(exc))
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    dtype = resolve_dtype(dtype, device)  # "auto": one rule, `specdec.runtimes.precision.default_dtype`
    if drafter != "model" and target and not draft and not pair:
        target_spec, draft_spec = target, None  # prompt lookup needs no draft model
    else:
        target_spec, draft_spec = models.resolve_pair(pair, target, draft)
    t_load = time.perf_counter()
    names = target_spec + (f" and {draft_spec}" if draft_spec and drafter == "model" else "")
    # a progress line for a load that takes seconds; a small local checkpoint loads silently, so that bad
    # input found after loading (a prompt too long for the context) is still the only line on stderr
    slow_load = any(_large_weights(s) for s in (target_spec, draft_spec) if s)
    if slow_load:
        models.progress(f"loading {names} ({_runtime_label(backend, dtype, quant, gguf_type)}) ...")
    loaded = load_pair(
        target_spec,
        draft_spec if drafter == "model" else None,
        backend=backend,
        draft_backend=draft_backend,
        device=device,
        dtype=dtype,
        threads=threads,
        compile=compile,
        trust_remote_code=trust_remote_code,
        quant=quant,
        draft_dtype=draft_dtype,
        draft_quant=draft_quant_arg(draft_quant),
        other_tokenizer=other_tokenizer,
        **({"gguf_type": gguf_type} if gguf_type is not None else {}),
    )
    if slow_load:
        models.progress(f"loaded in {time.perf_counter() - t_load:.1f} s")
    tok = loaded.tokenizer
    prompt_ids = encode_prompt(tok, prompt, chat_template=chat_template)
    the_drafter = ModelDrafter(loaded.draft.backend, loaded.vocab_size) if drafter == "model" else PromptLookupDrafter()
    if other_tokenizer:
        from specdec.drafters.xtok import cross_tokenizer_drafter

        the_drafter = cross_tokenizer_drafter(loaded, sampling)
    from specdec.engine.decoding import _check_inputs

    _check_inputs(prompt_ids, max_new_tokens, loaded.target.backend.max_length)  # before measuring costs
    cost_key = {"target": target_spec, "draft": draft_spec if drafter == "model" else None, "backend": backend,
                "draft_backend": draft_backend, "device": device, "dtype": dtype, "threads": threads,
                "compile": compile,
                # only when set, so that the costs cached for full-precision setups keep their keys
                **{n: v for n, v in (("quant", quant), ("draft_dtype", draft_dtype), ("draft_quant", draft_quant),
                                     ("gguf_type", gguf_type)) if v is not None}}
    costs, pad_to = (pad_costs(loaded, cost_key, k) if pad_verify else (None, None))
    if (policy == "cost" or drafter == "suffix") and costs is None:
        costs = quick_policy_costs(loaded, cost_key, k, refresh=remeasure_costs)
    if drafter == "suffix":  # drafts as long as its match and the measured verification costs say it pays
        from specdec.drafters.suffix import SuffixDrafter
        from specdec.measure.costs import CostCurve

        the_drafter = SuffixDrafter(CostCurve.from_costs(costs))
    the_policy = build_policy(policy, k, loaded, the_drafter, costs=costs, cost_key=cost_key, pad_verify=pad_verify)
    common = {"sampling": sampling, "eos_ids": loaded.eos_ids, "vocab_size": loaded.vocab_size, "seed": seed}
    if baseline:  # warm both paths up once so that neither timed run pays first-call costs
        warm = min(8, max_new_tokens)
        speculative_generate(loaded.target.backend, the_drafter, prompt_ids, warm, policy=the_policy,
                             pad_to=pad_to, **common)
        autoregressive_generate(loaded.target.backend, prompt_ids, warm, pad_to=pad_to, **common)
    result = speculative_generate(loaded.target.backend, the_drafter, prompt_ids, max_new_tokens, policy=the_policy,
                                  pad_to=pad_to, **common)
    text = tok.decode(result.token_ids, skip_special_tokens=True)
    out = result.summary()
    out.update(text=text, k=k, drafter=drafter, policy=policy, prompt_tokens=len(prompt_ids), backend=backend,
               dtype=loaded.target.dtype, gguf_type=gguf_type,
               draft_dtype=loaded.draft.dtype if loaded.draft is not None else None, quant=quant)
    out["rounds_k"] = [r.k for r in result.rounds]
    out["rounds_alpha"] = [r.alpha_estimate for r in result.rounds]  # None for fixed K
    out["pad_verify"] = pad_verify
    if pad_verify:
        out["rounds_n_forward"] = [r.n_forward for r in result.rounds]  # tokens in each target forward
    if baseline:
        # with --pad-verify the baseline pads its 1-token steps by the same curve: where a 2-token forward is
        # cheaper (bf16 on some CPUs), plain target-only would be an unfairly slow baseline
        base = autoregressive_generate(loaded.target.backend, prompt_ids, max_new_tokens, pad_to=pad_to,
                                       **common)
        out["baseline_token_ids"] = base.token_ids
        base_tps, spec_tps = _rate(base.tokens_per_s), _rate(result.tokens_per_s)
        out["baseline_tokens_per_s"] = base_tps  # None (JSON null), never NaN, when nothing was generated
        out["speedup"] = spec_tps / base_tps if spec_tps and base_tps else None
        out["identical_to_baseline"] = base.token_ids == result.token_ids
        if sampling.greedy and not out["identical_to_baseline"]:
            # Exact in fp32; in half precision the kernels that score 1 and K+1 tokens round differently
            # and can flip a near-tie: report where, with the target's top-2 logit margin there, never
            # silently.
            from specdec.runtimes.compiled import first_divergence, next_token_logits

            out["divergence"] = first_divergence(
                base.token_ids, result.token_ids,
                lambda seq: next_token_logits(loaded.target.backend, seq)[: loaded.vocab_size],
                prompt=prompt_ids,
            )
    print(text, file=sys.stderr if as_json else sys.stdout)  # with --json stdout is the JSON object alone
    print(
        f"\n[{result.num_tokens} tokens, {result.finish_reason}] {_fmt(result.tokens_per_s)} tok/s, "
        f"TTFT {result.ttft_s:.3f} s, rounds {result.num_rounds}, acceptance {_fmt(result.acceptance_rate)}, "
        f"block efficiency {_fmt(result.block_efficiency)}; ran "
        f"{_runtime_label(backend, loaded.target.dtype, quant, gguf_type)}",
        file=sys.stderr if as_json else sys.stdout,
    )
    if result.policy_note:  # e.g. the cost policy ran target-only because no K pays on this configuration
        drafted = sum(1 for r in result.rounds if r.k > 0)
        print(f"{policy} policy: {result.policy_note}; drafted in {drafted} of {result.num_rounds} rounds",
              file=sys.stderr if as_json else sys.stdout)
    if pad_verify:
        padded = sum(1 for r in result.rounds if r.n_forward is not None and r.n_forward > r.k + 1)
        print(f"verification padded in {padded} of {result.num_rounds} rounds "
              f"({sum(r.n_forward - r.k - 1 for r in result.rounds)} filler tokens)",
              file=sys.stderr if as_json else sys.stdout)
    if baseline:
        same = "identical" if out["identical_to_baseline"] else "DIFFERENT"
        print(
            f"baseline {_fmt(out['baseline_tokens_per_s'])} tok/s; speedup {_fmt(out['speedup'])}x; "
            f"outputs {same}",
            file=sys.stderr if as_json else sys.stdout,
        )
        div = out.get("divergence")
        if div:
            print(divergence_line(div, loaded.target.dtype), file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(out))


def _runtime_label(backend: str, dtype: str | None, quant: str | None, gguf_type: str | None = None) -> str:
    """What ran, for the progress and statistics lines: ``transformers bfloat16``, ``llama.cpp GGUF``,
    ``llama.cpp GGUF requantized to Q4_0``."""
    if backend == "llamacpp":
        return "llama.cpp GGUF" + (f" requantized to {gguf_type}" if gguf_type else "")
    return f"{backend} {dtype}{' ' + quant if quant else ''}"


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


def divergence_line(div: dict, dtype: str | None) -> str:
    """The plain-words line `generate --baseline` prints when greedy speculative output differs from
    target-only decoding: where, the two tokens, the target's top-2 logit margin there, and what it means
    for the dtype that ran (a near-tie rounded differently by reduced-precision kernels, or, in float32,
    a difference that should not happen)."""
    where = (f"first difference at new token {div['step']}: baseline {div['eager_token']}, speculative "
             f"{div['compiled_token']}; target top-2 logit margin there {div['margin']:.4g}")
    if dtype in ("bfloat16", "float16"):
        return (f"{where}. In {dtype} the kernels that score 1 token and K+1 tokens round differently, so a "
                "near-tie can flip; the algorithm is exact, and --dtype float32 gives token-identical output")
    if dtype is None:  # llama.cpp: quantized kernels whose rounding depends on the batch size
        return (f"{where}. llama.cpp scores 1 token and K+1 tokens with kernels that round differently, so a "
                "near-tie can flip; the transformers backend in --dtype float32 gives token-identical output")
    return f"{where}. In {dtype} this is unexpected: please report it"


def quick_policy_costs(loaded, cost_key: dict, k: int, *, refresh: bool = False) -> dict:
    """The cost policy's costs for `generate` (`specdec.measure.quick_costs.cached_quick_costs`: the target at a
    handful of shapes up to K + 1 tokens and the draft step, seconds; cached per machine, model files,
    dtype and threads, measured again with `refresh`). A progress line goes to stderr before a measurement
    and a note after. Fails in one line when the models cannot be timed."""
    from specdec.measure.quick_costs import cached_quick_costs, model_fingerprint
    from specdec.models import progress

    key = {**cost_key, "target": model_fingerprint(cost_key.get("target")),
           "draft": model_fingerprint(cost_key.get("draft"))}
    measuring = []

    def measure(pair, **kw):
        from specdec.measure.quick_costs import quick_measure

        measuring.append(True)
        progress(f"measuring the cost policy's forward costs (K + 1 up to {kw['max_n']} tokens; once per "
                 "machine, models, dtype and threads) ...")
        return quick_measure(pair, **kw)

    try:
        costs, note = cached_quick_costs(loaded, key, max_n=k + 1, refresh=refresh, measure=measure)
    except ValueError as exc:
        fail(f"the cost policy cannot time these models: {exc}")
    progress(note)
    return costs


def _rate(x: float | None) -> float | None:
    """A tokens/s figure, or None where it is missing, zero or not finite (no tokens generated)."""
    return x if x and math.isfinite(x) else None


def _fmt(x) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def default_policy(policy: str | None, k: int | None) -> tuple[str, int]:
    """``(policy, K)`` for `generate` from its options: ``--k`` alone keeps a fixed K; neither option gives the
    `cost` policy (measured within 10% of the best fixed K per prompt type and never 5% below target-only
    on the default pair) with K <= 16; a policy alone gets K = 4 (fixed, heuristic) or 16 (confidence,
    cost). The same rule as the Python API's `specdec.generate`."""
    from specdec.entrypoints.api import _default_policy

    return _default_policy(policy, k)


def pad_costs(loaded, cost_key: dict, k: int):
    """``(costs, pad_to)`` for ``generate --pad-verify``: the measured costs of this setup
    (`specdec.bench.costs.cached_costs`, target forwards of n = 1 .. max(K + 1, 17) tokens, so that a
    verification can be padded to any shape the sweep measures) and ``CostCurve.padded_n`` of their curve.
    Fails in one line when no costs can be had."""
    from specdec.bench.costs import cached_costs
    from specdec.measure.costs import CostCurve

    try:
        costs, note = cached_costs(loaded, cost_key, max_n=max(k + 1, 17))
        curve = CostCurve.from_costs(costs)
    except ValueError as exc:
        fail(f"--pad-verify needs the target's measured cost curve and none is available: {exc}")
    print(f"specdec: {note}", file=sys.stderr)
    return costs, curve.padded_n


def build_policy(name: str, k: int, loaded, drafter, costs: dict | None = None, cost_key: dict | None = None,
                 pad_verify: bool = False):
    """The K policy for a run. `cost` without `costs` takes them from `specdec.bench.costs.cached_costs` under
    `cost_key` (an earlier measurement of the same setup on this machine, or a new one: 3 target samples per
    n, 9 draft samples; a note goes to stderr). `pad_verify`: the cost policy prices verification at the
    padded shape (`specdec.policies.cost.CostPolicy`).

    Raises:
        ValueError: unknown policy, or ``cost`` with neither `costs` nor `cost_key`.
    """
    from specdec.policies import base as policies

    if name == "fixed":
        return policies.FixedK(k)
    if name == "cost" and costs is None:
        from specdec.bench.costs import cached_costs

        if cost_key is None:
            raise ValueError("the cost policy needs measured costs or a cost_key to find or store them under")
        costs, note = cached_costs(loaded, cost_key, max_n=k + 1)
        print(f"specdec: {note}", file=sys.stderr)
    if name == "cost" and getattr(drafter, "name", "") != "model":
        costs = {**costs, "draft_step_s": 0.0}  # prompt lookup drafts for free (no model step)
    return policies.make_policy(name, k, costs=costs, pad_verify=pad_verify)


@app.command("models")
def models_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON list of presets (for scripts).")] = False,
) -> None:
    """List the model presets: draft/target, sizes, where the weights are, whether available offline now.

    On a terminal: a table whose long cells fold onto further lines (preset names never wrap or get cut).
    Piped or redirected: one tab-separated line per preset under a header line, nothing cut, so
    ``specdec models | grep qwen2.5-coder`` finds the row. ``--json`` prints every field.
    """
    from specdec.models import list_presets

    rows = list_presets()
    if as_json:
        print(json.dumps(rows, default=str))
        return
    header = ("preset", "draft -> target", "params", "offline now", "disk", "weights")
    cells = [
        (
            r["name"] + (" (default)" if r.get("default") else "")
            + (" (other tokenizer)" if r.get("other_tokenizer") else ""),
            f"{r['draft']} -> {r['target']}",
            f"{_human(r.get('draft_params'))} -> {_human(r.get('target_params'))}",
            "yes" if r.get("available_offline_now") else "no",
            f"{(r.get('disk_bytes') or 0) / 1e9:.2f} GB",
            str(r.get("weights", "")),
        )
        for r in rows
    ]
    if not sys.stdout.isatty():
        for line in (header, *cells):
            print("\t".join(line))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="specdec model presets")
    for i, col in enumerate(header):
        if i == 0:  # the preset name is what users copy: never wrapped, never cut
            table.add_column(col, no_wrap=True, min_width=max(len(c[0]) for c in cells) if cells else None)
        else:
            table.add_column(col, overflow="fold")
    for c in cells:
        table.add_row(*c)
    Console().print(table)


def _human(n) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _register_subcommands() -> None:
    from specdec.bench import commands as bench_commands
    from specdec.report import commands as report_commands

    bench_commands.register(app)
    report_commands.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `specdec` console script: known errors become one stderr line and exit 2."""
    import os

    from specdec.models import ChunkAssemblyError, ModelNotAvailableError
    from specdec.runtimes.base import BackendError

    # Library progress bars ("Loading weights") would break the one-line error contract on stderr.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    try:
        _register_subcommands()
        app(args=argv, standalone_mode=True)
    except SystemExit:
        raise
    except (ValueError, ModelNotAvailableError, ChunkAssemblyError, BackendError, FileNotFoundError, OSError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        print("specdec: interrupted; a sweep resumes with --resume", file=sys.stderr)
        raise SystemExit(130) from None
