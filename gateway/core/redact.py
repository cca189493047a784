"""Secret scrubbing for any text that may leave the process (logs, error messages)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

_PATTERNS = (
    re.compile(r"sk-[A-Za-z0-9_\-]{8,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{8,}"),
    re.compile(r"(?i)(x-api-key['\"]?\s*[:=]\s*['\"]?)[A-Za-z0-9._\-]{8,}"),
)
MASK = "[REDACTED]"
# A key as upstreams print it masked: some of its head, a run of stars (or dots, bullets, an
# ellipsis), some of its tail: ``pk_live_****8293``, ``sk-...wxyz``, ``sk-proj-*****wxyz``.
_MASKED = re.compile(r"([A-Za-z0-9_\-]*)(\*{2,}|\.{3,}|\u2026|\u2022{2,})([A-Za-z0-9_\-]*)")
_MASKED_ANY_STARS = 4  # this many stars between key characters is a masked key, configured or not
_FRAGMENT_MIN = 3  # a head or tail this long that a configured secret starts or ends with
# An echo of this many consecutive characters of a configured secret is masked (upstreams
# quote a prefix, a suffix or the middle of a key back); shorter secrets are masked whole.
PARTIAL = 8
PARTIAL_MIN_SECRET = 12


def _mask(m: re.Match[str]) -> str:
    return (m.group(1) if m.groups() else "") + MASK


@functools.lru_cache(maxsize=64)
def _prepared(secrets: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    """(the secrets masked whole, longest first; every PARTIAL-long piece of the long ones)."""
    whole = tuple(sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True))
    pieces = frozenset(
        piece
        for s in whole
        if len(s) >= PARTIAL_MIN_SECRET
        for piece in (s[i : i + PARTIAL] for i in range(len(s) - PARTIAL + 1))
        if _random_looking(piece)
    )
    return whole, pieces


def _random_looking(piece: str) -> bool:
    """A piece that ordinary text does not contain by chance: a digit, or mixed case inside
    (``upstream`` or ``-canary-`` of a key never mask those words elsewhere)."""
    if any(c.isdigit() for c in piece):
        return True
    return sum(c.isupper() for c in piece) >= 2 and sum(c.islower() for c in piece) >= 2


def _mask_pieces(text: str, pieces: frozenset[str]) -> str:
    """Mask every run of ``text`` covered by pieces of a secret (a partial echo)."""
    covered = bytearray(len(text))
    found = False
    for i in range(len(text) - PARTIAL + 1):
        if text[i : i + PARTIAL] in pieces:
            covered[i : i + PARTIAL] = b"\x01" * PARTIAL
            found = True
    if not found:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        if covered[i]:
            while i < len(text) and covered[i]:
                i += 1
            out.append(MASK)
        else:
            j = covered.find(1, i)
            j = len(text) if j < 0 else j
            out.append(text[i:j])
            i = j
    return "".join(out)


def _mask_masked(text: str, whole: tuple[str, ...]) -> str:
    """Mask the masked echoes of a key: any head/tail around ``_MASKED_ANY_STARS`` stars or
    more, and any masked form whose visible head or tail is a configured secret's."""

    def sub(m: re.Match[str]) -> str:
        head, stars, tail = m.group(1), m.group(2), m.group(3)
        if not head and not tail:
            return m.group(0)
        if stars.startswith("*") and len(stars) >= _MASKED_ANY_STARS:
            return MASK
        for secret in whole:
            if len(tail) >= _FRAGMENT_MIN and secret.endswith(tail):
                return MASK
            if len(head) >= _FRAGMENT_MIN and secret.startswith(head):
                return MASK
        return m.group(0)

    return _MASKED.sub(sub, text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the given secrets (whole, any echo of PARTIAL characters or more of a
    long one, or a masked form showing a few of its first or last characters) and anything
    shaped like an API key masked."""
    whole, pieces = _prepared(tuple(secrets))
    for secret in whole:
        if secret in text:
            text = text.replace(secret, MASK)
    if pieces and len(text) >= PARTIAL:
        text = _mask_pieces(text, pieces)
    if "*" in text or "." in text or "\u2026" in text or "\u2022" in text:
        text = _mask_masked(text, whole)
    for pattern in _PATTERNS:
        text = pattern.sub(_mask, text)
    return text
