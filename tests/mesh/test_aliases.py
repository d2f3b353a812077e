"""A model alias through the mesh: it may point at a model only a peer has; the entry node
resolves it, forwards under the target's name, and answers under the alias."""

from __future__ import annotations

from collections.abc import Callable

from tests.mesh.conftest import Node
from tests.support import assert_error, decision, wait_for


def test_an_alias_of_a_peers_model_resolves_on_the_entry_node(mesh_node: Callable[..., Node]) -> None:
    b = mesh_node("node-b", models={"tev1": ["decision"]})
    a = mesh_node("node-a", peers=[b.url])
    wait_for(lambda: a.client().post("/v1/systemone", json=decision("tev1")).status_code == 200)
    with a.admin() as admin:
        made = admin.post("/admin/aliases", json={"alias": "jev-latest", "model": "tev1"})
        assert made.status_code == 201 and made.json()["status"] == "active", made.text
        # A peer's model counts as a model: no alias may shadow it.
        assert_error(admin.post("/admin/aliases", json={"alias": "tev1", "model": "nimble"}), 409, "conflict_error")
    before = len(b.ollama.requests)
    answer = a.client().post("/v1/systemone", json=decision("jev-latest"))
    assert answer.status_code == 200 and answer.json()["model"] == "jev-latest", answer.text
    forwarded = [r for r in b.ollama.requests[before:] if r.path == "/v1/systemone"]
    assert [r.json["model"] for r in forwarded] == ["tev1:latest"]  # B was asked for the target
    assert_error(b.client().post("/v1/systemone", json=decision("jev-latest")), 404)  # aliases stay A's
