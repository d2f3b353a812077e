"""Settings read from the environment: the one variable that keeps uvicorn's own name too."""

from __future__ import annotations

import pytest

from app.settings import Settings


def test_forwarded_allow_ips_from_arbiter_or_uvicorn_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARBITER_FORWARDED_ALLOW_IPS", raising=False)
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    assert Settings().forwarded_allow_ips == "127.0.0.1"
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.0.0.1")
    assert Settings().forwarded_allow_ips == "10.0.0.1"  # uvicorn's name, as before the setting
    monkeypatch.setenv("ARBITER_FORWARDED_ALLOW_IPS", "10.0.0.2,10.0.0.3")
    assert Settings().forwarded_allow_ips == "10.0.0.2,10.0.0.3"  # Arbiter's own wins
    assert Settings(forwarded_allow_ips="*").forwarded_allow_ips == "*"


def test_other_settings_still_need_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARBITER_PORT", raising=False)
    monkeypatch.setenv("PORT", "9999")
    assert Settings().port == 8080
