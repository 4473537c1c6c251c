"""``better-compute placement ...``: seed 004's local, read-only commands.

``placement_app`` is mounted by ``app/cli.py`` as ``better-compute placement``. Each command keeps its
code in its own function so that commands added by other modules (``fleet``, ``compare``) merge cleanly.
Malformed documents exit with code 2 and a message naming the file and field on stderr.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from app.errors import InvalidInput

placement_app = typer.Typer(
    help="Explainable completion-time placement across daemon hosts and Slurm/PBS lanes (seed 004). "
    "Local and read-only: contacts nothing unless a command says so.",
    no_args_is_help=True,
)

EXIT_MALFORMED = 2


@placement_app.callback()
def _placement() -> None:
    """Explainable completion-time placement (seed 004): explain, fleet, compare."""


def read_json_document(path: Path, what: str) -> dict[str, Any]:
    """Read one JSON document from ``path``; raises :class:`InvalidInput` (path ``""``) when the file is
    missing, unreadable or not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise InvalidInput(f"{what} {path}: cannot read: {error.strerror or error}", path="") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidInput(
            f"{what} {path}: not JSON: {error.msg} at line {error.lineno} column {error.colno}", path=""
        ) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{what} {path}: the document must be a JSON object", path="")
    return data


def parse_now(value: str | None) -> datetime:
    """``--now``: an ISO 8601 time with a UTC offset; omitted = this host's clock (UTC)."""
    if value is None:
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"--now: {value!r} is not an ISO 8601 time", path="now") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidInput(f"--now: {value!r} must carry a UTC offset, e.g. +00:00", path="now")
    return parsed


def fail_malformed(error: InvalidInput, source: str | None = None) -> None:
    """Print ``error: <source>: <message>`` on stderr and exit with code 2."""
    prefix = f"{source}: " if source else ""
    typer.echo(f"error: {prefix}{error.message}", err=True)
    raise typer.Exit(EXIT_MALFORMED)


def run_explain(
    fleet_path: Path,
    request_path: Path,
    as_json: bool,
    now_text: str | None,
    max_age: int,
    estimate_path: Path | None,
) -> str:
    """Load the documents, explain, and return the text or ``vq.placement-explanation/1`` JSON (with a
    trailing newline). Raises :class:`InvalidInput` naming the file and field."""
    from app.fleet.documents import load_fleet, load_request
    from app.fleet.estimate import load_estimate
    from app.fleet.explain import explain_placement, render_text, to_json

    now = parse_now(now_text)
    loaded: dict[str, Any] = {}
    sources = [("fleet", fleet_path, load_fleet), ("request", request_path, load_request)]
    if estimate_path is not None:
        sources.append(("estimate", estimate_path, load_estimate))
    for what, path, loader in sources:
        data = read_json_document(path, what)
        try:
            loaded[what] = loader(data)
        except InvalidInput as error:
            raise InvalidInput(f"{path}: {error.message}", path=error.path, details=error.details) from None
    explanation = explain_placement(
        loaded["fleet"], loaded["request"], now, max_age_seconds=max_age, estimate=loaded.get("estimate")
    )
    if as_json:
        return json.dumps(to_json(explanation), indent=2, ensure_ascii=False) + "\n"
    return render_text(explanation)


@placement_app.command("explain")
def explain_command(
    fleet: Annotated[Path, typer.Argument(help="vq.placement-fleet/1 JSON file.")],
    request: Annotated[Path, typer.Argument(help="vq.placement-request/1 JSON file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print vq.placement-explanation/1 JSON.")] = False,
    now: Annotated[
        str | None,
        typer.Option("--now", help="Evaluate at this ISO 8601 time (with offset); default: now."),
    ] = None,
    max_age: Annotated[
        int, typer.Option("--max-age", min=0, help="Reject observations older than this many seconds.")
    ] = 300,
    estimate: Annotated[
        Path | None,
        typer.Option("--estimate", help="vq.calibrated-estimate/1 JSON filling unset runtime and memory."),
    ] = None,
) -> None:
    """Show where one job should run and why: every rejected target with its reasons, every eligible one
    with its predicted completion (staging + queue wait + execution + transfer). Reads two files;
    submits, reserves and contacts nothing. Exit code 2 on a malformed document."""
    try:
        output = run_explain(fleet, request, as_json, now, max_age, estimate)
    except InvalidInput as error:
        fail_malformed(error)
        return
    typer.echo(output, nl=False)
