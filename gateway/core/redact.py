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
_STARS = re.compile(r"\*{2,}|\.{3,}|\u2026|\u2022{2,}")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_MASKED_REACH = 256  # key characters looked at on each side of a mask (longer runs are no key)
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
    covered: bytearray | None = None
    for piece in pieces:  # a few dozen pieces, each found by the C string search
        at = text.find(piece)
        while at >= 0:
            if covered is None:
                covered = bytearray(len(text))
            covered[at : at + PARTIAL] = b"\x01" * PARTIAL
            at = text.find(piece, at + 1)
    if covered is None:
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
    more, and any masked form whose visible head or tail is a configured secret's. Linear:
    each mask found looks at most ``_MASKED_REACH`` characters either side (a regex with an
    open-ended head backtracks quadratically over a long run of key characters)."""
    out: list[str] = []
    last = 0
    n = len(text)
    for m in _STARS.finditer(text):
        start, end = m.span()
        if start < last:
            continue
        head_at = start
        while head_at > last and start - head_at < _MASKED_REACH and text[head_at - 1] in _KEY_CHARS:
            head_at -= 1
        tail_at = end
        while tail_at < n and tail_at - end < _MASKED_REACH and text[tail_at] in _KEY_CHARS:
            tail_at += 1
        if _is_masked_key(text[head_at:start], m.group(0), text[end:tail_at], whole):
            out.append(text[last:head_at])
            out.append(MASK)
            last = tail_at
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def _is_masked_key(head: str, stars: str, tail: str, whole: tuple[str, ...]) -> bool:
    if not head and not tail:
        return False
    if stars.startswith("*") and len(stars) >= _MASKED_ANY_STARS:
        return True
    for secret in whole:
        if len(tail) >= _FRAGMENT_MIN and secret.endswith(tail):
            return True
        if len(head) >= _FRAGMENT_MIN and secret.startswith(head):
            return True
    return False


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
