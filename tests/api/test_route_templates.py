"""Route templates for labels and the access log: the route the router picks, never the raw path."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI

from app.observability.middleware import route_template, route_templates


def _app() -> FastAPI:
    app = FastAPI()
    nodes = APIRouter()
    nodes.add_api_route("/v1/nodes/hello", lambda: None, methods=["POST"])
    nodes.add_api_route("/v1/nodes/{node_id}", lambda: None, methods=["GET"])
    nodes.add_api_route("/v1/nodes/{node_id}/cordon", lambda: None, methods=["POST"])
    app.include_router(nodes)
    app.include_router(APIRouter(), prefix="/unused")
    prefixed = APIRouter()
    prefixed.add_api_route("/items/{item_id}", lambda: None, methods=["PUT"])
    app.include_router(prefixed, prefix="/v2")
    app.add_api_route("/ui/{path:path}", lambda: None, methods=["GET"], include_in_schema=False)
    return app


@pytest.mark.parametrize(
    ("method", "path", "template"),
    [
        ("POST", "/v1/nodes/hello", "/v1/nodes/hello"),
        ("GET", "/v1/nodes/hello", "/v1/nodes/{node_id}"),  # the router takes the full match
        ("GET", "/v1/nodes/node_01abc", "/v1/nodes/{node_id}"),
        ("DELETE", "/v1/nodes/node_01abc", "/v1/nodes/{node_id}"),  # a 405 still names its route
        ("POST", "/v1/nodes/node_01abc/cordon", "/v1/nodes/{node_id}/cordon"),
        ("PUT", "/v2/items/42", "/v2/items/{item_id}"),  # the include prefix is part of the template
        ("GET", "/v1/nodes/a/b/c", "unmatched"),
        ("GET", "/v1/reservations/res_%00", "unmatched"),
        ("GET", "/", "unmatched"),
        ("GET", "/ui/js/pages/pool.js", "/ui/{path}"),  # a path convertor takes slashes
        ("GET", "/ui/", "/ui/{path}"),
    ],
)
def test_the_template_of_a_request(method: str, path: str, template: str) -> None:
    scope = {"type": "http", "method": method, "path": path}
    assert route_template(scope, route_templates(_app().routes)) == template
