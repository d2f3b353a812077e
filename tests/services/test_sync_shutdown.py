"""A gateway stopping while its start-up sync waits on backends that never answer."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy.orm import Session

from app.db.models import Lease, Service, utcnow
from app.db.session import Database
from app.services.sync import SyncLoop
from app.settings import Settings
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, add_service, run_async, wait_for


@pytest.fixture
def silent_services(db: Database) -> Iterator[list[socket.socket]]:
    """Three Ollama services, added while they answered, whose ports now accept connections
    (the kernel's backlog) and never answer."""
    listeners: list[socket.socket] = []
    for n in range(3):
        with EmulatorServer(make_ollama_app(OllamaState())) as server:
            add_service(db, type="ollama-external", url=server.url, name=f"silent-{n}")
            port = server.port
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(16)
        listeners.append(listener)
    yield listeners
    for listener in listeners:
        listener.close()


def test_a_stop_gives_up_the_admin_call_under_way_and_calls_no_other(
        db: Database, silent_services: list[socket.socket], gateway_factory: Callable[..., Gateway]) -> None:
    gateway = gateway_factory(backend_admin_timeout=30.0)
    # The start-up sync is waiting on the first service: its connection is in the backlog.
    wait_for(lambda: select.select([silent_services[0]], [], [], 0)[0])
    started = time.monotonic()
    gateway.stop()
    took = time.monotonic() - started
    # Once the stop waited for the call under way, up to its admin timeout (30 s here), and before
    # that the sync went on to the next service, and the next, one timeout each. The call is
    # awaited on the gateway's loop now: cancelling the sync's task gives it up at once.
    assert took < 3.0, took
    # The others were never called, and nothing is written about the one given up: it did not
    # fail, the process stopped.
    assert [bool(select.select([listener], [], [], 0)[0]) for listener in silent_services] == [True, False, False]
    with db.session() as session:
        status = {s.name: (s.reachable, s.last_error) for s in session.query(Service)}
    assert status["silent-0"] == (True, None), status


def test_a_background_task_that_swallowed_its_cancel_does_not_hold_the_stop(
        db: Database, gateway_factory: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch) -> None:
    """As the service sync did when redis-py turned the cancel of a publish into a ConnectionError:
    the task went on to its minutes-long sleep, and the gateway's stop waited on it."""
    monkeypatch.setattr("app.components.TASKS_STOP_TIMEOUT", 0.3)
    gateway = gateway_factory()
    components = gateway.app.components
    loop = components.loop
    assert loop is not None

    async def swallows_one_cancel() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            pass  # turned into something else, and handled
        await asyncio.sleep(60)  # its next wait, as the sync loop's interval

    def add() -> None:
        components._tasks.append(loop.create_task(swallows_one_cancel(), name="swallower"))

    loop.call_soon_threadsafe(add)
    wait_for(lambda: any(t.get_name() == "swallower" for t in components._tasks))
    started = time.monotonic()
    gateway.stop()
    assert time.monotonic() - started < 5  # not the task's 60 s


def test_a_sync_cancelled_in_a_transaction_is_waited_for_before_the_database_closes(db: Database) -> None:
    """A cancel reaches the sync's task, not the worker thread its transaction runs in: the stop
    waits for that transaction (``settled``) before it disposes of the database."""
    sync = SyncLoop(db, Settings(database_url=db.url), lambda: None)
    started = threading.Event()

    def slow_write(session: Session) -> None:
        started.set()
        time.sleep(0.5)
        session.add(Lease(name="written-late", holder="test", expires_at=utcnow()))

    async def walk() -> bool:
        task = asyncio.create_task(sync._in_session(slow_write))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sync.settled(5.0)
        with db.session() as session:
            return session.get(Lease, "written-late") is not None

    assert run_async(walk())
