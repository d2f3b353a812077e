"""Nodes in one process, each with its own database and emulated Ollama: models shared,
requests forwarded, checked and billed on the entry node only."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import orjson
import pytest
from prometheus_client import generate_latest
from sqlalchemy import func, select

from app.api.asgi import Receive, Scope, Send, send_bytes
from app.db.models import AuditEntry, MeshPeer, UsageRecord
from app.errors import NotFound
from app.mesh import node as mesh_node_module
from app.mesh.auth import MeshAuth, MeshCredentialRefused, Refusal
from tests.api.public.openai_sdk import QUESTIONS, TICKET
from tests.mesh.conftest import MESH_KEY, Node
from tests.support import assert_error, decision, wait_for

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _usage(node: Node) -> list[UsageRecord]:
    """What the node billed for answered requests."""
    with node.stack.db.session() as session:
        return list(session.scalars(select(UsageRecord).where(UsageRecord.status == 200)))


def _metrics(node: Node) -> str:
    return generate_latest(node.gateway.app.components.metrics.registry).decode()


def _answers(node: Node, model: str) -> bool:
    return node.client().post("/v1/systemone", json=decision(model)).status_code == 200


def _missing(node: Node, model: str) -> bool:
    return node.client().post("/v1/systemone", json=decision(model)).status_code == 404


def test_a_model_on_a_peer_answers_through_this_node_and_is_billed_once(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    before = len(b.ollama.requests)
    response = a.client().post("/v1/systemone", json=decision("tev1"), headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "tev1"
    forwarded = [r for r in b.ollama.requests[before:] if r.path == "/v1/systemone"]  # not B's syncs
    assert len(forwarded) == 1
    assert forwarded[0].header("traceparent") == TRACEPARENT
    assert forwarded[0].json["questions"] == decision("tev1")["questions"]  # order and content kept

    # Billed once, on the entry node, to the caller's project; the node that served it records nothing.
    wait_for(lambda: len(_usage(a)) >= 2)
    rows = _usage(a)
    assert {r.provider for r in rows} == {"mesh"} and {r.model for r in rows} == {"tev1"}
    assert all(r.project_id is not None and r.input_tokens > 0 for r in rows)
    time.sleep(0.3)
    assert _usage(b) == []
    assert 'gen_ai_provider_name="mesh"' in _metrics(a)
    assert 'gen_ai_request_model="tev1"' in _metrics(a)
    assert "gen_ai_client_token_usage_count{" not in _metrics(b)


def test_three_nodes_in_a_line(mesh_node: Callable[..., Node]) -> None:
    c = mesh_node("node-c", models={"tev1": ["decision"]})
    b = mesh_node("node-b", peers=[c.url])
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    route = next(m for p in a.mesh()["peers"] for m in p["models"] if m["name"] == "tev1")
    assert route["hops"] == 2 and route["path"] == ["node-c", "node-b"]
    # A tenant of A sees the mesh's models in its list.
    listed = a.client().get("/v1/models").json()["data"]
    assert [m["id"] for m in listed] == ["tev1"] and listed[0]["owned_by"] == "mesh"


def test_a_route_waits_as_long_as_the_model_where_it_runs(mesh_node: Callable[..., Node],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # tev1 may take 30 s on node-c; node-a's own backends get a tenth of a second. A request
    # through A and B waits for tev1's 30 s (and a margin per hop), not for A's own timeout.
    # The margin per hop is 1 s here instead of 5 s, so that the request that outlasts the wrong
    # timeout need not take 7.5 s (all three nodes run in this process).
    monkeypatch.setattr(mesh_node_module, "HOP_MARGIN", 1.0)
    c = mesh_node("node-c", models={"tev1": ["decision"]}, backend_timeout=30.0)
    b = mesh_node("node-b", peers=[c.url])
    a = mesh_node("node-a", peers=[b.url], backend_timeout=0.1)
    wait_for(lambda: _answers(a, "tev1"))
    # Well past A's own timeout plus one margin (1.1 s, 2 s if rounded up to the next second).
    c.ollama.faults.latency = 3.0
    slow = a.client().post("/v1/systemone", json=decision("tev1"))
    assert slow.status_code == 200, slow.text
    c.ollama.faults.reset()
    assert _answers(a, "tev1")  # and the route was not backed off


def test_links_work_both_ways(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b")
    a = mesh_node("node-a", models={"nimble": ["decision"]}, peers=[b.url])
    wait_for(lambda: _answers(b, "nimble"))
    peer = b.peer("node-a")
    assert peer is not None and peer["direction"] == "inbound" and peer["state"] == "connected"
    assert peer["url"] == a.url


def test_removal_and_peer_loss_show_up_within_seconds(mesh_node: Callable[..., Node]) -> None:
    c = mesh_node("node-c", models={"tev1": ["decision"], "nimble": ["decision"]})
    b = mesh_node("node-b", peers=[c.url])
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1") and _answers(a, "nimble"))

    assert c.admin().delete("/admin/services/ollama/models/tev1").status_code == 204
    started = time.monotonic()
    wait_for(lambda: _missing(a, "tev1"), timeout=5)
    assert time.monotonic() - started < 5
    assert _answers(a, "nimble")

    c.gateway.stop()
    started = time.monotonic()
    wait_for(lambda: _missing(a, "nimble"), timeout=5)
    assert time.monotonic() - started < 5
    peer = b.peer("node-c")
    assert peer is not None and peer["state"] == "unreachable" and "cannot reach" in peer["error"]


def test_a_wrong_mesh_key_is_refused_and_both_sides_say_so(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a", peers=[b.url], mesh_key="not-the-mesh-key-of-this-test-suite-0123456789")
    wait_for(lambda: (a.mesh()["peers"][0]["state"] == "key_rejected"))
    peer = a.mesh()["peers"][0]
    assert "refused this node's mesh key" in peer["error"] and peer["models"] == []
    refused = wait_for(lambda: b.mesh()["refused"])
    assert refused[-1]["peer"] == "node-a" and "wrong mesh key" in refused[-1]["reason"]
    assert refused[-1]["address"] == "127.0.0.1"
    assert _missing(a, "tev1")
    assert b.peer("node-a") is None  # never joined


def test_a_peer_that_stops_taking_this_nodes_key_gives_500(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    b.gateway.app.components.mesh.auth._key = b"rotated on node-b only"  # type: ignore[union-attr]
    # A request that meets the new key at once, and later ones after the exchange noticed.
    response = a.client().post("/v1/systemone", json=decision("tev1"))
    assert_error(response, 500, "upstream_auth_error")
    assert "mesh key" in response.json()["error"]
    wait_for(lambda: a.peer("node-b")["state"] == "key_rejected")  # type: ignore[index]
    response = a.client().post("/v1/systemone", json=decision("tev1"))
    assert_error(response, 500, "upstream_auth_error")
    assert "node-b" in response.json()["error"]


def test_a_peer_renamed_at_its_url_is_introduced_again_whatever_its_refusal_says(
        mesh_node: Callable[..., Node], monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer restarted under another ARBITER_MESH_NODE_NAME refuses exchanges signed for its old
    name; its refusal's reason header, not its words, has this node introduce itself again."""
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    original = MeshCredentialRefused.__init__

    def reworded(self: MeshCredentialRefused, reason: Refusal, message: str) -> None:
        original(self, reason, "not accepted here")  # every refusal worded anew, as a later build may

    monkeypatch.setattr(MeshCredentialRefused, "__init__", reworded)
    mesh = b.gateway.app.components.mesh
    mesh.name = mesh.auth.node = "node-b2"  # type: ignore[union-attr]
    signed, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/mesh/v1/exchange", b"{}", target="node-b")
    refused = httpx.post(f"{b.url}/mesh/v1/exchange", content=b"{}", headers=signed)
    assert "another node" not in assert_error(refused, 401, "authentication_error")["error"]
    assert refused.headers["X-Arbiter-Mesh-Refusal"] == "other-node"
    wait_for(lambda: (p := a.mesh()["peers"][0])["name"] == "node-b2" and p["state"] == "connected")
    assert _answers(a, "tev1")
    assert a.peer("node-b") is None


