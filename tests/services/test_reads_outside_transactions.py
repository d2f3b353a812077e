"""Admin calls to backends are made with no database transaction open (read the row, call the
backend, write what it answered), and what a backend answered about a service that changed in
between is not written: the admin is told (409) instead."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event

from app.db.models import Service
from app.db.session import Database
from infra_adapters.admin import AdminClient
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.support import Gateway, Stack, assert_error, body, synced


class Calls:
    """Every admin call the gateway makes, with the connections its thread held at that moment."""

    def __init__(self) -> None:
        self.made: list[tuple[str, int]] = []
        self._held: Counter[int] = Counter()
        self.before: Callable[[str], None] = lambda url: None  # what the test does as a call starts

    def watch(self, gateway: Gateway) -> Gateway:
        engine = gateway.app.components.database.engine
        event.listen(engine, "checkout", lambda *_: self._count(1))
        event.listen(engine, "checkin", lambda *_: self._count(-1))
        return gateway

    def _count(self, step: int) -> None:
        self._held[threading.get_ident()] += step

    def seen(self, url: str) -> None:
        self.made.append((url, self._held[threading.get_ident()]))
        self.before(url)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    watched = Calls()
    original = AdminClient.request

    async def request(self: AdminClient, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        watched.seen(url)
        return await original(self, method, url, *args, **kwargs)

    monkeypatch.setattr(AdminClient, "request", request)
    return watched


def test_no_admin_call_is_made_while_a_connection_is_held(
        calls: Calls, db: Database, vllm: tuple[EmulatorServer, VllmState],
        gateway_factory: Callable[..., Gateway]) -> None:
    """Before, add, install, refresh and the scheduled sync made their backend calls inside an
    open transaction (the worker thread that held the session made them): a slow backend held a
    connection, and on SQLite could hold the write lock, for as long as it took."""
    with EmulatorServer(make_ollama_app(OllamaState())) as ollama:
        stack = Stack.provision(db)
        stack.gateway = calls.watch(synced(gateway_factory()))
        with stack.client("admin") as admin:
            body(admin.post("/admin/services", json={"type": "ollama-external", "url": ollama.url, "name": "lab"}),
                 201)
            body(admin.post("/admin/services", json={"type": "vllm", "url": vllm[0].url, "name": "gpu"}), 201)
            body(admin.post("/admin/services/lab/refresh"), 200)
            body(admin.patch("/admin/services/lab", json={"url": ollama.url + "/"}), 200)
            body(admin.post("/admin/services/gpu/models",
                            json={"model": "Qwen/Qwen3-0.6B", "public_name": "qwen", "capabilities": ["completion"]}),
                 201)
            assert admin.delete("/admin/services/lab/models/nimble").status_code == 204
        components = stack.gateway.app.components
        before = len(calls.made)
        asyncio.run_coroutine_threadsafe(components.sync.sync_all(), components.loop).result(30)
        assert len(calls.made) > before  # the scheduled sync read both services
    paths = {url.split("/", 3)[-1] for url, _ in calls.made}
    assert {"api/version", "api/tags", "api/show", "api/delete", "version", "v1/models"} <= paths, paths
    assert [call for call in calls.made if call[1]] == [], calls.made


def test_a_refresh_of_a_service_changed_meanwhile_writes_nothing(calls: Calls, stack: Stack) -> None:
    with EmulatorServer(make_ollama_app(OllamaState(version="0.40.0"))) as other:
        def move(url: str) -> None:
            if url.endswith("/api/tags") and calls.before is move:
                calls.before = lambda url: None
                with stack.db.session() as session:  # another admin points the service elsewhere
                    service = session.query(Service).filter_by(name="ollama").one()
                    service.url, service.last_error = other.url, "untouched"

        calls.before = move
        with stack.client("admin") as admin:
            refused = assert_error(admin.post("/admin/services/ollama/refresh"), 409, "conflict_error")
            assert "changed while its backend was being read" in refused["error"]
            view = body(admin.get("/admin/services/ollama"), 200)
    assert (view["url"], view["last_error"], view["version"]) == (other.url, "untouched", "0.35.0")


def test_an_install_on_a_service_changed_meanwhile_is_refused(
        calls: Calls, vllm_stack: Stack, vllm: tuple[EmulatorServer, VllmState]) -> None:
    def rekey(url: str) -> None:
        if url.endswith("/v1/models") and calls.before is rekey:
            calls.before = lambda url: None
            with vllm_stack.db.session() as session:
                session.query(Service).filter_by(name="vllm").one().url = vllm[0].url + "/"

    calls.before = rekey
    with vllm_stack.client("admin") as admin:
        refused = admin.post("/admin/services/vllm/models",
                             json={"model": "Qwen/Qwen3-0.6B", "public_name": "q2", "capabilities": ["completion"]})
        assert_error(refused, 409, "conflict_error")
        names = {m["public_name"] for m in body(admin.get("/admin/services/vllm/models"), 200)["data"]}
    assert "q2" not in names


@pytest.mark.parametrize("change", ["patch", "uninstall"])
def test_a_change_to_a_service_changed_meanwhile_is_refused(calls: Calls, stack: Stack, change: str) -> None:
    """A new key read against the service's backend, or a model removed from its Ollama, while
    another admin pointed the service elsewhere: 409, and the row keeps the other admin's change."""
    moved = stack.ollama.url + "/"

    def move(url: str) -> None:
        if calls.before is move:
            calls.before = lambda url: None
            with stack.db.session() as session:
                session.query(Service).filter_by(name="ollama").one().url = moved

    calls.before = move
    with stack.client("admin") as admin:
        if change == "patch":
            refused = admin.patch("/admin/services/ollama", json={"timeout": 30, "version_override": "0.40.0"})
        else:
            refused = admin.delete("/admin/services/ollama/models/nimble")
        said = assert_error(refused, 409, "conflict_error")["error"]
        assert ("changed while its backend was being read; nothing was written" if change == "patch"
                else "changed while 'nimble:latest' was being removed from its backend") in said, said
        view = body(admin.get("/admin/services/ollama"), 200)
        names = {m["public_name"] for m in body(admin.get("/admin/services/ollama/models"), 200)["data"]}
    assert (view["url"], view["timeout"], view["version_override"]) == (moved, None, None)
    assert "nimble" in names  # its row stays (the emulator did remove it: the admin refreshes to see)


