"""Random ids without a system call each: ``random_hex`` cuts them from a pooled buffer of
``os.urandom`` bytes (as unpredictable as ``os.urandom`` itself).

Why: ``os.urandom`` releases the GIL around its ``getrandom`` call, so on the event loop's
thread each call offers the GIL to any other Python thread that wants it (the ledger's writer,
a store's worker) and may wait for it back; a Responses request took several such ids. One
call per ``POOL_BYTES`` instead. The pool is refilled in a forked child, so two processes never
share a byte of it."""

from __future__ import annotations

import os
import threading
from typing import Final

POOL_BYTES: Final = 4096


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.buf, self.pos = b"", 0

    def take(self, n: int) -> bytes:
        with self.lock:
            if self.pos + n > len(self.buf):
                self.buf, self.pos = os.urandom(max(POOL_BYTES, n)), 0
            out = self.buf[self.pos : self.pos + n]
            self.pos += n
            return out


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.reset)


def random_hex(nbytes: int) -> str:
    """``nbytes`` random bytes as lowercase hex (``2 * nbytes`` characters)."""
    return _pool.take(nbytes).hex()
