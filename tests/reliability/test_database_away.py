"""The database going away: /readyz says so but stays ready, keys verified within
ARBITER_KEY_STALE_SECONDS keep working past their cache's TTL, keys not verified lately are
refused with 503 (fail closed), a replica started meanwhile waits for it, and Arbiter recovers by
itself when the database returns. Runs in the PostgreSQL pass (the database is cut with a TCP
proxy in front of it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, select, update

from app.db.models import ApiKey, UsageRecord
from app.db.session import Database
from app.tenancy.keys import KeyHasher
from tests.reliability.proxy import TcpProxy
from tests.support import Gateway, Stack, assert_error, decision, wait_for


@pytest.fixture
def cut(db: Database) -> Iterator[tuple[TcpProxy, str]]:
    """A proxy in front of the database, and the database's URL through it."""
    if not db.url.startswith("postgresql"):
        pytest.skip("the database is cut with a TCP proxy in front of PostgreSQL: PostgreSQL pass only")
    url = db.engine.url
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).up()
    yield proxy, url.set(port=proxy.port).render_as_string(hide_password=False)
    proxy.stop()


@pytest.fixture
def proxied(stack: Stack, cut: tuple[TcpProxy, str],
            gateway_factory: Callable[..., Gateway]) -> tuple[Stack, TcpProxy]:
    proxy, through = cut
    stack.gateway = gateway_factory(database_url=through)
    return stack, proxy


def records(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(UsageRecord)) or 0)


def test_cached_keys_keep_working_unknown_keys_are_refused_and_it_recovers(proxied: tuple[Stack, TcpProxy]) -> None:
    stack, proxy = proxied
    stranger = stack.new_project("stranger")  # a valid key this gateway has never seen
    served = 0
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200  # the key is now cached
        served += 1
        assert client.get("/readyz").status_code == 200
        proxy.down()
        ready = client.get("/readyz")  # decisions go on: reported, not failed on
        assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text
        assert ready.json()["database"] == "unreachable"
        for _ in range(5):
            assert client.post("/v1/systemone", json=decision()).status_code == 200
            served += 1
    with stack.gateway.client(stranger) as client:
        refused = client.post("/v1/systemone", json=decision())
    assert_error(refused, 503)
    assert "cannot verify the API key" in refused.json()["error"]
    proxy.up()
    with stack.client() as client:
        deadline = time.monotonic() + 15
        while client.get("/readyz").json()["status"] != "ready":
            assert time.monotonic() < deadline, "Arbiter did not recover when the database came back"
            time.sleep(0.2)
    with stack.gateway.client(stranger) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        served += 1
    deadline = time.monotonic() + 10  # usage buffered during the outage is written now
    while records(stack.db) < served and time.monotonic() < deadline:
        time.sleep(0.1)
    assert records(stack.db) == served


def test_keys_verified_before_an_outage_outlive_their_cache_ttl(
        stack: Stack, cut: tuple[TcpProxy, str], gateway_factory: Callable[..., Gateway]) -> None:
    """A database outage longer than the key cache's TTL: keys verified within
    ARBITER_KEY_STALE_SECONDS keep working; keys not verified lately get 503 (cannot verify), never
    401; afterwards every key is verified again (a revocation made meanwhile takes hold)."""
    proxy, through = cut
    stack.gateway = gateway_factory(database_url=through, key_cache_ttl=1, key_stale_seconds=60)
    stranger = stack.new_project("stranger")  # valid, never seen by this gateway
    bogus = KeyHasher().new("project").value  # no such key at all
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200  # verified now
        proxy.down()
        time.sleep(1.5)  # past the TTL: the cached entry alone would not serve it
        for _ in range(5):
            answer = client.post("/v1/systemone", json=decision())
            assert answer.status_code == 200, answer.text
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "degraded" and ready.json()["database"] == "unreachable"
        for key in (stranger, bogus):
            with stack.gateway.client(key) as other:
                refused = other.post("/v1/systemone", json=decision())
            assert_error(refused, 503)
            assert "cannot verify the API key" in refused.json()["error"]
        # Revoked while this gateway cannot read the database (and with no Redis to tell it): the
        # documented trade-off, served until the database answers again.
        with stack.db.session() as session:
            session.execute(update(ApiKey).where(ApiKey.digest == KeyHasher().digest(stack.project_key))
                            .values(revoked_at=func.now()))
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        proxy.up()
        wait_for(lambda: client.post("/v1/systemone", json=decision()).status_code == 401, timeout=20)
        assert client.get("/readyz").json()["status"] == "ready"
    with stack.gateway.client(stranger) as other:
        assert other.post("/v1/systemone", json=decision()).status_code == 200


def test_a_replica_started_while_the_database_is_away_waits_for_it(
        stack: Stack, cut: tuple[TcpProxy, str], gateway_factory: Callable[..., Gateway],
        caplog: pytest.LogCaptureFixture) -> None:
    """It starts, answers /healthz, says on /readyz (503) and in its log why it is not ready, and
    becomes ready by itself when the database returns."""
    proxy, through = cut
    proxy.down()
    stack.gateway = gateway_factory(database_url=through)
    with stack.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 503, ready.text
        assert ready.json()["status"] == "not ready" and "database is unavailable" in ready.json()["reason"]
        assert_error(client.post("/v1/systemone", json=decision()), 503)
        assert "the database cannot be reached at start-up" in caplog.text
        proxy.up()
        wait_for(lambda: client.get("/readyz").json() == {"status": "ready"}, timeout=30)
        assert client.post("/v1/systemone", json=decision()).status_code == 200
