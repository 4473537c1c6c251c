"""How a router's routes serialise their answers, declared once per router."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute


class ExcludeUnsetRoute(APIRoute):
    """A route whose answer holds only the fields the service set (FastAPI's
    ``response_model_exclude_unset``), for every route of a router declared
    ``APIRouter(route_class=ExcludeUnsetRoute)``. Reservation and placement answers leave out what does
    not apply or is not known (a create's ``warnings``, an explanation's unknown fields) rather than
    answer null: app/capacity/views.py, app/answers/placement.py."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any) -> None:
        super().__init__(path, endpoint, **{**options, "response_model_exclude_unset": True})
