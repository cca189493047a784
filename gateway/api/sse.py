"""Server-sent events response that always releases the upstream, however the client left."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from functools import partial

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class SSEResponse(StreamingResponse):
    """Streams the body while listening for the client's disconnect; however the response
    ends (completed, client gone), closes the body generator so its ``finally`` runs now
    rather than at garbage collection (cancelling the upstream request), then awaits
    ``on_close``."""

    def __init__(
        self,
        stream: AsyncIterator[bytes],
        headers: dict[str, str],
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(stream, media_type="text/event-stream", headers=headers)
        self._stream = stream
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            # Watch for the client leaving while we wait on the upstream (Starlette relies on a
            # failing send() under ASGI 2.4, which only notices at the next chunk).
            async with anyio.create_task_group() as group:

                async def run(func: Callable[[], Awaitable[None]]) -> None:
                    await func()
                    group.cancel_scope.cancel()

                group.start_soon(run, partial(self.stream_response, send))
                await run(partial(self.listen_for_disconnect, receive))
        except* OSError:
            pass  # the client went away mid-send
        finally:
            if isinstance(self._stream, AsyncGenerator):
                with contextlib.suppress(Exception):
                    await self._stream.aclose()
            if self._on_close is not None:
                await self._on_close()
