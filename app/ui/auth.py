"""Signing in to the web UI with an admin key, and signing out."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.errors import AuthenticationFailed
from app.tenancy.keys import kind_of
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
    notice = "Your session ended (it expired, or its admin key was revoked); sign in again." if ended else None
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
    if kind_of(key) == "project":
        return _sign_in_page(request, status=401, error="That is a project key: project keys call models and "
                                                         "cannot sign in. Use an admin key (arb_admin_...).")
    try:
        principal = await components(request).keys.authenticate(f"Bearer {key}", "admin")
    except AuthenticationFailed as exc:
        text = {"invalid API key": "That is not a valid admin key."}.get(exc.message, exc.message)
        return _sign_in_page(request, status=401, error=text[:1].upper() + text[1:])
    seconds = components(request).settings.ui_session_minutes * 60
    session = state.signer.issue(principal.key_id, seconds)
    response = redirect(HOME)
    response.set_cookie(COOKIE, session.token, max_age=seconds, path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    response.delete_cookie(SIGNIN_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    admin = await signed_in(request)
    await posted(request, admin)
    response = redirect("/ui/sign-in")
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


def _sign_in_page(request: Request, *, status: int = 200, error: str | None = None,
                  notice: str | None = None) -> Response:
    nonce, token = ui_state(request).signer.signin_pair()
    response = render(request, "sign_in.html", None, status=status, signin_token=token, error=error,
                      notice=notice, shared=ui_state(request).signer.shared)
    response.set_cookie(SIGNIN_COOKIE, nonce, max_age=SIGNIN_SECONDS, path=COOKIE_PATH, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response
