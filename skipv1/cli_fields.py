"""Typer options made from a settings dataclass, so that each option is declared once: its
name, type and default in the dataclass, its help (and how the CLI spells or parses it) in the
field's metadata, `cli(...)`."""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

_MISSING = dataclasses.MISSING


def cli(
    help: str,
    *,
    panel: str | None = None,
    flag: str | None = None,
    type: Any = None,
    default: Any = _MISSING,
    parse: Callable[[Any], Any] | None = None,
) -> dict:
    """Field metadata: `flag` replaces --field-name, `type`/`default` what the CLI takes when
    it differs from the field (e.g. "16GiB" for a byte count), `parse` turns it into the
    field's value."""
    return {"cli": dict(help=help, panel=panel, flag=flag, type=type, default=default, parse=parse)}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not _MISSING:
        return field.default
    return None  # a default_factory (a list): the CLI's "not given"


def _parameter(field: dataclasses.Field) -> inspect.Parameter:
    meta = field.metadata["cli"]
    flags = (meta["flag"],) if meta["flag"] else ()
    option = typer.Option(*flags, help=meta["help"], rich_help_panel=meta["panel"])
    kind = meta["type"] if meta["type"] is not None else field.type
    default = meta["default"] if meta["default"] is not _MISSING else _default(field)
    return inspect.Parameter(
        field.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, option],
    )


def with_settings_options(settings_cls: type) -> Callable:
    """`fn(..., settings)` becomes a typer command that takes one option per field of
    `settings_cls` (those with `cli(...)` metadata) and gets them as one settings object."""
    fields = [f for f in dataclasses.fields(settings_cls) if "cli" in f.metadata]

    def decorate(fn: Callable) -> Callable:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()]
        own = [p for p in own if p.name != "settings"]

        @functools.wraps(fn)
        def command(**values):
            settings = {}
            for f in fields:
                value, parse = values.pop(f.name), f.metadata["cli"]["parse"]
                settings[f.name] = parse(value) if parse else value
            return fn(**values, settings=settings_cls(**settings))

        params = own + [_parameter(f) for f in fields]
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the signature above, not fn's
        return command

    return decorate
