"""Every placement step reads only what it declares (issue 21; docs/extending.md, "What a filter reads").

Each registered filter, derivation and scorer runs, in the pipeline's order, over many requests and
nodes through recording proxies of the request (and its device requests) and of the node; every request
field and node field it touched must be in its ``REQUEST_READS`` / ``NODE_READS``. The memo key a batch
uses is derived from those declarations, so an undeclared read would let a batch reuse an outcome that
a single plan would not give. A toy filter that reads ``topology`` without declaring it is caught, and
a filter that declares nothing turns the memo off for the requests it applies to.
"""

from __future__ import annotations

import types
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from app.placement.context import NodeWork, PlanContext
from app.placement.derived import DERIVATIONS, derivations_for
from app.placement.filters import FILTERS, applies
from app.placement.model import DeviceRequest, Gang, NodeSnapshot, PlacementRequest
from app.placement.options import SchedulerOptions
from app.placement.pipeline import NodeMemos, memo_fields, memo_key, plan_placement
from app.placement.plugins import SchedulerPlugin
from app.placement.reads import NODE_FIELDS, REQUEST_FIELDS, UnknownReadError
from app.placement.scorers import SCORERS
from app.placement.selectors import parse_selector
from tests.factories import gpu_snapshot
from tests.placement.builders import pool
from tests.placement.recording import Recorder, RecordingProxy, RecordingSeq


def _recording(ctx: PlanContext, node: NodeSnapshot, rec: Recorder) -> tuple[PlanContext, NodeWork]:
    """``ctx`` and a fresh ``NodeWork`` whose request-derived fields and node record what is read."""
    devices = RecordingSeq((RecordingProxy(d, rec, "devices.") for d in ctx.devices), rec, "devices")
    request = RecordingProxy(ctx.request, rec, "", {"devices": devices})
    recorded = replace(
        ctx,
        request=request,  # type: ignore[arg-type]
        devices=devices,
        selector_tokens=RecordingSeq(ctx.selector_tokens, rec, "devices.selector"),
        resources=RecordingSeq(ctx.resources, rec, "resources"),
        node_labels=RecordingSeq(ctx.node_labels, rec, "node_labels"),
    )
    work = NodeWork(node, len(ctx.devices))
    work.node = RecordingProxy(  # type: ignore[assignment]
        node,
        rec,
        "node.",
        {
            "inventory": RecordingProxy(node.inventory, rec, "inventory."),
            "state": RecordingProxy(node.state, rec, "state."),
        },
    )
    return recorded, work


def _owner_reads(owner: Any) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    return getattr(owner, "REQUEST_READS", None), getattr(owner, "NODE_READS", None)


def undeclared_reads(
    filters: tuple[Any, ...], requests: list[PlacementRequest], nodes: list[NodeSnapshot]
) -> set[tuple[str, str]]:
    """(owner, field) for every read not declared, over every request x node, steps run as the
    pipeline runs them (applying filters in order, each after the derivations it reads; then the
    scorers on the survivors). Owners declaring None are skipped (they may read anything)."""
    declared: dict[str, set[str] | None] = {}
    for flt in filters:
        req, nod = _owner_reads(flt)
        declared[f"filter {flt.NAME}"] = None if req is None else set(req) | set(nod or ())
    for d in DERIVATIONS:
        declared[f"derivation {d.name}"] = set(d.request_reads) | set(d.node_reads)
    for s in SCORERS.scorers:
        declared[f"scorer {s.name}"] = None if s.request_reads is None else set(s.request_reads)
    rec = Recorder()
    for request in requests:
        ctx = PlanContext.build(request, pool(*nodes), SchedulerOptions())
        for node in nodes:
            rctx, work = _recording(ctx, node, rec)
            done: set[str] = set()
            reason = None
            for flt in filters:
                rec.owner = f"filter {flt.NAME}"
                if not applies(flt, rctx):  # applies(ctx) reads the request too
                    continue
                for d in derivations_for(tuple(flt.READS)):
                    if d.name not in done:
                        done.add(d.name)
                        rec.owner = f"derivation {d.name}"
                        d.run(rctx, work)
                rec.owner = f"filter {flt.NAME}"
                reason = flt.check(rctx, work)
                if reason is not None:
                    break
            if reason is not None:
                continue
            for d in derivations_for(SCORERS.reads):
                if d.name not in done:
                    done.add(d.name)
                    rec.owner = f"derivation {d.name}"
                    d.run(rctx, work)
            for s in SCORERS.scorers:
                rec.owner = f"scorer {s.name}"
                s.score_fn()(rctx, work)
    missing = set()
    for owner, field in rec.log:
        allowed = declared[owner]
        if field.startswith("node."):
            continue  # the snapshot object itself (its inventory / state are recorded below it)
        if allowed is not None and field not in allowed:
            missing.add((owner, field))
    return missing


A100 = parse_selector("gpuProduct == 'A100'")


def _requests() -> list[PlacementRequest]:
    base = PlacementRequest(tenant_id="t1", pool_id="p")
    one = (DeviceRequest("gpu", 2),)
    return [
        base,
        replace(base, devices=one),
        replace(base, devices=(DeviceRequest("gpu", 2, topology="nvlink-all"),)),
        replace(base, devices=(DeviceRequest("gpu", 1, selector=A100), DeviceRequest("gpu", 1))),
        replace(base, devices=(DeviceRequest("mig", 1),)),
        replace(base, devices=one, resources={"cpu": Decimal(4), "memory": Decimal(8)}),
        replace(base, devices=one, node_labels={"zone": "a"}),
        replace(base, devices=one, node_labels={"rack": "*"}),
        replace(base, devices=one, binding="node"),
        replace(base, resources={"cpu": Decimal(2)}, binding="node", tenant_id="t2"),
        replace(base, devices=one, spot=True, gang=Gang(2, "zone")),
        replace(base, devices=(DeviceRequest("gpu", 4),)),
    ]


