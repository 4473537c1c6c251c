"""``better-compute node import|label|taint|untaint|cordon|uncordon`` (docs/cli.md, "Operator
commands"): the operator's changes to nodes through the inventory routes (docs/api.md, "Inventory").
Registered by ``app/cli.py`` as the ``node`` group (``node_app``); a key needs
``compute:inventory:write`` on the node's pool. NODE is a node id (``node_...``) or a node name
(``--pool`` picks the pool when several pools have a node of that name).

``label`` and ``taint`` read the node and write the whole list back (the routes replace it): a change
made by someone else between the two is overwritten, as ``PUT`` would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.client.api import DEFAULT_SERVER, ServiceClient, ServiceError
from app.client.common import KeyOpt, Output, OutputOpt, ServerOpt, assignments, emit, service, warn
from app.client.flags import UsageError

node_app = typer.Typer(help="Change nodes: import, label, taint, cordon.", no_args_is_help=True)

NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="Node id (node_...) or name.")]
PoolOpt = Annotated[str | None, typer.Option("--pool", help="The pool (id or name) of a NODE given by name.")]
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
IMPORT_FLAGS = {
    "name": "--name",
    "topo": "FILE",
    "nvidiaSmiXml": "--nvidia-smi-xml",
    "labels": "--label",
}


def _read(path: Path, flag: str) -> str:
    """The text of ``path`` (UTF-8); a file that cannot be read is a usage error naming ``flag``."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{flag} {path}: cannot read: {getattr(error, 'strerror', None) or error}") from None


def import_body(file: Path, name: str | None, xml: Path | None, labels: list[str]) -> dict[str, Any]:
    """The import body: ``file`` is the output of ``nvidia-smi topo -m`` (the node is named ``--name``,
    else after the file, ``dgx-01.txt`` -> ``dgx-01``), or a whole import body as a JSON object
    (docs/inventory-import.md) whose fields the flags override."""
    text = _read(file, "FILE")
    body: dict[str, Any]
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    body = document if isinstance(document, dict) else {"topo": text}
    if name or "name" not in body:
        body["name"] = name or file.name.split(".", 1)[0]
    if xml is not None:
        body["nvidiaSmiXml"] = _read(xml, "--nvidia-smi-xml")
    if labels:
        body["labels"] = {**(body.get("labels") or {}), **assignments(labels, "--label")}
    return body


@node_app.command("import")
def import_node(
    pool: Annotated[str, typer.Argument(metavar="POOL", help="Pool id (pool_...) or name.")],
    file: Annotated[
        Path, typer.Argument(metavar="FILE", help="nvidia-smi topo -m output, or an import body (JSON).")
    ],
    name: Annotated[str | None, typer.Option("--name", help="Node name (default: FILE's name).")] = None,
    nvidia_smi_xml: Annotated[
        Path | None, typer.Option("--nvidia-smi-xml", help="nvidia-smi -q -x output of the host.")
    ] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="key=value; repeat.")] = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Register a node from its nvidia-smi output (POST /v1/pools/{id}/nodes/import)."""
    from app.client import render as out

    with service(server, key, IMPORT_FLAGS) as api:
        body = import_body(file, name, nvidia_smi_xml, label or [])
        pool_id = api.pool_id(pool)
        node = api.import_node(pool_id, body)
        emit(node, output, lambda wide: out.nodes_view([node], wide, {}))
        warn(node)


def _node(api: ServiceClient, ref: str, pool: str | None) -> dict[str, Any]:
    """The whole node NODE names (by id or name)."""
    return api.node(api.node_id(ref, pool))


@node_app.command("label")
def label_node(
    node: NodeArg,
    labels: Annotated[
        list[str] | None, typer.Argument(metavar="KEY=VALUE...", help="Labels to set (or change).")
    ] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="A label key to remove; repeat.")] = (
        None
    ),
    pool: PoolOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Set or remove operator labels (system labels, bc.dev/..., are the agent's: 422)."""
    from app.client import operator_views as views

    flags = {"labels": "KEY=VALUE"}
    with service(server, key, flags) as api:
        given = assignments(labels or [], "KEY=VALUE")
        if not given and not remove:
            raise UsageError("nothing to change: give KEY=VALUE or --remove KEY")
        flags.update({f"labels.{k}": f"{k}=" for k in given})
        current = _node(api, node, pool)
        kept = views.operator_labels(current)
        missing = [k for k in remove or [] if k not in kept]
        if missing:
            raise ServiceError(404, "NOT_FOUND", f"node {current['name']} has no operator label {missing[0]}")
        wanted = {k: v for k, v in kept.items() if k not in (remove or [])} | given
        changed = api.set_node_labels(current["id"], wanted)
        emit(changed, output, lambda wide: views.node_brief_view(changed, wide))


