"""``GET /dashboard``: spend and savings charts for single-machine users without Grafana.

A static page (HTML + a small script drawing SVG, no CDN: it works offline) that reads the
admin API. It needs the admin key, given once: in the sign-in form (``POST /dashboard/login``),
or as HTTP Basic auth (any user name, the key as the password; also
``http://admin:KEY@host/dashboard``). Either way the answer sets a session cookie (HttpOnly,
SameSite=Strict, 12 h; an HMAC of its expiry under the admin key, never the key) that the
page's API calls carry, so the script never handles the key."""

from __future__ import annotations

import hmac
from html import escape
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.auth import (
    SESSION_COOKIE,
    SESSION_TTL_S,
    admin_credential,
    require_admin,
    session_token,
)
from gateway.api.state import AppState
from gateway.core.errors import SwitchyardError

router = APIRouter()
STATIC = Path(__file__).resolve().parent / "static"
_FILES = {"dashboard.js": "text/javascript; charset=utf-8", "dashboard.css": "text/css; charset=utf-8"}
# the sign-in form's style and the icon, before signing in
_PUBLIC = {"login.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}
_LOGIN_BODY_LIMIT = 4096
HTML = "text/html; charset=utf-8"
_SECURITY = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'self'; style-src 'self'; img-src 'self' data:",
    "x-frame-options": "DENY",
}


def _login_page(error: str = "") -> bytes:
    return (STATIC / "login.html").read_text().replace("{error}", escape(error)).encode()


def _guard(request: Request) -> Response | None:
    state: AppState = request.app.state.sy
    try:
        require_admin(request.headers, state.services.settings.admin_key)
    except SwitchyardError as exc:
        # The Basic challenge makes http://admin:KEY@host/dashboard work (a browser sends URL
        # credentials only when challenged) and brings up the browser's own prompt; the body,
        # shown when the prompt is dismissed, is the sign-in form (also at /dashboard/login).
        headers = {**_SECURITY, "www-authenticate": 'Basic realm="switchyard admin", charset="UTF-8"'}
        status = 401 if exc.status in (401, 403) else exc.status
        return Response(_login_page(f"{exc.message}."), status_code=status, headers=headers, media_type=HTML)
    return None


def _with_session(request: Request, response: Response) -> Response:
    """Set the session cookie (HttpOnly, SameSite=Strict; Secure over https)."""
    state: AppState = request.app.state.sy
    admin_key = state.services.settings.admin_key
    assert admin_key is not None  # checked by the caller
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
    response.set_cookie(
        SESSION_COOKIE,
        session_token(admin_key),
        max_age=SESSION_TTL_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    return response


@router.get("/dashboard")
async def dashboard(request: Request) -> Response:
    denied = _guard(request)
    if denied is not None:
        return denied
    html = (STATIC / "dashboard.html").read_bytes()
    response = Response(html, media_type=HTML, headers=_SECURITY)
    if admin_credential(request.headers) is not None:  # the key itself (Basic, Bearer): a session
        _with_session(request, response)
    return response


@router.get("/favicon.ico")
async def favicon() -> Response:
    """The icon browsers ask every origin for (an SVG: every current browser takes one)."""
    return Response((STATIC / "favicon.svg").read_bytes(), media_type="image/svg+xml", headers=_SECURITY)


@router.get("/dashboard/login")
async def login_form(request: Request) -> Response:
    """The sign-in form, without a Basic challenge (no browser prompt)."""
    return Response(_login_page(), headers=_SECURITY, media_type=HTML)


@router.post("/dashboard/login")
async def login(request: Request) -> Response:
    """The sign-in form: the admin key once, compared in constant time; 303 to the dashboard
    with the session cookie, or the form again (401) saying the key is wrong."""
    state: AppState = request.app.state.sy
    admin_key = state.services.settings.admin_key
    if admin_key is None:
        page = _login_page("The admin API is disabled: set SWITCHYARD_ADMIN_KEY to enable it.")
        return Response(page, status_code=403, headers=_SECURITY, media_type=HTML)
    raw = b""
    async for part in request.stream():
        raw += part
        if len(raw) > _LOGIN_BODY_LIMIT:
            return Response(
                _login_page("The form is too large."), status_code=413, headers=_SECURITY, media_type=HTML
            )
    try:
        key = parse_qs(raw.decode("utf-8"), max_num_fields=4).get("key", [""])[0]
    except (UnicodeDecodeError, ValueError):
        key = ""
    if not key or not hmac.compare_digest(key.encode(), admin_key.get().encode()):
        page = _login_page("That is not the admin key.")
        return Response(page, status_code=401, headers=_SECURITY, media_type=HTML)
    response = Response(b"", status_code=303, headers={**_SECURITY, "location": "/dashboard"})
    return _with_session(request, response)


@router.get("/dashboard/{name}")
async def dashboard_asset(request: Request, name: str) -> Response:
    if name in _PUBLIC:
        return Response((STATIC / name).read_bytes(), media_type=_PUBLIC[name], headers=_SECURITY)
    denied = _guard(request)
    if denied is not None:
        return denied
    media = _FILES.get(name)
    if media is None:
        return Response(b"not found\n", status_code=404, media_type="text/plain")
    return Response((STATIC / name).read_bytes(), media_type=media, headers=_SECURITY)