def test_a_change_that_calls_no_backend_is_not_refused_for_one_made_meanwhile(calls: Calls, stack: Stack) -> None:
    """A new timeout alone reads nothing of the backend: another admin's new URL meanwhile is no
    reason to refuse it (and both changes are kept)."""
    moved = stack.ollama.url + "/"
    made = len(calls.made)  # the start-up sync's

    def refuse(url: str) -> None:
        raise AssertionError(f"a new timeout called {url}")

    with stack.db.session() as session:
        session.query(Service).filter_by(name="ollama").one().url = moved
    calls.before = refuse
    with stack.client("admin") as admin:
        view = body(admin.patch("/admin/services/ollama", json={"timeout": 30}), 200)
    assert (view["url"], view["timeout"]) == (moved, 30) and len(calls.made) == made


def test_the_check_and_the_write_are_one(db: Database, stack: Stack) -> None:
    """The check that the row still points where the read was made and the write of what was
    read hold the row together: a change committed between them (after the check's SELECT) is
    seen, not overwritten. Before, the check was a comparison of the row as first read."""
    from app.services import sync

    with db.session() as session:
        service = session.query(Service).filter_by(name="ollama").one()
        endpoint = sync.Endpoint.of(service)
        with db.session() as other:  # another admin commits a new URL after this one's SELECT
            other.query(Service).filter_by(name="ollama").one().url = stack.ollama.url + "/"
        with pytest.raises(sync.ServiceChanged):
            sync.checked(session, service, endpoint)