def parse_taint(text: str) -> dict[str, str]:
    """``key=value:Effect`` (kubectl's spelling; ``key:Effect``, ``key=value`` and ``key`` too, the
    effect NoSchedule by default) -> ``{key, value, effect}``; raises :class:`UsageError`."""
    spec, colon, effect = text.rpartition(":") if ":" in text else (text, "", "NoSchedule")
    if colon and effect not in EFFECTS:
        raise UsageError(f"{text!r}: the effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    taint_key, _, value = spec.partition("=")
    if not taint_key:
        raise UsageError(f"{text!r}: give key=value:Effect")
    return {"key": taint_key, "value": value, "effect": effect}


@node_app.command("taint")
def taint_node(
    node: NodeArg,
    taint: Annotated[str, typer.Argument(metavar="KEY=VALUE:EFFECT", help="e.g. gpu=repair:NoSchedule.")],
    pool: PoolOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Add a taint, or change the value of the taint of that key and effect."""
    from app.client import operator_views as views

    with service(server, key, {"taints": "KEY=VALUE:EFFECT"}) as api:
        new = parse_taint(taint)
        current = _node(api, node, pool)
        same = (new["key"], new["effect"])
        taints = [t for t in current.get("taints") or [] if (t["key"], t["effect"]) != same] + [new]
        changed = api.set_node_taints(current["id"], taints)
        emit(changed, output, lambda wide: views.node_brief_view(changed, wide))


@node_app.command("untaint")
def untaint_node(
    node: NodeArg,
    taint_key: Annotated[str, typer.Argument(metavar="KEY", help="The taint's key (every effect of it).")],
    pool: PoolOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Remove the node's taints of that key (exit 1 when it has none)."""
    from app.client import operator_views as views

    with service(server, key) as api:
        current = _node(api, node, pool)
        taints = current.get("taints") or []
        kept = [t for t in taints if t["key"] != taint_key]
        if len(kept) == len(taints):
            raise ServiceError(404, "NOT_FOUND", f"node {current['name']} has no taint {taint_key}")
        changed = api.set_node_taints(current["id"], kept)
        emit(changed, output, lambda wide: views.node_brief_view(changed, wide))


def _cordon(
    node: str, pool: str | None, cordoned: bool, output: Output, server: str, key: str | None
) -> None:
    """Cordon (or uncordon) the node NODE names and print it."""
    from app.client import operator_views as views

    with service(server, key) as api:
        changed = api.cordon(api.node_id(node, pool), cordoned)
        emit(changed, output, lambda wide: views.node_brief_view(changed, wide))


@node_app.command("cordon")
def cordon_node(
    node: NodeArg,
    pool: PoolOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Cordon a node: it takes no new work (what it holds stays)."""
    _cordon(node, pool, True, output, server, key)


@node_app.command("uncordon")
def uncordon_node(
    node: NodeArg,
    pool: PoolOpt = None,
    output: OutputOpt = Output.table,
    server: ServerOpt = DEFAULT_SERVER,
    key: KeyOpt = None,
) -> None:
    """Uncordon a node: it takes work again (pending work of its pool is planned again)."""
    _cordon(node, pool, False, output, server, key)
