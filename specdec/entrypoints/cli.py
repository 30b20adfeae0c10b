"""The `specdec` command line: generate, models, sweep, costs, export, report.

Every command takes a model pair as ``--pair NAME`` (a preset; default ``qwen2.5-coder``) or
``--target T --draft D`` (hub ids, local checkpoint dirs or .gguf files). Bad input prints one line on
stderr and exits with status 2; nothing is lost (a sweep resumes with ``--resume``).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from specdec.errors import one_line, user_errors
from specdec.options import (  # the shared option declarations
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


def _drafts_with_model(name: str) -> bool:
    """Whether drafter `name` drafts with the draft model (False for a model-free or unknown one)."""
    from specdec.catalogue.drafters import drafter

    try:
        return drafter(name).needs_model
    except ValueError:
        return False


def _drafter_help() -> str:
    from specdec.catalogue.drafters import DRAFTERS

    return "; ".join(f"{n}: {e.help}" for n, e in DRAFTERS.items()) + " (default: draft)."


def _policy_help() -> str:
    from specdec.catalogue.policies import POLICIES

    return ("; ".join(f"{n}: {e.help}" for n, e in POLICIES.items())
            + ". Default: fixed when --k is given, else cost (K chosen per round).")


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Option("--prompt", help="Text to continue (or --prompts-file).")] = None,
    pair: PairOpt = None,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    k: Annotated[int | None, typer.Option("--k", help="K: draft tokens per round (fixed), or the largest K an "
                                          "adaptive policy may ask for (the heuristic's starting K). Default: 4 "
                                          "fixed/heuristic, 16 otherwise.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens")] = 128,
    drafter: Annotated[str, typer.Option("--drafter", help=_drafter_help())] = "draft",
    policy: Annotated[str | None, typer.Option("--policy", help=_policy_help())] = None,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k")] = 0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    chat_template: Annotated[bool, typer.Option("--chat-template", help="Wrap the prompt in the chat template.")] = False,
    baseline: Annotated[bool, typer.Option("--baseline", help="Also run target-only decoding of the same prompts "
                                           "and compare: speedup, and where greedy output first differs.")] = False,
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
        "--prompts-file", help="Many prompts instead of --prompt, read as `specdec sweep --prompts` reads them: "
        "JSON Lines (one object per line with a \"prompt\" string and optionally \"max_new_tokens\"), a JSON "
        "array of such objects, or plain text with one prompt per blank-line-separated block. Prints each "
        "text in file order, then a table of per-row figures.")] = None,
    batch_size: Annotated[int | None, typer.Option(
        "--batch-size", help="With --prompts-file: decode this many prompts at once (in file order; the last "
        "batch may be smaller), each row with its own accepted length. Eager backends only. Default: 1.")] = None,
    out: Annotated[str | None, typer.Option("--out", help="Also write the JSON document to this file.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out file.")] = False,
    gguf_type: GGUFTypeOpt = None,
) -> None:
    """Generate from one prompt (or, with --prompts-file, many, --batch-size at a time) with speculative
    decoding and print the text and its statistics.

    The settings are checked before any model loads (`specdec.entrypoints.generation.check_settings`), the
    pair is loaded by `specdec.entrypoints.api.load_pair` and the generation assembled and run by
    `specdec.entrypoints.generation.run`, the code the Python API runs. The default dtype is
    `specdec.runtimes.precision.default_dtype` (``--dtype auto``); the statistics name what ran."""
    from specdec import models
    from specdec.catalogue.drafters import drafter as drafter_entry
    from specdec.entrypoints import api, output
    from specdec.entrypoints import generation as g
    from specdec.runtimes.loading import RUNTIMES

    for flag, runtime in (("--backend", backend), ("--draft-backend", draft_backend)):
        if runtime is not None and runtime not in RUNTIMES:  # before any model loads or a progress line
            fail(f"unknown {flag} {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    if (prompt is None) == (prompts_file is None):
        fail("give --prompt TEXT, or --prompts-file FILE for many prompts" if prompt is None
             else "give either --prompt TEXT or --prompts-file FILE, not both")
    if prompt is not None and batch_size not in (None, 1):
        fail("--batch-size needs --prompts-file FILE (one prompt runs with --prompt TEXT alone)")
    if threads is not None and threads < 1:
        fail(f"--threads must be >= 1, got {threads}")
    if prompt is not None and not prompt.strip():
        fail("the prompt is empty")
    if compile and prompts_file is not None:
        fail("--compile: batched decoding runs the eager backend (a compiled static cache holds one sequence)")
    if other_tokenizer and not _drafts_with_model(drafter):
        fail(f"--other-tokenizer needs a drafter that drafts with the draft model, not --drafter {drafter}")
    try:
        specs = models.resolve_pair(pair, target, draft) if (pair or draft or not target) else (target, None)
        other = other_tokenizer or (specs[1] is not None and models.other_tokenizer_pair(*specs))
        settings = g.check_settings(
            drafter=drafter, policy=policy, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, chat_template=chat_template, pad_verify=pad_verify,
            batch_size=batch_size, many=prompts_file is not None, remeasure_costs=remeasure_costs,
            other_tokenizer=other, backend=backend, spelling=g.FLAGS)
        out_path = None
        if out is not None:  # checked (and its folder made) before any model loads: output is never lost
            from specdec.paths import check_output

            out_path = check_output(out, inputs=[prompts_file] if prompts_file else [], force=force, flag="--out",
                                    create_parent=True)
        entries = None
        if prompts_file is not None:
            from specdec.prompts import read_prompts

            entries = read_prompts(prompts_file)
    except ValueError as exc:
        fail(str(exc))
    needs_draft = drafter_entry(settings.drafter).needs_model
    if specs[1] is None and needs_draft:
        fail(f"--drafter {settings.drafter} needs a draft model: give --draft or --pair, or a model-free drafter")
    the_pair = api.load_pair(pair, target=target, draft=draft, dtype=dtype, device=device, threads=threads,
                             backend=backend, draft_backend=draft_backend, draft_dtype=draft_dtype, quant=quant,
                             draft_quant=draft_quant, gguf_type=gguf_type, compile=compile, other_tokenizer=other,
                             with_draft=needs_draft, trust_remote_code=trust_remote_code, progress=models.progress)
    texts = [prompt] if entries is None else [e.text for e in entries]
    lines = None if entries is None else [f"{prompts_file}, {e.where}" for e in entries]
    if entries is not None:
        budgets = tuple(max_new_tokens if e.max_new_tokens is None else e.max_new_tokens for e in entries)
        settings = g.replace_budgets(settings, budgets)
    ids = g.encode_prompts(the_pair.loaded, texts, chat_template=chat_template)
    limit = the_pair.loaded.target.backend.max_length
    budgets = g.budgets_of(settings, len(ids))
    for i, (p, n) in enumerate(zip(ids, budgets, strict=True)):
        if len(p) + n > limit:
            where = f"{lines[i]}: " if lines else ""
            fail(f"{where}prompt ({len(p)} tokens) + max_new_tokens ({n}) exceeds the target's context of {limit} "
                 "tokens")
    run = g.run(the_pair, settings, ids, baseline=baseline, progress=models.progress)
    for note in run.notes:
        models.progress(note)
    tok = the_pair.loaded.tokenizer
    doc = output.report(run, [tok.decode(r.token_ids, skip_special_tokens=True) for r in run.results],
                        runtime=the_pair.runtime, lines=lines,
                        extra={"prompts_file": prompts_file, "temperature": temperature, "seed": seed})
    label = api.runtime_label(the_pair.runtime)
    show = sys.stderr if as_json else sys.stdout
    if entries is None:
        output.print_single(doc, label=label, file=show)
    else:
        output.print_batch(doc, label=label, file=show)
    text = json.dumps(doc)
    if out_path is not None:
        out_path.write_text(text + "\n")
    if as_json:
        print(text)


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
    except (*user_errors(), OSError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        print("specdec: interrupted; a sweep resumes with --resume", file=sys.stderr)
        raise SystemExit(130) from None
