"""What every web UI page shares: the signed-in admin, forms and CSRF, rendering, errors.

Pages are server-rendered (Jinja2, autoescaped) forms that POST and redirect; a failed form is
rendered again with its error next to it. ``UiRoute`` turns whatever a handler raises into a
page (or, under /ui/api, a JSON error): never a stack trace.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import DataError, IntegrityError, SQLAlchemyError

from app.components import Components
from app.errors import ArbiterError, InvalidRequest, NotFound, TooLarge
from app.mesh.nonces import DatabaseNonces
from app.tenancy import roles, ui_sessions
from app.tenancy import service as tenancy
from app.tenancy.principal import Principal
from app.tenancy.service import Actor
from app.ui.session import COOKIE, COOKIE_PATH, CSRF_FIELD, CSRF_HEADER, SessionSigner, UiSession
from app.ui.shelf import SPENT_SECONDS, KeyShelf

log = logging.getLogger("arbiter.ui")
M = TypeVar("M", bound=BaseModel)
N = TypeVar("N", int, float)
R = TypeVar("R", bound="Row")
# Failures of a change that are shown next to its form: bad input, a backend away, a lost race.
FORM_ERRORS = (ArbiterError, IntegrityError, DataError)
HERE = Path(__file__).resolve().parent
MAX_FORM_BYTES = 256 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                                "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class SignInRequired(Exception):
    """No valid session: pages redirect to the sign-in form, /ui/api answers 401."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason or "sign in")
        self.reason = reason


class CsrfFailed(Exception):
    """A POST without the session's CSRF token."""


class UiState:
    """Per app: the session signer and the template environment."""

    def __init__(self, components: Components) -> None:
        secret = components.settings.secret_key
        self.signer = SessionSigner(secret.get_secret_value() if secret else None)
        self.new_keys = KeyShelf(DatabaseNonces(components.database, SPENT_SECONDS), getattr(components, "redis", None),
                                 secret.get_secret_value() if secret else None)
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=select_autoescape(default=True, default_for_string=True),
                                     trim_blocks=True, lstrip_blocks=True)
        self.templates.filters["when"] = when
        self.templates.filters["number"] = number


def components(request: Request) -> Components:
    return request.app.state.components  # type: ignore[no-any-return]


def ui_state(request: Request) -> UiState:
    state = getattr(request.app.state, "ui", None)
    if state is None:
        state = request.app.state.ui = UiState(components(request))
    return state  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Admin:
    """The signed-in admin of a UI request."""

    session: UiSession
    key_id: int
    key_prefix: str
    actor: Actor
    csrf: str
    principal: Principal | None = None  # its role: what the pages offer (app/ui/roles.py checks it)

    def can(self, need: str, project: str | None = None) -> bool:
        """Whether this admin's role allows ``need`` (a roles.Need value), for the templates."""
        return self.principal is not None and roles.allows(self.principal, roles.Need(need), project)


async def signed_in(request: Request) -> Admin:
    """The request's admin, after checking the cookie's signature and expiry, that its session is
    live in the database (app/tenancy/ui_sessions.py), and that the admin key is still usable (a
    revoked or expired key ends the session)."""
    state = ui_state(request)
    session = state.signer.verify(request.cookies.get(COOKIE))
    if session is None:
        expired = COOKIE in request.cookies
        raise SignInRequired("Your session has expired; sign in again." if expired else None)
    c = components(request)
    idle = dt.timedelta(minutes=c.settings.ui_session_idle_minutes)
    ended, principal = await c.in_session(lambda s: (ui_sessions.check(s, session.token, session.key_id, idle),
                                                      tenancy.principal_by_id(s, session.key_id)))
    if principal is None or principal.kind != "admin" or not principal.usable(dt.datetime.now(dt.UTC)):
        raise SignInRequired(ui_sessions.KEY_GONE.reason)
    if ended is not None:  # signed out, idle, past its age, or its key rotated: on every replica
        raise SignInRequired(ended.reason)
    request_id = request.scope.get("state", {}).get("request_id")
    return Admin(session, principal.key_id, principal.key_prefix, Actor(principal.actor, request_id),
                 state.signer.csrf(session), principal)


