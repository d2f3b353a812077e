"""Settings read from the environment: the one variable that keeps uvicorn's own name too."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

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


@pytest.mark.parametrize(("field", "value"), [
    ("port", 0), ("port", 65536), ("metrics_port", 70000), ("sync_interval", 0), ("flush_interval", -1),
    ("registry_refresh_interval", 0), ("mesh_interval", 0), ("backend_timeout", 0), ("backend_pool_size", 0),
    ("key_cache_ttl", -1), ("max_concurrency", -1), ("mesh_max_hops", 0), ("log_level", "loud"),
    ("secret_key", "CHANGE-ME"), ("secret_key", "short"), ("metrics_token", "change_me"),
    ("mesh_key", "please-changeme"), ("key_pepper", "Change-Me"),
])
def test_values_out_of_range_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{field: value})
    assert refused.value.errors()[0]["loc"] == (field,)


def test_a_log_level_in_any_case_is_taken() -> None:
    assert Settings(log_level="warning").log_level == "WARNING"