def test_a_backends_own_401_or_403_behind_a_peer_comes_back_unchanged(mesh_node: Callable[..., Node]) -> None:
    # Only a refusal of the mesh credential itself is this node's upstream_auth_error (SPEC §1).
    b = mesh_node("node-b", models={"tev1": ["decision"], "llama3.2": ["completion"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}
    for status, text in ((403, b'{"error":"model is gated for this account"}'), (401, b'{"error":"sign in first"}')):
        b.ollama.faults.status, b.ollama.faults.body = status, text
        for response in (a.client().post("/v1/systemone", json=decision("tev1")),
                         a.client().post("/v1/chat/completions", json=chat)):
            assert (response.status_code, response.content) == (status, text)
    b.ollama.faults.reset()
    assert _answers(a, "tev1")
    assert a.peer("node-b")["state"] == "connected"  # type: ignore[index]


def test_checks_run_on_the_entry_node(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"], "nimble": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    limited = a.stack.new_project("limited", models=["nimble"])
    before = len(b.ollama.requests)
    response = a.gateway.client(limited).post("/v1/systemone", json=decision("tev1"))
    assert_error(response, 403, "permission_error")
    # It never left the entry node (B's own syncs may come and go meanwhile).
    assert [r for r in b.ollama.requests[before:] if r.path == "/v1/systemone"] == []
    assert a.gateway.client(limited).post("/v1/systemone", json=decision("nimble")).status_code == 200


def test_chat_goes_through_the_mesh_too(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"llama3.2": ["completion"]})
    a = mesh_node("node-a", peers=[b.url])
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}
    wait_for(lambda: a.client().post("/v1/chat/completions", json=body).status_code == 200)
    answer = a.client().post("/v1/chat/completions", json=body).json()
    assert answer["model"] == "llama3.2"
    with a.client().stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        assert stream.status_code == 200
        text = b"".join(stream.iter_bytes())
    assert b"data: [DONE]" in text


def test_forwarded_requests_need_the_mesh_credential(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    body = orjson.dumps(decision("tev1"))
    good = MeshAuth(MESH_KEY, "node-x")
    with httpx.Client(base_url=b.url) as client:
        signed, _ = good.sign("POST", "/v1/systemone", body, target="node-b")
        ok = client.post("/v1/systemone", content=body, headers=signed)
        assert ok.status_code == 200, ok.text
        # The same credential again (a replay), a wrong key, another body, a made-up scheme.
        replayed = client.post("/v1/systemone", content=body, headers=signed)
        assert_error(replayed, 401, "authentication_error")
        assert replayed.headers["X-Arbiter-Mesh-Refused"] == "1"  # the sender's mesh key, not its request
        wrong, _ = MeshAuth("another key", "node-x").sign("POST", "/v1/systemone", body, target="node-b")
        assert_error(client.post("/v1/systemone", content=body, headers=wrong), 401, "authentication_error")
        signed, _ = good.sign("POST", "/v1/systemone", body, target="node-b")
        assert_error(client.post("/v1/systemone", content=body.replace(b"tev1", b"tev2"), headers=signed),
                     401, "authentication_error")
        assert_error(client.post("/v1/systemone", content=body, headers={"Authorization": "ArbiterMesh v1;x"}),
                     401, "authentication_error")
        # Meant for another node (a request captured on its way to C, replayed to B), or for any node.
        for target in ("node-c", "*"):
            elsewhere, _ = good.sign("POST", "/v1/systemone", body, target=target)
            refused = client.post("/v1/systemone", content=body, headers=elsewhere)
            assert_error(refused, 401, "authentication_error")
        # Signed by the node itself: a loop.
        own, _ = MeshAuth(MESH_KEY, "node-b").sign("POST", "/v1/systemone", body, target="node-b")
        assert "loop" in client.post("/v1/systemone", content=body, headers=own).text
    time.sleep(0.3)
    assert _usage(b) == []  # a forwarded request is billed by the node it entered


def test_a_credential_with_digits_that_are_not_ascii_is_a_401(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    body = orjson.dumps(decision("tev1"))
    auth = MeshAuth(MESH_KEY, "node-x")
    for path, target in (("/v1/systemone", "node-b"), ("/mesh/v1/exchange", "node-b")):
        signed = auth.sign("POST", path, body, target=target)[0]
        parts = signed["Authorization"].split(";")
        for index in (3, 5):  # the time, the hop count: "²" passes str.isdigit(), not int()
            header = ";".join([*parts[:index], "²", *parts[index + 1:]]).encode("latin-1")
            response = httpx.post(f"{b.url}{path}", content=body, headers={**signed, "Authorization": header})
            assert "malformed" in assert_error(response, 401, "authentication_error")["error"]


def test_a_standalone_node_refuses_mesh_credentials(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]}, mesh_key=None)
    body = orjson.dumps(decision("tev1"))
    headers, _ = MeshAuth(MESH_KEY, "node-x").sign("POST", "/v1/systemone", body, target="node-b")
    response = httpx.post(f"{b.url}/v1/systemone", content=body, headers=headers)
    assert_error(response, 401, "authentication_error")
    assert b.mesh()["enabled"] is False
    assert httpx.post(f"{b.url}/mesh/v1/exchange", content=b"{}").status_code == 404


def test_tenants_cannot_send_hop_headers(mesh_node: Callable[..., Node]) -> None:
    # A line of three where B forwards only requests that have taken fewer than 2 hops: a tenant's
    # hop header, if it were read, would stop the request at B.
    c = mesh_node("node-c", models={"tev1": ["decision"]})
    b = mesh_node("node-b", peers=[c.url], mesh_max_hops=2)
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "tev1"))
    before = len(c.ollama.requests)
    response = a.client().post("/v1/systemone", json=decision("tev1"),
                               headers={"X-Arbiter-Mesh-Hops": "99", "X-Arbiter-Mesh-Proof": "forged"})
    assert response.status_code == 200, response.text
    (served,) = [r for r in c.ollama.requests[before:] if r.path == "/v1/systemone"]
    assert not {k.lower() for k in served.headers} & {"x-arbiter-mesh-hops", "x-arbiter-mesh-proof"}