class Form:
    """An url-encoded form body."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def get(self, name: str, default: str = "") -> str:
        return next((v for k, v in self._pairs if k == name), default).strip()

    def getlist(self, name: str) -> list[str]:
        return [v.strip() for k, v in self._pairs if k == name and v.strip()]

    def has(self, name: str) -> bool:
        return any(k == name for k, _ in self._pairs)

    def values(self) -> dict[str, str]:
        """Every field once (for filling a form in again), never the CSRF token."""
        return {k: v for k, v in self._pairs if k != CSRF_FIELD}


async def read_form(request: Request) -> Form:
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise TooLarge(f"the form is larger than {MAX_FORM_BYTES // 1024} KiB")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    return Form(parse_qsl(text, keep_blank_values=True, max_num_fields=1000))


async def posted(request: Request, admin: Admin) -> Form:
    """The form of a POST, after its CSRF token is checked."""
    form = await read_form(request)
    if not ui_state(request).signer.csrf_ok(admin.session, form.get(CSRF_FIELD)):
        raise CsrfFailed()
    return form


def validated(schema: type[M], data: dict[str, Any]) -> M:
    """A form's fields checked by the admin API's own request schema (the same rules)."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = " ".join(str(part).replace("_", " ") for part in first.get("loc", ())).capitalize()
        text = str(first.get("msg", "invalid value"))
        raise InvalidRequest(f"{where}: {text}" if where else text) from exc


def whole(form: Form, name: str, label: str) -> int | None:
    """An optional whole-number field: None when blank."""
    return _number(form, name, label, int, "a whole number")


def decimal(form: Form, name: str, label: str) -> float | None:
    """An optional number field: None when blank."""
    return _number(form, name, label, float, "a number")


def _number(form: Form, name: str, label: str, kind: type[N], what: str) -> N | None:
    raw = form.get(name)
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise InvalidRequest(f"{label} must be {what}, not {raw[:40]!r}") from None


