"""Request-body deadlines on one sweep timer per process.

``asyncio.timeout`` costs ~4 µs per use here (a timer handle armed, rescheduled and cancelled
per request); a body read needs only a coarse deadline (``server.body_timeout_s``, seconds), so
reads register their task in a dict (~0.3 µs) and one timer, armed while any are registered,
cancels the ones past their deadline every ``SWEEP_S``. ``BodyDeadlines.read`` turns that
cancellation into ``TimeoutError`` exactly as ``asyncio.timeout`` does (``uncancel``: another
cancellation of the same task still propagates).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Final, TypeVar

T = TypeVar("T")
SWEEP_S: Final = 0.05  # how late past its deadline a read may be cut


class BodyDeadlines:
    """Deadlines of the tasks reading a body (one per app: ``AppState.body_deadlines``)."""

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[object], float] = {}
        self._expired: set[asyncio.Task[object]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def read(self, what: Awaitable[T], timeout_s: float) -> T:
        """Await ``what`` (in the current task) for at most ``timeout_s`` (+ up to ``SWEEP_S``);
        raises ``TimeoutError`` past it."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        base = task.cancelling()
        self._due[task] = loop.time() + timeout_s
        if self._timer is None or self._loop is not loop:  # (a new loop: tests run several)
            self._loop, self._timer = loop, loop.call_later(SWEEP_S, self._sweep)
        try:
            return await what
        except asyncio.CancelledError:
            if task in self._expired and task.uncancel() <= base:
                raise TimeoutError from None
            raise
        finally:
            self._due.pop(task, None)
            self._expired.discard(task)

    def _sweep(self) -> None:
        self._timer = None
        if not self._due:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for task, due in list(self._due.items()):
            if due <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._timer = loop.call_later(SWEEP_S, self._sweep)
