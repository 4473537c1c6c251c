"""A batch decides exactly as single plans do (issue 21; docs/extending.md, "What a filter reads").

Random sequences of requests (topology, selectors, tenants against dedications and cordons, scalar
resources, nodeLabels, whole-node leases, spot, gangs, overlapping windows) are planned twice over the
same pool: one at a time, each on fresh node snapshots and without a memo (what a single create does),
and as one batch does it (``app/capacity/planning/shared_reads.py``'s groups): per window, a node keeps its
snapshot
object until a plan changes it, and the plans of the window share one memo store. Each plan's decision
(the nodes and atoms chosen, or the pending reason) must be the same on both paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.placement.gang import plan_gang
from app.placement.model import (
    Atom,
    DeviceRequest,
    Gang,
    NodeInventory,
    NodeSnapshot,
    NodeState,
    PlacementRequest,
    Plan,
    PoolSnapshot,
    ScalarResource,
)
from app.placement.options import SchedulerOptions
from app.placement.pipeline import NodeMemos, plan_placement
from app.placement.selectors import parse_selector

WINDOWS = ((0, 2), (1, 3), (2, 4), (0, 4))  # hours: overlapping and disjoint ones
A100 = parse_selector("gpuProduct == 'A100'")


@st.composite
def inventories(draw: st.DrawFn) -> tuple[tuple[NodeInventory, tuple[str, ...], bool, str], ...]:
    """2-5 nodes: 2-8 GPUs of A100 or H100 linked NV, SYS or mixed; a zone label; NoSchedule reasons
    (a dedication, a cordon or none); leasable or not; cpu 8 or 32."""
    nodes = []
    for n in range(draw(st.integers(2, 5))):
        node_id = f"n{n}"
        gpus = draw(st.sampled_from((8, 4, 6, 2)))
        product = draw(st.sampled_from(("A100", "A100", "H100")))
        atoms = tuple(
            Atom(
                id=f"{node_id}-GPU{i}",
                device_class="gpu",
                attributes={"gpuProduct": product},
                numa_node=i // 3,
            )
            for i in range(gpus)
        )
        wiring = draw(st.sampled_from(("NV12", "SYS", "mixed")))
        links = {
            (atoms[a].id, atoms[b].id): (
                wiring if wiring != "mixed" else ("NV12" if a // 2 == b // 2 else "SYS")
            )
            for a in range(gpus)
            for b in range(a + 1, gpus)
        }
        labels = {"zone": draw(st.sampled_from(("a", "b")))}
        inventory = NodeInventory(node_id, node_id, labels, {"zone": "operator"}, atoms, links)
        reasons = draw(st.sampled_from(((),) * 4 + (("tainted dedicated=t1",), ("cordoned",))))
        cpu = draw(st.sampled_from(("32", "32", "8")))
        nodes.append((inventory, reasons, draw(st.sampled_from((True, True, False))), cpu))
    return tuple(nodes)


@st.composite
def requests(draw: st.DrawFn) -> tuple[PlacementRequest, int]:
    """One request and its window index."""
    devices = tuple(
        DeviceRequest(
            "gpu",
            draw(st.sampled_from((2, 1, 3, 4))),
            selector=draw(st.sampled_from((None, None, None, A100))),
            topology=draw(st.sampled_from((None, "nvlink-all"))),
        )
        for _ in range(draw(st.sampled_from((1, 1, 2, 0))))
    )
    resources = draw(st.sampled_from(({}, {"cpu": Decimal(4)}, {"cpu": Decimal(12)})))
    if not devices and not resources:
        resources = {"cpu": Decimal(2)}
    binding = draw(st.sampled_from(("device",) * 5 + ("node",)))
    gang = draw(st.sampled_from((None,) * 6 + (Gang(2, "zone"), Gang(2))))
    request = PlacementRequest(
        tenant_id=draw(st.sampled_from(("t1", "t2"))),
        pool_id="p",
        devices=devices,
        resources=resources,
        node_labels=draw(st.sampled_from(({}, {}, {}, {"zone": "a"}, {"zone": "*"}))),
        binding=binding,
        gang=gang if binding == "device" else None,
        spot=draw(st.booleans()),
    )
    return request, draw(st.integers(0, len(WINDOWS) - 1))


@dataclass
class _Pool:
    """The pool's static nodes and what the plans so far hold, per window."""

    nodes: tuple[tuple[NodeInventory, tuple[str, ...], bool, str], ...]
    held: list[tuple[int, str, frozenset[str], Decimal]] = field(
        default_factory=list
    )  # window, node, atoms, cpu

    def state(self, node: int, window: int) -> NodeState:
        inventory, reasons, leasable, cpu = self.nodes[node]
        lo, hi = WINDOWS[window]
        overlapping = [
            h for h in self.held if h[1] == inventory.id and WINDOWS[h[0]][0] < hi and lo < WINDOWS[h[0]][1]
        ]
        booked = frozenset(a for h in overlapping for a in h[2])
        used = sum((h[3] for h in overlapping), Decimal(0))
        return NodeState(
            reasons, leasable, frozenset(), booked, {"cpu": ScalarResource(Decimal(cpu), Decimal(1), used)}
        )

    def take(self, plan: Plan | object, window: int) -> None:
        if isinstance(plan, Plan):
            for c in plan.placements:
                self.held.append((window, c.node_id, frozenset(c.atoms), Decimal(c.resources.get("cpu", 0))))


