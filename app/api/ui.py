"""The operator's dashboard at ``/ui`` and the offline API docs at ``/docs`` and ``/redoc``
(docs/dashboard.md).

Neither is part of the API: every route here is ``include_in_schema=False``, takes no key (the request
guard asks one only under ``/v1/``), and answers files shipped inside installed packages, so the pages
load with no network beyond the service itself:

- ``GET /ui`` (and ``/ui/``): the dashboard's ``index.html``; ``GET /ui/{path}``: one of its static files
  (``app/ui/static/``: HTML, CSS, ES modules, SVG). The app routes by the URL's hash
  (``/ui/#/pools/<poolId>``), so no other path is a page. 404 ``NOT_FOUND`` for a file that is not there
  (a path that leaves the folder is not there).
- ``GET /docs``: Swagger UI, its JavaScript and CSS from the ``fastapi-offline`` package
  (``GET /docs/assets/{name}``), never a CDN; ``GET /redoc`` likewise.

Dashboard answers carry a Content-Security-Policy that allows scripts from the service only.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse

from app.errors import NotFound

UI_PREFIX = "/ui"
STATIC = Path(__file__).resolve().parents[1] / "ui" / "static"
DOCS_ASSETS = Path(str(files("fastapi_offline") / "static"))
ASSET_NAMES = frozenset({"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"})
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".html": "text/html"}

router = APIRouter(include_in_schema=False)


def _static(path: Path) -> FileResponse:
    media = MEDIA_TYPES.get(path.suffix)
    headers = {
        "Content-Security-Policy": CSP,
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
    }
    return FileResponse(path, media_type=media, headers=headers)


def ui_file(relative: str) -> Path:
    """The file of ``app/ui/static/`` at ``relative`` (``""`` is ``index.html``). Raises
    :class:`~app.errors.NotFound` for a missing file or a path outside the folder."""
    root = STATIC.resolve()
    path = (root / (relative or "index.html")).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise NotFound(f"no dashboard file {relative!r}")
    return path


@router.get(UI_PREFIX)
async def dashboard() -> FileResponse:
    """The dashboard's page (hash routing: ``/ui/#/pools/<poolId>``)."""
    return _static(ui_file(""))


@router.get(UI_PREFIX + "/{path:path}")
async def dashboard_file(path: str) -> FileResponse:
    """One static file of the dashboard; ``/ui/`` is the page itself."""
    return _static(ui_file(path))


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    """Swagger UI on ``/openapi.json`` with its assets served here (works offline)."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="better-compute - Swagger UI",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon.png",
        oauth2_redirect_url="/docs/oauth2-redirect",
    )


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 redirect page."""
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    """ReDoc on ``/openapi.json`` with its script served here (no web fonts: works offline)."""
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="better-compute - ReDoc",
        redoc_js_url="/docs/assets/redoc.standalone.js",
        redoc_favicon_url="/docs/assets/favicon.png",
        with_google_fonts=False,
    )


@router.get("/docs/assets/{name}")
async def docs_asset(name: str) -> FileResponse:
    """One of Swagger UI's and ReDoc's files from the installed ``fastapi-offline`` package."""
    if name not in ASSET_NAMES:
        raise NotFound(f"no docs asset {name!r}")
    return FileResponse(DOCS_ASSETS / name, headers={"Cache-Control": "max-age=86400"})
