"""The shortlist's memo keys come from what it declares it reads (docs/extending.md, "What a filter
reads"; app/placement/shortlist.py): every read of the request by ``free_groups`` and ``shortlist_rows``
is recorded through proxies, and the recorded fields must be exactly the declared ones (a read left
undeclared would let two requests share a memo entry they must not; a stale declaration splits it)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any

from app.placement.model import DeviceRequest, PlacementRequest, PoolInventory
from app.placement.options import SchedulerOptions
from app.placement.selectors import parse_selector
from app.placement.shortlist import (
    FREE_GROUPS_READS,
    SHAPE_READS,
    Exceptions,
    free_groups,
    shape_key,
    shortlist_rows,
)
from tests.factories import gpu_snapshot
from tests.placement.recording import Recorder, RecordingProxy, RecordingSeq


class _Resources(Mapping[str, Any]):
    """A request's ``resources`` that tells its names (``resources.names``) from its amounts."""

    def __init__(self, real: Mapping[str, Any], rec: Recorder) -> None:
        self._real, self._rec = real, rec

    def __iter__(self) -> Iterator[str]:
        self._rec.read("resources.names")
        return iter(self._real)

    def __len__(self) -> int:
        self._rec.read("resources.names")
        return len(self._real)

    def __contains__(self, key: object) -> bool:
        self._rec.read("resources.names")
        return key in self._real

    def __getitem__(self, key: str) -> Any:
        self._rec.read("resources")
        return self._real[key]


class _Labels(dict):  # type: ignore[type-arg]
    rec: Recorder

    def items(self) -> Any:
        self.rec.read("node_labels")
        return super().items()

    def __bool__(self) -> bool:
        self.rec.read("node_labels")
        return super().__len__() > 0


def _recording(request: PlacementRequest, rec: Recorder) -> PlacementRequest:
    devices = RecordingSeq((RecordingProxy(d, rec, "devices.") for d in request.devices), rec, "devices")
    labels = _Labels(request.node_labels)
    labels.rec = rec
    wrap = {"devices": devices, "resources": _Resources(request.resources, rec), "node_labels": labels}
    return RecordingProxy(request, rec, "", wrap, record_wrapped=False)  # type: ignore[return-value]


def _inventory() -> PoolInventory:
    snapshots = [
        gpu_snapshot("a", 4, attributes={"gpuProduct": "A100"}, labels={"zone": "a"}),
        gpu_snapshot("b", 8, resources={"cpu": ("16", "1", "0")}),
        gpu_snapshot("c", 2, labels={"zone": "b"}, resources={"cpu": ("8", "1", "0")}),
    ]
    nodes = {s.inventory.id: s.inventory for s in snapshots}
    names = {s.inventory.id: frozenset(s.state.resources) for s in snapshots}
    return PoolInventory(1, nodes, tuple(nodes), resource_names=names)


def _requests() -> list[PlacementRequest]:
    base = PlacementRequest(tenant_id="t1", pool_id="p", devices=(DeviceRequest("gpu", 2),))
    a100 = parse_selector("gpuProduct == 'A100'")
    return [
        base,
        replace(base, devices=(DeviceRequest("gpu", 1, selector=a100), DeviceRequest("gpu", 1))),
        replace(base, resources={"cpu": Decimal(4)}),
        replace(base, node_labels={"zone": "a"}),
    ]


def _exceptions() -> Exceptions:
    return Exceptions({"b": {"b-GPU0"}}, {"c": {"c-GPU1"}}, {}, frozenset(), frozenset())


def _reads_of(run: Any) -> set[str]:
    rec = Recorder()
    for request in _requests():
        run(_recording(request, rec))
    return {field for _owner, field in rec.log}


def test_free_groups_reads_exactly_what_it_declares() -> None:
    assert _reads_of(lambda r: free_groups(_inventory(), r)) == set(FREE_GROUPS_READS)


def test_shortlist_rows_reads_exactly_what_its_shape_key_holds() -> None:
    options = SchedulerOptions()

    def run(request: PlacementRequest) -> None:
        shortlist_rows(_inventory(), request, options, _exceptions(), 10)

    assert _reads_of(run) == set(SHAPE_READS)


def test_the_shape_key_tells_apart_what_the_shortlist_reads() -> None:
    options = SchedulerOptions()
    keys = {shape_key(r, options) for r in _requests()}
    assert len(keys) == len(_requests())
    same = replace(_requests()[2], resources={"cpu": Decimal(6)})  # amounts are not read: shared
    assert shape_key(same, options) == shape_key(_requests()[2], options)
