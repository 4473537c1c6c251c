"""Inventory routes: pools, nodes, node import from nvidia-smi, cordon, taints, labels, health."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BeforeValidator

from app.answers.inventory import ImportedNode, Node, NodeList, Pool, PoolList
from app.answers.occupancy import PoolOccupancy
from app.api.deps import Principal, Services, current_principal, services
from app.api.errors import conflicts, responses
from app.api.paging import CURSOR_QUERY, decode_cursor, next_cursor, page_after, time_then_id
from app.iam.authorize import authorize, holds_grant_on, may_read_work_of
from app.inventory import occupancy
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody, LabelsBody, NodeCreate, NodeImport, PoolCreate, TaintsBody
from app.placement.request import FIRST_WINDOW_YEAR, LAST_WINDOW_YEAR, window_end

router = APIRouter(tags=["inventory"])
WRITE, READ = "compute:inventory:write", "compute:inventory:read"


async def _node_pool(svc: Services, node_id: str) -> str:
    return await inventory.node_pool_id(svc.engine, node_id)


@router.post(
    "/v1/pools",
    status_code=201,
    response_model=Pool,
    responses={**responses(401, 403, 409, 422), **conflicts("CONFLICT")},
    operation_id="createPool",
)
async def create_pool(
    body: PoolCreate, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> Pool:
    authorize(principal, WRITE, "*")
    return await inventory.create_pool(svc.engine, body.name)


@router.get("/v1/pools", response_model=PoolList, responses=responses(401, 422), operation_id="listPools")
async def list_pools(
    limit: int = Query(default=100, ge=1, le=1000),
    cursor: str | None = CURSOR_QUERY,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> PoolList:
    """A page of the pools the caller may read, oldest first."""
    pools = await inventory.list_pools(svc.engine)
    visible = [p for p in pools if holds_grant_on(principal, f"pool:{p.id}")]
    return PoolList(**page_after(visible, "pools", _pool_key, time_then_id, limit, cursor))


def _pool_key(pool: Pool) -> tuple[str, ...]:
    return pool.createdAt, pool.id


@router.get(
    "/v1/pools/{pool_id}", response_model=Pool, responses=responses(401, 403, 404), operation_id="getPool"
)
async def get_pool(
    pool_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> Pool:
    if not holds_grant_on(principal, f"pool:{pool_id}"):  # the rule of list_pools
        authorize(principal, READ, f"pool:{pool_id}")
    return await inventory.get_pool(svc.engine, pool_id)


@router.get(
    "/v1/pools/{pool_id}/nodes",
    response_model=NodeList,
    responses=responses(401, 403, 404, 422),
    operation_id="listNodes",
)
async def list_nodes(
    pool_id: str,
    limit: int = Query(default=1000, ge=1, le=10_000),
    cursor: str | None = CURSOR_QUERY,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> NodeList:
    """The pool's nodes in id order, a page at a time."""
    authorize(principal, READ, f"pool:{pool_id}")
    after = None if cursor is None else decode_cursor(cursor, "nodes", 1)[0]
    page = await inventory.list_nodes(svc.engine, pool_id, limit, after)
    return NodeList(items=page.items, nextCursor=next_cursor("nodes", page.next))


def _iso_time(value: object) -> object:
    """A query's time: ISO 8601 text with a UTC offset, in years 1970..9999 (not a number of seconds)."""
    if not isinstance(value, str):
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO 8601 time, e.g. 2026-12-01T12:00:00Z") from None
    if parsed.tzinfo is None:
        raise ValueError("needs a UTC offset, e.g. 2026-12-01T12:00:00Z")
    if window_end(parsed, 0) is None:
        raise ValueError(f"must lie in years {FIRST_WINDOW_YEAR}..{LAST_WINDOW_YEAR} (UTC)")
    return parsed


IsoTime = Annotated[datetime | None, BeforeValidator(_iso_time)]


