"""Inventory routes: pools, nodes, node import from nvidia-smi, cordon, taints, labels, health."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from app.answers.inventory import ImportedNode, Node, NodeList, Pool, PoolList
from app.api.deps import Principal, Services, current_principal, services
from app.api.errors import conflicts, responses
from app.api.paging import CURSOR_QUERY, decode_cursor, next_cursor, page_after, time_then_id
from app.iam.authorize import authorize, holds_grant_on
from app.inventory import service as inventory
from app.inventory.schemas import HealthBody, LabelsBody, NodeCreate, NodeImport, PoolCreate, TaintsBody

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
