"""``SWITCHYARD_LEDGER=none``: a ledger that records nothing, for measuring what the ledger
costs (``python -m load_tests.bench --gateway-env SWITCHYARD_LEDGER=none``)."""

from __future__ import annotations

import asyncio
import logging
import os
from decimal import Decimal
from pathlib import Path

from gateway.core.ledger_row import LedgerRow
from gateway.ledger.store import SQLiteLedger

log = logging.getLogger(__name__)


class NullLedger(SQLiteLedger):
    """``SWITCHYARD_LEDGER=none``: records nothing. Only for measuring what the ledger costs
    (``python -m load_tests.bench --gateway-env SWITCHYARD_LEDGER=none``); never in production."""

    def __init__(self) -> None:
        super().__init__(Path(os.devnull))

    def start(self) -> None:
        self.phase = "started"
        log.warning("SWITCHYARD_LEDGER=none: requests are NOT recorded (benchmark mode)")

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True

    def write(self, row: LedgerRow) -> None:
        return None

    def submit(self, row: LedgerRow) -> asyncio.Future[bool]:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        fut.set_result(False)
        return fut

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def healthy(self) -> bool:
        return not self._closed

    def spent_since(self, scope: str, since_ts: float) -> dict[str, Decimal]:
        return {}
