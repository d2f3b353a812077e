"""SPEC §5's version rule against a stand-in for an older node that does not know decision models."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from infra_adapters.emulators.server import EmulatorServer
from tests.mesh.conftest import MESH_KEY, Node
from tests.mesh.old_peer import make_old_peer_app
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
