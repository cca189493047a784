"""Load of self-hosted vLLM engines: scrape each replica's /metrics, keep the latest sample, and
decide when an engine is saturated (its requests then spill over to the route's next target,
and come back once it recovers).

vLLM >= 0.30 names: vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total, vllm:time_to_first_token_seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from gateway.config.policy import EngineLoadPolicy, Policy
from gateway.routing.plan import RoutePlan

log = logging.getLogger("switchyard")

WANTED = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
}

Recorder = Callable[[str, str, dict[str, float | None]], None]

# A probe that timed out: the replica's server is up but too busy to answer /metrics within
# probe_timeout_s (vLLM's API server shares its event loop with the engine's work). The replica
# takes no more requests ("slow": they spill over) but counts as down only after
# SLOW_DOWN_AFTER such probes in a row; a refused or failed connection is down at once.
SLOW = "slow"
SLOW_DOWN_AFTER = 3


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One scrape, summed over label sets (a server may serve several model names)."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    ttft_sum: float | None = None
    ttft_count: float | None = None


def parse_vllm_metrics(text: str) -> ReplicaSample:
    """The fields Switchyard uses from a Prometheus text exposition."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        name = line[:brace] if brace >= 0 else line.split(" ", 1)[0]
        field = WANTED.get(name)
        if field is None:
            continue
        try:
            value = float(line.rsplit("}", 1)[-1].split()[0] if brace >= 0 else line.split()[1])
        except (IndexError, ValueError):
            continue
        if field == "kv_usage":
            found[field] = max(found.get(field, 0.0), value)
        else:
            found[field] = found.get(field, 0.0) + value
    return ReplicaSample(**found)


