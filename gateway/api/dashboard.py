"""``GET /dashboard``: spend and savings charts for single-machine users without Grafana.

A static page (HTML + a small script drawing SVG, no CDN: it works offline) that reads the
admin API. It needs the admin key: the browser asks for it through HTTP Basic auth (any user
name, the admin key as the password) and then sends it with the page's API calls."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.auth import require_admin
from gateway.api.state import AppState
from gateway.core.errors import SwitchyardError

router = APIRouter()
STATIC = Path(__file__).resolve().parent / "static"
_FILES = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
_SECURITY = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'self'; style-src 'self'; img-src 'self' data:",
    "x-frame-options": "DENY",
}


def _guard(request: Request) -> Response | None:
    state: AppState = request.app.state.sy
    try:
        require_admin(request.headers, state.services.settings.admin_key)
    except SwitchyardError as exc:
        headers = {"www-authenticate": 'Basic realm="switchyard admin", charset="UTF-8"'}
        body = f"{exc.message}. Sign in with any user name and the admin key as the password.\n"
        return Response(body, status_code=401 if exc.status in (401, 403) else exc.status, headers=headers)
    return None


@router.get("/dashboard")
async def dashboard(request: Request) -> Response:
    denied = _guard(request)
    if denied is not None:
        return denied
    html = (STATIC / "dashboard.html").read_bytes()
    return Response(html, media_type="text/html; charset=utf-8", headers=_SECURITY)


@router.get("/dashboard/{name}")
async def dashboard_asset(request: Request, name: str) -> Response:
    denied = _guard(request)
    if denied is not None:
        return denied
    media = _FILES.get(name)
    if media is None:
        return Response(b"not found\n", status_code=404, media_type="text/plain")
    return Response((STATIC / name).read_bytes(), media_type=media, headers=_SECURITY)
