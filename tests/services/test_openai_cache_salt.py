"""The per-project prefix-cache salt on `openai` services (SPEC §1): one that is a vLLM (its
`GET /version` answers `{"version": ...}`) gets it as a `vllm` service does, in chat and in label
reads, with a tenant's own `cache_salt` combined in, never passed through; any other
OpenAI-compatible server shares one cache Arbiter cannot salt, and its status says so."""

from __future__ import annotations

import hashlib
import html
from collections.abc import Callable
from contextlib import closing
from typing import Any

from app.db.session import Database
from app.services.sync import SHARED_PREFIX_CACHE
from app.tenancy.salts import TenantSalts
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from infra_adapters.openai_compat import vllm_version
from tests.support import Gateway, Stack, decision
from tests.ui.conftest import ui_sign_in

QWEN = "Qwen/Qwen3-0.6B"
CHAT = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}]}
PATHS = ("/v1/chat/completions", "/v1/systemone")


def _openai_stack(db: Database, server: EmulatorServer, gateway_factory: Callable[..., Gateway]) -> Stack:
    stack = Stack.provision(db)
    stack.gateway = gateway_factory()
    added = stack.client("admin").post("/admin/services", json={"type": "openai", "url": server.url,
                                                                 "name": "openai-server"})
    assert added.status_code == 201, added.text
    return stack


def _salts_sent(state: VllmState, stack: Stack, **extra: Any) -> list[Any]:
    before = len(state.requests)
    with stack.client() as client:
        assert client.post("/v1/chat/completions", json={**CHAT, **extra}).status_code == 200
        assert client.post("/v1/systemone", json=decision(QWEN, **extra)).status_code == 200
    return [r.json.get("cache_salt") for r in state.requests[before:] if r.path in PATHS]


def _tenant_salt(stack: Stack) -> str:
    project = int(stack.client("admin").get("/admin/projects/acme").json()["id"])
    return TenantSalts(stack.gateway.settings).of(project)


def test_an_openai_service_that_is_a_vllm_salts_chat_and_label_reads_per_project(
        db: Database, vllm: tuple[EmulatorServer, VllmState], gateway_factory: Callable[..., Gateway]) -> None:
    server, state = vllm
    stack = _openai_stack(db, server, gateway_factory)
    (view,) = stack.client("admin").get("/admin/services").json()["data"]
    assert view["version"] == state.version and view["prefix_cache_salted"] is True
    assert view["prefix_cache_message"] is None
    tenant = _tenant_salt(stack)
    salts = _salts_sent(state, stack)
    assert len(salts) == 4 and set(salts) == {tenant}  # one chat, three label reads
    # A tenant's own salt is combined with the project's, as on a vllm service: never passed through.
    combined = hashlib.sha256(f"{tenant}:end-user-7".encode()).hexdigest()
    assert set(_salts_sent(state, stack, cache_salt="end-user-7")) == {combined}


def test_another_openai_compatible_server_says_its_cache_is_shared(
        db: Database, vllm: tuple[EmulatorServer, VllmState], gateway_factory: Callable[..., Gateway]) -> None:
    server, state = vllm
    state.version = None  # no /version route: llama.cpp's server, LM Studio, a hosted API
    stack = _openai_stack(db, server, gateway_factory)
    (view,) = stack.client("admin").get("/admin/services").json()["data"]
    assert view["version"] is None and view["prefix_cache_salted"] is False
    assert view["prefix_cache_message"] == SHARED_PREFIX_CACHE
    assert _salts_sent(state, stack) == [None] * 4  # nothing Arbiter could salt with
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as ui:
        page = html.unescape(ui.get(f"/ui/services/{view['id']}").text)
    assert SHARED_PREFIX_CACHE in page and "shared by every project" in page


def test_a_vllm_answering_its_version_again_is_salted_after_a_refresh(
        db: Database, vllm: tuple[EmulatorServer, VllmState], gateway_factory: Callable[..., Gateway]) -> None:
    server, state = vllm
    state.version = None
    stack = _openai_stack(db, server, gateway_factory)
    state.version = "0.33.0"  # say a proxy in front of it passed /version through from now on
    refreshed = stack.client("admin").post("/admin/services/openai-server/refresh")
    assert refreshed.status_code == 200, refreshed.text
    assert set(_salts_sent(state, stack)) == {_tenant_salt(stack)}


def test_only_vllms_own_version_answer_counts() -> None:
    assert vllm_version({"version": "0.33.0"}) == "0.33.0"
    for other in (None, {}, {"version": ""}, {"version": 33}, ["0.33.0"], {"version": "v2.1", "commit": "abc"}):
        assert vllm_version(other) is None, other
