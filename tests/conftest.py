"""Shared fixtures: a migrated database (SQLite, or PostgreSQL when
ARBITER_TEST_DATABASE_URL says so), backend emulators on loopback, and Arbiter
itself served by uvicorn on a free port. Everything talks real HTTP."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.db import migrate
from app.db.models import Base
from app.db.session import Database
from app.settings import sqlalchemy_url
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app
from tests.support import Gateway, Stack, start_gateway, synced

# Service credentials are stored encrypted; every Settings() in the tests can open them.
os.environ.setdefault("ARBITER_SECRET_KEY", "test-secret-key-for-service-credentials")


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = os.environ.get("ARBITER_TEST_DATABASE_URL", "")
    if base.startswith(("postgresql", "postgres")):
        name = f"arbiter_test_{uuid.uuid4().hex[:12]}"
        server = make_url(sqlalchemy_url(base))
        admin = create_engine(server, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = server.set(database=name).render_as_string(hide_password=False)
        try:
            migrate.upgrade(url)
            yield url
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'arbiter.db'}"
        migrate.upgrade(url)
        yield url


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    """The test database, emptied before each test."""
    database = Database(database_url)
    tables = [t.name for t in reversed(Base.metadata.sorted_tables)]
    with database.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            for table in tables:
                connection.execute(text(f"DELETE FROM {table}"))
    yield database
    database.dispose()


@pytest.fixture
def ollama() -> Iterator[tuple[EmulatorServer, OllamaState]]:
    state = OllamaState()
    with EmulatorServer(make_ollama_app(state)) as server:
        yield server, state


@pytest.fixture
def vllm() -> Iterator[tuple[EmulatorServer, VllmState]]:
    state = VllmState()
    with EmulatorServer(make_vllm_app(state)) as server:
        yield server, state


@pytest.fixture
def gateway_factory(db: Database) -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def make(**overrides: Any) -> Gateway:
        gateway = start_gateway(overrides.pop("database_url", db.url), **overrides)
        started.append(gateway)
        return gateway

    yield make
    for gateway in started:
        gateway.stop()


@pytest.fixture
def stack(db: Database, ollama: tuple[EmulatorServer, OllamaState],
          gateway_factory: Callable[..., Gateway]) -> Stack:
    """Arbiter in front of an emulated Ollama, with a project 'acme' (all models) and its key."""
    server, state = ollama
    built = Stack.provision(db, ollama_url=server.url)
    built.gateway = synced(gateway_factory())
    built.ollama, built.ollama_state = server, state
    return built


@pytest.fixture
def vllm_stack(db: Database, vllm: tuple[EmulatorServer, VllmState],
               gateway_factory: Callable[..., Gateway]) -> Stack:
    """Arbiter in front of an emulated vLLM (``extra["server"]``, ``extra["state"]``), with a
    project 'acme' (all models) and its key."""
    server, state = vllm
    built = Stack.provision(db, vllm_url=server.url)
    built.gateway = synced(gateway_factory())
    built.extra.update(server=server, state=state)
    return built
