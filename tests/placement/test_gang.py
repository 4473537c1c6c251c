"""Gang placement, pure: members on distinct nodes sharing the topologyKey label, the best group by total
score, and the pending reason when no group holds the gang."""

from __future__ import annotations

from dataclasses import replace

from app.placement.gang import plan_gang
from app.placement.model import Gang, Plan, Rejections
from app.placement.options import SchedulerOptions
from tests.factories import gpu_snapshot
from tests.placement.builders import pool, request


def _gang(members: int, key: str | None = "rack", count: int = 2) -> object:
    return replace(request(count=count), gang=Gang(members, key))


def test_members_share_the_rack_with_the_best_total() -> None:
    nodes = [
        gpu_snapshot("a1", labels={"rack": "a"}, booked=(0, 1)),  # binpack prefers the busier nodes
        gpu_snapshot("a2", labels={"rack": "a"}),
        gpu_snapshot("b1", labels={"rack": "b"}, booked=(0,)),
        gpu_snapshot("b2", labels={"rack": "b"}, booked=(0,)),
        gpu_snapshot("c1", labels={"rack": "c"}, booked=(0, 1)),
    ]
    plan = plan_gang(_gang(2), pool(*nodes), SchedulerOptions())  # type: ignore[arg-type]
    assert isinstance(plan, Plan)
    by_id = {c.node_id: c for c in plan.ranked}
    totals = {
        "a": by_id["a1"].score + by_id["a2"].score,
        "b": by_id["b1"].score + by_id["b2"].score,
    }
    assert abs(totals["a"] - totals["b"]) < 1e-12  # 1 + 0.5 against 0.75 + 0.75: a tie, broken by rack
    best = min(totals, key=lambda rack: (-round(totals[rack], 9), rack))
    assert {c.node_id for c in plan.members} == {f"{best}1", f"{best}2"}
    assert len({a for c in plan.members for a in c.atoms}) == 4 and plan.chosen == plan.members[0]


def test_without_a_topology_key_any_nodes_will_do() -> None:
    nodes = [gpu_snapshot(f"n{i}", labels={"rack": str(i)}) for i in range(3)]
    plan = plan_gang(_gang(3, key=None), pool(*nodes), SchedulerOptions())  # type: ignore[arg-type]
    assert isinstance(plan, Plan) and {c.node_id for c in plan.members} == {"n0", "n1", "n2"}


def test_no_group_holds_the_gang() -> None:
    nodes = [
        gpu_snapshot("a1", labels={"rack": "a"}),
        gpu_snapshot("b1", labels={"rack": "b"}),
        gpu_snapshot("b2", labels={"rack": "b"}, booked=(0, 1, 2)),
        gpu_snapshot("x", labels={}),
    ]
    result = plan_gang(_gang(2), pool(*nodes), SchedulerOptions())  # type: ignore[arg-type]
    assert isinstance(result, Rejections)
    assert result.summary == (
        "no node fits (4 nodes): 1 × fits: 1 of 4 gpu free; "
        "gang: 2 members need 2 nodes with the same rack, 3 fit (best rack=b: 1)"
    )
    assert result.by_node["x"] == "gang: missing rack"
