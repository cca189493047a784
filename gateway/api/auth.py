"""Who is calling: a virtual key (hashed lookup) or, when the policy says so, nobody; and the
one admin check (Bearer, x-api-key, or HTTP Basic with the admin key as the password so a
browser can open /dashboard), compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping

from gateway.config.policy import Policy
from gateway.config.settings import Secret
from gateway.core.errors import AuthenticationError, PermissionDeniedError, ServiceUnavailableError
from gateway.core.types import Principal
from gateway.limits.keys import KeyCache, store_errors


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


def require_admin(headers: Mapping[str, str], admin_key: Secret | None) -> None:
    if admin_key is None:
        raise PermissionDeniedError(
            "Admin API disabled: set SWITCHYARD_ADMIN_KEY to enable it", code="admin_disabled"
        )
    key = admin_credential(headers)
    if key is None:
        raise AuthenticationError("Admin endpoints need the admin key", code="missing_api_key")
    if not hmac.compare_digest(key.encode(), admin_key.get().encode()):
        raise PermissionDeniedError("This key is not the admin key", code="not_admin")
