"""``better-compute placement ...``: docs/explain.md's local, read-only commands.

``placement_app`` is mounted by ``app/cli.py`` as ``better-compute placement``. Each command keeps its
code in its own function so that commands added by other modules (``fleet``, ``compare``) merge cleanly.
Malformed documents exit with code 2 and a message naming the file and field on stderr.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from app.errors import InvalidInput

if TYPE_CHECKING:  # the fleet modules are imported by the commands that run: `--help` needs none of them
    from app.fleet.build import HistoryOptions
    from app.fleet.build_plan import BuildPlan

placement_app = typer.Typer(
    help="Explainable completion-time placement across daemon hosts and Slurm/PBS lanes (docs/explain.md). "
    "Local and read-only: contacts nothing unless a command says so.",
    no_args_is_help=True,
)

EXIT_MALFORMED = 2
T = TypeVar("T")


@placement_app.callback()
def _placement() -> None:
    """Explainable completion-time placement (docs/explain.md): explain, fleet, compare."""


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


def load_json_file(path: Path, what: str, loader: Callable[[dict[str, Any]], T]) -> T:
    """Read ``path`` (:func:`read_json_document`) and validate it with ``loader``; an error keeps its field
    path and names the file before its message (``fleet.json: fleet: targets.3.node.cpus: ...``)."""
    try:
        return loader(read_json_document(path, what))
    except InvalidInput as error:
        raise error.under("", label=str(path)) from None


def parse_now(value: str | None) -> datetime:
    """``--now``: an ISO 8601 time with a UTC offset; omitted = this host's clock (UTC)."""
    from app.fleet.documents import parse_instant

    return datetime.now(UTC) if value is None else parse_instant(value, "--now")


def fail_malformed(error: InvalidInput, source: str | None = None) -> None:
    """Print ``error: <source>: <message>`` on stderr and exit with code 2."""
    prefix = f"{source}: " if source else ""
    typer.echo(f"error: {prefix}{error.message}", err=True)
    raise typer.Exit(EXIT_MALFORMED)


def print_document(make: Callable[[], str]) -> None:
    """Print what ``make()`` renders (no newline added); a malformed input document fails with
    :func:`fail_malformed` (exit code 2)."""
    try:
        output = make()
    except InvalidInput as error:
        fail_malformed(error)
        return
    typer.echo(output, nl=False)


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
    from app.fleet.estimate import check_estimate_program, load_estimate
    from app.fleet.explain import explain_placement
    from app.fleet.render import render_text, to_json

    now = parse_now(now_text)
    loaded: dict[str, Any] = {}
    sources = [("fleet", fleet_path, load_fleet), ("request", request_path, load_request)]
    if estimate_path is not None:
        sources.append(("estimate", estimate_path, load_estimate))
    for what, path, loader in sources:
        loaded[what] = load_json_file(path, what, loader)
    if estimate_path is not None:
        try:
            check_estimate_program(loaded["request"], loaded["estimate"])
        except InvalidInput as error:
            raise error.under("", label=str(estimate_path)) from None
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
    print_document(lambda: run_explain(fleet, request, as_json, now, max_age, estimate))


# ---------------------------------------------------------------------------------------------------
# placement fleet / placement compare (docs/fleet.md)


def _read_job_history(path: Path | None) -> list[Any]:
    """Job records from a ``vq.job-history/1`` file (empty without one)."""
    from app.fleet.history import load_job_history

    if path is None:
        return []
    return list(load_json_file(path, "job history", load_job_history).jobs)


@dataclass(frozen=True)
class FleetOptions:
    """The options of ``vq placement fleet`` (docs/fleet.md, "Commands").

    ``base_path``: the base ``vq.placement-fleet/1`` file (never overwritten); ``output``: where the
    fleet goes (None: stdout). The evidence options as given on the command line: ``capacity``
    (``NAME=ANSWER.json``), ``collect`` (``NAME``), ``queue_history`` (``NAME[=TARGET]``),
    ``scheduler_shape`` (``NAME[=HOST]``), ``runtime_root`` (``NAME=ROOT``). ``hosts_path``: the hosts
    TOML (None: ``BC_FLEET_HOSTS_FILE``); ``timeout_seconds``: per host call; ``history_path``: the
    ``vq.job-history/1`` file and ``history`` its selection; ``now_text``: this host's clock for the
    build (ISO 8601 with offset; None: the clock).
    """

    base_path: Path
    output: Path | None = None
    capacity: tuple[str, ...] = ()
    collect: tuple[str, ...] = ()
    queue_history: tuple[str, ...] = ()
    scheduler_shape: tuple[str, ...] = ()
    runtime_root: tuple[str, ...] = ()
    hosts_path: Path | None = None
    timeout_seconds: float = 60.0
    history_path: Path | None = None
    history: HistoryOptions = field(default_factory=lambda: _history_options())
    now_text: str | None = None


