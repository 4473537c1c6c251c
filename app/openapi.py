"""The checked-in OpenAPI document: generated from the app by one command, checked by a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.settings import Settings


def openapi_document() -> dict[str, Any]:
    """The app's OpenAPI schema (no database needed: the lifespan does not run)."""
    from app.main import create_app

    return create_app(Settings(database_url="postgresql://unused/unused")).openapi()


def render_openapi() -> str:
    """The document as stable, sorted, indented JSON text."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


def write_openapi(path: str | Path = "openapi/openapi.json") -> None:
    """Write the document to ``path`` (``better-compute openapi``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(render_openapi())
