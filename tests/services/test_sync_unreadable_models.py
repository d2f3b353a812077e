"""Syncing an Ollama whose /api/show fails for one model (SPEC §4): that model is skipped, with
why, in the service status; the others are synced. Over real HTTP to the emulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Stack, body, decide

BROKEN = "llama runner: failed to read gguf: unexpected EOF"  # what Ollama's ShowHandler says, as a 500
REASON = "cannot read its capabilities: /api/show answered HTTP 500"


@pytest.fixture
def lab() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    state = OllamaState(models={"tev1": ["decision"], "llama3.2": ["completion", "tools"],
                                "nomic-embed-text": ["embedding"]})
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


def names(view: dict[str, Any]) -> list[str]:
    return sorted(m["public_name"] for m in view["models"])


def add(admin: httpx.Client, server: EmulatorServer) -> dict[str, Any]:
    return body(admin.post("/admin/services", json={"type": "ollama-external", "url": server.url,
                                                    "name": "lab"}), 201)  # type: ignore[no-any-return]


def test_one_model_whose_show_fails_is_skipped_and_the_others_are_synced(
        stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    state.show_errors["llama3.2"] = BROKEN
    with stack.client("admin") as admin:
        added = add(admin, server)
        assert added["reachable"] is True and added["last_error"] is None
        assert names(added) == ["nomic-embed-text", "tev1"]
        assert added["skipped_models"] == [{"model": "llama3.2", "backend_name": "llama3.2:latest",
                                            "reason": REASON}]
        assert server.url not in added["skipped_models"][0]["reason"]  # no URL (it may carry a secret)
        assert body(admin.get("/admin/services/lab"), 200)["skipped_models"] == added["skipped_models"]
        shown = [r.json["model"] for r in state.requests if r.path == "/api/show"]
        assert sorted(shown) == ["llama3.2:latest", "nomic-embed-text:latest", "tev1:latest"]
        assert decide(stack, "tev1").status_code == 200

        state.show_errors.clear()  # the model was repaired: the next sync registers it
        refreshed = body(admin.post("/admin/services/lab/refresh"), 200)
        assert refreshed["skipped_models"] == [] and refreshed["reachable"] is True
        listed = body(admin.get("/admin/services/lab/models"), 200)["data"]
        assert sorted(m["public_name"] for m in listed) == ["llama3.2", "nomic-embed-text", "tev1"]


def test_a_registered_model_whose_show_fails_keeps_its_row(
        stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    with stack.client("admin") as admin:
        assert names(add(admin, server)) == ["llama3.2", "nomic-embed-text", "tev1"]
        before = {m["public_name"]: m for m in body(admin.get("/admin/services/lab/models"), 200)["data"]}
        state.show_errors["tev1"] = BROKEN
        refreshed = body(admin.post("/admin/services/lab/refresh"), 200)
        assert refreshed["reachable"] is True and refreshed["last_error"] is None
        assert refreshed["skipped_models"] == [{"model": "tev1", "backend_name": "tev1:latest",
                                                "reason": REASON}]
        after = {m["public_name"]: m for m in body(admin.get("/admin/services/lab/models"), 200)["data"]}
        assert after == before  # kept as last synced, capabilities and all
    assert decide(stack, "tev1").status_code == 200


def test_every_show_failing_still_syncs_the_service(
        stack: Stack, lab: tuple[EmulatorServer, OllamaState]) -> None:
    server, state = lab
    for model in list(state.models):
        state.show_errors[model] = BROKEN
    with stack.client("admin") as admin:
        added = add(admin, server)
        assert added["reachable"] is True and added["models"] == []
        assert sorted(s["model"] for s in added["skipped_models"]) == ["llama3.2", "nomic-embed-text", "tev1"]