def _history_options(**given: Any) -> HistoryOptions:
    """:class:`app.fleet.build.HistoryOptions` (imported when a fleet is built)."""
    from app.fleet.build import HistoryOptions

    return HistoryOptions(**given)


def _refuse_overwrite(options: FleetOptions) -> None:
    from app.fleet.build_plan import FleetBuildRefused

    output, base = options.output, options.base_path
    if output is not None and (
        output.resolve() == base.resolve() or (output.exists() and output.samefile(base))
    ):
        raise FleetBuildRefused(f"-o {output}: refusing to write over the base file", path="output")


def _plan(options: FleetOptions, capacity_names: tuple[str, ...]) -> BuildPlan:
    """The build plan the options name (refused later by :func:`app.fleet.build_plan.check_plan`)."""
    from app.fleet.build_plan import BuildPlan, parse_assignment

    history_pairs = [
        parse_assignment(item, "--queue-history", value_required=False) for item in options.queue_history
    ]
    shape_pairs = [
        parse_assignment(item, "--scheduler-shape", value_required=False) for item in options.scheduler_shape
    ]
    root_pairs = [
        parse_assignment(item, "--runtime-root", value_required=True) for item in options.runtime_root
    ]
    return BuildPlan(
        capacity=capacity_names,
        collect=tuple(options.collect),
        queue_history=tuple((name, value or name) for name, value in history_pairs),
        scheduler_shape=tuple((name, value or name) for name, value in shape_pairs),
        runtime_root=tuple((name, value or "") for name, value in root_pairs),
    )


def _hosts(plan: BuildPlan, options: FleetOptions) -> dict[str, Any]:
    """The configured hosts when the plan contacts any (``--hosts`` or ``BC_FLEET_HOSTS_FILE``)."""
    from app.fleet.build_plan import FleetBuildRefused
    from app.fleet.ssh import load_hosts
    from app.settings import get_settings

    if not (plan.collect or plan.scheduler_shape or plan.runtime_root):
        return {}
    hosts_file = options.hosts_path or get_settings().fleet_hosts_file
    if hosts_file is None:
        raise FleetBuildRefused("no hosts file: give --hosts FILE or set BC_FLEET_HOSTS_FILE", path="hosts")
    return load_hosts(hosts_file)


