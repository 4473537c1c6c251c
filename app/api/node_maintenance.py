"""Node maintenance routes (docs/operating.md, "Maintenance: drain and delete"): drain, undrain, delete.
They need ``compute:inventory:write`` on the node's pool, as cordon and node registration do."""

from __future__ import annotations

from fastapi import APIRouter, Body, Response

from app.answers.inventory import DrainedNode, Node
from app.api.access import authorize_on_node
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.capacity.controllers.drain import drop_plans_on_node, reschedule_future_work
from app.inventory import maintenance
from app.inventory import service as inventory
from app.inventory.schemas import DrainBody

router = APIRouter(tags=["inventory"])
WRITE = "compute:inventory:write"


@router.post("/v1/nodes/{node_id}/drain", responses=responses(401, 403, 404, 422), operation_id="drainNode")
async def drain(
    node_id: str, principal: CurrentPrincipal, svc: ServicesDep, body: DrainBody | None = Body(default=None)
) -> DrainedNode:
    """Drain the node: no new work lands on it (the NoSchedule reason `draining`, whole-node leases
    included); work placed on it keeps its window; planned starts on it are dropped and planned again
    elsewhere. With `reschedule: true` its future reservations (windows not started) are moved to other
    nodes, or back to pending, and listed in `rescheduled`. `drain` reads `draining` until nothing
    current or future is placed on it, then `drained`. Idempotent."""
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    await maintenance.set_drain(svc.engine, node_id, True)  # committed first: nothing plans onto it again
    await drop_plans_on_node(svc.engine, node_id)
    moved = []
    if body is not None and body.reschedule:
        moved = await reschedule_future_work(svc.engine, svc.cache, svc.capacity, node_id)
    node = await inventory.get_node(svc.engine, node_id)
    return DrainedNode(**dict(node), rescheduled=moved)


@router.post("/v1/nodes/{node_id}/undrain", responses=responses(401, 403, 404), operation_id="undrainNode")
async def undrain(node_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    """Lift a drain: the node takes new work again (unless cordoned, tainted or unhealthy), and pending
    reservations are woken. Moved reservations stay where they went. Idempotent."""
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    return await maintenance.set_drain(svc.engine, node_id, False)


@router.delete(
    "/v1/nodes/{node_id}",
    status_code=204,
    response_class=Response,
    responses=responses(401, 403, 404, conflicts=("CONFLICT",)),
    operation_id="deleteNode",
)
async def delete_node(node_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Response:
    """Delete a node that holds no current or future allocation (a drained one): 204. While it holds
    some, 409 CONFLICT naming up to five reservations and how many. Its history stays: past
    reservations keep their allocations on it; it leaves the pool's node list, counts, placement and
    occupancy, `GET /v1/nodes/{id}` answers 404, and its name may be taken by a new node."""
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    await maintenance.delete_node(svc.engine, node_id)
    return Response(status_code=204)
