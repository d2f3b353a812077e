"""A service's stored key stays with the origin it was given for (issue #30): a change of the
service's scheme, host or port drops it unless the same change gives one; and every way a
backend fails to be one reads alike to an admin (no port scanning by adding services)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import closing

import pytest

from app.db.models import Service
from app.routing.credentials import CredentialBox
from app.services.service import KEY_DROPPED
from app.services.sync import origin
from app.settings import Settings
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app
from tests.support import Gateway, Stack, assert_error, body, closed_port, decide
from tests.ui.conftest import csrf_of, ui_sign_in

STORED = "sk-stored-7d3f9a51"
MODEL = "Qwen/Qwen3-0.6B"


@pytest.fixture
def capture() -> Iterator[tuple[EmulatorServer, VllmState]]:
    """Another vLLM, on another port: it records every request's headers, and needs no key."""
    state = VllmState()
    with EmulatorServer(make_vllm_app(state)) as server:
        yield server, state


def operator_key(stack: Stack) -> str:
    with stack.client("admin") as owner:
        return str(body(owner.post("/admin/admin-keys", json={"name": "op", "role": "operator"}), 201)["key"])


def keyed(vllm_stack: Stack) -> VllmState:
    """The stack's vLLM wants ``STORED``, and its service holds it."""
    state: VllmState = vllm_stack.extra["state"]
    state.required_bearer = STORED
    with vllm_stack.client("admin") as owner:
        assert body(owner.patch("/admin/services/vllm", json={"api_key": STORED}), 200)["reachable"] is True
    return state


def test_an_origin_change_drops_the_stored_key(vllm_stack: Stack,
                                               capture: tuple[EmulatorServer, VllmState]) -> None:
    keyed(vllm_stack)
    server, state = capture
    with vllm_stack.gateway.client(operator_key(vllm_stack)) as operator:
        moved = body(operator.patch("/admin/services/vllm", json={"url": server.url}), 200)
        assert moved["has_credential"] is False and moved["reachable"] is True
        body(operator.post("/admin/services/vllm/refresh"), 200)
    assert decide(vllm_stack, MODEL).status_code == 200  # forwarded to the new origin, without the key
    paths = {r.path for r in state.requests}
    assert {"/version", "/v1/models"} <= paths and paths - {"/version", "/v1/models"}, paths
    assert [r.header("Authorization") for r in state.requests] == [None] * len(state.requests)
    assert all(STORED not in str(r.headers) for r in state.requests)
    with vllm_stack.client("admin") as owner:
        entry = body(owner.get("/admin/audit"), 200)["data"]
        update = next(e for e in entry if e["action"] == "service.update")
        assert update["details"] == {"url": server.url, "api_key": KEY_DROPPED}
        assert STORED not in owner.get("/admin/audit").text


def test_a_path_change_on_the_same_origin_keeps_the_key(vllm_stack: Stack) -> None:
    state = keyed(vllm_stack)
    url = vllm_stack.extra["server"].url
    state.requests.clear()
    with vllm_stack.client("admin") as owner:
        # The same origin written otherwise (upper case, the path changed): the key goes along.
        elsewhere = body(owner.patch("/admin/services/vllm", json={"url": url.upper() + "/prefix"}), 200)
        assert elsewhere["has_credential"] is True
        assert {r.header("Authorization") for r in state.requests} == {f"Bearer {STORED}"}
        back = body(owner.patch("/admin/services/vllm", json={"url": url}), 200)
        assert back["has_credential"] is True and back["reachable"] is True  # the server wants the key: held
        update = body(owner.get("/admin/audit"), 200)["data"][0]
        assert update["details"] == {"url": url}
    assert decide(vllm_stack, MODEL).status_code == 200


def test_a_change_giving_url_and_key_uses_the_new_key(vllm_stack: Stack,
                                                      capture: tuple[EmulatorServer, VllmState]) -> None:
    keyed(vllm_stack)
    server, state = capture
    state.required_bearer = "sk-new-2b8c"
    with vllm_stack.client("admin") as owner:
        moved = body(owner.patch("/admin/services/vllm", json={"url": server.url, "api_key": "sk-new-2b8c"}), 200)
        assert moved["has_credential"] is True and moved["reachable"] is True
        assert body(owner.get("/admin/audit"), 200)["data"][0]["details"] == {"url": server.url,
                                                                             "api_key": "changed"}
    assert decide(vllm_stack, MODEL).status_code == 200
    assert {r.header("Authorization") for r in state.requests} == {"Bearer sk-new-2b8c"}


def test_an_ollama_cloud_moved_elsewhere_needs_its_key_again(stack: Stack,
                                                             capture: tuple[EmulatorServer, VllmState]) -> None:
    with stack.db.session() as session:
        session.add(Service(name="cloud", type="ollama-cloud", url="https://ollama.com", text_limit=1000,
                            credential=CredentialBox.from_settings(Settings(database_url=stack.db.url)).seal("k"),
                            skipped_models=[]))
    with stack.client("admin") as owner:
        refused = assert_error(owner.patch("/admin/services/cloud", json={"url": capture[0].url}), 400)
    assert "give the api_key again" in refused["error"]
    assert capture[1].requests == []


