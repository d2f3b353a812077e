"""Admin calls to a backend (its version, its models): one TLS context for all of them."""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.http import admin_tls
from infra_adapters.ollama import OllamaBackend


def test_admin_calls_load_the_certificates_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx makes a TLS context for every client it opens (~20 ms of CPU for the system's
    certificates), whether or not the URL is https; a sync makes several calls, every replica
    every few minutes, so they share one."""
    admin_tls()
    loads: list[str] = []
    for name in ("load_verify_locations", "load_default_certs"):  # a CA file or directory; the system's
        original = getattr(ssl.SSLContext, name)

        def counted(self: ssl.SSLContext, *args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            loads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(ssl.SSLContext, name, counted)
    with EmulatorServer(make_ollama_app(OllamaState())) as server:
        backend = OllamaBackend(server.url)
        for _ in range(3):
            assert backend.read_version()
            assert backend.list_models()
    assert loads == []


def test_the_shared_context_still_checks_certificates_and_names() -> None:
    context = admin_tls()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
