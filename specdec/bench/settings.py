"""One declaration per sweep setting, from which ``specdec sweep``'s options are built.

A `Setting` is a setting's name (the `SweepConfig` field, the TOML key of ``--config`` files and, with
dashes, the option ``--name``), its default, its help text and its help panel. `SweepConfig`'s fields
declare theirs in their metadata (`setting`; read back by `field_settings`); the options of the command
itself (where to store, how to run) are `Setting` records. `typer_command` turns the settings into a
function with one typer option per setting, each default shown in its help from the declaration:

- a setting a TOML file may hold (`Setting.in_file`) has no default on the command line (None: "not given"),
  so that the file's value, then the declared default, applies when the flag is absent;
- an option declared once for every command in `specdec.entrypoints.cli` (``--pair``, ``--target``, ``--backend``, ...:
  `specdec.options.SHARED_OPTIONS`) takes its names and help from there.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

__all__ = [
    "PANELS",
    "PANEL_MODELS",
    "PANEL_PLAN",
    "PANEL_RUNTIME",
    "PANEL_SAMPLING",
    "PANEL_STORE",
    "Setting",
    "field_settings",
    "setting",
    "shown_default",
    "typer_command",
]

PANEL_MODELS = "Models"
PANEL_PLAN = "Plan"
PANEL_SAMPLING = "Sampling"
PANEL_RUNTIME = "Runtime"
PANEL_STORE = "Results"
#: The help panels in the order ``--help`` lists them.
PANELS = (PANEL_MODELS, PANEL_PLAN, PANEL_SAMPLING, PANEL_RUNTIME, PANEL_STORE)


@dataclass(frozen=True)
class Setting:
    """One setting of ``specdec sweep``.

    Attributes:
        name: the Python name (`SweepConfig` field, TOML key); the option is ``--name`` with dashes.
        default: its value when neither the command line nor a ``--config`` file gives one.
        help: the option's help text without its default (appended from `default`); None: the shared
            declaration's (`specdec.options.SHARED_OPTIONS`).
        panel: the ``--help`` panel (one of `PANELS`).
        type: the command line's type (int, float, str, bool, Path); comma-separated lists are str.
        flags: the option's names when not the plain ``--name`` (booleans: ``--name/--no-name``).
        cli: False for a setting only a ``--config`` file sets.
        in_file: a ``--config`` file may hold it (its command-line default is then None, "not given"); true
            of every `SweepConfig` field.
    """

    name: str
    default: Any
    help: str | None
    panel: str
    type: Any = str
    flags: tuple[str, ...] = ()
    cli: bool = True
    in_file: bool = False


def setting(default: Any, help: str | None = None, panel: str = PANEL_PLAN, *, type: Any = None,
            flags: tuple[str, ...] = (), cli: bool = True) -> Any:
    """A `SweepConfig` field (``dataclasses.field``) with `default` and the rest of its `Setting` in its
    metadata; `type` None: from the field's annotation (`field_settings`)."""
    meta = {"help": help, "panel": panel, "type": type, "flags": flags, "cli": cli}
    return dataclasses.field(default=default, metadata={"setting": meta})


def _cli_type(hint: Any) -> Any:
    """The command-line type of a field annotation: the non-None member of ``X | None``; a tuple (a list on
    the command line: comma-separated) or any other union is str."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _cli_type(args[0]) if len(args) == 1 else str
    return hint if hint in (bool, int, float, str) else str


def field_settings(cls: type) -> list[Setting]:
    """The `Setting` of every field of dataclass `cls` declared with `setting`, in field order.

    Raises:
        TypeError: a field declared without `setting`.
    """
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("setting")
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        cli_type = meta["type"] or _cli_type(hints[f.name])
        out.append(Setting(f.name, f.default, meta["help"], meta["panel"], cli_type, meta["flags"], meta["cli"],
                           in_file=True))
    return out


def shown_default(value: Any) -> str | None:
    """A default as ``--help`` shows it: on/off, a comma-separated list (``none`` when empty), a number
    without trailing zeros; None when there is nothing to show (no default)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _option(s: Setting) -> tuple[Any, Any]:
    """``(annotation, command-line default)`` of `s`'s typer option."""
    import typer

    decls, help_text = s.flags, s.help
    if help_text is None:
        from specdec.options import SHARED_OPTIONS

        if s.name not in SHARED_OPTIONS:
            raise TypeError(f"setting {s.name!r} has no help text and no shared declaration in specdec.entrypoints.cli")
        info = typing.get_args(SHARED_OPTIONS[s.name])[1]
        names = (info.default, *(info.param_decls or ()))  # typer.Option("--name", ...): its first argument
        decls, help_text = tuple(n for n in names if isinstance(n, str)), info.help
    if not decls and s.type is bool:
        dashed = s.name.replace("_", "-")
        decls = (f"--{dashed}/--no-{dashed}",)
    shown = shown_default(s.default)
    flag_only = s.type is bool and not any("/" in d for d in decls)
    if shown is not None and not (flag_only and s.default is False):
        help_text = f"{help_text} (default: {shown})"
    option = typer.Option(*decls, help=help_text, rich_help_panel=s.panel, show_default=False)
    cli_default = None if s.in_file else s.default
    annotation = s.type if cli_default is not None else s.type | None
    return Annotated[annotation, option], cli_default


def typer_command(body: Callable[..., None], settings: Sequence[Setting], doc: str) -> Callable[..., None]:
    """A function for ``app.command``: one keyword parameter and typer option per command-line setting of
    `settings` (listed by panel, `PANELS` order, then in the order given), docstring `doc`, calling
    ``body(**values)`` with every option's value (None for a file setting not given on the command line).

    Raises:
        TypeError: a setting with neither help text nor a shared declaration.
    """
    chosen = sorted((s for s in settings if s.cli), key=lambda s: PANELS.index(s.panel))
    params = []
    for s in chosen:
        annotation, default = _option(s)
        params.append(inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotation))

    def command(**values: Any) -> None:
        return body(**values)

    command.__signature__ = inspect.Signature(params)  # what typer reads the options from
    command.__doc__ = doc
    command.__name__ = command.__qualname__ = body.__name__.lstrip("_")
    command.__module__ = body.__module__
    return command
