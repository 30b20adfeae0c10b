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

from specdec.catalogue.drafters import DEFAULT_DRAFTER
from specdec.errors import one_line, user_errors

app = typer.Typer(
    help="Speculative decoding, implemented exactly and measured against target-only decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)



GENERATE_DOC = """Generate from one prompt (or, with --prompts-file, many, --batch-size at a time) with speculative
decoding and print the text and its statistics."""


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

    return "; ".join(f"{n}{''.join(f' (alias {a})' for a in e.aliases[:1])}: {e.help}" for n, e in DRAFTERS.items()) + "."


def _policy_help() -> str:
    from specdec.catalogue.policies import POLICIES

    return ("; ".join(f"{n}: {e.help}" for n, e in POLICIES.items())
            + ". Default: fixed when --k is given, else cost (K chosen per round).")


def _k_help() -> str:
    from specdec.catalogue.policies import POLICIES

    return ("K: draft tokens per round (fixed), or the largest K an adaptive policy may ask for (the heuristic's "
            "starting K); a drafter that sets its own length (suffix, mixed) takes it as its cap. Default: "
            + ", ".join(f"{n} {e.default_k}" for n, e in POLICIES.items())
            + " (a batch's cost policy at most 16, fewer for wide batches).")


def _generate_settings() -> tuple:
    """``specdec generate``'s options, each declared once (`specdec.bench.settings.Setting`; the options every
    command shares take their names and help from `specdec.options.SHARED_OPTIONS`)."""
    from specdec.bench.settings import (
        PANEL_MODELS,
        PANEL_PLAN,
        PANEL_RUNTIME,
        PANEL_SAMPLING,
        PANEL_STORE,
        Setting,
    )  # fmt: skip

    def flag(name, help, panel=PANEL_PLAN):
        return Setting(name, False, help, panel, bool, (f"--{name.replace('_', '-')}",))

    return (
        Setting("pair", None, None, PANEL_MODELS), Setting("target", None, None, PANEL_MODELS),
        Setting("draft", None, None, PANEL_MODELS),
        flag("other_tokenizer", "The draft model has another tokenizer: draft text, verify target ids (string-level "
             "exact match when greedy, token-level intersection when sampling). K fixed by default.", PANEL_MODELS),
        Setting("prompt", None, "Text to continue (or --prompts-file).", PANEL_PLAN),
        Setting("prompts_file", None, "Many prompts instead of --prompt, read as `specdec sweep --prompts` reads "
                "them: JSON Lines (one object per line with a \"prompt\" string and optionally \"max_new_tokens\"), "
                "a JSON array of such objects, or plain text with one prompt per blank-line-separated block.",
                PANEL_PLAN),
        Setting("batch_size", None, "With --prompts-file: decode this many prompts at once (in file order; the "
                "last batch may be smaller), each row with its own accepted length. Eager backends only; 1 when "
                "not given.", PANEL_PLAN, int),
        Setting("max_new_tokens", 128, "New tokens per prompt.", PANEL_PLAN, int),
        Setting("drafter", DEFAULT_DRAFTER, _drafter_help(), PANEL_PLAN),
        Setting("policy", None, _policy_help(), PANEL_PLAN),
        Setting("k", None, _k_help(), PANEL_PLAN, int),
        flag("chat_template", "Wrap the prompt in the chat template."),
        flag("baseline", "Also run target-only decoding of the same prompts and compare: speedup, and where "
             "greedy output first differs."),
        flag("pad_verify", "Pad each verification forward to the cheapest shape on the target's measured cost "
             "curve (the whole curve up to K + 1 tokens; measured now when not cached); the cost policy prices K "
             "with the padded cost; --baseline pads its target-only steps by the same curve."),
        flag("remeasure_costs", "Time the cost policy's forward shapes again instead of reusing the measurement "
             "cached for this machine, models, dtype and threads."),
        Setting("temperature", 0.0, "0 = greedy.", PANEL_SAMPLING, float),
        Setting("top_k", 0, "Top-k (0: off).", PANEL_SAMPLING, int),
        Setting("top_p", 1.0, "Top-p (1: off).", PANEL_SAMPLING, float),
        Setting("seed", 0, "Sampling seed (prompt i of a file: seed + i).", PANEL_SAMPLING, int),
        Setting("backend", "transformers", None, PANEL_RUNTIME), Setting("draft_backend", None, None, PANEL_RUNTIME),
        Setting("device", "cpu", None, PANEL_RUNTIME), Setting("dtype", "auto", None, PANEL_RUNTIME),
        Setting("threads", None, None, PANEL_RUNTIME, int), Setting("compile", False, None, PANEL_RUNTIME, bool),
        Setting("quant", None, None, PANEL_RUNTIME), Setting("draft_dtype", None, None, PANEL_RUNTIME),
        Setting("draft_quant", None, None, PANEL_RUNTIME), Setting("gguf_type", None, None, PANEL_RUNTIME),
        Setting("trust_remote_code", False, None, PANEL_RUNTIME, bool),
        Setting("as_json", False, "Print one JSON document on stdout (the text and the statistics go to stderr).",
                PANEL_STORE, bool, ("--json",)),
        Setting("out", None, "Also write the JSON document to this file (its folder is made first).", PANEL_STORE),
        flag("force", "Overwrite an existing --out file.", PANEL_STORE),
    )


def _check_generate(o: dict):
    """Everything the arguments alone decide, before any model loads: ``(settings, model specs, other
    tokenizer, --out path, prompt-file entries)``. Fails in one line."""
    from specdec import models
    from specdec.entrypoints import generation as g
    from specdec.runtimes.loading import RUNTIMES

    for flag, runtime in (("--backend", o["backend"]), ("--draft-backend", o["draft_backend"])):
        if runtime is not None and runtime not in RUNTIMES:
            fail(f"unknown {flag} {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    prompt, prompts_file = o["prompt"], o["prompts_file"]
    if (prompt is None) == (prompts_file is None):
        fail("give --prompt TEXT, or --prompts-file FILE for many prompts" if prompt is None
             else "give either --prompt TEXT or --prompts-file FILE, not both")
    if prompt is not None and o["batch_size"] not in (None, 1):
        fail("--batch-size needs --prompts-file FILE (one prompt runs with --prompt TEXT alone)")
    if o["threads"] is not None and o["threads"] < 1:
        fail(f"--threads must be >= 1, got {o['threads']}")
    if prompt is not None and not prompt.strip():
        fail("the prompt is empty")
    if o["compile"] and prompts_file is not None:
        fail("--compile: batched decoding runs the eager backend (a compiled static cache holds one sequence)")
    if o["other_tokenizer"] and not _drafts_with_model(o["drafter"]):
        fail(f"--other-tokenizer needs a drafter that drafts with the draft model, not --drafter {o['drafter']}")
    made: list = []  # the folders the --out check makes (none yet)
    try:
        pair, target, draft = o["pair"], o["target"], o["draft"]
        specs = models.resolve_pair(pair, target, draft) if (pair or draft or not target) else (target, None)
        other = o["other_tokenizer"] or (specs[1] is not None and models.other_tokenizer_pair(*specs))
        settings = g.check_settings(
            drafter=o["drafter"], policy=o["policy"], k=o["k"], max_new_tokens=o["max_new_tokens"],
            temperature=o["temperature"], top_k=o["top_k"], top_p=o["top_p"], seed=o["seed"],
            chat_template=o["chat_template"], pad_verify=o["pad_verify"],
            batch_size=(1 if o["batch_size"] is None else o["batch_size"]) if prompts_file else o["batch_size"],
            many=prompts_file is not None, remeasure_costs=o["remeasure_costs"], other_tokenizer=other,
            backend=o["backend"], spelling=g.FLAGS)
        out_path = None
        if o["out"] is not None:  # checked (and its folder made) before any model loads: output is never lost
            from pathlib import Path

            from specdec.paths import check_output

            parent = Path(o["out"]).absolute().parent
            made = [d for d in (parent, *parent.parents) if not d.exists()]  # removed again if the command fails
            out_path = check_output(o["out"], inputs=[prompts_file] if prompts_file else [], force=o["force"],
                                    flag="--out", create_parent=True)
        entries = None
        if prompts_file is not None:
            from specdec.prompts import read_prompts

            entries = read_prompts(prompts_file)
    except ValueError as exc:
        _remove_empty(made)
        fail(str(exc))
    return settings, specs, other, out_path, entries, made


def _remove_empty(folders) -> None:
    """Remove the folders the --out check made (deepest first) that are still empty: a failed command leaves none."""
    import contextlib

    for d in folders:
        with contextlib.suppress(OSError):
            d.rmdir()


def _generate(**o) -> None:
    """``specdec generate``: the settings checked (`_check_generate`), the pair loaded by
    `specdec.entrypoints.api.load_pair`, the generation assembled and run by `specdec.entrypoints.generation.run`
    (the code the Python API runs), then printed and written (`specdec.entrypoints.output`); a folder the --out
    check made is removed again when the command fails before writing into it."""
    settings, specs, other, out_path, entries, made = _check_generate(o)
    try:
        _generate_checked(o, settings, specs, other, out_path, entries)
    except BaseException:
        if out_path is None or not out_path.exists():
            _remove_empty(made)
        raise


def _generate_checked(o: dict, settings, specs, other, out_path, entries) -> None:
    """``specdec generate`` once its settings and output path are checked: load, run, print, write."""
    from specdec import models
    from specdec.catalogue.drafters import drafter as drafter_entry
    from specdec.catalogue.drafters import model_free_drafters
    from specdec.entrypoints import api, output
    from specdec.entrypoints import generation as g

    needs_draft = drafter_entry(settings.drafter).needs_model
    if specs[1] is None and needs_draft:
        default = " (the default)" if o["drafter"] == DEFAULT_DRAFTER else ""
        free = " or ".join(model_free_drafters())
        fail(f"--drafter {settings.drafter}{default} needs a draft model: give --draft or --pair, or a model-free "
             f"drafter (--drafter {free})")
    load = {n: o[n] for n in ("dtype", "device", "threads", "backend", "draft_backend", "draft_dtype", "quant",
                              "draft_quant", "gguf_type", "compile", "trust_remote_code")}
    the_pair = api.load_pair(o["pair"], target=o["target"], draft=o["draft"], other_tokenizer=other,
                             with_draft=needs_draft, progress=models.progress, **load)
    texts = [o["prompt"]] if entries is None else [e.text for e in entries]
    lines = None if entries is None else [f"{o['prompts_file']}, {e.where}" for e in entries]
    if entries is not None:
        settings = g.replace_budgets(settings, tuple(o["max_new_tokens"] if e.max_new_tokens is None
                                                     else e.max_new_tokens for e in entries))
    ids = g.encode_prompts(the_pair.loaded, texts, chat_template=o["chat_template"])
    limit = the_pair.loaded.target.backend.max_length
    for i, (p, n) in enumerate(zip(ids, g.budgets_of(settings, len(ids)), strict=True)):
        if len(p) + n > limit:
            where = f"{lines[i]}: " if lines else ""
            fail(f"{where}prompt ({len(p)} tokens) + max_new_tokens ({n}) exceeds the target's context of {limit} "
                 "tokens")
    run = g.run(the_pair, settings, ids, baseline=o["baseline"], progress=models.progress)
    for note in run.notes:
        models.progress(note)
    tok = the_pair.loaded.tokenizer
    doc = output.report(run, [tok.decode(r.token_ids, skip_special_tokens=True) for r in run.results],
                        runtime=the_pair.runtime, lines=lines, prompts=texts, extra={
                            "prompts_file": o["prompts_file"], "temperature": o["temperature"], "top_k": o["top_k"],
                            "top_p": o["top_p"], "seed": o["seed"]})
    show = sys.stderr if o["as_json"] else sys.stdout
    label = api.runtime_label(the_pair.runtime)
    (output.print_single if entries is None else output.print_batch)(doc, label=label, file=show)
    text = json.dumps(doc)
    if out_path is not None:
        from specdec.paths import write_text_replacing

        write_text_replacing(out_path, text + "\n")
    if o["as_json"]:
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


def register_subcommands() -> typer.Typer:
    """Add generate and the bench's and report's commands to `app` (once; deferred so that importing this
    module loads neither half); returns `app`."""
    if any(c.name == "generate" for c in app.registered_commands):
        return app
    from specdec.bench import commands as bench_commands
    from specdec.bench.settings import typer_command

    app.command("generate")(typer_command(_generate, _generate_settings(), GENERATE_DOC))
    from specdec.report import commands as report_commands

    bench_commands.register(app)
    report_commands.register(app)
    return app


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
        register_subcommands()
        code = app(args=argv, standalone_mode=False)  # click's usage errors come here, not as its boxed text
    except SystemExit:
        raise
    except typer.Abort:
        raise SystemExit(1) from None
    except typer.TyperException as exc:  # a bad option or value (click's usage errors): one line, as any error
        where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "specdec"
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if not message.strip():  # no arguments: the help was printed
            raise SystemExit(getattr(exc, "exit_code", 2)) from None
        fail(f"{where}: {message} (see {where} --help)")
    except (*user_errors(), OSError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        print("specdec: interrupted; a sweep resumes with --resume", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)  # as click's standalone mode ends: typer.Exit's code
