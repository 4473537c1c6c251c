"""What every client command shares: the options (``--server``, ``--key``, ``-o``, ``--limit``), the
one-line failure, the :func:`service` context that turns client errors into exit codes (docs/cli.md,
"Exit codes"), the console and :func:`emit`.

Start-up cost matters here (docs/cli.md, "Start-up"): this module imports typer and the light parts of
:mod:`app.client` only. The HTTP client is the standard library's (httpx, with the trio it imports,
costs a third of a second); rich and yaml are imported when something is printed
(:mod:`app.client.render`), so ``--help`` and usage errors pay for none of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.client import EXIT_API_ERROR, EXIT_USAGE, Output
from app.client.api import ServiceClient, ServiceError, Unreachable
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
