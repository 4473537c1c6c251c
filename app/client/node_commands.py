"""``better-compute node import|label|taint|untaint|cordon|uncordon|drain|undrain|delete`` (docs/cli.md,
"Operator commands"): the operator's changes to nodes through the inventory routes (docs/api.md,
"Inventory"). Registered by ``app/cli.py`` as the ``node`` group (``node_app``); a key needs
``compute:inventory:write`` on the node's pool. NODE is a node id (``node_...``) or a node name
(``--pool`` picks the pool when several pools have a node of that name).

``drain NODE [--reschedule]``, ``undrain NODE`` and ``delete NODE`` are the maintenance verbs (docs/cli.md;
docs/operating.md, "Maintenance: drain and delete"). A delete of a node that still holds work exits 1
with ``CONFLICT: ...``.

``label`` and ``taint`` read the node and write the whole list back (the routes replace it): a change
made by someone else between the two is overwritten, as ``PUT`` would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.client.api import ServiceClient, ServiceError
from app.client.common import Shown, assignments, client_command, listed, warn
from app.client.flags import UsageError

if TYPE_CHECKING:
    from rich.console import RenderableType

node_app = typer.Typer(
    help="Change nodes: import, label, taint, cordon, drain, delete.", no_args_is_help=True
)

NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="Node id (node_...) or name.")]
PoolOpt = Annotated[str | None, typer.Option("--pool", help="The pool (id or name) of a NODE given by name.")]
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
IMPORT_FLAGS = {
    "name": "--name",
    "topo": "FILE",
    "nvidiaSmiXml": "--nvidia-smi-xml",
    "labels": "--label",
}
LABEL_FLAGS = {"labels": "KEY=VALUE", "labels.*": "*="}  # a 422 at labels.<key> names <key>=


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
@client_command(IMPORT_FLAGS)
def import_node(
    api: ServiceClient,
    pool: Annotated[str, typer.Argument(metavar="POOL", help="Pool id (pool_...) or name.")],
    file: Annotated[
        Path, typer.Argument(metavar="FILE", help="nvidia-smi topo -m output, or an import body (JSON).")
    ],
    name: Annotated[str | None, typer.Option("--name", help="Node name (default: FILE's name).")] = None,
    nvidia_smi_xml: Annotated[
        Path | None, typer.Option("--nvidia-smi-xml", help="nvidia-smi -q -x output of the host.")
    ] = None,
    label: Annotated[list[str] | None, typer.Option("--label", help="key=value; repeat.")] = None,
) -> Shown:
    """Register a node from its nvidia-smi output (POST /v1/pools/{id}/nodes/import)."""
    from app.client import render as out

    body = import_body(file, name, nvidia_smi_xml, label or [])
    node = api.import_node(api.pool_id(pool), body)
    warn(node)
    return listed([node], lambda rows, wide: out.nodes_view(rows, wide, {}), one=True)


def changed_node(node: dict[str, Any]) -> Shown:
    """A node an operator command changed: name, id, status, cordon, labels and taints."""
    from app.client import operator_views as views

    return Shown(node, lambda wide: views.node_brief_view(node, wide))


@node_app.command("label")
@client_command(LABEL_FLAGS)
def label_node(
    api: ServiceClient,
    node: NodeArg,
    labels: Annotated[
        list[str] | None, typer.Argument(metavar="KEY=VALUE...", help="Labels to set (or change).")
    ] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="A label key to remove; repeat.")] = (
        None
    ),
    pool: PoolOpt = None,
) -> Shown:
    """Set or remove operator labels (system labels, bc.dev/..., are the agent's: 422)."""
    from app.client import operator_views as views

    given = assignments(labels or [], "KEY=VALUE")
    if not given and not remove:
        raise UsageError("nothing to change: give KEY=VALUE or --remove KEY")
    current = api.named_node(node, pool)
    kept = views.operator_labels(current)
    missing = [k for k in remove or [] if k not in kept]
    if missing:
        raise ServiceError(404, "NOT_FOUND", f"node {current['name']} has no operator label {missing[0]}")
    wanted = {k: v for k, v in kept.items() if k not in (remove or [])} | given
    return changed_node(api.set_node_labels(current["id"], wanted))


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
@client_command({"taints": "KEY=VALUE:EFFECT"})
def taint_node(
    api: ServiceClient,
    node: NodeArg,
    taint: Annotated[str, typer.Argument(metavar="KEY=VALUE:EFFECT", help="e.g. gpu=repair:NoSchedule.")],
    pool: PoolOpt = None,
) -> Shown:
    """Add a taint, or change the value of the taint of that key and effect."""
    new = parse_taint(taint)
    current = api.named_node(node, pool)
    same = (new["key"], new["effect"])
    taints = [t for t in current.get("taints") or [] if (t["key"], t["effect"]) != same] + [new]
    return changed_node(api.set_node_taints(current["id"], taints))


@node_app.command("untaint")
@client_command()
def untaint_node(
    api: ServiceClient,
    node: NodeArg,
    taint_key: Annotated[str, typer.Argument(metavar="KEY", help="The taint's key (every effect of it).")],
    pool: PoolOpt = None,
) -> Shown:
    """Remove the node's taints of that key (exit 1 when it has none)."""
    current = api.named_node(node, pool)
    taints = current.get("taints") or []
    kept = [t for t in taints if t["key"] != taint_key]
    if len(kept) == len(taints):
        raise ServiceError(404, "NOT_FOUND", f"node {current['name']} has no taint {taint_key}")
    return changed_node(api.set_node_taints(current["id"], kept))


@node_app.command("cordon")
@client_command()
def cordon_node(api: ServiceClient, node: NodeArg, pool: PoolOpt = None) -> Shown:
    """Cordon a node: it takes no new work (what it holds stays)."""
    return changed_node(api.cordon(api.node_id(node, pool), True))


@node_app.command("uncordon")
@client_command()
def uncordon_node(api: ServiceClient, node: NodeArg, pool: PoolOpt = None) -> Shown:
    """Uncordon a node: it takes work again (pending work of its pool is planned again)."""
    return changed_node(api.cordon(api.node_id(node, pool), False))


def drained(api: ServiceClient, answer: dict[str, Any]) -> Shown:
    """A drain's or undrain's answer: the node's drain and the reservations a reschedule moved, their
    nodes by name (looked up for people only)."""
    from app.client import operator_views as views

    def view(wide: bool) -> RenderableType:
        moved = {m["toNodeId"] for m in answer.get("rescheduled") or () if m.get("toNodeId")}
        names = api.node_names({answer["poolId"]: moved}) if moved else {}
        return views.drain_view(answer, names, wide)

    return Shown(answer, view)


@node_app.command("drain")
@client_command()
def drain_node(
    api: ServiceClient,
    node: NodeArg,
    reschedule: Annotated[
        bool,
        typer.Option("--reschedule", help="Move its future reservations (not started yet) to other nodes."),
    ] = False,
    pool: PoolOpt = None,
) -> Shown:
    """No new work lands on the node; its current work keeps its window (drain: draining, then
    drained once nothing current or future is placed there)."""
    return drained(api, api.drain_node(api.node_id(node, pool), reschedule))


@node_app.command("undrain")
@client_command()
def undrain_node(api: ServiceClient, node: NodeArg, pool: PoolOpt = None) -> Shown:
    """Lift a drain: the node takes new work again."""
    return drained(api, api.undrain_node(api.node_id(node, pool)))


@node_app.command("delete")
@client_command()
def delete_node(api: ServiceClient, node: NodeArg, pool: PoolOpt = None) -> Shown:
    """Delete a node that holds no current or future work (drain it first); its history stays."""
    from rich.text import Text

    node_id = api.node_id(node, pool)
    api.delete_node(node_id)
    said = node_id if node == node_id else f"{node} ({node_id})"
    return Shown({"id": node_id, "deleted": True}, lambda wide: Text(f"node {said} deleted"))