def drop_blank(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields that were filled in: a blank one (None) is left out of a schema's input."""
    return {k: v for k, v in fields.items() if v is not None}


class Row(Protocol):
    """A database row as the pages see it: something with an id."""

    @property
    def id(self) -> int: ...


def by_id(rows: Iterable[R], row_id: int, missing: str) -> R:
    """The row with id ``row_id`` (an id from a page's URL or form); NotFound(missing) if it is gone."""
    found = next((row for row in rows if row.id == row_id), None)
    if found is None:
        raise NotFound(missing)
    return found


MESH_WARNING = "mesh_warning"
_API_HINT = re.compile(r"\s*Send the request again with \"confirm\": true to install anyway\.")


def mesh_check(c: Components, capabilities: list[str]) -> None:
    """The mesh's check before a decision model comes (as the admin API runs it): a 409
    ``mesh_warning`` when a known peer is too old for it. Nothing without a mesh."""
    check = getattr(getattr(c, "mesh", None), "check_decision_install", None)
    if check is not None:
        check(capabilities)


def mesh_guard(c: Components, confirmed: bool) -> Callable[[list[str]], None] | None:
    """The guard for a change that may bring a decision model; none once the admin confirmed."""
    return None if confirmed else (lambda capabilities: mesh_check(c, capabilities))


def is_mesh_warning(error: Exception) -> bool:
    return isinstance(error, ArbiterError) and error.error_type == MESH_WARNING


def mesh_warning(error: Exception, action: str, button: str, cancel: str, fields: dict[str, str], *,
                 lists: dict[str, list[str]] | None = None, secret: str = "") -> dict[str, Any]:
    """The "Warning from the mesh" panel (macros.html mesh_warning): the reason without the API's
    hint, and a form that sends ``fields`` again to ``action`` with confirm=true. ``secret`` names a
    field that is never sent back: the panel asks for it again."""
    text = _API_HINT.sub("", error.message if isinstance(error, ArbiterError) else str(error))
    return {"message": text, "action": action, "button": button, "cancel": cancel,
            "fields": {k: v for k, v in fields.items() if k not in ("confirm", secret, *(lists or {}))},
            "lists": lists or {}, "secret": secret}


def check_csrf_header(request: Request, admin: Admin) -> None:
    if not ui_state(request).signer.csrf_ok(admin.session, request.headers.get(CSRF_HEADER)):
        raise CsrfFailed()


def render(request: Request, template: str, admin: Admin | None, *, status: int = 200,
           **context: Any) -> HTMLResponse:
    """A page. Its ``errors`` (form id -> reason, each shown beside its form by ``ui.error``) are
    also summed up at the top of the page (base.html), unless the page gives its own ``summary``."""
    page = ui_state(request).templates.get_template(template)
    context.setdefault("summary", error_summary(context.get("errors") or {}))
    html = page.render(admin=admin, csrf=admin.csrf if admin else None, path=request.url.path, **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def error_summary(errors: Mapping[str, str], targets: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """What failed, for the summary at the top of a page (macros.html's ``error_summary``): the id
    of each reason beside its form (``ui.error``'s ``<id>-error``) and its text. ``errors`` is keyed
    by the id given to ``ui.error``; ``targets`` maps a key to that id where they differ."""
    targets = targets or {}
    return [(f"{targets.get(form, form)}-error", text) for form, text in errors.items() if text]


def redirect(url: str) -> RedirectResponse:
    """After a successful POST: see the result with a GET (post/redirect/get)."""
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def message(error: Exception) -> str:
    """What to show next to a form for a failed change."""
    if isinstance(error, ArbiterError):
        return error.message
    if isinstance(error, IntegrityError):
        return "That name is taken; it was created by another request just now."
    if isinstance(error, DataError):
        return "A value cannot be stored (control characters such as NUL are not allowed)."
    return "The database is unavailable; try again shortly."


class UiRoute(APIRoute):
    """Turns every failure of a UI handler into a page (or /ui/api JSON), with the security
    headers, and never a stack trace."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            api = request.url.path.startswith("/ui/api/")
            try:
                response = await handler(request)
            except SignInRequired as exc:
                if api:
                    return _json(401, "sign in to the web UI first", "authentication_error")
                target = "/ui/sign-in" + ("?ended=1" if exc.reason else "")
                response = redirect(target)
                if exc.reason:
                    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
                return response
            except CsrfFailed:
                if api:
                    return _json(403, "missing or wrong X-CSRF-Token header; reload the page", "permission_error")
                return await _failure(request, 403, "This form has expired or did not come from this page",
                                "The form's security token is missing or wrong, so nothing was changed. "
                                "Go back, reload the page and try again.")
            except RequestValidationError:
                if api:
                    return _json(404, "no such item", "not_found_error")
                return await _failure(request, 404, "Not found", "There is nothing at this address.")
            except ArbiterError as exc:
                if api:
                    return _json(exc.status, exc.message, exc.error_type)
                return await _failure(request, exc.status, "That did not work", message(exc))
            except SQLAlchemyError as exc:
                log.error("database error in the web UI: %s", type(exc).__name__)
                status = 400 if isinstance(exc, IntegrityError | DataError) else 503
                if api:
                    return _json(status, message(exc), "backend_error")
                return await _failure(request, status, "That did not work", message(exc))
            except Exception:
                log.exception("unexpected error in the web UI")
                if api:
                    return _json(500, "internal error; the request id is in X-Request-Id", "internal_error")
                return await _failure(request, 500, "Something went wrong",
                                "Arbiter hit an internal error; nothing is shown here on purpose. "
                                "The request id below is in the server's logs.")
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return guarded


def _json(status: int, text: str, error_type: str) -> JSONResponse:
    return JSONResponse({"error": text, "detail": {"error_type": error_type, "message": text}},
                        status_code=status, headers=SECURITY_HEADERS)


async def _failure(request: Request, status: int, title: str, text: str) -> HTMLResponse:
    request_id = request.scope.get("state", {}).get("request_id")
    return render(request, "error.html", await admin_if_any(request), status=status, title=title, text=text,
                  request_id=request_id)


async def admin_if_any(request: Request) -> Admin | None:
    """The signed-in admin, for an error page's navigation; None when there is none (or the lookup
    fails too: an error page must not fail)."""
    try:
        return await signed_in(request)
    except Exception:  # noqa: BLE001 - whatever it is, the page is shown without the navigation
        return None


def when(value: Any) -> str:
    """An ISO time as ``2024-05-01 12:34 UTC``; empty for none."""
    if not value:
        return ""
    try:
        if isinstance(value, int | float):
            moment = dt.datetime.fromtimestamp(value, dt.UTC)
        else:
            moment = dt.datetime.fromisoformat(str(value))
    except (ValueError, OverflowError, OSError):
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: Any) -> str:
    try:
        return f"{int(value):,}".replace(",", "\u202f")
    except (TypeError, ValueError):
        return str(value)
