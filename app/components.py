"""Every long-lived component, built once per app by ``create_app`` and started in its lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pydantic_core
from prometheus_client import start_http_server
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.changes import ChangeBus
from app.chat.forward import ChatForwarder
from app.db.reports import Reports
from app.db.session import Database
from app.decisions.forward import Forwarder
from app.mesh.node import Mesh
from app.prepare import key_hasher, prepare_database, unreachable_reason
from app.routing.registry import Registry
from app.routing.router import ReplicaRouter
from app.services.installs import Installer
from app.services.registry_rows import registry_rows
from app.services.sync import SyncLoop
from app.settings import Settings
from app.telemetry.metrics import Metrics, backend_labels
from app.telemetry.observer import Observer
from app.telemetry.retention import Outcome, UsageMaintenance
from app.telemetry.spool import Journal
from app.telemetry.spool_watch import SpoolWatch
from app.telemetry.tracing import Tracing, provider_from_environment
from app.telemetry.usage import UsageLedger
from app.tenancy import service as tenancy
from app.tenancy.keycache import KeyCache
from app.tenancy.limits import LocalStore, RateLimiter, RedisStore
from app.tenancy.replicas import ReplicaCount
from app.tenancy.salts import TenantSalts, stored_secret
from app.tenancy.throttle import FailureThrottle, LocalFailures, RedisFailures
from app.tenancy.touches import KeyTouches
from infra_adapters.admin import AdminClient

TASKS_STOP_TIMEOUT = 5.0  # seconds for the background tasks to end once cancelled
START_RETRY_MAX = 10.0  # seconds between tries at most, for a replica started while the database is away
log = logging.getLogger("arbiter")
T = TypeVar("T")


class Components:
    def __init__(self, settings: Settings, tracer_provider: Any = None) -> None:
        self.settings = settings
        self.tracing = Tracing(tracer_provider if tracer_provider is not None else provider_from_environment(),
                               state=settings.trace_state, state_max_bytes=settings.trace_state_max_bytes)
        self.database = Database(settings.database_url)
        self.reports = Reports(settings.database_url, pool_size=settings.report_pool_size,
                               timeout=settings.report_timeout_seconds, per_minute=settings.usage_reads_per_minute)
        self.hasher = key_hasher(settings)
        self.keys = KeyCache(self.hasher, self._load_principal, settings.key_cache_ttl,
                             stale=settings.key_stale_seconds)
        self.registry = Registry(self.database, settings, read=registry_rows, labels=backend_labels)
        self.metrics = Metrics(project_label=settings.metrics_project_label)
        self.redis = _redis_client(settings)
        # The replicas counted in the database: while Redis is away, each counts limit / replicas.
        self.replica_count = ReplicaCount(self.database, settings.registry_refresh_interval)
        self.limiter = RateLimiter(RedisStore(self.redis) if self.redis is not None else LocalStore(),
                                   fallback=settings.rate_limit_mode, shared=self.redis is not None,
                                   on_limited=self.metrics.rate_limited.inc,
                                   replicas=lambda: self.replica_count.count)
        if self.redis is not None:
            self.metrics.redis_up.set_function(lambda: 1.0 if self.limiter.healthy else 0.0)
            self.metrics.rate_limit_fallback.set_function(lambda: 1.0 if self.limiter.sharing else 0.0)
            self.metrics.rate_limit_replicas.set_function(lambda: float(self.limiter.replicas()))
        else:  # no Redis to be up or down: no series (a constant 0 would read as an outage)
            for gauge in (self.metrics.redis_up, self.metrics.rate_limit_fallback, self.metrics.rate_limit_replicas):
                self.metrics.registry.unregister(gauge)
        self.bus = ChangeBus(self.redis)
        self.throttle = FailureThrottle(RedisFailures(self.redis) if self.redis is not None else LocalFailures(),
                                        limit=settings.auth_failure_limit, window=settings.auth_failure_window)
        self.router = ReplicaRouter(settings.replica_backoff)
        self.salts = TenantSalts(settings)
        self.forwarder = Forwarder(self.registry, self.router, settings, self.tracing, self.limiter, salts=self.salts)
        self.chat = ChatForwarder(self.registry, self.router, settings, self.limiter, self.tracing, salts=self.salts)
        self.mesh = Mesh(settings, self.registry, self.database, self.redis)
        # Every admin call to a backend (versions, model lists, removals) on one pooled client.
        self.admin = AdminClient(timeout=settings.backend_admin_timeout,
                                 connect_timeout=settings.backend_connect_timeout)
        self.sync = SyncLoop(self.database, settings, self.changed_models, self.admin)
        self.installer = Installer(self.database, settings, self.changed_models, self.admin)
        self.touches = KeyTouches(self.database)
        spool_dir = _spool_dir(settings)
        # A spool directory set: every record journaled as it comes; else what a shutdown is left with.
        journal = Journal(spool_dir, journaling=settings.usage_spool_dir is not None,
                          interval=settings.usage_fsync_interval, always=settings.usage_durable == "always",
                          on_fsync=self.metrics.usage_spool_fsync.observe,
                          on_error=self.metrics.usage_spool_write_errors.inc)
        self.ledger = UsageLedger(self.database, on_dropped=self.metrics.usage_dropped.inc, journal=journal,
                                  on_write_error=self.metrics.usage_write_errors.inc)
        self.spool_watch = SpoolWatch(spool_dir, mine=journal.owner)
        # Day partitions, the previous release's rows, retention: on the lease holder only.
        self.maintenance = UsageMaintenance(self.database, interval=settings.usage_maintenance_interval,
                                            retention_days=settings.usage_retention_days,
                                            rollup_retention_days=settings.rollup_retention_days,
                                            on_run=self._maintained)
        if self.database.engine.dialect.name != "postgresql":  # no partitions: no series
            self.metrics.registry.unregister(self.metrics.usage_partitions)
        # Read at scrape time, as is every service's reachability the registry last read.
        self.metrics.usage_pending.set_function(lambda: float(self.ledger.pending))
        self.metrics.usage_spool_records.set_function(lambda: float(self.spool_watch.waiting))
        self.metrics.usage_spool_bytes.set_function(lambda: float(self.spool_watch.bytes))
        self.metrics.usage_journal_records.set_function(lambda: float(journal.pending_records()))
        self.metrics.service_up.source = self.registry.reachable_services
        self.observer = Observer(self.metrics, self.ledger, log_payloads=settings.log_payloads,
                                 is_known=self.registry.known, alias_target=self.registry.alias_target,
                                 traced=self.tracing.on)
        self._tasks: list[asyncio.Task[None]] = []
        self.loaded = False  # the database was read once (migrations, models): decisions can be served
        self._metrics_server: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _load_principal(self, digest: str) -> Any:
        with self.database.session() as session:
            return tenancy.load_principal(session, digest)

    def prepare_database(self) -> None:
        """Migrate (when configured) or refuse an unmigrated database; bootstrap the admin key."""
        prepare_database(self.settings, self.database, self.hasher)

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()  # for tools and tests that look inside from outside
        await self.ledger.open()  # the journal: this process's lock in the spool, and its writer
        await asyncio.to_thread(self.ledger.load_spool)  # what dead processes left in the spool: written soon
        await asyncio.to_thread(self.spool_watch.look)  # and what is left there (a file it could not read)
        if self.settings.metrics_port is not None:
            self._metrics_server = start_http_server(self.settings.metrics_port, self.settings.metrics_host,
                                                     registry=self.metrics.registry)
        try:
            await self._load()
        except Exception as exc:
            why = unreachable_reason(exc, self.database.url)
            if why is None:
                raise
            # A replica starting while the database is away: it serves /healthz (and /readyz's 503,
            # saying why) meanwhile, and starts the rest once the database answers.
            log.error("the database cannot be reached at start-up (%s); waiting for it: /readyz answers 503 "
                      "until it does", why)
            self._tasks = [asyncio.create_task(self._wait_for_database(why), name="wait for the database")]
            return
        await self._run()

    async def _load(self) -> None:
        """What serving needs from the database: its migrations checked (or made), the models."""
        await asyncio.to_thread(self.prepare_database)
        if self.salts.needs_stored_secret:  # no secret set: the deployment's own, read once here
            self.salts.adopt(await asyncio.to_thread(stored_secret, self.database))
        await self.registry.reload()
        self.loaded = True

    async def _wait_for_database(self, said: str) -> None:
        """Try again, with back-off, until the process is stopped; say so now and then."""
        delay, said_at = 0.5, asyncio.get_running_loop().time()
        while not self.loaded:
            await asyncio.sleep(delay)
            delay = min(delay * 2, START_RETRY_MAX)
            try:
                await self._load()
            except Exception as exc:  # noqa: BLE001 - an unmigrated database too: `arbiter migrate` fixes it
                why = unreachable_reason(exc, self.database.url) or f"{type(exc).__name__}: {exc}"
                now = asyncio.get_running_loop().time()
                if why != said or now - said_at >= 60:
                    log.error("still waiting for the database (%s); not ready", why)
                    said, said_at = why, now
        log.info("the database answers: starting")
        await self._run()

    async def _run(self) -> None:
        await self.mesh.start()
        self._tasks += [
            asyncio.create_task(self.registry.run(self.settings.registry_refresh_interval)),
            asyncio.create_task(self.mesh.run(self.settings.registry_refresh_interval)),
            asyncio.create_task(self.touches.run(self.settings.flush_interval)),
            asyncio.create_task(self.ledger.run(self.settings.flush_interval)),
            asyncio.create_task(self.spool_watch.run()),
            asyncio.create_task(self.maintenance.run(), name="usage maintenance"),
            # Versions and models are read at start-up (in the background: a slow backend must
            # not hold the gateway's start) and then on a schedule.
            asyncio.create_task(self.sync.run(self.settings.sync_interval)),
            # On (re)subscribing, a missed change is possible but unknown: cached keys are verified
            # again on their next use, yet kept for a database outage (app/tenancy/keycache.py).
            asyncio.create_task(self.bus.listen({"keys": self._apply_key_change,
                                                 "models": self.registry.reload,
                                                 "mesh": self.mesh.reload_peers},
                                                catch_up={"keys": self._catch_up_keys})),
        ]
        if self.redis is not None:  # shares of limits while Redis is away, and the way back
            self._tasks += [asyncio.create_task(self.replica_count.run()), asyncio.create_task(self.limiter.run())]

    async def stop(self) -> None:
        """Each step on its own: one failing (the database away) must not skip the others."""
        # A task that swallowed its cancel (a library turning it into an error of its own) goes on
        # to its next wait, minutes away: a second cancel reaches it there. One that outlives
        # that is left behind, and the shutdown goes on (the usage records still get written).
        pending: set[asyncio.Task[None]] = set(self._tasks)
        for _ in range(2):
            if not pending:
                break
            for task in pending:
                task.cancel()
            done, pending = await asyncio.wait(pending, timeout=TASKS_STOP_TIMEOUT)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.error("background task %s ended with an error", task.get_name(), exc_info=task.exception())
        for task in pending:
            log.error("background task %s did not stop when cancelled; shutting down without it", task.get_name())
        self._tasks = []
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("mesh", self.mesh.stop),
            ("installs", self.installer.aclose),
            # The sync's task was cancelled with the others (its backend call given up); a transaction
            # of it already in a worker thread ends on its own first. Then its lease goes.
            ("sync", lambda: self.sync.settled(TASKS_STOP_TIMEOUT)),
            # (Never started, while the database was away: it holds no lease.)
            ("sync lease", lambda: asyncio.to_thread(self.sync.release) if self.loaded else _nothing()),
            ("usage maintenance", lambda: self._stop_maintenance() if self.loaded else _nothing()),
            ("admin calls", self.admin.aclose),
            ("replica heartbeat", lambda: asyncio.to_thread(self.replica_count.release)),
            ("key re-reads", self.keys.aclose),
            ("key touches", self.touches.flush),
            ("usage", self._close_ledger),
            ("backends", self.registry.aclose),
        ]
        shutdown = getattr(self.tracing.provider, "shutdown", None)
        if shutdown is not None:
            steps.append(("traces", lambda: asyncio.to_thread(shutdown)))  # export what is buffered
        if self.redis is not None:
            steps.append(("redis", self.redis.aclose))
        for name, step in steps:
            try:
                await step()
            except Exception:
                log.exception("shutdown step '%s' failed; going on with the others", name)
        if self._metrics_server is not None:
            server, thread = self._metrics_server
            server.shutdown()
            thread.join(timeout=5)
        self.reports.dispose()
        self.database.dispose()

    def _maintained(self, outcome: Outcome) -> None:
        if outcome.partitions is not None:
            self.metrics.usage_partitions.set(outcome.partitions)
        if outcome.deleted:
            self.metrics.usage_retention_deleted.inc(outcome.deleted)

    async def _stop_maintenance(self) -> None:
        """Its step under way ends on its own (a short transaction), then its lease goes."""
        await self.maintenance.settled(TASKS_STOP_TIMEOUT)
        await asyncio.to_thread(self.maintenance.release)

    async def _close_ledger(self) -> None:
        # The last requests' records first: a request the server cancelled at its graceful
        # timeout may have finished during the steps above.
        self.observer.drain()
        await self.ledger.close()
        await asyncio.to_thread(self.spool_watch.look)  # what it kept there, for a last scrape

    async def changed_keys(self) -> None:
        """A key or a project changed: drop cached principals here and on every replica."""
        self.keys.invalidate()
        await self.bus.publish("keys")

    async def changed_models(self) -> None:
        """Services or models changed: reload the registry here and on every replica."""
        await self.registry.reload()
        await self.bus.publish("models")

    async def changed_mesh_peers(self) -> None:
        """A peer was added or removed through the admin API: here and on every replica."""
        await self.mesh.reload_peers()
        await self.bus.publish("mesh")

    async def _apply_key_change(self) -> None:
        self.keys.invalidate()

    async def _catch_up_keys(self) -> None:
        self.keys.expire()

    async def in_session(self, work: Callable[[Session], T]) -> T:
        """Run ``work(session)`` in a worker thread, in one transaction."""
        return await self.database.in_session(work)

    async def in_report(self, work: Callable[[Session], T], *, who: int | str | None = None, what: str = "") -> T:
        """A usage report: ``work(session)`` on the report pool (app/db/reports.py), never the one key
        lookups use; ``who`` (a key's id) held to ARBITER_USAGE_READS_PER_MINUTE, and a query past
        ARBITER_REPORT_TIMEOUT_SECONDS a 504 that says to narrow ``what``."""
        return await self.reports.run(work, who=who, what=what)

    async def in_change(self, work: Callable[[Session], T]) -> T:
        """An admin change: ``work(session)`` in one transaction, and its answer encoded as JSON
        before the commit. An answer that cannot be sent (text that is no UTF-8 in it) is then a
        500 with nothing committed, not a change made, audited, and reported as failed."""
        def checked(session: Session) -> T:
            answer = work(session)
            pydantic_core.to_json(answer)  # what FastAPI's encoding of the answer would raise
            return answer
        return await self.database.in_session(checked)


async def _nothing() -> None:
    return None


def _spool_dir(settings: Settings) -> Path:
    """ARBITER_USAGE_SPOOL_DIR, or the SQLite database's directory, or the working directory."""
    if settings.usage_spool_dir:
        return Path(settings.usage_spool_dir)
    url = make_url(settings.sqlalchemy_url())
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return Path(url.database).resolve().parent
    return Path.cwd()


def _redis_client(settings: Settings) -> Any:
    if settings.redis_url is None:
        return None
    import redis.asyncio
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    # After an outage the pool still holds connections Redis closed: a command on one fails
    # once, then goes through on a new connection (the rate limiter's own 1 s bound still holds).
    return redis.asyncio.from_url(settings.redis_url.get_secret_value(), socket_timeout=1.0,
                                  socket_connect_timeout=1.0, health_check_interval=15,
                                  retry=Retry(NoBackoff(), 1),
                                  retry_on_error=[RedisConnectionError, RedisTimeoutError])
