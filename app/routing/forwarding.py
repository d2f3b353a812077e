"""The forwarding core: the one failover rule (SPEC §4) of every request sent to a model's
replicas, decisions and chat alike.

A forwarding path (``Forwarding``: app/decisions/forward.py, app/chat/forward.py) makes one
attempt on one replica in its own way (a decision is read whole, a chat answer streams; their
spans differ), and says what came of it:

- it returns the answer: the request is done (a backend's own 4xx too: it is about the request,
  and another replica would say the same);
- ``TryAnother(error)``: the replica failed to answer (no connection, a timeout, a broken
  connection): it is taken out for the router's back-off and another replica is tried;
- ``TryAnother(error, take_out=False)``: the replica cannot take this request but is not sick
  (it rejected Arbiter's credential, it serves no decisions): another is tried, it stays in;
- ``FaultAnswer(answer)``: the replica's own 502/503/504: taken out; when another replica will
  be tried, the path holds the answer (``Forwarding.hold``) and another is tried, otherwise it
  goes back as it came;
- any other ArbiterError is about the answer itself (over the response cap, not JSON): another
  replica would do no better, so the request stops at once.

When no replica answers, the latest held 502/503/504 goes back as it came (a backend's own
answer beats a generic error of ours), else the last replica's error, else the router's 503
(none could be tried). An error leaves with the labels of the replica it came from
(``served_by``) and the seconds waited on every attempt's backend (``backend_seconds``).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, TypeVar

from app.errors import ArbiterError, BackendFailed, UpstreamAuthFailed
from app.routing.registry import Registry, Replica
from app.routing.router import ReplicaRouter
from infra_adapters.base import (
    BackendError,
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    ReplyTooLarge,
)

# One cell: the seconds a request has waited on backends so far, over all its attempts, whether
# they answered or failed (the gateway's overhead is the rest). A list: ~25 ns a request, where
# an object with an __init__ cost ~250 ns on the hot path.
Waited = list[float]
FAULT_STATUSES = frozenset({502, 503, 504})  # a replica's own answers that take it out
log = logging.getLogger("arbiter.forwarding")

A = TypeVar("A")


class TryAnother(Exception):
    """This replica gives no answer to this request; another replica may."""

    def __init__(self, error: ArbiterError, *, take_out: bool = True) -> None:
        super().__init__(error.message)
        self.error = error  # the caller's error when no replica answers
        self.take_out = take_out  # False: this replica is not sick, it stays in


class FaultAnswer(Exception):
    """A replica's own 502/503/504 answer: it is taken out, and its answer is the one that goes
    back when no other replica answers."""

    def __init__(self, answer: Any) -> None:
        super().__init__(f"HTTP {answer.status}")
        self.answer = answer


class Forwarding(Protocol[A]):
    """How one forwarding path makes its attempts; ``A`` is its answer."""

    async def attempt(self, model: str, replica: Replica, forwarded: dict[str, Any],
                      options: CallOptions, waited: Waited) -> A:
        """``forwarded`` sent to ``replica``, its wait added to ``waited[0]``; the answer, or the
        verdict raised (``TryAnother``, ``FaultAnswer``, an ArbiterError that stops)."""

    async def hold(self, answer: A, waited: Waited) -> A | None:
        """A ``FaultAnswer``'s answer kept while another replica is tried, or None when it cannot
        be kept (it broke off while read)."""


async def failover(path: Forwarding[A], router: ReplicaRouter, replicas: list[Replica], model: str,
                   body: dict[str, Any], options: CallOptions, waited: Waited) -> A:
    """``body`` sent to the replicas ``router`` picks, in turn, until one answers (the rule above).
    Each replica gets it with ``model`` set to its own name for the model."""
    attempts = router.attempts(replicas)
    failed: ArbiterError | None = None
    held: A | None = None
    for replica in attempts:
        forwarded = dict(body)
        forwarded["model"] = replica.backend_name
        try:
            return await path.attempt(model, replica, forwarded, options, waited)
        except TryAnother as verdict:
            if verdict.take_out:
                router.take_out(replica)
            verdict.error.served_by = replica.tried_at
            failed = verdict.error
        except FaultAnswer as fault:
            router.take_out(replica)
            if not attempts.another():
                return fault.answer  # the last replica's: as it came
            held = await path.hold(fault.answer, waited) or held
        except ArbiterError as stop:
            stop.served_by = replica.tried_at
            stop.backend_seconds = waited[0]
            raise
    if held is not None:
        return held
    error = failed if failed is not None else attempts.none_left(model)
    error.backend_seconds = waited[0]
    raise error


def failure_verdict(model: str, replica: Replica, exc: BackendError, max_reply_bytes: int) -> Exception:
    """What a backend's failure to answer means: an answer over the response cap is about the
    answer (the request stops: another replica would send as much), any other failure is about
    the replica (``TryAnother``)."""
    error = backend_failure(model, replica, exc, max_reply_bytes)
    if isinstance(exc, ReplyTooLarge):
        return error
    error.__cause__ = exc  # raised after the loop, out of this except: it still says what happened
    return TryAnother(error)


def backend_failure(model: str, replica: Replica, exc: BackendError, max_reply_bytes: int) -> BackendFailed:
    """What a backend's failure to answer is for the caller (SPEC §1): 504 when it did not answer
    within the model's timeout, 502 when it could not be reached, broke the connection, or
    answered past the response cap. All but the last take the replica out (SPEC §4)."""
    if isinstance(exc, BackendTimeout):
        return BackendFailed(504, f"model '{model}' did not answer within {replica.timeout:g}s")
    if isinstance(exc, ReplyTooLarge):
        return BackendFailed(502, f"model '{model}' answered more than the {max_reply_bytes}-byte response cap")
    if isinstance(exc, BackendUnreachable):
        return BackendFailed(502, f"the backend of model '{model}' could not be reached")
    return BackendFailed(502, f"the backend of model '{model}' broke the connection")


def credential_refused(registry: Registry, replica: Replica, status: int) -> TryAnother:
    """A replica refused Arbiter's own credential (decisions and chat alike): logged for the
    operator, noted on the service's status, and another replica tried; this one stays in (its
    other models' keys may be fine). The caller gets a 500 ``upstream_auth_error`` if none answers."""
    log.error("service %s rejected Arbiter's credential (HTTP %s)", replica.service_name, status)
    registry.note_credential_rejected(replica)
    return TryAnother(UpstreamAuthFailed(rejected_credential(replica)), take_out=False)


def rejected_credential(replica: Replica) -> str:
    """The message of a replica's refusal of Arbiter's own credential: what an admin must fix."""
    if replica.service_type == "mesh":
        return (f"mesh node '{replica.service_name}' rejected this node's mesh key; "
                "every node of a mesh needs the same ARBITER_MESH_KEY")
    return f"service '{replica.service_name}' rejected Arbiter's credential; an admin must update the service's key"
