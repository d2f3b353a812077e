"""Signing in to the web UI with an admin key, and signing out.

A sign-in starts a session in the database (app/tenancy/ui_sessions.py) and is audited; so is
a failed one (as ``anonymous@<address>``, never with the key typed). Failed sign-ins count
against the client address (app/tenancy/throttle.py): past the limit the form answers 429 with
Retry-After before the key is looked up. Sign-out ends the session for every replica.
"""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from app import audit
from app.api.throttle import client_of
from app.errors import AuthenticationFailed
from app.tenancy import ui_sessions
from app.tenancy.keys import kind_of
from app.tenancy.throttle import retry_message
from app.ui.session import COOKIE, COOKIE_PATH, CSRF_FIELD, SIGNIN_COOKIE, SIGNIN_SECONDS
from app.ui.web import (
    SignInRequired,
    UiRoute,
    components,
    posted,
    read_form,
    redirect,
    render,
    signed_in,
    ui_state,
)

router = APIRouter(route_class=UiRoute)
HOME = "/ui/services"


async def home(request: Request) -> Response:
    """/ui: the services page, or the sign-in form first."""
    await signed_in(request)
    return redirect(HOME)


@router.get("/sign-in")
async def sign_in_form(request: Request, ended: int = 0) -> Response:
    try:
        await signed_in(request)
        return redirect(HOME)
    except SignInRequired:
        pass
    notice = ("Your session ended (it expired or went unused, or its admin key was revoked or rotated); "
              "sign in again.") if ended else None
    return _sign_in_page(request, notice=notice)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await read_form(request)
    state = ui_state(request)
    if not state.signer.signin_ok(request.cookies.get(SIGNIN_COOKIE), form.get(CSRF_FIELD)):
        return _sign_in_page(request, status=403,
                             error="This sign-in form has expired or did not come from this page; try again.")
    key = form.get("key")
    if not key:
        return _sign_in_page(request, status=400, error="Enter an admin key (it starts with arb_admin_).")
    c = components(request)
    client = client_of(request.scope)
    wait = await c.throttle.retry_after(client)
    if wait:
        return _sign_in_page(request, status=429, error=retry_message(wait).capitalize() + ".",
                             headers={"Retry-After": str(wait)})
    if kind_of(key) == "project":
        await _failed(request, client, "a project key")
        return _sign_in_page(request, status=401, error="That is a project key: project keys call models and "
                                                         "cannot sign in. Use an admin key (arb_admin_...).")
    try:
        principal = await c.keys.authenticate(f"Bearer {key}", "admin")
    except AuthenticationFailed as exc:
        await _failed(request, client, exc.message)
        text = {"invalid API key": "That is not a valid admin key."}.get(exc.message, exc.message)
        return _sign_in_page(request, status=401, error=text[:1].upper() + text[1:])
    seconds = c.settings.ui_session_minutes * 60
    session = state.signer.issue(principal.key_id, seconds)
    expires = dt.datetime.fromtimestamp(session.expires, dt.UTC)
    request_id = request.scope.get("state", {}).get("request_id")

    def start(s: Session) -> None:
        ui_sessions.start(s, principal.key_id, session.token, expires)
        audit.record(s, actor=principal.actor, action="ui.sign_in", target=f"key:{principal.key_id}:"
                     f"{principal.key_prefix}", request_id=request_id, details={"client": client})

    await c.in_session(start)
    response = redirect(HOME)
    response.set_cookie(COOKIE, session.token, max_age=seconds, path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    response.delete_cookie(SIGNIN_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    admin = await signed_in(request)
    await posted(request, admin)

    def end(s: Session) -> None:
        ui_sessions.end(s, admin.session.token)
        audit.record(s, actor=admin.actor.name, action="ui.sign_out", target=f"key:{admin.key_id}:{admin.key_prefix}",
                     request_id=admin.actor.request_id)

    await components(request).in_session(end)
    response = redirect("/ui/sign-in")
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


async def _failed(request: Request, client: str, reason: str) -> None:
    """A failed sign-in: counted against the address, and audited without the key typed."""
    c = components(request)
    await c.throttle.failed(client)
    request_id = request.scope.get("state", {}).get("request_id")
    await c.in_session(lambda s: audit.record(s, actor=f"anonymous@{client}", action="ui.sign_in_failed",
                                              target="ui", request_id=request_id, details={"reason": reason}))


def _sign_in_page(request: Request, *, status: int = 200, error: str | None = None,
                  notice: str | None = None, headers: dict[str, str] | None = None) -> Response:
    nonce, token = ui_state(request).signer.signin_pair()
    response = render(request, "sign_in.html", None, status=status, signin_token=token, error=error,
                      notice=notice, shared=ui_state(request).signer.shared)
    response.headers.update(headers or {})
    response.set_cookie(SIGNIN_COOKIE, nonce, max_age=SIGNIN_SECONDS, path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response
