"""What every client command shares: the options (``--server``, ``--key``, ``-o``, ``--limit``), the
one-line failure, the :func:`service` context that turns client errors into exit codes (docs/cli.md,
"Exit codes"), the console, :func:`emit`, and :func:`client_command`, which gives a command those
options, opens its client and prints what it returns (a :class:`Shown`).

Start-up cost matters here (docs/cli.md, "Start-up"): this module imports typer and the light parts of
:mod:`app.client` only. The HTTP client is the standard library's (httpx, with the trio it imports,
costs a third of a second); rich and yaml are imported when something is printed
(:mod:`app.client.render`), so ``--help`` and usage errors pay for none of them.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, update_wrapper
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.client import EXIT_API_ERROR, EXIT_USAGE, Output
from app.client.api import DEFAULT_SERVER, ServiceClient, ServiceError, Unreachable
from app.client.flags import UsageError, with_flag

if TYPE_CHECKING:
    from rich.console import Console, RenderableType


ServerOpt = Annotated[
    str, typer.Option("--server", envvar="BC_SERVER", help="Service URL.", show_default=True)
]
KeyOpt = Annotated[
    str | None, typer.Option("--key", envvar="BC_API_KEY", help="API key.", show_default=False)
]
OutputOpt = Annotated[Output, typer.Option("-o", "--output", help="Output format.")]
LimitOpt = Annotated[
    int | None, typer.Option("--limit", min=1, help="Show at most this many (default: all).")
]


@cache
def console() -> Console:
    """The console of every command's output, made on first use (rich is not imported before).
    No hard wraps when the output is not a terminal (kubectl does not wrap either: rows stay greppable)."""
    from rich.console import Console

    return Console(soft_wrap=True, width=None if sys.stdout.isatty() else 10_000)


def fail(message: str, code: int) -> typer.Exit:
    """Print one plain line on stderr (no markup: messages carry brackets) and make the exit."""
    typer.echo(message, err=True)
    return typer.Exit(code)


def emit(data: Any, output: Output, view: Callable[[bool], RenderableType]) -> None:
    """Print ``data`` as ``output``: the document itself for json/yaml, else ``view(wide)``
    (:func:`app.client.render.emit`)."""
    from app.client import render

    render.emit(console(), data, output, view)


def warn(answer: dict[str, Any]) -> None:
    """The answer's ``warnings``, one ``warning: ...`` line each on stderr (they change no exit code)."""
    for warning in answer.get("warnings") or ():
        typer.echo(f"warning: {warning}", err=True)


@contextmanager
def service(server: str, key: str | None, flags: dict[str, str] | None = None) -> Iterator[ServiceClient]:
    """A client of ``server`` for one command, turning failures into exits: an unreachable service is
    one line naming the URL (exit 1), an error answer ``CODE: message`` with the field path replaced by
    its flag from ``flags`` (exit 1), a :class:`UsageError` its message (exit 2)."""
    if not key:
        raise fail("an API key is needed: --key or BC_API_KEY", EXIT_USAGE)
    if not server.startswith(("http://", "https://")):
        raise fail(f"--server {server!r}: give an http:// or https:// URL", EXIT_USAGE)
    try:
        with ServiceClient(server, key) as client:
            yield client
    except Unreachable as error:
        raise fail(error.message, EXIT_API_ERROR) from None
    except ServiceError as error:
        message = error.message
        if flags is not None:
            message = with_flag(message, str(error.details.get("path", "")), flags)
        raise fail(f"{error.code}: {message}", EXIT_API_ERROR) from None
    except UsageError as error:
        raise fail(error.message, EXIT_USAGE) from None


# a duration the CLI turns into a time on this machine's clock (``--since``, ``--expires``); the service's
# own rule (app.placement.request.parse_duration) would import pydantic for two flags
DURATION = re.compile(r"([0-9]+)([smhdw]?)")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_seconds(text: str, *, unit_required: bool = False) -> int | None:
    """The seconds of ``90m``, ``12h``, ``1d``, ``2w``, ``30s`` or, unless ``unit_required``, a whole
    number of seconds; None when ``text`` is no such duration (0 is one: the caller refuses it)."""
    found = DURATION.fullmatch(text.strip())
    if found is None or (unit_required and not found[2]):
        return None
    return int(found[1]) * UNIT_SECONDS.get(found[2], 1)


def assignments(items: list[str], flag: str, separator: str = "=") -> dict[str, str]:
    """``["gpu=8", "cpu=64"]`` -> ``{"gpu": "8", "cpu": "64"}``, in the order given (a key given twice:
    the last wins). Raises :class:`UsageError` naming ``flag`` for an item without ``separator`` or
    with an empty key."""
    pairs: dict[str, str] = {}
    for item in items:
        name, found, value = item.partition(separator)
        if not found or not name:
            raise UsageError(f"{flag} {item!r}: give key{separator}value")
        pairs[name] = value
    return pairs


@dataclass(frozen=True)
class Shown:
    """What a :func:`client_command` prints: the service's ``answer`` as it came (``-o json|yaml``), or
    ``view(wide)`` for people (``-o table|wide``). The view runs while the client is still open, so it
    may look up what only a person needs (node and pool names) and JSON output never pays for that."""

    answer: Any
    view: Callable[[bool], RenderableType]


def listed(
    rows: list[dict[str, Any]],
    view: Callable[[list[dict[str, Any]], bool], RenderableType],
    *,
    one: bool = False,
) -> Shown:
    """What a list prints: ``{"items": rows}`` (every page joined), or the row itself when ``one`` was
    asked for (``get pools ID``, ``pool create``); ``view(rows, wide)`` for people either way."""
    return Shown(rows[0] if one else {"items": rows}, lambda wide: view(rows, wide))


def _connection_options(
    output: OutputOpt = Output.table, server: ServerOpt = DEFAULT_SERVER, key: KeyOpt = None
) -> None:
    """The options every client command ends with, in this order (:func:`client_command` adds them)."""


def options_of(declared: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters of ``declared`` (a function or a class), keyword-only, so a command's signature
    can take them after its own: typer reads a command's options from its signature."""
    parameters = inspect.signature(declared, eval_str=True).parameters.values()
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters]


CONNECTION_OPTIONS = options_of(_connection_options)


def client_command(
    flags: dict[str, str] | None = None, *, output: bool = True
) -> Callable[[Callable[..., Shown | None]], Callable[..., None]]:
    """Make a client command of ``run(api, ...)``: the command takes ``run``'s own parameters (after the
    client ``api``) and then ``-o``, ``--server`` and ``--key`` (without ``-o`` when ``output`` is false);
    it opens the client with :func:`service` (``flags`` name the request's fields in errors), calls
    ``run`` and prints the :class:`Shown` it returns as ``-o`` says (None: ``run`` printed itself)."""
    options = CONNECTION_OPTIONS if output else CONNECTION_OPTIONS[1:]

    def decorate(run: Callable[..., Shown | None]) -> Callable[..., None]:
        def command(**arguments: Any) -> None:
            chosen = arguments.pop("output", Output.table)
            with service(arguments.pop("server"), arguments.pop("key"), flags) as api:
                shown = run(api, **arguments)
                if shown is not None:
                    emit(shown.answer, chosen, shown.view)

        update_wrapper(command, run)  # its name and docstring (the help)
        own = options_of(run)[1:]  # after the client
        command.__signature__ = inspect.Signature([*own, *options])  # type: ignore[attr-defined]
        return command

    return decorate
