"""The database going away: /readyz turns red, requests with cached keys keep working, unknown
keys are refused (fail closed), and Arbiter recovers by itself when the database returns.
Runs in the PostgreSQL pass (the database is cut with a TCP proxy in front of it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import func, select

from app.db.models import UsageRecord
from app.db.session import Database
from tests.reliability.proxy import TcpProxy
from tests.support import Gateway, Stack, assert_error, decision


@pytest.fixture
def proxied(stack: Stack, db: Database, gateway_factory: Callable[..., Gateway]) -> Iterator[tuple[Stack, TcpProxy]]:
    if not db.url.startswith("postgresql"):
        pytest.skip("the database is cut with a TCP proxy in front of PostgreSQL: PostgreSQL pass only")
    url = db.engine.url
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432).up()
    through = url.set(port=proxy.port).render_as_string(hide_password=False)
    stack.gateway = gateway_factory(database_url=through)
    yield stack, proxy
    proxy.stop()


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
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "not ready"
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
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "Arbiter did not recover when the database came back"
            time.sleep(0.2)
    with stack.gateway.client(stranger) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        served += 1
    deadline = time.monotonic() + 10  # usage buffered during the outage is written now
    while records(stack.db) < served and time.monotonic() < deadline:
        time.sleep(0.1)
    assert records(stack.db) == served