def test_origins_compare_normalised() -> None:
    assert origin("HTTP://GPU:80/v1") == origin("http://gpu") == "http://gpu:80"
    assert origin("https://gpu/") == origin("https://gpu:443/x") != origin("http://gpu:443")
    assert origin("http://[::1]:8000/a") == "http://[::1]:8000"
    assert origin("http://gpu:8000") != origin("http://gpu:8001")


def test_a_service_url_with_a_query_or_a_fragment_is_refused(vllm_stack: Stack) -> None:
    url = vllm_stack.extra["server"].url
    with vllm_stack.client("admin") as owner:
        for bad in (f"{url}?x=1", f"{url}/?", f"{url}#top", f"{url}/v1#"):
            added = assert_error(owner.post("/admin/services", json={"type": "vllm", "url": bad, "name": "q"}), 400)
            changed = assert_error(owner.patch("/admin/services/vllm", json={"url": bad}), 400)
            for error in (added["error"], changed["error"]):
                assert "query string" in error and "fragment" in error and "base URL" in error, error
        assert body(owner.get("/admin/services/vllm"), 200)["url"] == url


@pytest.fixture
def answering() -> Iterator[dict[str, str]]:
    """Local ports, each failing differently: one that redirects, one with a non-HTTP talker,
    one that says 404 to everything, one that accepts and never answers."""
    listeners: list[socket.socket] = []
    stop = threading.Event()

    def serve(reply: bytes | None) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(0.2)
        listeners.append(listener)

        def loop() -> None:
            held: list[socket.socket] = []
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                if reply is None:
                    held.append(conn)  # never answered
                    continue
                try:
                    conn.recv(65536)
                    conn.sendall(reply)
                finally:
                    conn.close()
            for conn in held:
                conn.close()
        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    urls = {
        "redirect": serve(b"HTTP/1.1 302 Found\r\nLocation: http://example.invalid/\r\nContent-Length: 0\r\n\r\n"),
        "not-found": serve(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found"),
        "not-json": serve(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
        "wrong-shape": serve(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]"),
        "not-http": serve(b"SSH-2.0-OpenSSH_9.6\r\n"),
        "silent": serve(None),
        "closed": f"http://127.0.0.1:{closed_port()}",
    }
    yield {**urls, "tls": urls["not-found"].replace("http://", "https://")}  # TLS to a plain HTTP server
    stop.set()
    for listener in listeners:
        listener.close()


def test_every_way_a_backend_fails_reads_alike(vllm_stack: Stack, gateway_factory: Callable[..., Gateway],
                                               answering: dict[str, str],
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Refused, silent, redirecting, 404, not JSON, the wrong JSON, not HTTP: the admin is told
    one thing (with the origin), the server log says which."""
    caplog.set_level(logging.WARNING, logger="arbiter.sync")
    # Long enough that a loaded CI machine's answering backends answer in time; the silent one waits it out.
    gateway = gateway_factory(backend_admin_timeout=3.0)
    seen: dict[str, str] = {}
    with gateway.client(vllm_stack.admin_key) as owner:
        for kind, url in answering.items():
            error = assert_error(owner.post("/admin/services", json={"type": "vllm", "url": url,
                                                                     "name": "probe"}), 400)["error"]
            seen[kind] = error.replace(origin(url), "<origin>")
        changed = body(owner.patch("/admin/services/vllm", json={"url": answering["redirect"]}), 200)
        refreshed = body(owner.post("/admin/services/vllm/refresh"), 200)
    expected = ("cannot add service 'probe': could not read vllm backend at <origin>: it did not answer as a vllm "
                "server (see the server log)")
    assert seen == dict.fromkeys(answering, expected)
    for view in (changed, refreshed):
        assert view["reachable"] is False
        assert view["last_error"] == (f"could not read vllm backend at {origin(answering['redirect'])}: "
                                      "it did not answer as a vllm server (see the server log)")
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "arbiter.sync")
    for reason in ("answered HTTP 302", "answered HTTP 404", "not JSON", "did not answer within 3s",
                   f"cannot reach {answering['closed']}"):
        assert reason in logged, (reason, logged)


def test_the_ui_change_form_drops_the_key_and_says_so(vllm_stack: Stack,
                                                      capture: tuple[EmulatorServer, VllmState]) -> None:
    keyed(vllm_stack)
    server, state = capture
    with closing(ui_sign_in(vllm_stack.gateway.url, vllm_stack.admin_key)) as ui:
        sid = body(vllm_stack.client("admin").get("/admin/services/vllm"), 200)["id"]
        page = f"/ui/services/{sid}"
        assert "drops the stored API key" in ui.get(page).text  # the form says so before
        moved = ui.post(page, data={"csrf": csrf_of(ui.get(page).text), "url": server.url})
        assert moved.status_code == 303 and moved.headers["location"].endswith("done=key-dropped")
        assert "its stored API key was dropped" in ui.get(moved.headers["location"]).text
    assert state.requests and [r.header("Authorization") for r in state.requests] == [None] * len(state.requests)
    assert body(vllm_stack.client("admin").get("/admin/services/vllm"), 200)["has_credential"] is False
