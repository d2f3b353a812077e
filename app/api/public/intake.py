"""The first steps of every lean public route: the key, then the body under its caps.

When either fails, the error is sent here (with ``Connection: close`` when the body
was not read) and the route gets None.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.api.asgi import Receive, Scope, Send, header_map, send_error
from app.decisions.body import ClientGone, check_length, content_encoding, read_body
from app.decisions.budget import DecodeBudget, Reservation
from app.decisions.multipart import is_multipart
from app.errors import ArbiterError, PermissionDenied
from app.mesh.auth import SCHEME, MeshAuth, MeshCredentialRefused, Refusal, request_target
from app.telemetry.record import RequestRecord
from app.tenancy.keycache import KeyCache
from app.tenancy.principal import Principal

_HEADERS = frozenset({b"authorization", b"content-length", b"content-encoding", b"content-type",
                      b"traceparent", b"tracestate", b"x-arbiter-mesh-body-digest"})
_PROPAGATED = ("traceparent", "tracestate")
# Sends an error in a route's error shape: ``(send, error, close=...)``.
ErrorSender = Callable[..., Awaitable[None]]
# Spends a request from the caller's rate limits, or raises RateLimited (429).
Admission = Callable[[Principal], Awaitable[None]]


@dataclass(slots=True)
class Intake:
    principal: Principal
    raw: bytes  # a decoded body is a bytearray, read as bytes (body.py)
    forward_headers: dict[str, str]  # what goes on to the backend: trace context, request id
    form_type: str | None = None  # a multipart body's Content-Type (decisions/multipart.py)
    grown: Reservation | None = None  # what the body grew to, reserved from the decode budget
    decoded: int = 0  # how much of ``grown`` is the decoded body's own

    def parsed(self) -> None:
        """The body is parsed: its bytes are let go, and what their decoding reserved given back
        (what its images' base64 reserves since stays until the answer has gone)."""
        self.raw = b""
        if self.grown is not None:
            self.grown.give_back(self.decoded)
            self.decoded = 0

    def done(self) -> None:
        """Give back the decode budget this request took (once its answer has gone)."""
        if self.grown is not None:
            self.grown.release()

    def record(self, scope: Scope, operation: str) -> RequestRecord:
        """The record of this request, for metrics, logs and usage; its access line is the
        record's, so the middleware writes none (``recorded``)."""
        scope["state"]["recorded"] = True
        principal = self.principal
        return RequestRecord(scope["state"]["request_id"], operation, scope["path"],
                             project_id=principal.project_id, project=principal.project_name,
                             key_id=principal.key_id, forwarded=principal.kind == "mesh")


async def take(scope: Scope, receive: Receive, send: Send, keys: KeyCache, max_body: int,
               send_error: ErrorSender = send_error, mesh: MeshAuth | None = None,
               admit: Admission | None = None, budget: DecodeBudget | None = None) -> Intake | None:
    """The caller and the body. A tenant sends a project key; a mesh peer forwarding a request
    sends its mesh credential instead (proved on the head; the body, once read, against its signed
    digest). Hop headers a tenant sends are never read: only the signed credential says how many
    hops a request took.

    Cheap before costly (issue #30): after the length and encoding (413, 415: SPEC §1's order),
    an archived project (403) and a spent rate limit (``admit``, called only for a principal with
    limits: 429) are refused on the head, before a byte of the body is read or decoded; a compressed body's
    growth is reserved from ``budget`` as it is decoded (503 when other bodies hold it)."""
    headers = header_map(scope, _HEADERS)
    authorization = headers.get("authorization")
    claim = None
    try:
        if authorization is not None and authorization.startswith(SCHEME):
            if mesh is None:
                raise MeshCredentialRefused(Refusal.NO_MESH,
                                            "this node is not in a mesh (ARBITER_MESH_KEY is not set)")
            claim = await mesh.admit(authorization, scope["method"],
                                     request_target(scope["path"], scope.get("query_string", b"")), headers)
            principal = Principal.mesh_node(claim.node, claim.hops, claim.salt)
        else:
            principal = await keys.authenticate(authorization, "project")
        check_length(headers.get("content-length"), max_body)  # SPEC §1: length, then encoding
        encoding = content_encoding(headers.get("content-encoding"))
        if principal.archived:
            raise PermissionDenied(f"project '{principal.project_name}' is archived")
        if admit is not None and principal.limited:
            await admit(principal)
    except ArbiterError as error:
        await send_error(send, error, close=True)  # the body is unread: do not parse it as a request
        return None
    grown = (budget.reservation(principal.project_id) if budget is not None and encoding != "identity"
             else None)
    try:
        raw = await read_body(receive, encoding, max_body, grown)
        if claim is not None and mesh is not None:
            mesh.verify_body(claim, raw)
    except ClientGone:
        if grown is not None:
            grown.release()
        return None
    except ArbiterError as error:
        if grown is not None:
            grown.release()
        await send_error(send, error, close=True)
        return None
    except BaseException:  # a cancel (the server shutting down): nothing may stay reserved
        if grown is not None:
            grown.release()
        raise
    forward_headers = {name: headers[name] for name in _PROPAGATED if name in headers}
    forward_headers["X-Request-Id"] = scope["state"]["request_id"]
    content_type = headers.get("content-type")  # its first byte only, for a JSON body (~50 ns)
    multipart = content_type is not None and content_type[:1] in "mM" and is_multipart(content_type)
    return Intake(principal, raw, forward_headers, content_type if multipart else None, grown,
                  0 if grown is None else grown.held)
