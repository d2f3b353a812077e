"""The web UI's session rules over plain HTTP: who may sign in, what the cookie is, what ends a
session, and CSRF on every change."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import closing

import httpx

from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI
from app.ui.session import COOKIE, SIGNIN_COOKIE, SessionSigner
from tests.support import Gateway, Stack
from tests.ui.conftest import csrf_of, ui_sign_in


def key_id(stack: Stack, value: str) -> int:
    with stack.db.session() as session:
        principal = tenancy.load_principal(session, KeyHasher().digest(value))
        assert principal is not None
        return principal.key_id


def test_pages_need_a_session(stack: Stack) -> None:
    with httpx.Client(base_url=stack.gateway.url) as client:
        for path in ("/ui", "/ui/", "/ui/services", "/ui/models", "/ui/projects", "/ui/usage", "/ui/audit",
                     "/ui/mesh", "/ui/services/1", "/ui/projects/1"):
            answer = client.get(path)
            assert answer.status_code == 303 and answer.headers["location"] == "/ui/sign-in", path
        api = client.get("/ui/api/installs/1")
        assert api.status_code == 401 and api.json()["detail"]["error_type"] == "authentication_error"
        assert client.post("/ui/api/models/1/test").status_code == 401
        # A POST without a session changes nothing either.
        assert client.post("/ui/projects", data={"name": "sneaky"}).status_code == 303
    with stack.db.session() as session:
        assert "sneaky" not in [p.name for p in tenancy.list_projects(session)]


def test_sign_in_sets_a_strict_http_only_expiring_cookie(stack: Stack) -> None:
    with httpx.Client(base_url=stack.gateway.url) as client:
        form = client.get("/ui/sign-in")
        assert form.status_code == 200 and 'name="key"' in form.text
        assert "default-src 'self'" in form.headers["content-security-policy"]
        answer = client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": stack.admin_key})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/services"
        cookie = next(v for v in answer.headers.get_list("set-cookie") if v.startswith(f"{COOKIE}="))
        attributes = {part.strip().split("=")[0].lower(): part.strip() for part in cookie.split(";")}
        assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict"
        assert attributes["path"] == "Path=/ui" and attributes["max-age"] == "Max-Age=28800"
        assert "secure" not in attributes  # plain http here; https requests get Secure
        token = cookie.split(";")[0].split("=", 1)[1]
        assert stack.admin_key not in token and stack.admin_key[-12:] not in token  # no key material
        page = client.get("/ui/services")
        assert page.status_code == 200 and "Sign out" in page.text
        assert stack.admin_key not in page.text


def test_a_project_key_or_a_wrong_key_cannot_sign_in(stack: Stack) -> None:
    with httpx.Client(base_url=stack.gateway.url) as client:
        for key, expected in ((stack.project_key, "That is a project key"),
                              ("arb_admin_" + "x" * 43, "That is not a valid admin key"),
                              ("hello", "That is not a valid admin key"),
                              ("", "Enter an admin key")):
            form = client.get("/ui/sign-in")
            answer = client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": key})
            assert answer.status_code in (400, 401), key
            assert expected in answer.text and 'role="alert"' in answer.text
            assert COOKIE not in client.cookies
            assert key == "" or key not in answer.text  # the key typed is not echoed


def test_the_sign_in_form_itself_needs_its_token(stack: Stack) -> None:
    with httpx.Client(base_url=stack.gateway.url) as client:
        answer = client.post("/ui/sign-in", data={"key": stack.admin_key})
        assert answer.status_code == 403 and "expired" in answer.text and COOKIE not in client.cookies
        client.get("/ui/sign-in")  # the nonce cookie, but a made-up token
        answer = client.post("/ui/sign-in", data={"key": stack.admin_key, "csrf": "made-up"})
        assert answer.status_code == 403 and COOKIE not in client.cookies


def test_forged_expired_and_foreign_cookies_are_refused(stack: Stack) -> None:
    admin_id = key_id(stack, stack.admin_key)
    secret = os.environ["ARBITER_SECRET_KEY"]
    good = SessionSigner(secret).issue(admin_id, 600).token
    body, _, signature = good.rpartition(".")
    forged_id = body.split(".", 1)[1]
    cookies = {
        "expired": SessionSigner(secret).issue(admin_id, 60, now=time.time() - 3600).token,
        "other secret": SessionSigner("another-secret-entirely").issue(admin_id, 600).token,
        "tampered id": f"9{body}.{signature}",
        "longer life": f"{admin_id}.{int(time.time()) + 10**6}.{forged_id.split('.', 1)[1]}.{signature}",
        "no signature": body,
        "garbage": "x" * 500,
    }
    for name, value in cookies.items():
        with httpx.Client(base_url=stack.gateway.url, cookies={COOKIE: value}) as client:
            answer = client.get("/ui/services")
            assert answer.status_code == 303, name
            assert answer.headers["location"].startswith("/ui/sign-in"), name
            assert client.get("/ui/api/installs/1").status_code == 401, name
    # Even a cookie the server's own signer made counts only with its session in the database
    # (one minted with a leaked ARBITER_SECRET_KEY has none); a real sign-in's does.
    with httpx.Client(base_url=stack.gateway.url, cookies={COOKIE: good}) as client:
        assert client.get("/ui/services").status_code == 303
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as signed:
        assert signed.get("/ui/services").status_code == 200


def test_revoking_the_admin_key_ends_its_session(stack: Stack) -> None:
    with stack.db.session() as session:
        other = tenancy.create_key(session, KeyHasher(), CLI, kind="admin", name="other")[1]
    client = ui_sign_in(stack.gateway.url, other)
    try:
        assert client.get("/ui/services").status_code == 200
        with stack.client("admin") as admin:
            assert admin.post(f"/admin/keys/{key_id(stack, other)}/revoke").status_code == 200
        answer = client.get("/ui/services")
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/sign-in?ended=1"
        assert f'{COOKIE}=""' in answer.headers["set-cookie"]  # cleared
        notice = httpx.get(stack.gateway.url + "/ui/sign-in?ended=1")
        assert "session ended" in notice.text
        # A revoked key cannot sign in again either.
        form = client.get("/ui/sign-in")
        again = client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": other})
        assert again.status_code == 401 and "revoked or expired" in again.text
    finally:
        client.close()


def test_every_change_needs_the_csrf_token(stack: Stack) -> None:
    client = ui_sign_in(stack.gateway.url, stack.admin_key)
    try:
        token = csrf_of(client.get("/ui/projects").text)
        for sent in ({}, {"csrf": ""}, {"csrf": "wrong"}, {"csrf": token[:-1]}):
            answer = client.post("/ui/projects", data={"name": "forged", "scope": "all", **sent})
            assert answer.status_code == 403, sent
            assert "security token is missing or wrong" in answer.text
            assert "Traceback" not in answer.text
        for path in ("/ui/services", "/ui/models/install", "/ui/keys/1/revoke", "/ui/sign-out",
                     "/ui/services/1/refresh", "/ui/projects/1/models"):
            assert client.post(path, data={"csrf": "wrong"}).status_code == 403, path
        with stack.db.session() as session:
            assert "forged" not in [p.name for p in tenancy.list_projects(session)]
        # The scripts' JSON: the header, not a form field.
        assert client.post("/ui/api/models/1/test").status_code == 403
        assert client.post("/ui/api/models/1/test", headers={"X-CSRF-Token": "wrong"}).status_code == 403
        missing = client.post("/ui/api/models/999/test", headers={"X-CSRF-Token": token})
        assert missing.status_code == 404 and missing.json()["detail"]["error_type"] == "not_found_error"
        # The right token works, and the change is audited as this admin key's.
        made = client.post("/ui/projects", data={"name": "made", "scope": "all", "csrf": token})
        assert made.status_code == 303
        with stack.client("admin") as admin:
            entry = admin.get("/admin/audit").json()["data"][0]
        assert entry["action"] == "project.create" and entry["target"] == "project:made"
        assert entry["actor"] == f"admin-key:{key_id(stack, stack.admin_key)}:{stack.admin_key[:14]}"
        assert entry["request_id"] == made.headers["x-request-id"]
    finally:
        client.close()


def test_sign_out_clears_the_cookie(stack: Stack) -> None:
    client = ui_sign_in(stack.gateway.url, stack.admin_key)
    try:
        token = csrf_of(client.get("/ui/services").text)
        answer = client.post("/ui/sign-out", data={"csrf": token})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/sign-in"
        assert f'{COOKIE}=""' in answer.headers["set-cookie"]
        assert client.get("/ui/services").status_code == 303
    finally:
        client.close()


def test_sessions_span_replicas_with_a_secret_key_and_last_ui_session_minutes(
        stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:  # stack first: its backend stops last
    """With ARBITER_SECRET_KEY another process (a replica, a restart) accepts the session, and
    ARBITER_UI_SESSION_MINUTES sets how long it lasts; without the secret, each process signs
    with its own random one."""
    replica = gateway_factory(ui_session_minutes=5)
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        token = client.cookies[COOKIE]
    with httpx.Client(base_url=replica.url, cookies={COOKIE: token}) as other:
        assert other.get("/ui/services").status_code == 200
    with httpx.Client(base_url=replica.url) as fresh:
        form = fresh.get("/ui/sign-in")
        assert "has no <code>ARBITER_SECRET_KEY</code>" not in form.text
        answer = fresh.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": stack.admin_key})
        assert "Max-Age=300" in answer.headers["set-cookie"]
        expires = int(fresh.cookies[COOKIE].split(".")[1])
        assert 290 < expires - time.time() <= 300
    alone = gateway_factory(secret_key=None)
    with httpx.Client(base_url=alone.url, cookies={COOKIE: token}) as other:
        assert other.get("/ui/services").status_code == 303  # not its secret
        assert "has no <code>ARBITER_SECRET_KEY</code>" in other.get("/ui/sign-in").text
    with closing(ui_sign_in(alone.url, stack.admin_key)) as own:
        assert own.get("/ui/services").status_code == 200


def test_the_cookie_is_secure_behind_a_trusted_https_proxy_only(
        stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:  # stack first: its backend stops last
    """X-Forwarded-Proto counts from ARBITER_FORWARDED_ALLOW_IPS (loopback by default), never from anyone."""
    untrusting = gateway_factory(forwarded_allow_ips="10.9.9.9")
    for gateway, trusted in ((stack.gateway, True), (untrusting, False)):
        with httpx.Client(base_url=gateway.url, headers={"X-Forwarded-Proto": "https"}) as client:
            form = client.get("/ui/sign-in")
            nonce = set_cookie(form, SIGNIN_COOKIE)
            # httpx keeps a Secure cookie for https: carried by hand, as the browser behind the proxy would.
            answer = client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": stack.admin_key},
                                 headers={"Cookie": nonce.split(";")[0]})
            assert answer.status_code == 303, answer.text
            for cookie in (nonce, set_cookie(answer, COOKIE)):
                attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
                assert ("secure" in attributes) is trusted, (gateway.url, cookie)


def set_cookie(response: httpx.Response, name: str) -> str:
    return next(v for v in response.headers.get_list("set-cookie") if v.startswith(f"{name}="))
