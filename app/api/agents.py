"""Node agent routes: Hello and heartbeat (DESIGN.md, "Node agent and Hello")."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from app.api.deps import Principal, Services, current_principal, services
from app.api.errors import responses
from app.iam.authorize import authorize, granted_pools
from app.inventory import hello as agents
from app.inventory.schemas import AgentDevice, HeartbeatAnswer, HeartbeatBody, HelloAnswer, HelloBody

router = APIRouter(tags=["agents"])
HELLO = "compute:nodes:hello"


def _hello_answer(outcome: agents.HelloOutcome, interval: int) -> HelloAnswer:
    view: dict[str, Any] = outcome.view
    return HelloAnswer(
        nodeId=view["id"],
        poolId=view["poolId"],
        name=view["name"],
        created=outcome.created,
        inventoryChanged=outcome.inventory_changed,
        intervalSeconds=interval,
        labels=view["labels"],
        labelSources=view["labelSources"],
        noScheduleReasons=view["noScheduleReasons"],
        devices=[
            AgentDevice(id=d["id"], device_class=d["class"], healthy=d["healthy"], bookable=d["bookable"])
            for d in view["devices"]
        ],
        warnings=list(outcome.warnings),
    )


@router.post(
    "/v1/nodes/hello",
    response_model=HelloAnswer,
    response_model_by_alias=True,
    responses=responses(401, 403, 404, 409, 422),
    operation_id="sendHello",
)
async def send_hello(
    body: HelloBody, principal: Principal = Depends(current_principal), svc: Services = Depends(services)
) -> HelloAnswer:
    """Register or update the node ``(poolId, name)`` from its agent; writes its system labels."""
    authorize(principal, HELLO, f"pool:{body.poolId}")
    outcome = await agents.hello(svc.engine, body)
    return _hello_answer(outcome, body.intervalSeconds)


@router.post(
    "/v1/nodes/{node_id}/heartbeat",
    response_model=HeartbeatAnswer,
    responses=responses(401, 403, 404, 409, 422),
    operation_id="sendHeartbeat",
)
async def send_heartbeat(
    node_id: str,
    body: HeartbeatBody,
    principal: Principal = Depends(current_principal),
    svc: Services = Depends(services),
) -> HeartbeatAnswer:
    """Record device health from the node's agent; a heartbeat that changes nothing is one statement."""
    outcome = await agents.heartbeat(
        svc.engine,
        node_id,
        body,
        lambda pool_id: authorize(principal, HELLO, f"pool:{pool_id}"),
        granted_pools(principal, HELLO),
    )
    return HeartbeatAnswer(
        nodeId=outcome.node_id, changed=outcome.changed, noScheduleReasons=outcome.no_schedule_reasons
    )