def _capacity_answers(pairs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """``--capacity NAME=ANSWER.json``: each file's validated answer; errors name the option."""
    from app.fleet.build_plan import FleetBuildRefused
    from app.fleet.capacity import load_capacity_answer

    answers = {}
    for name, file_name in pairs:
        path = Path(file_name or "")
        try:
            answers[name] = load_capacity_answer(read_json_document(path, "capacity answer"))
        except InvalidInput as error:
            raise error.under(
                f"capacity.{name}", label=f"--capacity {name}={path}", as_type=FleetBuildRefused
            ) from None
    return answers


def run_fleet(options: FleetOptions) -> tuple[str, list[str]]:
    """Build the fleet (docs/explain.md): returns the ``vq.placement-fleet/1`` JSON text and the report lines.
    Every refusal raises :class:`InvalidInput` before any host is contacted."""
    import asyncio

    from app.fleet.build_plan import FleetBuildRefused, parse_assignment
    from app.fleet.collect import build_from_hosts
    from app.fleet.documents import dump_document, load_fleet

    _refuse_overwrite(options)
    base = load_json_file(options.base_path, "fleet", load_fleet)
    capacity_pairs = [parse_assignment(item, "--capacity", value_required=True) for item in options.capacity]
    plan = _plan(options, tuple(name for name, _ in capacity_pairs))
    hosts = _hosts(plan, options)
    if plan.queue_history and options.history_path is None:
        raise FleetBuildRefused("--queue-history needs --history FILE (vq.job-history/1)", path="history")
    jobs = _read_job_history(options.history_path)
    fixed_now = parse_now(options.now_text) if options.now_text is not None else None
    result = asyncio.run(
        build_from_hosts(
            base,
            plan,
            hosts,
            capacity=_capacity_answers(capacity_pairs),
            jobs=jobs,
            history=options.history,
            timeout_seconds=options.timeout_seconds,
            **({"clock": lambda: fixed_now} if fixed_now is not None else {}),
        )
    )
    text = json.dumps(dump_document(result.fleet, only_given=True), indent=2, ensure_ascii=False) + "\n"
    return text, [entry.line() for entry in result.report]


@placement_app.command("fleet")
def fleet_command(
    base: Annotated[Path, typer.Argument(help="Base vq.placement-fleet/1 JSON file (never overwritten).")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the fleet here (default stdout).")
    ] = None,
    capacity: Annotated[
        list[str] | None,
        typer.Option("--capacity", help="NAME=ANSWER.json: a daemon's vq broker capacity answer."),
    ] = None,
    collect: Annotated[
        list[str] | None, typer.Option("--collect", help="NAME: ask this configured daemon host over SSH.")
    ] = None,
    queue_history: Annotated[
        list[str] | None,
        typer.Option("--queue-history", help="NAME[=TARGET]: lane queue wait from recorded waits of TARGET."),
    ] = None,
    scheduler_shape: Annotated[
        list[str] | None,
        typer.Option(
            "--scheduler-shape", help="NAME[=HOST]: node shape and limits from sinfo / qstat+pbsnodes."
        ),
    ] = None,
    runtime_root: Annotated[
        list[str] | None, typer.Option("--runtime-root", help="NAME=ROOT: runtimes from a deployment root.")
    ] = None,
    hosts: Annotated[
        Path | None, typer.Option("--hosts", help="Hosts TOML (\\[hosts.NAME]); default BC_FLEET_HOSTS_FILE.")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds per host call.")] = 60.0,
    history: Annotated[
        Path | None, typer.Option("--history", help="This queue's job records (vq.job-history/1 JSON).")
    ] = None,
    history_jobs: Annotated[int, typer.Option("--history-jobs", min=1)] = 50,
    history_days: Annotated[int, typer.Option("--history-days", min=1)] = 14,
    history_min: Annotated[int, typer.Option("--history-min", min=1)] = 5,
    now: Annotated[
        str | None,
        typer.Option("--now", help="This host's clock for the build (ISO 8601 with offset); default: now."),
    ] = None,
) -> None:
    """Build a fleet file from live evidence: capacity answers, SSH collection, queue history, scheduler
    shapes and runtime roots. Contacts only the --collect / --scheduler-shape / --runtime-root hosts;
    every refusal happens before any contact (exit code 2). Each target's outcome goes to stderr."""
    try:
        text, lines = run_fleet(
            FleetOptions(
                base_path=base,
                output=output,
                capacity=tuple(capacity or ()),
                collect=tuple(collect or ()),
                queue_history=tuple(queue_history or ()),
                scheduler_shape=tuple(scheduler_shape or ()),
                runtime_root=tuple(runtime_root or ()),
                hosts_path=hosts,
                timeout_seconds=timeout,
                history_path=history,
                history=_history_options(jobs=history_jobs, days=history_days, minimum=history_min),
                now_text=now,
            )
        )
    except InvalidInput as error:
        fail_malformed(error)
        return
    for line in lines:
        typer.echo(line, err=True)
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")


def run_compare(
    fleet_path: Path, history_path: Path, jobs: int, now_text: str | None, max_age: int, as_json: bool
) -> str:
    """Compare the broker's orderings on recorded jobs; the text report or ``vq.placement-compare/1``."""
    from app.fleet.compare import compare_orderings, render_text
    from app.fleet.documents import load_fleet

    now = parse_now(now_text)
    fleet = load_json_file(fleet_path, "fleet", load_fleet)
    records = _read_job_history(history_path)
    comparison = compare_orderings(fleet, records, now, jobs=jobs, max_age_seconds=max_age)
    if as_json:
        return json.dumps(comparison.to_json(), indent=2, ensure_ascii=False) + "\n"
    return render_text(comparison)


@placement_app.command("compare")
def compare_command(
    fleet: Annotated[Path, typer.Argument(help="vq.placement-fleet/1 JSON file.")],
    history: Annotated[Path, typer.Option("--history", help="This queue's job records (vq.job-history/1).")],
    jobs: Annotated[
        int, typer.Option("--jobs", min=1, help="Most recent finished local jobs to compare.")
    ] = 50,
    now: Annotated[str | None, typer.Option("--now", help="ISO 8601 time with offset; default now.")] = None,
    max_age: Annotated[int, typer.Option("--max-age", min=0, help="Max observation age, seconds.")] = 300,
    as_json: Annotated[bool, typer.Option("--json", help="Print vq.placement-compare/1 JSON.")] = False,
) -> None:
    """See what \\[broker] policy = "completion-time" would change on this host's recorded jobs: each job
    placed by the capacity ordering and by the completion-time re-ranker. Read-only; contacts nothing."""
    print_document(lambda: run_compare(fleet, history, jobs, now, max_age, as_json))
