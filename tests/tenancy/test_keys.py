"""API key material (SPEC §3): generation, digests, constant-time checks, bearer parsing."""

from __future__ import annotations

import hashlib
import hmac
import string

import pytest

from app.db.session import Database
from app.tenancy import keys
from app.tenancy import service as tenancy
from app.tenancy.keys import (
    ADMIN_PREFIX,
    MAX_KEY_LENGTH,
    PROJECT_PREFIX,
    KeyHasher,
    bearer_token,
    kind_of,
)
from app.tenancy.service import CLI

BASE62 = set(string.digits + string.ascii_letters)


@pytest.mark.parametrize(("kind", "prefix"), [("project", "arb_proj_"), ("admin", "arb_admin_")])
def test_new_key_shape(kind: str, prefix: str) -> None:
    new = KeyHasher().new(kind)
    assert new.value.startswith(prefix)
    body = new.value[len(prefix):]
    assert len(body) == 43
    assert set(body) <= BASE62
    assert new.prefix == new.value[: len(prefix) + 4]
    assert new.last_four == new.value[-4:]
    assert kind_of(new.value) == kind
    assert len(new.value) <= MAX_KEY_LENGTH


def test_prefix_constants() -> None:
    assert PROJECT_PREFIX == "arb_proj_"
    assert ADMIN_PREFIX == "arb_admin_"


def test_43_base62_chars_hold_256_bits() -> None:
    assert 62**43 > 2**256


def test_base62_encodes_the_extremes() -> None:
    assert keys._base62(bytes(32)) == "0" * 43
    top = keys._base62(b"\xff" * 32)
    assert len(top) == 43 and set(top) <= BASE62
    alphabet = string.digits + string.ascii_uppercase + string.ascii_lowercase
    # _base62 emits the least significant digit first
    assert sum(alphabet.index(c) * 62**i for i, c in enumerate(top)) == 2**256 - 1


def test_thousand_keys_are_unique() -> None:
    hasher = KeyHasher()
    new = [hasher.new("project") for _ in range(1000)]
    assert len({k.value for k in new}) == 1000
    assert len({k.digest for k in new}) == 1000
    # the alphabet is actually used, not a fixed subset
    assert set("".join(k.value[len(PROJECT_PREFIX):] for k in new)) == BASE62


def test_digest_without_pepper_is_sha256_hex() -> None:
    value = "arb_proj_abc"
    assert KeyHasher().digest(value) == hashlib.sha256(value.encode()).hexdigest()
    assert KeyHasher(None).digest(value) == KeyHasher("").digest(value)


def test_digest_with_pepper_is_hmac_sha256() -> None:
    value = "arb_proj_abc"
    peppered = KeyHasher("s3cret-pepper").digest(value)
    assert peppered == hmac.new(b"s3cret-pepper", value.encode(), hashlib.sha256).hexdigest()
    assert peppered != KeyHasher().digest(value)
    assert peppered != KeyHasher("other-pepper").digest(value)
    assert len(peppered) == 64 and set(peppered) <= set("0123456789abcdef")


def test_new_key_digest_matches_its_hasher() -> None:
    hasher = KeyHasher("pepper")
    new = hasher.new("admin")
    assert new.digest == hasher.digest(new.value)
    assert new.digest != KeyHasher().digest(new.value)


def test_digest_of_odd_text_does_not_raise() -> None:
    assert len(KeyHasher().digest("arb_proj_\ud800")) == 64
    assert len(KeyHasher("p").digest("za\u017c\u00f3\u0142\u0107")) == 64


def test_matches() -> None:
    hasher = KeyHasher("pepper")
    new = hasher.new("project")
    assert hasher.matches(new.value, new.digest)
    assert not hasher.matches(new.value + "x", new.digest)
    assert not hasher.matches(new.value[:-1], new.digest)
    assert not hasher.matches("", new.digest)
    assert not KeyHasher().matches(new.value, new.digest)  # wrong pepper
    assert not hasher.matches(new.value, new.digest.upper())
    assert not hasher.matches(new.value, "")


def spy_on_compare_digest(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The calls to ``hmac.compare_digest`` made through app/tenancy/keys.py from now on."""
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    return calls


def test_matches_uses_a_constant_time_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_on_compare_digest(monkeypatch)
    hasher = KeyHasher()
    assert hasher.matches("arb_proj_x", hasher.digest("arb_proj_x"))
    assert not hasher.matches("arb_proj_y", hasher.digest("arb_proj_x"))
    assert len(calls) == 2


def test_a_key_found_by_its_digest_is_compared_in_constant_time(db: Database,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Lookups are by digest (an index); the row found is then compared in constant time."""
    hasher = KeyHasher()
    with db.session() as session:
        tenancy.create_project(session, "acme", CLI)
        _, value = tenancy.create_key(session, hasher, CLI, kind="project", project="acme")
    calls = spy_on_compare_digest(monkeypatch)
    digest = hasher.digest(value)
    with db.session() as session:
        found = tenancy.load_principal(session, digest)
        assert tenancy.load_principal(session, hasher.digest(value + "x")) is None
    assert found is not None and found.project_name == "acme"
    assert calls == [(digest, digest)]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("arb_proj_abc", "project"),
        ("arb_admin_abc", "admin"),
        ("arb_proj_", "project"),
        ("arb_other_abc", None),
        ("ARB_PROJ_abc", None),
        ("sk-abc", None),
        ("", None),
        ("arb_", None),
        ("arb_admin", None),
    ],
)
def test_kind_of(value: str, kind: str | None) -> None:
    assert kind_of(value) == kind


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer arb_proj_abc", "arb_proj_abc"),
        ("bearer arb_proj_abc", "arb_proj_abc"),
        ("BEARER arb_proj_abc", "arb_proj_abc"),
        ("BeArEr arb_proj_abc", "arb_proj_abc"),
        ("Bearer    arb_proj_abc", "arb_proj_abc"),
        ("  Bearer arb_proj_abc  ", "arb_proj_abc"),
        ("Bearer " + "a" * MAX_KEY_LENGTH, "a" * MAX_KEY_LENGTH),
    ],
)
def test_bearer_token(header: str, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        "Bearer",
        "Bearer ",
        "Bearer      ",
        "Basic dXNlcjpwYXNz",
        "Token arb_proj_abc",
        "Digest arb_proj_abc",
        "Bearerarb_proj_abc",
        "arb_proj_abc",
        "Bearer " + "a" * (MAX_KEY_LENGTH + 1),
        "Bearer " + "a" * 10_000,
    ],
)
def test_bearer_token_refused(header: str | None) -> None:
    assert bearer_token(header) is None
