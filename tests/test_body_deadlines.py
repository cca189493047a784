"""Body-read deadlines on one sweep timer (``gateway.api.deadlines``): a read past its deadline
raises TimeoutError, a quick one leaves nothing behind, another cancellation of the task still
propagates, and the timer stops once nothing is registered."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.api.deadlines import SWEEP_S, BodyDeadlines


async def test_a_read_past_its_deadline_times_out_and_a_quick_one_returns() -> None:
    deadlines = BodyDeadlines()
    never: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await deadlines.read(never, 0.2)
    took = time.monotonic() - t0
    assert 0.2 <= took < 0.2 + SWEEP_S + 0.3
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    async def body() -> bytes:
        await asyncio.sleep(0.01)
        return b"{}"

    assert await deadlines.read(body(), 5) == b"{}"
    assert not deadlines._due and not deadlines._expired
    await asyncio.sleep(SWEEP_S * 3)
    assert deadlines._timer is None  # nothing registered: the sweep stopped


async def test_another_cancellation_still_propagates() -> None:
    deadlines = BodyDeadlines()
    loop = asyncio.get_running_loop()

    async def reader() -> None:
        await deadlines.read(loop.create_future(), 30)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.01)
    task.cancel()  # a client disconnect, a shutdown: not a timeout
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines._due

    async def late_reader() -> None:  # expired, and cancelled from outside too: cancelled
        try:
            await deadlines.read(loop.create_future(), 0.001)
        except TimeoutError:
            pytest.fail("an outside cancellation became a timeout")

    task = asyncio.create_task(late_reader())
    await asyncio.sleep(0.01)  # registered, past its deadline, the sweep not run yet
    deadlines._sweep()  # the sweep cancels it ...
    task.cancel()  # ... and so does someone else, before it runs again
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_many_reads_share_one_timer_and_each_gets_its_own_deadline() -> None:
    deadlines = BodyDeadlines()
    loop = asyncio.get_running_loop()
    quick = [loop.create_future() for _ in range(50)]
    reads = [asyncio.create_task(deadlines.read(f, 0.1 if i % 2 else 30)) for i, f in enumerate(quick)]
    await asyncio.sleep(0.01)
    timer = deadlines._timer
    assert timer is not None
    await asyncio.sleep(0.1 + SWEEP_S * 2)
    for i, f in enumerate(quick):
        if i % 2 == 0:
            f.set_result(i)
    got = await asyncio.gather(*reads, return_exceptions=True)
    assert [type(g) for g in got[1::2]] == [TimeoutError] * 25
    assert got[0::2] == list(range(0, 50, 2))