@router.get(
    "/v1/pools/{pool_id}/occupancy",
    response_model=PoolOccupancy,
    responses=responses(401, 403, 404, 422),
    operation_id="getPoolOccupancy",
)
async def get_occupancy(
    pool_id: str,
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
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
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


@router.post(
    "/v1/pools/{pool_id}/archive",
    response_model=Pool,
    responses=responses(401, 403, 404),
    operation_id="archivePool",
)
async def archive_pool(
    pool_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> Pool:
    authorize(principal, WRITE, f"pool:{pool_id}")
    return await inventory.archive_pool(svc.engine, pool_id)


@router.post(
    "/v1/pools/{pool_id}/nodes",
    status_code=201,
    response_model=Node,
    responses={**responses(401, 403, 404, 409, 422), **conflicts("CONFLICT", "POOL_ARCHIVED")},
    operation_id="createNode",
)
async def create_node(
    pool_id: str,
    body: NodeCreate,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> Node:
    authorize(principal, WRITE, f"pool:{pool_id}")
    return await inventory.add_node(svc.engine, pool_id, body)


@router.post(
    "/v1/pools/{pool_id}/nodes/import",
    status_code=201,
    response_model=ImportedNode,
    responses={**responses(401, 403, 404, 409, 422), **conflicts("CONFLICT", "POOL_ARCHIVED")},
    operation_id="importNode",
)
async def import_node(
    pool_id: str,
    body: NodeImport,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> ImportedNode:
    authorize(principal, WRITE, f"pool:{pool_id}")
    return await inventory.import_node(svc.engine, pool_id, body)


@router.get(
    "/v1/nodes/{node_id}", response_model=Node, responses=responses(401, 403, 404), operation_id="getNode"
)
async def get_node(
    node_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> Node:
    authorize(principal, READ, f"pool:{await _node_pool(svc, node_id)}")
    return await inventory.get_node(svc.engine, node_id)


@router.post(
    "/v1/nodes/{node_id}/cordon",
    response_model=Node,
    responses=responses(401, 403, 404),
    operation_id="cordonNode",
)
async def cordon(
    node_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> Node:
    authorize(principal, WRITE, f"pool:{await _node_pool(svc, node_id)}")
    return await inventory.set_cordon(svc.engine, node_id, True)


@router.post(
    "/v1/nodes/{node_id}/uncordon",
    response_model=Node,
    responses=responses(401, 403, 404),
    operation_id="uncordonNode",
)
async def uncordon(
    node_id: str, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> Node:
    authorize(principal, WRITE, f"pool:{await _node_pool(svc, node_id)}")
    return await inventory.set_cordon(svc.engine, node_id, False)


@router.put(
    "/v1/nodes/{node_id}/taints",
    response_model=Node,
    responses=responses(401, 403, 404, 422),
    operation_id="setNodeTaints",
)
async def set_taints(
    node_id: str,
    body: TaintsBody,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> Node:
    authorize(principal, WRITE, f"pool:{await _node_pool(svc, node_id)}")
    return await inventory.set_taints(svc.engine, node_id, body.taints)


@router.put(
    "/v1/nodes/{node_id}/labels",
    response_model=Node,
    responses=responses(401, 403, 404, 422),
    operation_id="setNodeLabels",
)
async def set_labels(
    node_id: str,
    body: LabelsBody,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> Node:
    authorize(principal, WRITE, f"pool:{await _node_pool(svc, node_id)}")
    return await inventory.set_labels(svc.engine, node_id, body.labels)


@router.post(
    "/v1/nodes/{node_id}/health",
    response_model=Node,
    responses=responses(401, 403, 404, 422),
    operation_id="setNodeHealth",
)
async def set_health(
    node_id: str,
    body: HealthBody,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> Node:
    authorize(principal, WRITE, f"pool:{await _node_pool(svc, node_id)}")
    return await inventory.set_health(svc.engine, node_id, body)
