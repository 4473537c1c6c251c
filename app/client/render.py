"""Output of the client commands: ``-o table|wide|json|yaml`` (docs/cli.md).

- ``json`` and ``yaml`` print the service's answer as it came (a list as ``{"items": [...]}``, every page
  joined), UTF-8 (``×``, not ``\\u00d7``), keys in the service's order;
- ``table`` and ``wide`` are for people: rich tables without borders in the manner of ``kubectl get``,
  nodes by name (``names`` maps node id -> name; an unknown id prints as itself), ``-`` or ``<none>``
  for nothing (never ``{}``); ``wide`` adds ids and the less used columns.

Every ``*_view`` function takes data and returns a rich renderable: nothing here talks to the service.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from app.client import Output as Output  # the -o choices, imported from here too
from app.client.allocations import current_allocations
from app.errors import AppError

NONE = "<none>"
_TRAILING_BLANKS = re.compile(r" +((?:\x1b\[[0-9;]*m)*)$")  # spaces before the line's closing style codes
EMPTY_CELL = "-"
DRAINING = "draining"  # a drained node's NoSchedule reason (its ``drain`` says whether it is drained yet)


def document_text(data: Any, output: Output) -> str:
    """``data`` as JSON (indented, UTF-8 characters as themselves) or YAML (block style, in the
    answer's key order), ending with a newline."""
    if output is Output.yaml:
        import yaml

        return yaml.safe_dump(
            data, allow_unicode=True, sort_keys=False, default_flow_style=False, width=1 << 20
        )
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def write_document(data: Any, output: Output) -> None:
    """Write :func:`document_text` to stdout as UTF-8 bytes, whatever the locale's encoding."""
    text = document_text(data, output)
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a captured text stream (tests of the pure functions)
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    buffer.write(text.encode("utf-8"))
    buffer.flush()


def emit(console: Console, data: Any, output: Output, view: Callable[[bool], RenderableType]) -> None:
    """Print ``data`` as ``output``: the document itself for json/yaml, else ``view(wide)``."""
    if output in (Output.json, Output.yaml):
        write_document(data, output)
        return
    with console.capture() as captured:
        console.print(view(output is Output.wide))
    # rich pads every cell to its column's width: drop the blanks that would end each line
    lines = (_TRAILING_BLANKS.sub(r"\1", line) for line in captured.get().splitlines())
    console.file.write("".join(f"{line}\n" for line in lines))
    console.file.flush()


# -- small formats --------------------------------------------------------------------------------


def amounts(values: Mapping[str, Any] | None) -> str:
    """``{cpu: 8, memory: 1024}`` -> ``cpu 8, memory 1024``; nothing -> ``-``."""
    return ", ".join(f"{name} {amount}" for name, amount in (values or {}).items()) or EMPTY_CELL


def when(value: str | None) -> str:
    """An ISO 8601 time from the service to the second, UTC as ``Z``: ``2026-12-01T14:41:05Z``."""
    if not value:
        return EMPTY_CELL
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        return value
    if instant.utcoffset() is not None and not instant.utcoffset():
        return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return instant.replace(microsecond=0).isoformat()


def joined(values: Iterable[str], empty: str = EMPTY_CELL) -> str:
    """``a, b, c``, or ``empty`` when there are none."""
    return ", ".join(values) or empty


def node_name(names: Mapping[str, str], node_id: str) -> str:
    """The node's name when it is known, else its id."""
    return names.get(node_id, node_id)


def new_table(*columns: str) -> Table:
    """A borderless table with upper-case headers, like ``kubectl get``."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column.upper(), overflow="fold")
    return table


def field_grid(rows: Iterable[tuple[str, RenderableType]]) -> Table:
    """``Label:  value`` lines in two aligned columns, like ``kubectl describe``."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(f"{label}:", value if not isinstance(value, str) else Text(value))
    return grid


def section(title: str, body: RenderableType | str) -> Group:
    """``Title:`` and its body indented by two columns."""
    return Group(
        Text(f"{title}:", style="bold"), Padding(Text(body) if isinstance(body, str) else body, (0, 0, 0, 2))
    )


# -- preview --------------------------------------------------------------------------------------


def why_not_sections(holder: Mapping[str, Any]) -> list[RenderableType]:
    """The ``Rejections`` (filter, reason, nodes, examples) and ``Nearest misses`` (node, filter,
    shortfall, missing atoms) tables of a preview or an Unschedulable condition that carries them."""
    sections: list[RenderableType] = []
    rows = holder.get("rejections") or []
    if rows:
        table = new_table("filter", "reason", "nodes", "examples")
        for r in rows:
            table.add_row(str(r["filter"]), str(r["reason"]), str(r["count"]), joined(r.get("nodes", [])))
        sections.append(section("Rejections", table))
    misses = holder.get("nearestMisses") or []
    if misses:
        table = new_table("node", "filter", "shortfall", "missing atoms")
        for m in misses:
            table.add_row(
                m.get("nodeName") or m["nodeId"],
                str(m["filter"]),
                str(m["shortfall"]),
                str(m["missingAtoms"]),
            )
        sections.append(section("Nearest misses", table))
    return sections


def preview_view(answer: Mapping[str, Any], wide: bool) -> RenderableType:
    """``fits``: the candidates best first (node name, score, atoms; ``wide`` adds the node id and
    each scorer); else ``does not fit: <reason>``, the earliest window that fits (or why none), and
    what preempting spot work would take."""
    if not answer.get("fits"):
        text = Text.from_markup(f"[yellow]does not fit[/yellow]: {escape(str(answer.get('reason', '')))}")
        if "earliest" in answer:
            earliest = answer["earliest"]
            if earliest is None:
                text.append(f"\nno earliest window: {answer.get('earliestReason', '')}")
            else:
                text.append(
                    f"\nearliest: from {when(earliest['start'])} to {when(earliest['end'])} on "
                    f"{earliest.get('nodeName') or earliest['nodeId']} ({joined(earliest.get('atoms', []))})"
                )
        preemptible = answer.get("preemptible")
        if preemptible:
            nodes = joined(c.get("nodeName") or c["nodeId"] for c in preemptible.get("candidates", []))
            text.append(
                f"\nfits by preempting {preemptible['reservations']} spot reservation(s) on {nodes}, "
                f"from {preemptible['startsAt']}"
            )
        sections = why_not_sections(answer)
        return Group(text, *sections) if sections else text
    candidates = answer.get("candidates", [])
    scorers = sorted({name for c in candidates for name in c.get("scores", {})}) if wide else []
    table = new_table("node", *(["id"] if wide else []), "score", *scorers, "atoms")
    for c in candidates:
        row = [c.get("nodeName") or c["nodeId"], *([c["nodeId"]] if wide else []), f"{c['score']:.3f}"]
        row += [f"{c.get('scores', {}).get(name, 0):.3f}" for name in scorers]
        table.add_row(*row, joined(c.get("atoms", [])))
    return table


# -- reservations ---------------------------------------------------------------------------------


def _waiting_reason(reservation: Mapping[str, Any]) -> str:
    """The message of the latest Unschedulable condition (why a pending reservation waits), or ``-``."""
    for condition in reversed(reservation.get("conditions", [])):
        if condition.get("type") == "Unschedulable" and reservation.get("status") in ("pending", "queued"):
            return str(condition.get("message", EMPTY_CELL))
    return EMPTY_CELL


def reservations_view(
    reservations: list[Mapping[str, Any]], names: Mapping[str, str], wide: bool
) -> RenderableType:
    """One row per reservation: id, tenant, status, atoms, node names, created, why it waits;
    ``wide`` adds the pool, scalar resources, window and idempotency key. Atoms, nodes, resources and
    window are those of its :func:`current_allocations` (not of one a repair or a drain moved away)."""
    if not reservations:
        return Text("no reservations")
    extra = ["pool", "resources", "start", "end", "idempotency key"] if wide else []
    table = new_table("id", "tenant", "status", "atoms", "nodes", "created", *extra, "reason")
    for r in reservations:
        allocations = current_allocations(r)
        atoms = sum(len(a.get("atoms", [])) for a in allocations)
        row = [
            r["id"],
            r["tenantId"],
            r["status"],
            str(atoms) if allocations else EMPTY_CELL,
            joined(dict.fromkeys(node_name(names, a["nodeId"]) for a in allocations)),
            when(r.get("createdAt")),
        ]
        if wide:
            held: Counter[str] = Counter()
            for a in allocations:
                held.update({k: v for k, v in (a.get("resources") or {}).items()})
            row += [
                r["poolId"],
                amounts(dict(held)),
                when(allocations[0]["start"]) if allocations else EMPTY_CELL,
                when(allocations[0]["end"]) if allocations else EMPTY_CELL,
                r.get("idempotencyKey") or EMPTY_CELL,
            ]
        table.add_row(*row, _waiting_reason(r))
    return table


def allocations_view(allocations: list[Mapping[str, Any]], names: Mapping[str, str], wide: bool) -> Table:
    """The allocations: node name, atoms, scalar resources, window (``wide`` adds ids)."""
    extra = ["id", "node id"] if wide else []
    table = new_table("node", *extra, "atoms", "resources", "start", "end", "released")
    for a in allocations:
        ids = [a["id"], a["nodeId"]] if wide else []
        table.add_row(
            node_name(names, a["nodeId"]),
            *ids,
            joined(a.get("atoms", [])),
            amounts(a.get("resources")),
            when(a.get("start")),
            when(a.get("end")),
            when(a.get("releasedAt")),
        )
    return table


def reservation_view(reservation: Mapping[str, Any], names: Mapping[str, str], wide: bool) -> RenderableType:
    """What reserve, extend and release print: ``<id> <status>``, then its current allocations
    (:func:`current_allocations`) or why it waits."""
    status = reservation["status"]
    colour = {"placed": "green", "pending": "yellow", "queued": "yellow"}.get(status, "bold")
    parts: list[RenderableType] = [
        Text.from_markup(f"{escape(reservation['id'])} [{colour}]{escape(status)}[/{colour}]")
    ]
    held = current_allocations(reservation)
    if held and status == "placed":
        parts.append(allocations_view(held, names, wide))
    reason = _waiting_reason(reservation)
    if reason != EMPTY_CELL:
        parts.append(Text(f"  {reason}"))
    return Group(*parts)


def _selector_text(selector: Any) -> str:
    """A stored selector (``{matchExpressions: [...]}``) as shorthand, e.g. ``gpu.model in (A100)``."""
    from app.placement.request import SelectorBody
    from app.placement.selectors import format_selector

    if isinstance(selector, str):
        return selector
    try:
        return format_selector(SelectorBody.model_validate(selector).to_selector())
    except (ValueError, TypeError, AppError):  # a shape this client does not know: show it as it is
        return json.dumps(selector, ensure_ascii=False)


def request_text(spec: Mapping[str, Any]) -> str:
    """A reservation's request in one line: ``2 gpu (gpu.model in (A100), nvlink-all), cpu 8, for 1h``."""
    parts = []
    for d in spec.get("devices") or []:
        how = [_selector_text(d["selector"])] if d.get("selector") else []
        how += [d["topology"]] if d.get("topology") else []
        parts.append(f"{d['count']} {d['class']}" + (f" ({', '.join(how)})" if how else ""))
    parts += [f"{name} {amount}" for name, amount in (spec.get("resources") or {}).items()]
    parts.append(f"for {spec.get('duration')}")
    if spec.get("start"):
        parts.append(f"from {when(spec['start'])}")
    if spec.get("binding") not in (None, "device"):
        parts.append(f"binding {spec['binding']}")
    if spec.get("gang"):
        parts.append(f"gang of {spec['gang'].get('members')}")
    if spec.get("spot"):
        parts.append("spot")
    return ", ".join(parts)


def describe_reservation_view(
    reservation: Mapping[str, Any], names: Mapping[str, str], wide: bool
) -> RenderableType:
    """``describe reservation``: its fields, request, allocations and conditions."""
    head = field_grid(
        [
            ("ID", reservation["id"]),
            ("Tenant", reservation["tenantId"]),
            ("Pool", reservation["poolId"]),
            ("Status", reservation["status"]),
            ("Request", request_text(reservation.get("spec") or {})),
            ("Idempotency key", reservation.get("idempotencyKey") or NONE),
            ("Created", when(reservation.get("createdAt"))),
            ("Released", when(reservation.get("releasedAt")) if reservation.get("releasedAt") else NONE),
        ]
    )
    allocations = reservation.get("allocations") or []
    conditions = reservation.get("conditions") or []
    condition_table = new_table("type", "status", "reason", "message")
    for c in conditions:
        condition_table.add_row(
            str(c.get("type", "")),
            str(c.get("status", "")),
            str(c.get("reason", "")),
            str(c.get("message", "")),
        )
    waiting = [c for c in conditions if c.get("type") == "Unschedulable" and c.get("status") == "True"]
    return Group(
        head,
        section("Allocations", allocations_view(allocations, names, wide) if allocations else NONE),
        section("Conditions", condition_table if conditions else NONE),
        *(why_not_sections(waiting[-1]) if waiting else ()),
    )


# -- pools and nodes ------------------------------------------------------------------------------


def _capacity(pool: Mapping[str, Any], resource: str) -> str:
    held = (pool.get("capacity") or {}).get(resource)
    return f"{held['allocated']}/{held['total']}" if held else EMPTY_CELL


def pools_view(pools: list[Mapping[str, Any]], wide: bool) -> RenderableType:
    """One row per pool: name, id, nodes, GPUs allocated/total, archived; ``wide`` adds every other
    resource and the creation time."""
    if not pools:
        return Text("no pools")
    others = sorted({r for p in pools for r in (p.get("capacity") or {}) if r != "gpu"}) if wide else []
    table = new_table("name", "id", "nodes", "gpu", *others, "status", *(["created"] if wide else []))
    for p in pools:
        row = [p["name"], p["id"], str(p.get("nodeCount", EMPTY_CELL)), _capacity(p, "gpu")]
        row += [_capacity(p, r) for r in others]
        row.append(f"archived {when(p['archivedAt'])}" if p.get("archivedAt") else "active")
        table.add_row(*row, *([when(p.get("createdAt"))] if wide else []))
    return table


def node_status(node: Mapping[str, Any]) -> str:
    """``schedulable``, or the node's NoSchedule reasons (``cordoned, heartbeat lost``). A drained
    node's reason ``draining`` reads as its ``drain``: ``draining`` while it still holds current or future
    work, ``drained`` once it holds none (docs/api.md, "Drain and delete")."""
    drain = node.get("drain")
    reasons = [
        drain if drain and reason == DRAINING else reason for reason in node.get("noScheduleReasons") or []
    ]
    return joined(reasons, "schedulable")


def device_counts(node: Mapping[str, Any]) -> dict[str, int]:
    """``{class: count}`` of a node summary (already counted) or of a whole node (a device list)."""
    devices = node.get("devices") or {}
    if isinstance(devices, Mapping):
        return dict(devices)
    return dict(Counter(d["class"] for d in devices))


def labels_text(labels: Mapping[str, Any] | None, empty: str = EMPTY_CELL) -> str:
    """``k=v, k=v`` in key order (values as JSON spells them: ``true``, not ``True``), or ``empty``."""
    return joined((f"{k}={_scalar_text(v)}" for k, v in sorted((labels or {}).items())), empty)


def _scalar_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def taints_text(taints: list[Mapping[str, Any]] | None, empty: str = EMPTY_CELL) -> str:
    """``key=value:Effect, ...`` (kubectl's spelling), or ``empty``."""
    return joined((f"{t['key']}={t.get('value', '')}:{t.get('effect', '')}" for t in taints or []), empty)


def nodes_view(nodes: list[Mapping[str, Any]], wide: bool, pool_names: Mapping[str, str]) -> RenderableType:
    """One row per node: name, id, status, devices (``8 gpu``); ``wide`` adds the pool and labels.
    ``pool_names`` maps pool id -> name for nodes that carry ``poolId``."""
    if not nodes:
        return Text("no nodes")
    table = new_table("name", "id", "status", "devices", *(["pool", "labels"] if wide else []))
    for n in nodes:
        devices = joined(f"{count} {cls}" for cls, count in sorted(device_counts(n).items()))
        row = [n["name"], n["id"], node_status(n), devices]
        if wide:
            pool = n.get("poolId")
            row += [pool_names.get(pool, pool) if pool else EMPTY_CELL, labels_text(n.get("labels"))]
        table.add_row(*row)
    return table


def _link_summary(links: list[Mapping[str, Any]]) -> str:
    """``NV2 × 8, SYS × 16`` (how many atom pairs are joined by each kind of link), or ``<none>``."""
    counts = Counter(str(link.get("link")) for link in links)
    return joined((f"{kind} × {n}" for kind, n in sorted(counts.items())), NONE)


def describe_node_view(node: Mapping[str, Any], pool_name: str | None, wide: bool) -> RenderableType:
    """``describe node``: its fields, labels, taints, scalar resources, devices and links (``wide``
    lists every link)."""
    pool = node.get("poolId", "")
    head = field_grid(
        [
            ("Name", node["name"]),
            ("ID", node["id"]),
            ("Pool", f"{pool_name} ({pool})" if pool_name and pool_name != pool else pool),
            ("Status", node_status(node)),
            ("Cordoned", "yes" if node.get("cordoned") else "no"),
            ("Labels", labels_text(node.get("labels"), NONE)),
            ("Taints", taints_text(node.get("taints"), NONE)),
        ]
    )
    resources = node.get("resources") or {}
    resource_table = new_table("resource", "allocatable", "ratio", "allocated")
    for name, r in resources.items():
        resource_table.add_row(name, str(r.get("allocatable")), str(r.get("ratio")), str(r.get("allocated")))
    devices = node.get("devices") or []
    device_table = new_table("id", "class", "numa", "healthy", "bookable", "attributes")
    for d in devices:
        device_table.add_row(
            d["id"] + (f" (in {d['parent']})" if d.get("parent") else ""),
            d["class"],
            EMPTY_CELL if d.get("numaNode") is None else str(d["numaNode"]),
            "yes" if d.get("healthy") else "no",
            "yes" if d.get("bookable") else "no",
            labels_text(d.get("attributes")),
        )
    links = node.get("links") or []
    if wide and links:
        link_body: RenderableType = new_table("a", "b", "link")
        for link in links:
            link_body.add_row(str(link["a"]), str(link["b"]), str(link["link"]))
    else:
        link_body = _link_summary(links)
    return Group(
        head,
        section("Resources", resource_table if resources else NONE),
        section("Devices", device_table if devices else NONE),
        section("Links", link_body),
    )
