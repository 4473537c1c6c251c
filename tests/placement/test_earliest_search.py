"""The pure earliest-start search (app/placement/earliest.py; docs/lifecycle.md, "Earliest start"): tables
of cases, the proof's edges (half-open windows, a holding ending exactly at the requested start), and a
brute-force check of the claim that the earliest start is the requested one or a holding's end."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from app.placement.earliest import (
    BusyAtFirst,
    EarliestSearch,
    Held,
    NodeHoldings,
    QuotaRoom,
    class_counts,
    no_nodes_reason,
    no_quota_reason,
    node_bound,
    peak,
    search,
)
from app.placement.model import DeviceRequest, Gang, MatchExpression, PlacementRequest, Selector
from tests.factories import gpu_snapshot

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LAST = T0 + timedelta(days=1)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def request(
    gpus: int = 0, minutes: int = 60, resources: dict[str, int] | None = None, **extra: object
) -> PlacementRequest:
    devices = (DeviceRequest("gpu", gpus),) if gpus else ()
    return PlacementRequest(
        tenant_id="acme",
        pool_id="p",
        devices=devices,
        resources={k: Decimal(v) for k, v in (resources or {}).items()},
        start=T0,
        end=at(minutes),
        **extra,  # type: ignore[arg-type]
    )


def booked(node: str, windows: dict[int, list[tuple[int, int]]]) -> NodeHoldings:
    """GPU index -> [(start minute, end minute)] on ``node``."""
    return NodeHoldings(
        bookings={f"{node}-GPU{i}": [(at(s), at(e)) for s, e in w] for i, w in windows.items()}
    )


def starts(found, n: int = 5) -> list[datetime]:  # noqa: ANN001
    out = []
    for t in found.starts():
        out.append(t)
        if len(out) == n:
            break
    return out


# (name, request, nodes' holdings, expected first start in minutes from T0, or None)
CASES = [
    ("free now", request(4), {"a": booked("a", {})}, 0),
    ("4 of 8 booked for an hour", request(8), {"a": booked("a", {i: [(-30, 60)] for i in range(4)})}, 60),
    # a booking ending exactly at T0 holds nothing in [T0, ...): the window is half-open
    ("ends exactly at T0", request(8), {"a": booked("a", {i: [(-60, 0)] for i in range(8)})}, 0),
    # a booking starting exactly at T0 + d does not overlap [T0, T0 + d)
    (
        "starts exactly at the window's end",
        request(8),
        {"a": booked("a", {i: [(60, 120)] for i in range(8)})},
        0,
    ),
    # a gap shorter than the window is skipped: free [30, 50) only, then free from 90
    (
        "a gap too short",
        request(8, minutes=30),
        {"a": booked("a", {i: [(-10, 30), (50, 90)] for i in range(8)})},
        90,
    ),
    (
        "a gap just long enough",
        request(8, minutes=20),
        {"a": booked("a", {i: [(-10, 30), (50, 90)] for i in range(8)})},
        30,
    ),
    # the earlier of two nodes
    (
        "two nodes",
        request(8),
        {"a": booked("a", {i: [(0, 120)] for i in range(8)}), "b": booked("b", {0: [(0, 45)]})},
        45,
    ),
    # atoms free at different times: 8 free only once the last one ends
    ("staggered atoms", request(8), {"a": booked("a", {i: [(0, 10 * (i + 1))] for i in range(8)})}, 80),
    (
        "staggered atoms, fewer needed",
        request(5),
        {"a": booked("a", {i: [(0, 10 * (i + 1))] for i in range(8)})},
        50,
    ),
    ("never within the lead", request(8), {"a": booked("a", {0: [(0, 3 * 24 * 60)]})}, None),
]


@pytest.mark.parametrize(("name", "req", "holdings", "expected"), CASES, ids=[c[0] for c in CASES])
def test_first_candidate(name: str, req: PlacementRequest, holdings: dict, expected: int | None) -> None:
    nodes = [gpu_snapshot(n, 8) for n in sorted(holdings)]
    found = search(req, nodes, {}, holdings, QuotaRoom(), LAST)
    first = starts(found, 1)
    assert first == ([] if expected is None else [at(expected)])
    if expected is None:
        assert found.why_none() == no_nodes_reason(1, LAST)


def test_candidates_come_in_order_without_repeats() -> None:
    holdings = {
        "a": booked("a", {i: [(0, 30)] for i in range(8)}),
        "b": booked("b", {i: [(0, 30)] for i in range(8)}),
        "c": booked("c", {i: [(0, 60), (70, 80)] for i in range(8)}),
    }
    found = search(
        request(8, minutes=5), [gpu_snapshot(n, 8) for n in "abc"], {}, holdings, QuotaRoom(), LAST
    )
    assert starts(found) == [at(30), at(60), at(80)]


def test_scalars_are_counted_per_instant() -> None:
    # two holdings of 40 cpu that do not overlap: 60 of 64 free except where one holds
    node = gpu_snapshot("a", 0)
    held = NodeHoldings(
        scalars={"cpu": [Held(at(0), at(30), Decimal(40)), Held(at(30), at(90), Decimal(40))]}
    )
    found = search(
        request(resources={"cpu": 30}), [node], {"a": {"cpu": Decimal(64)}}, {"a": held}, QuotaRoom(), LAST
    )
    assert starts(found, 1) == [at(90)]
    found = search(
        request(resources={"cpu": 24}), [node], {"a": {"cpu": Decimal(64)}}, {"a": held}, QuotaRoom(), LAST
    )
    assert starts(found, 1) == [T0]
    # a node without the resource's row never holds it
    found = search(request(resources={"cpu": 1}), [node], {}, {}, QuotaRoom(), LAST)
    assert starts(found, 1) == []


def test_a_selector_counts_only_matching_atoms() -> None:
    h100 = gpu_snapshot("h", 8, attributes={"gpuProduct": "H100"})
    a100 = gpu_snapshot("a", 8, attributes={"gpuProduct": "A100"})
    holdings = {
        "h": booked("h", {i: [(0, 30)] for i in range(8)}),
        "a": booked("a", {i: [(0, 90)] for i in range(8)}),
    }
    selector = Selector((MatchExpression("gpuProduct", "In", ("A100",)),))
    req = request(minutes=60)
    req = PlacementRequest(**{**_fields(req), "devices": (DeviceRequest("gpu", 2, selector),)})
    found = search(req, [h100, a100], {}, holdings, QuotaRoom(), LAST)
    assert starts(found, 1) == [at(90)]


def test_a_gang_needs_members_nodes_at_one_start() -> None:
    holdings = {n: booked(n, {i: [(0, m)] for i in range(8)}) for n, m in (("a", 30), ("b", 90), ("c", 60))}
    nodes = [gpu_snapshot(n, 8) for n in "abc"]
    found = search(request(8, gang=Gang(2)), nodes, {}, holdings, QuotaRoom(), LAST)
    assert starts(found, 1) == [at(60)]
    found = search(request(8, gang=Gang(4)), nodes, {}, holdings, QuotaRoom(), LAST)
    assert starts(found, 1) == [] and found.why_none() == no_nodes_reason(4, LAST)


def test_a_lease_needs_a_node_holding_nothing() -> None:
    # one GPU of the node booked until 45 (the lease asks for 1 GPU: 7 are free, but the node is not)
    holdings = {"a": booked("a", {7: [(0, 45)]})}
    found = search(request(1, binding="node"), [gpu_snapshot("a", 8)], {}, holdings, QuotaRoom(), LAST)
    assert starts(found, 1) == [at(45)]
    held = NodeHoldings(scalars={"memory": [Held(at(0), at(50), Decimal(1))]})
    found = search(
        request(1, binding="node"),
        [gpu_snapshot("a", 8)],
        {"a": {"memory": Decimal(9)}},
        {"a": held},
        QuotaRoom(),
        LAST,
    )
    assert starts(found, 1) == [at(50)]


def test_node_state_that_is_not_a_window_holds_at_every_start() -> None:
    cordoned = gpu_snapshot("a", 8, reasons=("cordoned",))
    sick = gpu_snapshot("b", 8, unavailable=(0,))
    found = search(request(8), [cordoned, sick], {}, {}, QuotaRoom(), LAST)
    assert starts(found, 1) == []
    dedicated = gpu_snapshot("c", 8, reasons=("tainted dedicated=acme",))
    assert starts(search(request(8), [dedicated], {}, {}, QuotaRoom(), LAST), 1) == [T0]


def test_quota_is_tenant_wide_per_instant() -> None:
    quota = QuotaRoom(
        limits={"gpu": Decimal(8)},
        wanted={"gpu": Decimal(4)},
        holdings={"gpu": [Held(at(-30), at(40), Decimal(6)), Held(at(40), at(100), Decimal(2))]},
    )
    # the node is free all along; acme's quota has 2 left until 40, 6 from 40 to 100
    found = search(request(4), [gpu_snapshot("a", 8)], {}, {}, quota, LAST)
    assert starts(found, 2) == [at(40), at(100)]
    over = QuotaRoom(limits={"gpu": Decimal(2)}, wanted={"gpu": Decimal(4)})
    found = search(request(4), [gpu_snapshot("a", 8)], {}, {}, over, LAST)
    assert starts(found, 1) == [] and found.why_none() == no_quota_reason(LAST)


def test_peak_counts_half_open_windows() -> None:
    back_to_back = [Held(at(0), at(30), Decimal(5)), Held(at(30), at(60), Decimal(5))]
    assert peak(back_to_back, at(0), at(60)) == 5
    assert peak([*back_to_back, Held(at(29), at(31), Decimal(1))], at(0), at(60)) == 6
    assert peak(back_to_back, at(60), at(90)) == 0


def _fields(req: PlacementRequest) -> dict:
    return {name: getattr(req, name) for name in PlacementRequest.__slots__}  # type: ignore[attr-defined]


def _fits_by_brute_force(
    t: int, d: int, nodes: dict[str, dict[int, list[tuple[int, int]]]], gpus: int, members: int
) -> bool:
    """At least ``members`` nodes with ``gpus`` GPUs free over [t, t + d), every minute checked."""
    good = 0
    for windows in nodes.values():
        free = sum(1 for i in range(8) if all(not (s < t + d and t < e) for s, e in windows.get(i, [])))
        good += free >= gpus
    return good >= members


@pytest.mark.parametrize("seed", range(40))
def test_the_earliest_start_is_the_first_candidate(seed: int) -> None:
    """The claim of the module's docstring on random pools: the first candidate start is the first
    minute at which a brute-force check finds room (holdings on whole minutes)."""
    rng = random.Random(seed)
    layout: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for n in range(rng.randint(1, 4)):
        per_atom: dict[int, list[tuple[int, int]]] = {}
        for i in range(8):
            t, windows = rng.randint(-30, 10), []
            for _ in range(rng.randint(0, 3)):
                length = rng.randint(1, 60)
                windows.append((t, t + length))
                t += length + rng.randint(0, 40)
            per_atom[i] = windows
        layout[f"n{n}"] = per_atom
    gpus, d, members = rng.randint(1, 8), rng.randint(1, 90), rng.choice((1, 1, 2))
    last_minute = 400
    req = request(gpus, minutes=d, gang=Gang(members) if members > 1 else None)
    nodes = [gpu_snapshot(n, 8) for n in layout]
    found = search(req, nodes, {}, {n: booked(n, w) for n, w in layout.items()}, QuotaRoom(), at(last_minute))
    expected = next(
        (t for t in range(last_minute + 1) if _fits_by_brute_force(t, d, layout, gpus, members)), None
    )
    assert starts(found, 1) == ([] if expected is None else [at(expected)])
    # the I/O half's way (nodes added lowest bound first) takes the same candidates
    full = search(req, nodes, {}, {n: booked(n, w) for n, w in layout.items()}, QuotaRoom(), at(last_minute))
    assert _by_bounds(req, layout, at(last_minute), 3) == starts(full, 3)


def _by_bounds(req: PlacementRequest, layout: dict, last: datetime, n: int) -> list[datetime]:
    """The first ``n`` candidates as the I/O half takes them: nodes added lowest bound first, one at a
    time, each candidate taken only below the bound of every node not added yet."""
    bounds = []
    for name, per_atom in layout.items():
        across = [e for windows in per_atom.values() for s, e in windows if at(s) <= T0 < at(e)]
        busy = {"gpu": BusyAtFirst(len(across), at(min(across)), at(max(across)))} if across else {}
        bound = node_bound(class_counts(gpu_snapshot(name, 8).inventory), req, busy)
        if bound is not None:
            bounds.append((bound, name))
    bounds.sort()
    found, added, out = EarliestSearch(req, QuotaRoom(), last), 0, []
    while len(out) < n:
        t = found.next_start(bounds[added][0] if added < len(bounds) else None)
        if t is None:
            if added == len(bounds):
                break
            name = bounds[added][1]
            found.add(gpu_snapshot(name, 8), {}, booked(name, layout[name]))
            added += 1
            continue
        out.append(t)
    return out


def test_node_bound_waits_for_the_first_end_of_a_short_class() -> None:
    node = class_counts(gpu_snapshot("a", 8).inventory)
    busy = {"gpu": BusyAtFirst(4, at(30), at(90))}
    assert node_bound(node, request(4), busy) == T0  # 4 free at T0: no wait
    assert node_bound(node, request(5), busy) == at(30)  # short until the first of the four frees
    assert node_bound(node, request(9), busy) is None  # never: 8 atoms
    assert node_bound(node, request(1, binding="node"), {"": busy["gpu"]}) == at(90)  # a lease: all of them
    assert node_bound(node, request(1, binding="node"), {}) == T0
