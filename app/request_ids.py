"""A request's ids: the one the caller sees, and Arbiter's own.

A caller may name its request (``X-Request-Id``): that name is echoed on the answer, forwarded
to the backend and put on log lines, so the caller can find its request. It is the caller's
choice, though, and so no evidence: the audit log records Arbiter's own id for every request,
and the caller's beside it (``client_request_id``). ``CallerRequestId`` is the caller's id as a
string that also carries Arbiter's own, so every path that hands the request id on (an
``Actor``, a refusal) brings both to the audit log without a second argument.
"""

from __future__ import annotations

from typing import Self


class CallerRequestId(str):
    """The caller's ``X-Request-Id`` (this string), with Arbiter's own id in ``own``."""

    own: str

    def __new__(cls, caller: str, own: str) -> Self:
        made = super().__new__(cls, caller)
        made.own = own
        return made


def ids_of(request_id: str | None) -> tuple[str | None, str | None]:
    """(Arbiter's own id, the caller's id or None) of a request id as the scope holds it."""
    if isinstance(request_id, CallerRequestId):
        return request_id.own, str(request_id)
    return request_id, None
