"""SPEC §5's version rule against a stand-in for an older node that does not know decision models."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import pytest

from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.mesh.conftest import MESH_KEY, Node
from tests.mesh.old_peer import connect_as_old_node, make_old_peer_app
from tests.support import assert_error, decision, wait_for


@pytest.fixture
def old_peer() -> Iterator[EmulatorServer]:
    with EmulatorServer(make_old_peer_app(MESH_KEY)) as server:
        yield server


def _peer(node: Node) -> dict:  # type: ignore[type-arg]
    return node.peer("old-node") or {}


def test_an_older_node_refuses_a_node_with_decision_models_and_it_shows(
        mesh_node: Callable[..., Node], old_peer: EmulatorServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="arbiter.mesh")
    a = mesh_node("node-a", models={"nimble": ["decision"]}, peers=[old_peer.url])
    peer = wait_for(lambda: _peer(a).get("state") == "refused_us" and _peer(a))
    assert peer["version"] == "0.9.0" and peer["decision_models"] is False
    assert "old-node (version 0.9.0) refused this node's model list" in peer["error"]
    assert "does not know decision models" in peer["error"]
    assert any("refused this node's model list" in r.getMessage() and "old-node" in r.getMessage()
               for r in caplog.records)

    # Its models cannot be used; a decision request for one gets 405.
    response = a.client().post("/v1/systemone", json=decision("legacy-chat"))
    assert_error(response, 405, "unsupported_error")
    assert "old-node" in response.json()["error"]
    chat = a.client().post("/v1/chat/completions",
                           json={"model": "legacy-chat", "messages": [{"role": "user", "content": "hi"}]})
    assert_error(chat, 404, "not_found_error")
    assert_error(a.client().post("/v1/systemone", json=decision("never-heard-of")), 404, "not_found_error")


def test_installing_a_decision_model_while_a_peer_is_too_old_warns_first(
        mesh_node: Callable[..., Node], old_peer: EmulatorServer) -> None:
    a = mesh_node("node-a", peers=[old_peer.url])  # no decision model yet: the old node takes us
    wait_for(lambda: _peer(a).get("state") == "connected")
    assert _peer(a)["decision_models"] is False
    # Its models are shared, but none can answer decisions: 405, not 400.
    assert_error(a.client().post("/v1/systemone", json=decision("legacy-chat")), 405, "unsupported_error")

    warned = a.admin().post("/admin/services/ollama/models", json={"model": "tev1"})
    assert_error(warned, 409, "mesh_warning")
    assert "old-node (version 0.9.0)" in warned.json()["error"] and '"confirm": true' in warned.json()["error"]
    assert a.admin().get("/admin/installs").json()["data"] == []  # nothing started
    # A model without the decision capability installs without a word.
    assert a.admin().post("/admin/services/ollama/models", json={"model": "nomic-embed-text"}).status_code == 202

    confirmed = a.admin().post("/admin/services/ollama/models", json={"model": "tev1", "confirm": True})
    assert confirmed.status_code == 202, confirmed.text
    wait_for(lambda: a.client().post("/v1/systemone", json=decision("tev1")).status_code == 200)
    peer = wait_for(lambda: _peer(a).get("state") == "refused_us" and _peer(a))
    assert "tev1" in peer["error"]


def test_a_model_only_an_old_node_two_hops_away_has_gets_405(
        mesh_node: Callable[..., Node], old_peer: EmulatorServer) -> None:
    b = mesh_node("node-b", peers=[old_peer.url])
    a = mesh_node("node-a", peers=[b.url])  # A - B - old-node
    route = wait_for(lambda: next((m for p in a.mesh()["peers"] for m in p["models"]
                                   if m["name"] == "legacy-chat"), None))
    assert route["path"] == ["old-node", "node-b"]
    response = a.client().post("/v1/systemone", json=decision("legacy-chat"))
    assert "does not know decision models" in assert_error(response, 405, "unsupported_error")["error"]


def test_a_decision_model_elsewhere_in_the_mesh_does_not_cut_an_old_node_off(
        mesh_node: Callable[..., Node], old_peer: EmulatorServer) -> None:
    b = mesh_node("node-b", peers=[old_peer.url])
    a = mesh_node("node-a", peers=[b.url])  # A - B - old-node
    wait_for(lambda: _peer(b).get("state") == "connected" and (a.peer("node-b") or {}).get("state") == "connected")
    installed = a.admin().post("/admin/services/ollama/models", json={"model": "tev1"})
    assert installed.status_code == 202, installed.text  # nothing to warn about: no peer of A is too old
    wait_for(lambda: b.client().post("/v1/systemone", json=decision("tev1")).status_code == 200)
    time.sleep(1.0)  # a few exchanges of B with the old node
    peer = _peer(b)
    assert (peer["state"], peer["error"], peer["refused_by_peer"]) == ("connected", None, None)
    assert [m["name"] for m in peer["models"]] == ["legacy-chat"]  # still shared with B


def test_turning_label_reading_on_while_a_peer_is_too_old_warns_first(
        mesh_node: Callable[..., Node], old_peer: EmulatorServer) -> None:
    a = mesh_node("node-a", models={"llama3.2": ["completion"]}, peers=[old_peer.url])
    wait_for(lambda: _peer(a).get("state") == "connected")
    (model,) = a.admin().get("/admin/models").json()["data"]
    warned = a.admin().patch(f"/admin/models/{model['id']}", json={"read_strategy": "labels"})
    assert "old-node (version 0.9.0)" in assert_error(warned, 409, "mesh_warning")["error"]
    assert a.admin().get(f"/admin/models/{model['id']}").json()["read_strategy"] is None  # nothing changed
    assert a.admin().patch(f"/admin/models/{model['id']}", json={"timeout": 30}).status_code == 200  # no warning

    confirmed = a.admin().patch(f"/admin/models/{model['id']}", json={"read_strategy": "labels", "confirm": True})
    assert confirmed.status_code == 200, confirmed.text
    assert "decision" in confirmed.json()["capabilities"]
    wait_for(lambda: _peer(a).get("state") == "refused_us")


def test_adding_a_service_with_decision_models_while_a_peer_is_too_old_warns_first(
        mesh_node: Callable[..., Node], old_peer: EmulatorServer, vllm: tuple[EmulatorServer, VllmState]) -> None:
    a = mesh_node("node-a", peers=[old_peer.url])
    wait_for(lambda: _peer(a).get("state") == "connected")
    service = {"type": "vllm", "url": vllm[0].url, "name": "gpu"}
    warned = a.admin().post("/admin/services", json=service)
    assert "old-node (version 0.9.0)" in assert_error(warned, 409, "mesh_warning")["error"]
    assert [s["name"] for s in a.admin().get("/admin/services").json()["data"]] == ["ollama"]  # nothing added
    added = a.admin().post("/admin/services", json={**service, "confirm": True})
    assert added.status_code == 201, added.text
    wait_for(lambda: _peer(a).get("state") == "refused_us")


def test_an_older_node_that_connects_here_and_refuses_our_list_shows_it(
        mesh_node: Callable[..., Node], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="arbiter.mesh")
    a = mesh_node("node-a", models={"nimble": ["decision"]})
    reason = "this node (version 0.9.0) does not know decision models; it refuses a model list that has one (nimble)"
    connect_as_old_node(a.url, MESH_KEY, refused=reason)
    peer = _peer(a)
    assert (peer["direction"], peer["state"], peer["version"]) == ("inbound", "refused_us", "0.9.0")
    assert peer["error"] == f"peer old-node (version 0.9.0) refused this node's model list: {reason}"
    assert any("old-node (version 0.9.0) refused this node's model list" in r.getMessage() for r in caplog.records)
    assert_error(a.client().post("/v1/systemone", json=decision("legacy-chat")), 405, "unsupported_error")

    connect_as_old_node(a.url, MESH_KEY, refused=None)  # taken again (say its own list changed)
    assert (_peer(a)["state"], _peer(a)["error"]) == ("connected", None)
