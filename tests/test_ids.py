"""Pooled random ids: unique, hex, refilled across the pool's edge, and never shared with a
forked child."""

from __future__ import annotations

import os

from gateway.protocols import ids
from gateway.protocols.openai_responses import new_id


def test_ids_are_unique_hex_across_refills() -> None:
    n = 3 * ids.POOL_BYTES // 12 + 7  # several refills, one of them mid-id
    got = [ids.random_hex(12) for _ in range(n)]
    assert len(set(got)) == n and all(len(h) == 24 and int(h, 16) >= 0 for h in got)
    assert new_id("resp").startswith("resp_") and len(new_id("msg")) == len("msg_") + 24


def test_a_forked_child_draws_other_bytes() -> None:
    ids.random_hex(1)  # the pool holds unread bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it draws next
        os.write(write, ids.random_hex(16).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    assert child != ids.random_hex(16)  # the parent's next bytes are not the child's