def _decision(plan: object) -> object:
    if isinstance(plan, Plan):
        return tuple((c.node_id, c.atoms_by_request, dict(c.resources)) for c in plan.placements)
    return plan.summary  # type: ignore[attr-defined]


def _plan(request: PlacementRequest, snapshot: PoolSnapshot, seed: int, memos: NodeMemos | None) -> object:
    options = SchedulerOptions(seed=seed, top_n=2)
    if request.gang is not None:
        return plan_gang(request, snapshot, options)  # a batch plans gangs on the whole pool, no memo
    return plan_placement(request, snapshot, options, memos)


def one_at_a_time(nodes: tuple, sequence: list[tuple[PlacementRequest, int]]) -> list[object]:
    pool = _Pool(nodes)
    decisions = []
    for seed, (request, window) in enumerate(sequence):
        snapshot = PoolSnapshot(
            "p", nodes=tuple(NodeSnapshot(inv, pool.state(i, window)) for i, (inv, *_) in enumerate(nodes))
        )
        plan = _plan(request, snapshot, seed, None)
        pool.take(plan, window)
        decisions.append(_decision(plan))
    return decisions


def as_one_batch(nodes: tuple, sequence: list[tuple[PlacementRequest, int]]) -> list[object]:
    pool = _Pool(nodes)
    snapshots: dict[tuple[int, int], NodeSnapshot] = {}  # (window, node) -> kept while unchanged
    memos: dict[int, NodeMemos] = {}  # window -> the group's memo store
    decisions = []
    for seed, (request, window) in enumerate(sequence):
        for i, (inv, *_) in enumerate(nodes):
            if (window, i) not in snapshots:
                snapshots[window, i] = NodeSnapshot(inv, pool.state(i, window))
        snapshot = PoolSnapshot("p", nodes=tuple(snapshots[window, i] for i in range(len(nodes))))
        plan = _plan(request, snapshot, seed, memos.setdefault(window, {}))
        pool.take(plan, window)
        if isinstance(plan, Plan):  # the plan changed its nodes for every window overlapping its own
            lo, hi = WINDOWS[window]
            changed = {c.node_id for c in plan.placements}
            for w, i in list(snapshots):
                if nodes[i][0].id in changed and WINDOWS[w][0] < hi and lo < WINDOWS[w][1]:
                    del snapshots[w, i]
        decisions.append(_decision(plan))
    return decisions


VARIANTS = (
    "fresh",
    "devices",
    "topology",
    "selector",
    "tenant",
    "resources",
    "labels",
    "binding",
    "spot",
    "window",
)


@st.composite
def sequences(draw: st.DrawFn) -> list[tuple[PlacementRequest, int]]:
    """2-10 requests, each a fresh one or a variant of the first differing in one field: alike
    requests are where a memo shared across them could answer for the wrong one."""
    first, window = draw(requests())
    out = [(first, window)]
    for _ in range(draw(st.integers(1, 9))):
        other, other_window = draw(requests())
        how = draw(st.sampled_from(VARIANTS))
        if how == "fresh":
            out.append((other, other_window))
            continue
        variant = {
            "devices": replace(first, devices=other.devices or first.devices),
            "topology": replace(
                first,
                devices=tuple(
                    replace(d, topology=None if d.topology else "nvlink-all") for d in first.devices
                ),
            ),
            "selector": replace(
                first, devices=tuple(replace(d, selector=None if d.selector else A100) for d in first.devices)
            ),
            "tenant": replace(first, tenant_id=other.tenant_id),
            "resources": replace(first, resources=other.resources),
            "labels": replace(first, node_labels=other.node_labels),
            "binding": replace(
                first, binding=other.binding, gang=None if other.binding == "node" else first.gang
            ),
            "spot": replace(first, spot=other.spot),
            "window": first,
        }[how]
        if not variant.devices and not variant.resources:
            variant = replace(variant, resources={"cpu": Decimal(2)})
        out.append((variant, other_window if how == "window" else window))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=inventories(), sequence=sequences())
def test_a_batch_decides_as_one_plan_at_a_time(
    nodes: tuple, sequence: list[tuple[PlacementRequest, int]]
) -> None:
    assert as_one_batch(nodes, sequence) == one_at_a_time(nodes, sequence)


def test_the_issue_21_sequence() -> None:
    """A plain 2-GPU request then the same with nvlink-all on SYS-linked nodes: the second stays
    pending in the batch as alone (the memo once shared their outcomes)."""
    nodes = []
    for node_id in ("n0", "n1"):
        atoms = tuple(Atom(f"{node_id}-GPU{i}", "gpu") for i in range(4))
        links = {(atoms[a].id, atoms[b].id): "SYS" for a in range(4) for b in range(a + 1, 4)}
        nodes.append((NodeInventory(node_id, node_id, atoms=atoms, links=links), (), True, "32"))
    plain = PlacementRequest("t1", "p", devices=(DeviceRequest("gpu", 2),))
    nvlink = PlacementRequest("t1", "p", devices=(DeviceRequest("gpu", 2, topology="nvlink-all"),))
    sequence = [(plain, 0), (nvlink, 0)]  # the node the first did not take is unchanged for the second
    batch = as_one_batch(tuple(nodes), sequence)
    assert batch == one_at_a_time(tuple(nodes), sequence)
    assert isinstance(batch[1], str) and "topology: no NVLink-complete set of 2 gpu" in batch[1]
