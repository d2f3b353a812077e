"""Settings read from the environment: the one variable that keeps uvicorn's own name too."""

from __future__ import annotations

import math
import secrets

import pytest
from pydantic import ValidationError
from zxcvbn import zxcvbn

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
    ("label_mass_warning", -0.1), ("label_mass_warning", 1.01), ("label_mass_warning", "half"),
])
def test_values_out_of_range_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{field: value})
    assert refused.value.errors()[0]["loc"] == (field,)


WEAK_SECRETS = [("x", "at least 32 characters"), ("short-but-not-that-short-0123", "at least 32 characters"),
                ("a" * 64, "at least 8"), ("0123456789abcdef" * 2, "a piece of 16 characters repeated"),
                ("passwordpasswordpasswordpassword1", "too predictable"),
                ("01234567890123456789012345678901x", "too predictable"),
                ("qwertyuiopasdfghjklzxcvbnm1234567890", "too predictable"),
                ("Summer2024!Summer2024!Summer2024!x", "too predictable"),
                # Words, names and dates: long enough letter by letter, guessed far sooner.
                ("MyCompanyMeshKey2024ProductionCluster", "too guessable"),
                ("AcmeCorporationMeshSecret2025Berlin", "too guessable")]


@pytest.mark.parametrize("field", ["mesh_key", "key_pepper", "secret_key", "metrics_token"])
@pytest.mark.parametrize(("value", "why"), WEAK_SECRETS)
def test_weak_secrets_are_refused_naming_the_setting_and_the_fix(field: str, value: str, why: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**{field: value})
    (error,) = refused.value.errors()
    assert error["loc"] == (field,) and f"ARBITER_{field.upper()}" in error["msg"] and why in error["msg"]
    assert "secrets.token_urlsafe(32)" in error["msg"] and "arbiter secret" in error["msg"]
    assert value not in str(refused.value)  # never echoed, in the message or pydantic's own text


@pytest.mark.parametrize("field", ["mesh_key", "key_pepper", "secret_key", "metrics_token"])
def test_random_secrets_are_taken(field: str) -> None:
    for value in (secrets.token_urlsafe(32), secrets.token_hex(16), "correct-horse-battery-staple-of-mine"):
        assert getattr(Settings(**{field: value}), field).get_secret_value() == value


def test_generated_secrets_always_pass_the_strength_rule() -> None:
    """Thousands of each generator's tokens: none is refused, and each clears the 96 bits with room
    to spare (the rule's margin over a random token is what makes this no matter of luck)."""
    from app.settings import SECRET_MIN_BITS, SECRET_MIN_GUESS_BITS, secret_bits, weak_secret_problem

    for make in (lambda: secrets.token_urlsafe(32), lambda: secrets.token_hex(32), lambda: secrets.token_hex(16)):
        for _ in range(3000):
            value = make()
            assert secret_bits(value, enough=1e9) >= SECRET_MIN_BITS + 8, value
        for _ in range(200):  # zxcvbn's second opinion takes ~10 ms a token: fewer draws, a margin too
            value = make()
            assert weak_secret_problem(value) is None, value
            assert zxcvbn(value)["guesses_log10"] * math.log2(10) >= SECRET_MIN_GUESS_BITS + 8, value


def test_arbiter_secret_prints_a_secret_that_passes(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main

    assert main(["secret"]) == 0
    value = capsys.readouterr().out.strip()
    assert len(value) == 43 and Settings(mesh_key=value).mesh_key is not None


def test_a_log_level_in_any_case_is_taken() -> None:
    assert Settings(log_level="warning").log_level == "WARNING"