def _delta(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or new < old:  # a restart resets counters
        return None
    return new - old


@dataclass(slots=True)
class ReplicaState:
    url: str  # the replica's OpenAI base URL
    up: bool | None = None  # None: not probed yet
    sample: ReplicaSample | None = None
    hit_ratio: float | None = None  # prefix cache hits / queries over the last interval with traffic
    ttft_s: float | None = None  # mean TTFT over the last interval with first tokens
    probed_at: float = 0.0
    slow: int = 0  # probes in a row that timed out (SLOW)

    @property
    def label(self) -> str:
        parts = urlsplit(self.url)
        return parts.netloc or self.url

    @property
    def metrics_url(self) -> str:
        base = self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url
        return base + "/metrics"

    def observe(self, sample: ReplicaSample | str | None, now: float) -> None:
        """``sample``: what a probe read, None when the replica refused or failed, ``SLOW``
        when the probe timed out."""
        self.probed_at = now
        if sample is None:
            self.up, self.slow = False, 0
            return
        if isinstance(sample, str):  # SLOW: busy, not gone (yet)
            self.slow += 1
            if self.slow >= SLOW_DOWN_AFTER:
                self.up = False
            return
        old, self.up, self.slow = self.sample, True, 0
        if old is not None:
            queries = _delta(sample.prefix_queries, old.prefix_queries)
            hits = _delta(sample.prefix_hits, old.prefix_hits)
            if queries and hits is not None:
                self.hit_ratio = hits / queries
            count = _delta(sample.ttft_count, old.ttft_count)
            total = _delta(sample.ttft_sum, old.ttft_sum)
            if count and total is not None:
                self.ttft_s = total / count
        self.sample = sample

    def values(self) -> dict[str, float | None]:
        s = self.sample if self.up else None
        return {
            "up": 1.0 if self.up else 0.0,
            "queue_depth": s.waiting if s else None,
            "running": s.running if s else None,
            "kv_cache_usage": s.kv_usage if s else None,
            "prefix_cache_hit_ratio": self.hit_ratio,
            "ttft_seconds": self.ttft_s,
        }

    def saturation(self, load: EngineLoadPolicy) -> str | None:
        """Why this replica takes no more requests now (None: it has room)."""
        if self.up is False:
            return "down"
        if self.slow:
            return SLOW
        s = self.sample
        if s is None:
            return None
        if load.max_waiting is not None and s.waiting is not None and s.waiting > load.max_waiting:
            return "queue"
        if load.max_kv_usage is not None and s.kv_usage is not None and s.kv_usage >= load.max_kv_usage:
            return "kv_cache"
        if load.ttft_slo_s is not None and self.ttft_s is not None and self.ttft_s > load.ttft_slo_s:
            return "ttft"
        return None


@dataclass(slots=True)
class EngineState:
    name: str
    load: EngineLoadPolicy
    replicas: list[ReplicaState]

    def saturation(self) -> str | None:
        """Why the whole engine takes no more requests (every replica down or saturated)."""
        reasons = [r.saturation(self.load) for r in self.replicas]
        if any(reason is None for reason in reasons):
            return None
        live = [reason for reason in reasons if reason != "down"]
        return live[0] if live else "down"


async def _scrape(session: aiohttp.ClientSession, url: str, timeout: float) -> ReplicaSample | str | None:
    """The replica's sample; None when it refused, failed, answered an error or did not take
    the connection within half of ``timeout`` (the kernel accepts for a busy server: a host
    that does not is gone); ``SLOW`` when it took the connection but did not answer in time."""
    connect = aiohttp.ClientTimeout(sock_connect=timeout / 2)
    try:
        async with asyncio.timeout(timeout), session.get(url, timeout=connect) as resp:
            if resp.status != 200:
                return None
            return parse_vllm_metrics(await resp.text())
    except aiohttp.ConnectionTimeoutError:
        return None
    except TimeoutError:
        return SLOW
    except (aiohttp.ClientError, OSError, UnicodeDecodeError):
        return None


class EngineBoard:
    """Probe state of every engine with a ``load`` policy; survives policy reloads."""

    def __init__(self) -> None:
        self._engines: dict[str, EngineState] = {}

    def configure(self, policy: Policy) -> None:
        old = {(e.name, r.url): r for e in self._engines.values() for r in e.replicas}
        engines: dict[str, EngineState] = {}
        for name, prov in policy.providers.items():
            if prov.load is None:
                continue
            replicas = [old.get((name, url)) or ReplicaState(url) for url in prov.replica_urls]
            engines[name] = EngineState(name, prov.load, replicas)
        self._engines = engines

    @property
    def engines(self) -> dict[str, EngineState]:
        return self._engines

    def replica_available(self, engine: str, url: str) -> bool:
        """False when the probe saw the replica down or saturated (unprobed counts as available)."""
        state = self._engines.get(engine)
        if state is None:
            return True
        for r in state.replicas:
            if r.url == url:
                return r.saturation(state.load) is None
        return True

    def spill(self, plan: RoutePlan, count: Callable[[str, str], None]) -> RoutePlan:
        """Move saturated engines behind the route's other targets (they stay a last resort)."""
        if not self._engines or len(plan.targets) < 2:
            return plan
        keep, spilled = [], []
        for target in plan.targets:
            state = self._engines.get(target.provider)
            reason = state.saturation() if state is not None else None
            if reason is None:
                keep.append(target)
            else:
                spilled.append(target)
                if not keep:  # it would have been tried first: this request spills over
                    count(target.provider, reason)
        if not spilled or not keep:
            return plan
        return dataclasses.replace(plan, targets=(*keep, *spilled))

    async def probe_once(
        self,
        session: aiohttp.ClientSession,
        record: Recorder | None = None,
        only: Iterable[str] | None = None,
    ) -> None:
        names = list(self._engines) if only is None else [n for n in only if n in self._engines]
        jobs = [
            (state, r)
            for state in (self._engines[n] for n in names)
            for r in state.replicas
        ]  # fmt: skip
        samples = await asyncio.gather(
            *(_scrape(session, r.metrics_url, state.load.probe_timeout_s) for state, r in jobs)
        )
        now = time.monotonic()
        for (state, replica), sample in zip(jobs, samples, strict=True):
            replica.observe(sample, now)
            if record is not None:
                record(state.name, replica.label, replica.values())

    async def run(self, record: Recorder | None = None, tick_s: float = 0.25) -> None:
        """Probe each engine every its probe_interval_s until cancelled (the HTTP session is
        opened only once a policy has an engine to probe)."""
        last: dict[str, float] = {}
        session: aiohttp.ClientSession | None = None
        try:
            while True:
                now = time.monotonic()
                due = [
                    n for n, e in self._engines.items() if now - last.get(n, -1e9) >= e.load.probe_interval_s
                ]
                if due:
                    for n in due:
                        last[n] = now
                    if session is None:
                        session = aiohttp.ClientSession(trust_env=False)
                    try:
                        await self.probe_once(session, record, due)
                    except Exception:  # a probe must never take the gateway down
                        log.exception("engine probe failed")
                await asyncio.sleep(tick_s)
        finally:
            if session is not None:
                await session.close()
