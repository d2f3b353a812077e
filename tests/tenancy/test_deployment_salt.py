"""The cache salt's secret without ARBITER_SECRET_KEY or ARBITER_KEY_PEPPER: a random one each
deployment makes once and keeps in its database, so project 1's `cache_salt` is the same on every
replica of a deployment and differs from one deployment to another (app/tenancy/salts.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from app.db import migrate
from app.db.models import DeploymentSecret, Project
from app.db.session import Database
from app.tenancy.salts import TenantSalts, stored_secret
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.support import Gateway, Stack, synced

CHAT = {"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}]}
NO_SECRET = {"secret_key": None, "key_pepper": None}


def salt_sent(gateway: Gateway, key: str, state: VllmState) -> str:
    before = len(state.requests)
    with gateway.client(key) as client:
        response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200, response.text
    [salt] = [r.json["cache_salt"] for r in state.requests[before:] if r.path == "/v1/chat/completions"]
    return str(salt)


def test_replicas_of_a_deployment_share_the_salt_and_deployments_do_not(
        db: Database, vllm: tuple[EmulatorServer, VllmState], gateway_factory: Callable[..., Gateway],
        tmp_path: Path) -> None:
    server, state = vllm
    first = Stack.provision(db, vllm_url=server.url)
    one, two = synced(gateway_factory(**NO_SECRET)), synced(gateway_factory(**NO_SECRET))
    salt = salt_sent(one, first.project_key, state)
    assert salt_sent(two, first.project_key, state) == salt
    with db.session() as session:
        assert len(session.scalars(select(DeploymentSecret)).all()) == 1

    other_url = f"sqlite:///{tmp_path / 'other.db'}"  # another deployment: its own database
    migrate.upgrade(other_url)
    other_db = Database(other_url)
    try:
        second = Stack.provision(other_db, vllm_url=server.url)
        other = synced(gateway_factory(database_url=other_url, **NO_SECRET))
        with first.db.session() as a, other_db.session() as b:  # the same project id in both
            assert a.scalar(select(Project.id)) == b.scalar(select(Project.id))
        assert salt_sent(other, second.project_key, state) != salt
    finally:
        other_db.dispose()


def test_a_secret_key_keys_the_salt_as_before(db: Database, vllm: tuple[EmulatorServer, VllmState],
                                              gateway_factory: Callable[..., Gateway]) -> None:
    server, state = vllm
    stack = Stack.provision(db, vllm_url=server.url)
    gateway = synced(gateway_factory(secret_key="a-secret-key-of-this-test-Zq8vN2xLr5Tb7Wd"))
    stack.gateway = gateway
    project = int(stack.client("admin").get("/admin/projects/acme").json()["id"])
    assert salt_sent(gateway, stack.project_key, state) == TenantSalts(gateway.settings).of(project)
    with db.session() as session:  # nothing stored: the setting is the secret
        assert session.scalars(select(DeploymentSecret)).all() == []


def test_replicas_starting_at_once_agree_on_one_secret(db: Database) -> None:
    values: list[str] = []
    threads = [threading.Thread(target=lambda: values.append(stored_secret(db))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(values) == 4 and len(set(values)) == 1 and len(values[0]) >= 43