def _nodes() -> list[NodeSnapshot]:
    return [
        gpu_snapshot("a", 4, attributes={"gpuProduct": "A100"}, labels={"zone": "a"}),
        gpu_snapshot("b", 4, link="SYS", booked=(0,), resources={"cpu": ("16", "1", "0")}),
        gpu_snapshot("c", 4, reasons=("tainted dedicated=t2",), resources={"cpu": ("8", "1", "6")}),
        gpu_snapshot("d", 2, unavailable=(1,), labels={"zone": "b", "rack": "r1"}, leasable=False),
        gpu_snapshot(
            "e", 8, reasons=("cordoned",), resources={"cpu": ("64", "1", "0"), "memory": ("9", "1", "0")}
        ),
    ]


def test_every_registered_step_reads_only_what_it_declares() -> None:
    assert undeclared_reads(FILTERS, _requests(), _nodes()) == set()


def _toy_check(ctx: PlanContext, work: NodeWork) -> str | None:
    for device in ctx.devices:
        if device.topology == "nvlink-all":
            return "toy: no nvlink here"
    return None


def _toy(request_reads: tuple[str, ...] | None) -> types.ModuleType:
    toy = types.ModuleType("toy")
    toy.NAME = "toy"  # type: ignore[attr-defined]
    toy.READS = ()  # type: ignore[attr-defined]
    toy.AFTER = ()  # type: ignore[attr-defined]
    toy.check = _toy_check  # type: ignore[attr-defined]
    if request_reads is not None:
        toy.REQUEST_READS = request_reads  # type: ignore[attr-defined]
        toy.NODE_READS = ()  # type: ignore[attr-defined]
    return toy


def test_a_toy_filter_reading_topology_undeclared_is_caught() -> None:
    toy = _toy(("devices", "devices.device_class"))  # topology left out
    assert undeclared_reads((*FILTERS, toy), _requests(), _nodes()) == {("filter toy", "devices.topology")}
    declared = _toy(("devices", "devices.topology"))
    assert undeclared_reads((*FILTERS, declared), _requests(), _nodes()) == set()


def _key(request: PlacementRequest, filters: tuple[Any, ...] = FILTERS) -> Any:
    return memo_key(PlanContext.build(request, pool(*_nodes()), SchedulerOptions()), SCORERS, filters)


def test_the_memo_key_tells_apart_requests_differing_in_any_declared_field() -> None:
    base = PlacementRequest(tenant_id="t1", pool_id="p", devices=(DeviceRequest("gpu", 2),))
    nvlink = replace(base, devices=(DeviceRequest("gpu", 2, topology="nvlink-all"),))
    assert _key(base) != _key(nvlink)  # the bug of issue 21: topology was not in the batch's key
    assert _key(base) == _key(replace(base, spot=True))  # no step reads spot
    assert _key(base) != _key(replace(base, tenant_id="t2"))
    assert _key(base) != _key(replace(base, resources={"cpu": Decimal(1), "memory": Decimal(1)}))
    assert _key(replace(base, resources={"cpu": Decimal(1), "memory": Decimal(1)})) != _key(
        replace(base, resources={"memory": Decimal(1), "cpu": Decimal(1)})
    )  # the scalars reason names the first short resource in request order
    assert "devices.topology" in (memo_fields(FILTERS, SCORERS) or ())


def test_a_filter_that_declares_nothing_turns_the_memo_off_where_it_applies() -> None:
    base = PlacementRequest(tenant_id="t1", pool_id="p", devices=(DeviceRequest("gpu", 2),))
    undeclared = _toy(None)
    assert _key(base, (*FILTERS, undeclared)) is None
    undeclared.applies = lambda ctx: any(d.topology for d in ctx.devices)  # type: ignore[attr-defined]
    assert _key(base, (*FILTERS, undeclared)) is not None  # it cannot reject this request
    assert (
        _key(replace(base, devices=(DeviceRequest("gpu", 2, topology="nvlink-all"),)), (*FILTERS, undeclared))
        is None
    )


def test_a_declaration_naming_an_unknown_field_is_refused() -> None:
    bad = _toy(("devices.colour",))
    with pytest.raises(UnknownReadError, match="filter toy declares unknown request fields"):
        memo_fields((*FILTERS, bad), SCORERS)


def test_the_vocabulary_covers_the_request_and_node_fields() -> None:
    assert {f.split(".")[0] for f in REQUEST_FIELDS} == set(PlacementRequest.__slots__)  # type: ignore[attr-defined]
    assert {f.split(".", 1)[1] for f in REQUEST_FIELDS if f.startswith("devices.")} == set(
        DeviceRequest.__slots__  # type: ignore[attr-defined]
    )
    assert {f.split(".")[0] for f in NODE_FIELDS} == {"inventory", "state"}


def test_plugins_turn_the_memo_off() -> None:
    memos: NodeMemos = {}
    base = PlacementRequest(tenant_id="t1", pool_id="p", devices=(DeviceRequest("gpu", 1),))
    plan_placement(base, pool(*_nodes()), SchedulerOptions(plugins=(SchedulerPlugin("p1"),)), memos)
    assert memos == {}
    plan_placement(base, pool(*_nodes()), SchedulerOptions(), memos)
    assert len(memos) == 1
