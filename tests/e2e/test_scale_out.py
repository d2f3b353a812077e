"""Two `arbiter serve` replicas on one PostgreSQL and one Redis (issue 7). Runs in the
PostgreSQL pass of the suite (ARBITER_TEST_DATABASE_URL=postgresql://...)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import func, select

from app.db.models import Lease, UsageRecord
from app.db.session import Database
from app.settings import Settings
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.e2e.conftest import ARBITER, environment, wait_ready
from tests.support import add_service, free_port, redis_url

REDIS = redis_url(1)
BODY = {"model": "nimble", "state": "s", "questions": {"q": {"type": "noul"}}}


@dataclass
class Cluster:
    db: Database
    env: dict[str, str]
    urls: list[str]
    processes: list[subprocess.Popen[bytes]]
    key: str
    admin: str
    emulator: OllamaState

    def client(self, replica: int, key: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.urls[replica], timeout=30,
                            headers={"Authorization": f"Bearer {key or self.key}"})

    def stop(self, replica: int) -> int:
        process = self.processes[replica]
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=40)


@pytest.fixture
def cluster(db: Database) -> Iterator[Cluster]:
    if not db.url.startswith("postgresql"):
        pytest.skip("replicas share a PostgreSQL: this runs in the PostgreSQL pass")
    try:
        redis.Redis.from_url(REDIS, socket_timeout=1).flushdb()
    except redis.RedisError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    state = OllamaState()
    emulator = EmulatorServer(make_ollama_app(state)).start()
    url = db.engine.url.render_as_string(hide_password=False).replace("postgresql+psycopg://", "postgresql://")
    env = {**environment(url), "ARBITER_REDIS_URL": REDIS, "ARBITER_SYNC_INTERVAL": "0.5",
           "ARBITER_KEY_CACHE_TTL": "300", "ARBITER_REGISTRY_REFRESH_INTERVAL": "300",
           "ARBITER_FLUSH_INTERVAL": "0.2", "ARBITER_SECRET_KEY": "e2e-secret-key-of-the-whole-process-tests"}
    # Provisioned in this process, as `arbiter service add`, `project create`, `key create` and
    # `admin create-key` do (tests/test_cli.py runs those): four processes less per test.
    hasher = KeyHasher()
    settings = Settings(database_url=db.url, secret_key=env["ARBITER_SECRET_KEY"])
    add_service(db, settings, type="ollama-external", url=emulator.url, name="ollama")
    with db.session() as session:
        tenancy.create_project(session, "shop", CLI, models="all")
        key = tenancy.create_key(session, hasher, CLI, kind="project", project="shop")[1]
        admin = tenancy.create_key(session, hasher, CLI, kind="admin")[1]
    ports = [free_port(), free_port()]
    processes = [subprocess.Popen([ARBITER, "serve", "--port", str(p)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url_, process in zip(urls, processes, strict=True):
            wait_ready(f"{url_}/readyz", process)
        yield Cluster(db, env, urls, processes, key, admin, state)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        emulator.stop()


def usage_count(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(UsageRecord)) or 0)


def test_a_key_revoked_through_one_replica_is_refused_by_the_other_within_a_second(cluster: Cluster) -> None:
    with cluster.client(1) as b:
        assert b.post("/v1/systemone", json=BODY).status_code == 200  # cached on B (TTL 300 s)
    with cluster.client(0, cluster.admin) as a:
        key_id = a.get("/admin/projects/shop/keys").json()["data"][0]["id"]
        assert a.post(f"/admin/keys/{key_id}/revoke").status_code == 200
    revoked_at = time.monotonic()
    with cluster.client(1) as b:
        while b.post("/v1/systemone", json=BODY).status_code != 401:
            assert time.monotonic() - revoked_at < 1.0, "replica B still accepts the revoked key"
            time.sleep(0.05)


def test_an_allowlist_change_reaches_the_other_replica_within_a_second(cluster: Cluster) -> None:
    with cluster.client(1) as b:
        assert b.post("/v1/systemone", json=BODY).status_code == 200
    with cluster.client(0, cluster.admin) as a:
        assert a.patch("/admin/projects/shop", json={"models": ["clef"]}).status_code == 200
    changed_at = time.monotonic()
    with cluster.client(1) as b:
        while b.post("/v1/systemone", json=BODY).status_code != 403:
            assert time.monotonic() - changed_at < 1.0
            time.sleep(0.05)


def test_a_limit_of_n_per_minute_holds_across_both_replicas(cluster: Cluster) -> None:
    with cluster.client(0, cluster.admin) as a:
        assert a.patch("/admin/projects/shop", json={"requests_per_minute": 7}).status_code == 200
    time.sleep(0.3)  # the change notification reaches B
    with cluster.client(0) as a, cluster.client(1) as b:
        codes = [(a if i % 2 else b).post("/v1/systemone", json=BODY).status_code for i in range(14)]
    assert codes.count(200) == 7 and codes.count(429) == 7


def test_service_syncs_run_on_one_replica_at_a_time(cluster: Cluster) -> None:
    start = len([r for r in cluster.emulator.requests if r.path == "/api/tags"])
    time.sleep(3.0)
    syncs = len([r for r in cluster.emulator.requests if r.path == "/api/tags"]) - start
    # One runner syncs every 0.5 s (~6 in 3 s); two would make ~12.
    assert 2 <= syncs <= 8, syncs
    with cluster.db.session() as session:
        leases = [lease.name for lease in session.scalars(select(Lease))]
    # One sync lease; and each replica's heartbeat (app/tenancy/replicas.py).
    assert len([name for name in leases if not name.startswith("replica:")]) == 1, leases
    assert len([name for name in leases if name.startswith("replica:")]) == 2, leases


def test_requests_spread_over_both_replicas_are_recorded_once_each(cluster: Cluster) -> None:
    with cluster.client(0) as a, cluster.client(1) as b, ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: (a if i % 2 else b).post("/v1/systemone", json=BODY).status_code,
                              range(60)))
    assert codes == [200] * 60
    assert cluster.stop(0) == 0 and cluster.stop(1) == 0
    assert usage_count(cluster.db) == 60


def test_sigterm_during_a_burst_loses_no_accepted_request(cluster: Cluster) -> None:
    cluster.emulator.faults.latency = 0.2  # requests stay in flight while the replica shuts down

    def send(_: int) -> Any:
        try:
            with httpx.Client(base_url=cluster.urls[0], timeout=30,
                              headers={"Authorization": f"Bearer {cluster.key}"}) as client:
                return client.post("/v1/systemone", json=BODY).status_code
        except httpx.TransportError:
            return "refused"  # not accepted: the replica had stopped taking requests

    def forwarded() -> int:
        return sum(1 for r in list(cluster.emulator.requests) if r.path == "/v1/systemone")

    before = forwarded()
    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(send, i) for i in range(64)]
        # SIGTERM once some requests are in flight (on a loaded host, 32 clients can take longer
        # than a fixed pause to connect, and then every request is refused before it is accepted)
        deadline = time.monotonic() + 20
        while forwarded() < before + 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.processes[0].send_signal(signal.SIGTERM)
        results = [f.result() for f in futures]
    assert cluster.processes[0].wait(timeout=40) == 0
    accepted = [r for r in results if r != "refused"]
    assert accepted and all(r == 200 for r in accepted), results
    assert usage_count(cluster.db) == len(accepted)


def test_replicas_migrating_together_take_turns(db: Database) -> None:
    if not db.url.startswith("postgresql"):
        pytest.skip("the migration lock is PostgreSQL's advisory lock: this runs in the PostgreSQL pass")
    from sqlalchemy import create_engine, text

    server = db.engine.url
    name = f"{server.database}_mig"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        url = server.set(database=name).render_as_string(hide_password=False).replace("+psycopg", "")
        env = environment(url)
        runs = [subprocess.Popen([ARBITER, "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for _ in range(3)]
        assert [r.wait(timeout=120) for r in runs] == [0, 0, 0]
        from app.db import migrate

        migrated = create_engine(server.set(database=name))
        try:
            migrate.check_current(migrated)  # at head: every run finished, none broke another
        finally:
            migrated.dispose()
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
