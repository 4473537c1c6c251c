"""Node agent routes: Hello and heartbeat (docs/agent.md)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError

from app.api.deps import CurrentPrincipal, Principal, Services, ServicesDep
from app.api.errors import responses
from app.api.text_guard import check_json_body
from app.iam.authorize import authorize, granted_pools
from app.inventory import hello as agents
from app.inventory.schemas import AgentDevice, HeartbeatAnswer, HeartbeatBody, HelloAnswer, HelloBody

router = APIRouter(tags=["agents"])
HELLO = "compute:nodes:hello"


def _hello_answer(outcome: agents.HelloOutcome, interval: int) -> HelloAnswer:
    view = outcome.view
    return HelloAnswer(
        nodeId=view.id,
        poolId=view.poolId,
        name=view.name,
        created=outcome.created,
        inventoryChanged=outcome.inventory_changed,
        intervalSeconds=interval,
        labels=view.labels,
        labelSources=view.labelSources,
        noScheduleReasons=view.noScheduleReasons,
        devices=[
            AgentDevice(id=d.id, device_class=d.device_class, healthy=d.healthy, bookable=d.bookable)
            for d in view.devices
        ],
        warnings=list(outcome.warnings),
    )


@router.post("/v1/nodes/hello", responses=responses(401, 403, 404, 409, 422), operation_id="sendHello")
async def send_hello(body: HelloBody, principal: CurrentPrincipal, svc: ServicesDep) -> HelloAnswer:
    """Register or update the node ``(poolId, name)`` from its agent; writes its system labels."""
    authorize(principal, HELLO, f"pool:{body.poolId}")
    outcome = await agents.hello(svc.engine, body)
    return _hello_answer(outcome, body.intervalSeconds)


async def send_heartbeat(
    node_id: str, body: HeartbeatBody, principal: CurrentPrincipal, svc: ServicesDep
) -> HeartbeatAnswer:
    """Record device health from the node's agent; a heartbeat that changes nothing is one statement."""
    return await _heartbeat(node_id, body, principal, svc)


async def _heartbeat(
    node_id: str, body: HeartbeatBody, principal: Principal, svc: Services
) -> HeartbeatAnswer:
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


_HEARTBEAT_BODY: TypeAdapter[HeartbeatBody] = TypeAdapter(HeartbeatBody)
_HEARTBEAT_ANSWER: TypeAdapter[HeartbeatAnswer] = TypeAdapter(HeartbeatAnswer)


async def lean_heartbeat(request: Request) -> Response | None:
    """The heartbeat of a well-formed request, without FastAPI's dependency injection and response
    serialization (10,000 agents send 1,000 a second: bench/heartbeat.py). ``None`` when the request is
    not plainly valid (not ``application/json``, no principal, a body the schema refuses): the route's
    standard handler then answers it, with the same errors as every other route.

    It does what the standard handler does for a valid request: the app's body check
    (:func:`~app.api.text_guard.check_json_body`, the one global dependency: duplicate keys, unstorable
    text), the body validated by the same model, the principal the request guard resolved, and the answer
    as the response model renders it."""
    if request.headers.get("content-type") != "application/json":
        return None
    principal = request.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal):
        return None
    await check_json_body(request)
    try:
        body = _HEARTBEAT_BODY.validate_json(await request.body())
    except ValidationError:
        return None
    answer = await _heartbeat(request.path_params["node_id"], body, principal, request.app.state.services)
    return Response(_HEARTBEAT_ANSWER.dump_json(answer), media_type="application/json")


class LeanHeartbeatRoute(APIRoute):
    """The heartbeat route: declared (OpenAPI: body, answer, errors) and, when the request is invalid,
    answered like any route; a valid one takes :func:`lean_heartbeat`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        standard = super().get_route_handler()

        async def handle(request: Request) -> Response:
            lean = await lean_heartbeat(request)
            return lean if lean is not None else await standard(request)

        return handle


router.add_api_route(
    "/v1/nodes/{node_id}/heartbeat",
    send_heartbeat,
    methods=["POST"],
    responses=responses(401, 403, 404, 409, 422),
    operation_id="sendHeartbeat",
    route_class_override=LeanHeartbeatRoute,
)