def test_the_hop_limit_stops_a_request(mesh_node: Callable[..., Node]) -> None:
    c = mesh_node("node-c", models={"tev1": ["decision"]})
    b = mesh_node("node-b", peers=[c.url], mesh_max_hops=2)
    wait_for(lambda: b.gateway.app.components.registry.get("tev1") is not None)
    body = orjson.dumps(decision("tev1"))
    auth = MeshAuth(MESH_KEY, "node-x")
    for hops, status in ((1, 200), (2, 404)):
        headers, _ = auth.sign("POST", "/v1/systemone", body, hops=hops, target="node-b")
        response = httpx.post(f"{b.url}/v1/systemone", content=body, headers=headers)
        assert response.status_code == status, response.text


def test_peers_added_and_removed_through_the_admin_api(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a")
    assert a.mesh()["peers"] == []
    added = a.admin().post("/admin/mesh/peers", json={"url": b.url + "/"})
    assert added.status_code == 201, added.text
    assert added.json()["url"] == b.url
    assert_error(a.admin().post("/admin/mesh/peers", json={"url": b.url}), 409, "conflict_error")
    assert_error(a.admin().post("/admin/mesh/peers", json={"url": "ftp://x"}), 400, "invalid_request_error")
    wait_for(lambda: _answers(a, "tev1"))
    assert a.admin().delete(f"/admin/mesh/peers/{added.json()['id']}").status_code == 204
    wait_for(lambda: _missing(a, "tev1"), timeout=5)
    for missing in (999, 0, -1, 2**31, 2**70):  # past 32 or 64 bits: a 404, never a database error
        assert_error(a.admin().delete(f"/admin/mesh/peers/{missing}"), 404, "not_found_error")
    assert a.client().get("/admin/mesh").status_code == 401  # a project key cannot see it
    with a.stack.db.session() as session:
        actions = list(session.scalars(select(AuditEntry.action).where(AuditEntry.action.like("mesh.%"))))
        assert actions == ["mesh.peer.add", "mesh.peer.remove"]
        assert session.scalar(select(func.count()).select_from(AuditEntry)) >= 2


def test_peers_added_or_removed_by_another_replica_are_picked_up_without_redis(
        mesh_node: Callable[..., Node]) -> None:
    """Another replica of node-a (same database, no Redis to tell this one) adds then removes a peer."""
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a", registry_refresh_interval=0.2)
    with a.stack.db.session() as session:
        session.add(MeshPeer(url=b.url))
    wait_for(lambda: _answers(a, "tev1"), timeout=10)
    with a.stack.db.session() as session:
        session.execute(MeshPeer.__table__.delete())
    wait_for(lambda: _missing(a, "tev1"), timeout=10)


def test_the_openai_decisions_api_goes_through_the_mesh(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"nimble": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    body = {"model": "nimble", "input": TICKET, "questions": QUESTIONS}
    answer = wait_for(lambda: (r := a.client().post("/v1/decisions", json=body)).status_code == 200 and r)
    assert answer.json()["model"] == "nimble"
    assert [x["name"] for x in answer.json()["answers"]] == ["damaged", "department", None]
    wait_for(lambda: any(r.operation == "decision" and r.provider == "mesh" and r.status == 200
                         for r in _usage(a)))


def test_a_peers_404_on_the_openai_decisions_api_comes_back_whatever_its_words(
        mesh_node: Callable[..., Node]) -> None:
    """Every peer that can join has /v1/decisions (the builds before it sign v1 credentials), so
    its 404 there is the route's own: passed back, even worded as an unknown route's, and never
    retried as System One."""
    b = mesh_node("node-b", models={"nimble": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: _answers(a, "nimble"))
    body = {"model": "nimble", "input": TICKET, "questions": QUESTIONS}
    unknown_route = NotFound("no route POST /v1/decisions").body()
    gone = b'{"error":{"message":"model \'nimble\' is not installed","type":"not_found_error","param":null}}'
    for answer, message in ((unknown_route, "no route POST /v1/decisions"),
                            (gone, "model 'nimble' is not installed")):

        async def not_found(scope: Scope, receive: Receive, send: Send, answer: bytes = answer) -> None:
            await send_bytes(send, 404, answer, "application/json")

        b.gateway.app.openai_decisions = not_found
        before = len(b.ollama.requests)
        response = a.client().post("/v1/decisions", json=body)
        assert response.status_code == 404 and response.json()["error"]["message"] == message  # OpenAI's shape
        assert "/v1/systemone" not in [r.path for r in b.ollama.requests[before:]]


def test_a_peer_that_only_connects_here_is_dropped_when_it_falls_silent(mesh_node: Callable[..., Node]) -> None:
    a = mesh_node("node-a")
    b = mesh_node("node-b", models={"tev1": ["decision"]}, peers=[a.url])
    wait_for(lambda: _answers(a, "tev1"))
    b.gateway.stop()
    started = time.monotonic()
    wait_for(lambda: _missing(a, "tev1"), timeout=5)
    assert time.monotonic() - started < 5
    peer = a.peer("node-b")
    assert peer is not None and peer["state"] == "unreachable" and "no model-list exchange" in peer["error"]


def test_a_link_both_ways_keeps_one_route_per_node(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"llama3.2": ["completion"]})
    # A reaches B by "localhost"; B announces "127.0.0.1": two links to one node must not flap.
    a = mesh_node("node-a", peers=[b.url.replace("127.0.0.1", "localhost")])
    assert b.admin().post("/admin/mesh/peers", json={"url": a.url}).status_code == 201  # B connects back too
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    wait_for(lambda: a.client().post("/v1/chat/completions", json={**body, "stream": False}).status_code == 200)
    b.ollama.stream_delay = 0.2
    with a.client().stream("POST", "/v1/chat/completions", json=body) as stream:
        assert stream.status_code == 200
        assert b"data: [DONE]" in b"".join(stream.iter_bytes())
    mesh = a.gateway.app.components.mesh
    assert len(mesh._backends) == 1  # one pool for node-b: the configured address
