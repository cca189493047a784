"""Who is calling: a virtual key (hashed lookup) or, when the policy says so, nobody; and the
one admin check (Bearer, x-api-key, HTTP Basic with the admin key as the password, or the
dashboard's session cookie: an HMAC of its expiry under the admin key), in constant time."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping
from http.cookies import CookieError, SimpleCookie

from gateway.config.policy import Policy
from gateway.config.settings import Secret
from gateway.core.errors import AuthenticationError, PermissionDeniedError, ServiceUnavailableError
from gateway.core.types import Principal
from gateway.limits.key_cache import KeyCache, store_errors


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    return headers.get("x-api-key") or None


def authenticate(headers: Mapping[str, str], policy: Policy, keys: KeyCache) -> Principal:
    if policy.server.auth == "none":
        return _principal("anonymous", None, policy)
    key = presented_key(headers)
    if key is None:
        raise AuthenticationError(
            "You didn't provide an API key. Send it as 'Authorization: Bearer sk-sy-...'",
            code="missing_api_key",
        )
    try:
        server = policy.server
        record = keys.lookup(key, server.key_cache_ttl_s, server.key_cache_ttl_s + server.key_outage_grace_s)
    except store_errors():
        raise ServiceUnavailableError(
            "The key store is unreachable; retry shortly", code="key_store_unavailable"
        ) from None
    if record is None:
        raise AuthenticationError("Incorrect API key provided")
    return _principal(record.tenant, record.key_id, policy)


def _principal(tenant: str, key_id: str | None, policy: Policy) -> Principal:
    return Principal(tenant=tenant, key_id=key_id, allowed_models=policy.allowed_models(tenant))


def admin_credential(headers: Mapping[str, str]) -> str | None:
    """The admin key presented as a Bearer token, as x-api-key, or as the password of Basic auth."""
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "basic" and value.strip():
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2] or None
    return presented_key(headers)


SESSION_COOKIE = "sy_admin_session"
SESSION_TTL_S = 12 * 3600


def _session_mac(admin_key: Secret, expires: int) -> str:
    msg = f"switchyard-admin-session:{expires}".encode()
    return hmac.new(admin_key.get().encode(), msg, hashlib.sha256).hexdigest()


def session_token(admin_key: Secret, now: float | None = None, ttl_s: int = SESSION_TTL_S) -> str:
    """The dashboard's session cookie value: an expiry and its HMAC under the admin key
    (stateless; never the key itself; a new admin key ends every session)."""
    expires = int(now if now is not None else time.time()) + ttl_s
    return f"{expires}.{_session_mac(admin_key, expires)}"


def session_valid(token: str, admin_key: Secret, now: float | None = None) -> bool:
    expires_text, _, mac = token.partition(".")
    if not expires_text.isdigit() or int(expires_text) < (now if now is not None else time.time()):
        return False
    return hmac.compare_digest(mac.encode(), _session_mac(admin_key, int(expires_text)).encode())


def session_cookie(headers: Mapping[str, str]) -> str | None:
    raw = headers.get("cookie")
    if not raw:
        return None
    try:
        morsel = SimpleCookie(raw).get(SESSION_COOKIE)
    except CookieError:
        return None
    return morsel.value if morsel is not None else None


def require_admin(headers: Mapping[str, str], admin_key: Secret | None) -> None:
    """The admin key (Bearer, x-api-key or Basic), or the dashboard's session cookie."""
    if admin_key is None:
        raise PermissionDeniedError(
            "Admin API disabled: set SWITCHYARD_ADMIN_KEY to enable it", code="admin_disabled"
        )
    key = admin_credential(headers)
    if key is None:
        token = session_cookie(headers)
        if token is not None and session_valid(token, admin_key):
            return
        raise AuthenticationError("Admin endpoints need the admin key", code="missing_api_key")
    if not hmac.compare_digest(key.encode(), admin_key.get().encode()):
        raise PermissionDeniedError("This key is not the admin key", code="not_admin")
