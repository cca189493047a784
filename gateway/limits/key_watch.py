"""Key changes made anywhere reach this replica within a fraction of a second.

The key store keeps one change counter (``key_store_version``), bumped after every revoke
and limits change, whoever makes it: another replica's admin API or the CLI writing
the store directly. ``KeyWatch.run`` reads it every ``interval_s`` (one one-row query, off the
event loop); when it moves, the replica drops its cached keys (a revoked key is refused on its
next request) and reloads every key's limits (off the loop too). While it reads the counter,
the limits' own periodic reload (a query on the event loop) never runs: it is only the
fallback for a replica whose watch cannot reach the store. With a PostgreSQL key store that is every
replica sharing the database; with the SQLite store under ``SWITCHYARD_HOME``, every worker
process sharing that file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from gateway.limits.gate import Limits
from gateway.limits.key_cache import KeyCache, store_errors
from gateway.limits.keys import KeyStoreBase

log = logging.getLogger("switchyard")
INTERVAL_S: Final = 0.25
_LOG_EVERY_S: Final = 60.0


class KeyWatch:
    def __init__(
        self, store: KeyStoreBase, keys: KeyCache, limits: Limits, interval_s: float = INTERVAL_S
    ) -> None:
        self.store = store
        self.keys = keys
        self.limits = limits
        self.interval_s = interval_s
        self.version: int | None = None
        self.changes = 0  # how many moves of the counter this replica acted on
        self._logged = -_LOG_EVERY_S

    async def check(self) -> bool:
        """Read the counter once; True when it moved (the caches were refreshed)."""
        try:
            version = await asyncio.to_thread(self.store.version)
            if version == self.version:
                self.limits.confirm_key_limits()  # still current: no reload on the loop
                return False
            fresh = await asyncio.to_thread(self.store.all_limits)
        except store_errors() as exc:
            now = time.monotonic()
            if now - self._logged >= _LOG_EVERY_S:  # the key cache's outage rules apply meanwhile
                self._logged = now
                log.warning("key store unreachable; key changes wait for it: %s", type(exc).__name__)
            return False
        first = self.version is None
        self.version = self.keys.version = version
        self.limits.replace_key_limits(fresh)
        if first:
            return False
        self.keys.clear()
        self.changes += 1
        return True

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)
