"""Failed admin keys and failed web UI sign-ins are throttled per client address: past the
limit, 429 with Retry-After before the key is looked up. Addresses come from X-Forwarded-For,
which the gateway believes from loopback (ARBITER_FORWARDED_ALLOW_IPS' default), the way a
proxy in front of it sends them."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from app.ui.session import COOKIE
from tests.support import Gateway, Stack, assert_error, tampered
from tests.ui.conftest import csrf_of

LIMIT = 3


@pytest.fixture
def gateway(stack: Stack, gateway_factory: Callable[..., Gateway]) -> Gateway:
    return gateway_factory(auth_failure_limit=LIMIT, auth_failure_window=600)


def admin_get(gateway: Gateway, key: str | None, address: str, path: str = "/admin/projects") -> httpx.Response:
    headers = {"X-Forwarded-For": address}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.get(gateway.url + path, headers=headers)


def sign_in(gateway: Gateway, key: str, address: str) -> httpx.Response:
    with httpx.Client(base_url=gateway.url, headers={"X-Forwarded-For": address}) as client:
        form = client.get("/ui/sign-in")
        return client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": key})


def test_failed_admin_keys_lock_out_their_address_only(stack: Stack, gateway: Gateway) -> None:
    wrong = tampered(stack.admin_key)
    for _ in range(LIMIT):
        assert_error(admin_get(gateway, wrong, "10.0.0.1"), 401)
    blocked = admin_get(gateway, stack.admin_key, "10.0.0.1")  # the right key, too late: not looked up
    assert_error(blocked, 429, "rate_limit_error")
    assert 0 < int(blocked.headers["retry-after"]) <= 600
    assert stack.admin_key not in blocked.text and wrong not in blocked.text
    assert_error(admin_get(gateway, stack.admin_key, "10.0.0.1", "/metrics"), 429)
    assert admin_get(gateway, stack.admin_key, "10.0.0.2").status_code == 200  # another address
    # Project keys are not throttled (the decision path pays nothing for it).
    with httpx.Client(base_url=gateway.url, headers={"X-Forwarded-For": "10.0.0.1"}) as client:
        models = client.get("/v1/models", headers={"Authorization": f"Bearer {stack.project_key}"})
        assert models.status_code == 200


def test_a_success_does_not_reset_the_count_and_no_key_is_no_guess(stack: Stack, gateway: Gateway) -> None:
    wrong = tampered(stack.admin_key)
    for _ in range(LIMIT - 1):
        assert admin_get(gateway, wrong, "10.0.1.1").status_code == 401
    assert admin_get(gateway, stack.admin_key, "10.0.1.1").status_code == 200
    assert admin_get(gateway, wrong, "10.0.1.1").status_code == 401
    assert_error(admin_get(gateway, stack.admin_key, "10.0.1.1"), 429)
    for _ in range(LIMIT + 2):  # a client without a key (a probe, a misconfigured script) guesses nothing
        assert admin_get(gateway, None, "10.0.1.2").status_code == 401
    assert admin_get(gateway, stack.admin_key, "10.0.1.2").status_code == 200


def test_failed_sign_ins_lock_out_their_address(stack: Stack, gateway: Gateway) -> None:
    for key in ("arb_admin_" + "x" * 43, stack.project_key, tampered(stack.admin_key)):
        assert sign_in(gateway, key, "10.0.2.1").status_code == 401
    blocked = sign_in(gateway, stack.admin_key, "10.0.2.1")
    assert blocked.status_code == 429 and 0 < int(blocked.headers["retry-after"]) <= 600
    assert "Too many failed keys" in blocked.text and COOKIE not in blocked.cookies
    assert_error(admin_get(gateway, stack.admin_key, "10.0.2.1"), 429)  # one count per address
    ok = sign_in(gateway, stack.admin_key, "10.0.2.2")
    assert ok.status_code == 303 and COOKIE in ok.cookies
