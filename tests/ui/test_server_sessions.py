"""Web UI sessions end on the server: a saved cookie stops working after sign-out, after its
admin key is revoked or rotated, and after the idle timeout, on every replica. Sign-ins and
failed sign-ins are audited."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from contextlib import closing

import httpx
from sqlalchemy import select, update

from app.db.models import AuditEntry, UiSessionRow
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI
from app.tenancy.ui_sessions import digest
from app.ui.session import COOKIE
from tests.support import Gateway, Stack
from tests.ui.conftest import csrf_of, ui_sign_in
from tests.ui.test_session import key_id


def saved_session(url: str, key: str) -> tuple[str, str]:
    """The cookie and CSRF token of a fresh sign-in, as an attacker who copied them would hold them."""
    with closing(ui_sign_in(url, key)) as client:
        return client.cookies[COOKIE], csrf_of(client.get("/ui/projects").text)


def replay(url: str, cookie: str, csrf: str, project: str) -> tuple[httpx.Response, httpx.Response]:
    """A page read and a project created with a saved cookie, from a client of its own."""
    with httpx.Client(base_url=url, cookies={COOKIE: cookie}) as client:
        page = client.get("/ui/services")
        made = client.post("/ui/projects", data={"name": project, "scope": "all", "csrf": csrf})
    return page, made


def projects(stack: Stack) -> list[str]:
    with stack.db.session() as session:
        return [p.name for p in tenancy.list_projects(session)]


def refused(answer: httpx.Response) -> bool:
    return answer.status_code == 303 and answer.headers["location"].startswith("/ui/sign-in")


def new_admin_key(stack: Stack, name: str) -> str:
    with stack.db.session() as session:
        return tenancy.create_key(session, KeyHasher(), CLI, kind="admin", name=name)[1]


def test_a_saved_cookie_stops_working_after_sign_out(stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    replica = gateway_factory()  # the same database and secret: another replica
    client = ui_sign_in(stack.gateway.url, stack.admin_key)
    cookie, csrf = client.cookies[COOKIE], csrf_of(client.get("/ui/projects").text)
    page, made = replay(replica.url, cookie, csrf, "before")
    assert page.status_code == 200 and made.status_code == 303 and "before" in projects(stack)
    with closing(client):
        assert client.post("/ui/sign-out", data={"csrf": csrf}).status_code == 303
    for url in (stack.gateway.url, replica.url):
        page, made = replay(url, cookie, csrf, "after")
        assert refused(page) and refused(made), url
    assert "after" not in projects(stack)
    with stack.db.session() as session:
        row = session.get(UiSessionRow, digest(cookie))
        assert row is not None and row.ended_at is not None
        assert session.scalar(select(UiSessionRow.digest).where(UiSessionRow.digest == cookie)) is None


def test_rotating_or_revoking_the_admin_key_ends_its_sessions_at_once(stack: Stack) -> None:
    rotated, revoked = new_admin_key(stack, "rotated"), new_admin_key(stack, "revoked")
    sessions = {name: saved_session(stack.gateway.url, key) for name, key in (("rotated", rotated),
                                                                             ("revoked", revoked))}
    with stack.client("admin") as admin:
        answer = admin.post(f"/admin/keys/{key_id(stack, rotated)}/rotate", json={"grace_seconds": 3600})
        assert answer.status_code == 201, answer.text
        assert admin.post(f"/admin/keys/{key_id(stack, revoked)}/revoke").status_code == 200
    for name, (cookie, csrf) in sessions.items():
        page, made = replay(stack.gateway.url, cookie, csrf, f"by-{name}")
        assert refused(page) and page.headers["location"] == "/ui/sign-in?ended=1", name
        assert refused(made), name
    assert not {"by-rotated", "by-revoked"} & set(projects(stack))
    # The rotated key itself still works through its grace period; only its sessions ended.
    with stack.gateway.client(rotated) as old:
        assert old.get("/admin/projects").status_code == 200
    with closing(ui_sign_in(stack.gateway.url, answer.json()["key"])) as successor:
        assert successor.get("/ui/services").status_code == 200


def test_a_session_ends_after_the_idle_timeout_and_use_keeps_it_alive(
        stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    gateway = gateway_factory(ui_session_idle_minutes=2)
    cookie, _ = saved_session(gateway.url, stack.admin_key)
    now = dt.datetime.now(dt.UTC)

    def last_seen(ago: dt.timedelta | None = None) -> dt.datetime:
        with stack.db.session() as session:
            if ago is not None:
                session.execute(update(UiSessionRow).where(UiSessionRow.digest == digest(cookie))
                                .values(last_seen_at=now - ago))
            row = session.get(UiSessionRow, digest(cookie))
            assert row is not None
            return row.last_seen_at.replace(tzinfo=dt.UTC) if row.last_seen_at.tzinfo is None else row.last_seen_at

    with httpx.Client(base_url=gateway.url, cookies={COOKIE: cookie}) as client:
        recent = last_seen(dt.timedelta(seconds=5))
        assert client.get("/ui/services").status_code == 200
        assert last_seen() == recent  # used just now: not written again
        assert client.get("/ui/services").status_code == 200
        last_seen(dt.timedelta(seconds=100))  # idle for most of the 2 minutes, then used
        assert client.get("/ui/services").status_code == 200
        assert last_seen() > now - dt.timedelta(seconds=5)  # the use was recorded
        last_seen(dt.timedelta(minutes=2, seconds=5))  # idle past the 2 minutes
        answer = client.get("/ui/services")
        assert refused(answer) and answer.headers["location"] == "/ui/sign-in?ended=1"
    with httpx.Client(base_url=gateway.url, cookies={COOKIE: cookie}) as again:
        assert refused(again.get("/ui/services"))  # and it stays ended, whoever sends it


def test_sign_ins_and_failed_sign_ins_are_audited_without_the_key(stack: Stack) -> None:
    wrong = "arb_admin_" + "w" * 43
    with httpx.Client(base_url=stack.gateway.url) as client:
        form = client.get("/ui/sign-in")
        failed = client.post("/ui/sign-in", data={"csrf": csrf_of(form.text), "key": wrong},
                             headers={"X-Request-Id": "my-sign-in"})
        assert failed.status_code == 401
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        csrf = csrf_of(client.get("/ui/services").text)
        assert client.post("/ui/sign-out", data={"csrf": csrf}).status_code == 303
    with stack.db.session() as session:
        entries = list(session.scalars(select(AuditEntry).where(AuditEntry.action.like("ui.%"))
                                       .order_by(AuditEntry.id)))
    assert [e.action for e in entries] == ["ui.sign_in_failed", "ui.sign_in", "ui.sign_out"]
    miss, hit, out = entries
    assert miss.actor == "anonymous@127.0.0.1" and miss.target == "ui"
    assert miss.client_request_id == "my-sign-in" and miss.request_id not in (None, "my-sign-in")
    me = f"admin-key:{key_id(stack, stack.admin_key)}:{stack.admin_key[:14]}"
    assert hit.actor == out.actor == me and hit.target == f"key:{key_id(stack, stack.admin_key)}:{stack.admin_key[:14]}"
    for entry in entries:
        text = f"{entry.actor} {entry.target} {entry.details}"
        assert wrong not in text and wrong[-20:] not in text and stack.admin_key[14:] not in text
