"""Inventory routes: pools, nodes, node import from nvidia-smi, cordon, taints, labels, health."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from app.answers.inventory import ImportedNode, Node, NodeList, Pool, PoolList
from app.answers.occupancy import PoolOccupancy
from app.api.access import authorize_on_node
from app.api.deps import CurrentPrincipal, ServicesDep
from app.api.errors import responses
from app.api.paging import PageCursor, PageLimit, decode_cursor, next_cursor, page_after, time_then_id
from app.api.times import IsoTime
from app.iam.authorize import authorize, holds_grant_on, may_read_work_of
from app.inventory import occupancy
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody, LabelsBody, NodeCreate, NodeImport, PoolCreate, TaintsBody

router = APIRouter(tags=["inventory"])
WRITE, READ = "compute:inventory:write", "compute:inventory:read"


@router.post(
    "/v1/pools",
    status_code=201,
    responses=responses(401, 403, 422, conflicts=("CONFLICT",)),
    operation_id="createPool",
)
async def create_pool(body: PoolCreate, principal: CurrentPrincipal, svc: ServicesDep) -> Pool:
    authorize(principal, WRITE, "*")
    return await inventory.create_pool(svc.engine, body.name)


@router.get("/v1/pools", responses=responses(401, 422), operation_id="listPools")
async def list_pools(
    principal: CurrentPrincipal, svc: ServicesDep, limit: PageLimit = 100, cursor: PageCursor = None
) -> PoolList:
    """A page of the pools the caller may read, oldest first."""
    pools = await inventory.list_pools(svc.engine)
    visible = [p for p in pools if holds_grant_on(principal, f"pool:{p.id}")]
    return PoolList(**page_after(visible, "pools", _pool_key, time_then_id, limit, cursor))


def _pool_key(pool: Pool) -> tuple[str, ...]:
    return pool.createdAt, pool.id


@router.get("/v1/pools/{pool_id}", responses=responses(401, 403, 404), operation_id="getPool")
async def get_pool(pool_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Pool:
    if not holds_grant_on(principal, f"pool:{pool_id}"):  # the rule of list_pools
        authorize(principal, READ, f"pool:{pool_id}")
    return await inventory.get_pool(svc.engine, pool_id)


@router.get("/v1/pools/{pool_id}/nodes", responses=responses(401, 403, 404, 422), operation_id="listNodes")
async def list_nodes(
    pool_id: str,
    principal: CurrentPrincipal,
    svc: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    cursor: PageCursor = None,
) -> NodeList:
    """The pool's nodes in id order, a page at a time."""
    authorize(principal, READ, f"pool:{pool_id}")
    after = None if cursor is None else decode_cursor(cursor, "nodes", 1)[0]
    page = await inventory.list_nodes(svc.engine, pool_id, limit, after)
    return NodeList(items=page.items, nextCursor=next_cursor("nodes", page.next))


@router.get(
    "/v1/pools/{pool_id}/occupancy",
    response_model=PoolOccupancy,
    responses=responses(401, 403, 404, 422),
    operation_id="getPoolOccupancy",
)
async def get_occupancy(
    pool_id: str,
    principal: CurrentPrincipal,
    svc: ServicesDep,
    start: Annotated[
        IsoTime,
        Query(alias="from", description="ISO 8601 with a UTC offset; absent: the database's now"),
    ] = None,
    end: Annotated[
        IsoTime,
        Query(
            alias="to",
            description="ISO 8601 with a UTC offset, after `from`, at most 31 days after it; "
            "absent: from + 48 h",
        ),
    ] = None,
) -> Response:
    """Each node of the pool (id order) with its atoms' bookings over ``[from, to)`` and its scalars'
    held steps (docs/api.md, "Occupancy"). Who booked an atom (``reservationId``, ``tenantId``) is
    shown when the key may read that tenant's reservations, else null."""
    authorize(principal, READ, f"pool:{pool_id}")
    window = occupancy.Window(start, end)
    body = await occupancy.occupancy_json(
        svc.engine, pool_id, window, lambda tenant: may_read_work_of(principal, tenant)
    )
    # rendered once, as the model renders it: a 1,000-node answer is megabytes, and FastAPI would dump
    # the model, validate the dump and serialize it again (the heartbeat's lean answer does the same,
    # agents.py); tests/api/test_occupancy.py checks the text against the model
    return Response(body, media_type="application/json")


@router.post("/v1/pools/{pool_id}/archive", responses=responses(401, 403, 404), operation_id="archivePool")
async def archive_pool(pool_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Pool:
    authorize(principal, WRITE, f"pool:{pool_id}")
    return await inventory.archive_pool(svc.engine, pool_id)


# a node's registration and import answer the same errors: an archived pool takes no new node
NEW_NODE_ERRORS = responses(401, 403, 404, 422, conflicts=("CONFLICT", "POOL_ARCHIVED"))


@router.post(
    "/v1/pools/{pool_id}/nodes", status_code=201, responses=NEW_NODE_ERRORS, operation_id="createNode"
)
async def create_node(pool_id: str, body: NodeCreate, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    authorize(principal, WRITE, f"pool:{pool_id}")
    return await inventory.add_node(svc.engine, pool_id, body)


@router.post(
    "/v1/pools/{pool_id}/nodes/import", status_code=201, responses=NEW_NODE_ERRORS, operation_id="importNode"
)
async def import_node(
    pool_id: str, body: NodeImport, principal: CurrentPrincipal, svc: ServicesDep
) -> ImportedNode:
    authorize(principal, WRITE, f"pool:{pool_id}")
    return await inventory.import_node(svc.engine, pool_id, body)


@router.get("/v1/nodes/{node_id}", responses=responses(401, 403, 404), operation_id="getNode")
async def get_node(node_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    await authorize_on_node(principal, READ, svc.engine, node_id)
    return await inventory.get_node(svc.engine, node_id)


@router.post("/v1/nodes/{node_id}/cordon", responses=responses(401, 403, 404), operation_id="cordonNode")
async def cordon(node_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    return await inventory.set_cordon(svc.engine, node_id, True)


@router.post("/v1/nodes/{node_id}/uncordon", responses=responses(401, 403, 404), operation_id="uncordonNode")
async def uncordon(node_id: str, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    return await inventory.set_cordon(svc.engine, node_id, False)


@router.put(
    "/v1/nodes/{node_id}/taints", responses=responses(401, 403, 404, 422), operation_id="setNodeTaints"
)
async def set_taints(node_id: str, body: TaintsBody, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    return await inventory.set_taints(svc.engine, node_id, body.taints)


@router.put(
    "/v1/nodes/{node_id}/labels", responses=responses(401, 403, 404, 422), operation_id="setNodeLabels"
)
async def set_labels(node_id: str, body: LabelsBody, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    return await inventory.set_labels(svc.engine, node_id, body.labels)


@router.post(
    "/v1/nodes/{node_id}/health", responses=responses(401, 403, 404, 422), operation_id="setNodeHealth"
)
async def set_health(node_id: str, body: HealthBody, principal: CurrentPrincipal, svc: ServicesDep) -> Node:
    await authorize_on_node(principal, WRITE, svc.engine, node_id)
    return await inventory.set_health(svc.engine, node_id, body)
