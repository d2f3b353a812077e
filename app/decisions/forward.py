"""The forwarding path of a decision: the checks after parsing, the replica, the call,
and what comes back. No database here: the registry and the principal are in memory."""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from app import jsonbody
from app.decisions.schema import MEDIA_FIELDS, DecisionRequest
from app.decisions.textbound import Probe
from app.errors import (
    ArbiterError,
    BackendFailed,
    InvalidRequest,
    NotFound,
    TooLarge,
    Unsupported,
    UpstreamAuthFailed,
)
from app.routing.registry import ModelEntry, Registry, Replica
from app.routing.router import ReplicaRouter
from app.routing.strategies import answer_warnings
from app.settings import Settings
from app.telemetry.tracing import Tracing, annotate
from app.tenancy.limits import RateLimiter, limits_of
from app.tenancy.principal import Principal
from app.tenancy.salts import TenantSalts
from infra_adapters.base import (
    BackendError,
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    Reply,
    ReplyTooLarge,
)

log = logging.getLogger("arbiter.decisions")
# One cell: the seconds a request has waited on backends so far, over all its attempts, whether
# they answered or failed (the gateway's overhead is the rest). A list: ~25 ns a request, where
# an object with an __init__ cost ~250 ns on the hot path.
_Waited = list[float]
_REPLICA_FAULT_STATUSES = frozenset({502, 503, 504})


@dataclass(slots=True)
class Outcome:
    """What goes back to the caller, and what the gateway records about it."""

    status: int
    content_type: str
    body: bytes
    provider: str
    backend_seconds: float
    input_tokens: int | None = None
    output_tokens: int | None = None
    retry_after: str | None = None  # a backend error's own Retry-After
    # The codes of the answer's warnings (app/routing/strategies/answer_warnings.py).
    warnings: tuple[str, ...] = ()
    served_by: tuple[str, str, str] | None = None  # the answering replica's labels (Replica.answered_by)


class Forwarder:
    def __init__(self, registry: Registry, router: ReplicaRouter, settings: Settings,
                 tracing: Tracing | None = None, limiter: RateLimiter | None = None) -> None:
        self._limiter = limiter
        self._registry = registry
        self._router = router
        self._settings = settings
        self._tracing = tracing or Tracing(None, state=False, state_max_bytes=0)
        self._salts = TenantSalts(settings)

    async def decide(self, principal: Principal, body: dict[str, Any], request: DecisionRequest,
                     raw_length: int, headers: dict[str, str], *, only: int | None = None) -> Outcome:
        """Check and forward one decision. ``only`` (a service id) pins the replica (the Test action)."""
        model = request.model  # the answer's ``model``: the name the caller sent, an alias's too
        target = self._registry.resolve(model)
        principal.authorize(target, model)
        entry = self._registry.find(target, principal.mesh_hops)
        replicas = self._eligible(entry, body, request, raw_length)
        # A media check, so after 403, 404 and the text limit (SPEC §1's order).
        if request.remote_media and not self._settings.allow_remote_media_urls:
            raise InvalidRequest("remote media URLs are not accepted; send base64 or data: URLs "
                                 "(an admin can allow URLs with ARBITER_ALLOW_REMOTE_MEDIA_URLS)")
        if only is not None:
            replicas = [r for r in replicas if r.service_id == only]
            if not replicas:
                raise NotFound(f"model '{model}' is not served by that service")
        requests, tokens = limits_of(principal)
        if self._limiter is not None and (requests or tokens):
            await self._limiter.admit(requests, tokens)
        options = CallOptions(timeout=0.0, max_reply_bytes=self._settings.max_response_bytes,
                              headers=headers, tenant_salt=self._salts.of_caller(principal),
                              mesh_hops=principal.mesh_hops)
        waited: _Waited = [0.0]
        try:
            outcome = await self._call(model, replicas, body, options, waited)
        except ArbiterError as error:
            error.backend_seconds = waited[0]
            raise
        outcome.backend_seconds = waited[0]  # every attempt's wait, not only the last one's
        if tokens and self._limiter is not None and outcome.input_tokens is not None:
            await self._limiter.charge(tokens, outcome.input_tokens + (outcome.output_tokens or 0))
        return outcome

    def early_limit(self, principal: Principal, probe: Probe) -> tuple[int, Callable[[int], ArbiterError]]:
        """The text limit a body is held to before it is decoded, and its refusal for a text
        floor over it: its model's limit (413); and when its model is no use (missing, 403, 404),
        every service's limit here, with that refusal (no body that big is decoded to be refused).
        A body under it is decoded and checked in full, in SPEC §1's order."""
        largest = max((r.text_limit for e in self._registry.entries() for r in e.replicas),
                      default=self._settings.default_text_limit)
        if probe.model is None:
            problem = probe.model_problem()
            return largest, lambda _floor: problem
        try:
            target = self._registry.resolve(probe.model)
            principal.authorize(target, probe.model)
            entry = self._registry.find(target, principal.mesh_hops)
        except ArbiterError as error:
            refusal = error
            return largest, lambda _floor: refusal
        limit = max(r.text_limit for r in entry.replicas)
        return limit, lambda floor: TooLarge(
            f"the request's text is at least {floor} bytes, over the {limit}-byte limit of "
            f"model '{entry.public_name}' (media fields do not count)")

    def _eligible(self, entry: ModelEntry, body: dict[str, Any], request: DecisionRequest,
                  raw_length: int) -> list[Replica]:
        replicas = entry.replicas
        smallest = min(r.text_limit for r in replicas)
        if raw_length > smallest:
            text = len(jsonbody.dumps({k: v for k, v in body.items() if k not in MEDIA_FIELDS}))
            replicas = [r for r in replicas if text <= r.text_limit]
            if not replicas:
                raise TooLarge(f"the request's text is {text} bytes, over the "
                               f"{max(r.text_limit for r in entry.replicas)}-byte limit of "
                               f"model '{entry.public_name}' (media fields do not count)")
        for field in request.media:
            needed = MEDIA_FIELDS[field]
            replicas = [r for r in replicas if needed in r.capabilities]
            if not replicas:
                raise InvalidRequest(f"model '{entry.public_name}' does not take {field} "
                                     f"(it has no {needed} capability)")
        deciding = [r for r in replicas if "decision" in r.capabilities]
        if not deciding and all(r.legacy for r in replicas):
            raise Unsupported(f"model '{entry.public_name}' is only on mesh nodes whose version does not "
                              "know decision models; it cannot answer /v1/systemone")
        replicas = deciding
        if not replicas:
            raise InvalidRequest(f"model '{entry.public_name}' is not a decision model; "
                                 "it cannot answer /v1/systemone")
        return replicas

    async def _call(self, model: str, replicas: list[Replica], body: dict[str, Any],
                    options: CallOptions, waited: _Waited) -> Outcome:
        attempts = self._router.attempts(replicas)
        last_error: ArbiterError | None = None
        last_reply: Outcome | None = None
        for replica in attempts:
            try:
                return await self._call_one(model, replica, body, options, waited)
            except _ReplicaFault as fault:
                if fault.backoff:
                    self._router.take_out(replica)
                fault.error.served_by = replica.tried_at
                last_error = fault.error
                last_reply = fault.reply or last_reply
            except ArbiterError as error:  # about this answer (too large, not JSON): no other replica is tried
                error.served_by = replica.tried_at
                raise
        if last_reply is not None:  # a backend's own 5xx beats a generic error of ours
            return last_reply
        if last_error is not None:
            raise last_error
        raise attempts.none_left(model)

    async def _call_one(self, model: str, replica: Replica, body: dict[str, Any],
                        options: CallOptions, waited: _Waited) -> Outcome:
        forwarded = dict(body)
        forwarded["model"] = replica.backend_name
        if not self._tracing.on:  # no span to open or annotate: skip the context manager
            return await self._exchange(model, replica, forwarded, CallOptions(
                replica.timeout, options.max_reply_bytes, options.headers, options.tenant_salt,
                mesh_hops=options.mesh_hops), waited)
        headers = dict(options.headers)
        with self._tracing.client_span("decision", model, replica.provider, replica.backend.url,
                                       headers) as span:
            try:
                outcome = await self._exchange(model, replica, forwarded, CallOptions(
                    replica.timeout, options.max_reply_bytes, headers, options.tenant_salt,
                    mesh_hops=options.mesh_hops), waited)
            except _ReplicaFault as fault:
                annotate(span, error_type=fault.error.error_type if fault.reply is None else None,
                         status=fault.reply.status if fault.reply else None)
                raise
            except ArbiterError as error:
                annotate(span, error_type=error.error_type)
                raise
            if span is not None:
                annotate(span, input_tokens=outcome.input_tokens, output_tokens=outcome.output_tokens,
                         state=self._tracing.state_text(body), status=outcome.status,
                         response_model=replica.backend_name if outcome.status == 200 else None)
            return outcome

    async def _exchange(self, model: str, replica: Replica, forwarded: dict[str, Any],
                        call: CallOptions, waited: _Waited) -> Outcome:
        replica.in_flight += 1
        started = time.perf_counter()
        try:
            reply = await self._send(replica, forwarded, call)
        except BackendError as exc:
            error = backend_failure(model, replica, exc, call.max_reply_bytes)
            if isinstance(exc, ReplyTooLarge):  # about this answer, not the replica
                raise error from exc
            raise _ReplicaFault(error) from exc
        finally:
            replica.in_flight -= 1
            waited[0] += time.perf_counter() - started
        return self._outcome(model, replica, reply, waited[0])

    async def _send(self, replica: Replica, forwarded: dict[str, Any], call: CallOptions) -> Reply:
        """The backend call itself; a subclass may speak another dialect (the OpenAI Decisions API)."""
        return await replica.backend.systemone(forwarded, call)

    def _outcome(self, model: str, replica: Replica, reply: Reply, waited: float) -> Outcome:
        backend = replica.backend
        # Both are about this replica, not the request: another replica may still answer, so
        # they fail over like a connection error (SPEC §1: 405 only when every holder cannot).
        if backend.decisions_unsupported(reply):
            raise _ReplicaFault(Unsupported(f"model '{model}' cannot answer decisions: service "
                                            f"'{replica.service_name}' does not serve /v1/systemone "
                                            "(an Ollama older than 0.35.0 or a vLLM without decisions)"),
                                backoff=False)
        if backend.rejected_own_credential(reply):
            log.error("service %s rejected Arbiter's credential (HTTP %s)", replica.service_name, reply.status)
            self._registry.note_credential_rejected(replica)
            raise _ReplicaFault(UpstreamAuthFailed(rejected_credential(replica)), backoff=False)
        if reply.status != 200:
            outcome = Outcome(reply.status, reply.content_type or "application/octet-stream",
                              reply.body, replica.provider, waited, retry_after=reply.retry_after,
                              served_by=replica.answered_by)
            if reply.status in _REPLICA_FAULT_STATUSES:
                raise _ReplicaFault(BackendFailed(reply.status, "backend failed"), outcome)
            return outcome
        answer = _json_object(reply.body)
        if answer is None:
            raise BackendFailed(502, f"the backend of model '{model}' answered something that is "
                                     "not a JSON object")
        usage = answer.get("usage")
        tokens_in = tokens_out = None
        if isinstance(usage, dict):
            tokens_in = token_count(usage.get("input_tokens"))
            tokens_out = token_count(usage.get("output_tokens"))
        return Outcome(200, "application/json", _with_model(reply.body, answer, replica.backend_name, model),
                       replica.provider, waited, tokens_in, tokens_out,
                       warnings=answer_warnings.codes_of(answer), served_by=replica.answered_by)


class _ReplicaFault(Exception):
    """A failure that takes the replica out for a while (connection, timeout, 502/503/504, no
    decisions there, a rejected credential)."""

    def __init__(self, error: ArbiterError, reply: Outcome | None = None, *, backoff: bool = True) -> None:
        super().__init__(error.message)
        self.error = error
        self.reply = reply
        self.backoff = backoff  # False: try another replica, but this one is not sick


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


def rejected_credential(replica: Replica) -> str:
    if replica.service_type == "mesh":
        return (f"mesh node '{replica.service_name}' rejected this node's mesh key; "
                "every node of a mesh needs the same ARBITER_MESH_KEY")
    return f"service '{replica.service_name}' rejected Arbiter's credential; an admin must update the service's key"


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The answer as read for its usage and ``model`` (orjson: fast; past-64-bit integers may come
    back as floats, which is fine for reading, never for re-encoding: see ``_with_model``)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            value = jsonbody.loads(body)  # what orjson refuses and the strict parser takes
        except ArbiterError:
            return None
    return value if isinstance(value, dict) else None


def rewrite_model(body: bytes, backend_name: str, public_name: str) -> bytes:
    """A JSON object's ``model`` set to the public name; anything else unchanged."""
    answer = _json_object(body)
    return body if answer is None else _with_model(body, answer, backend_name, public_name)


def _with_model(body: bytes, answer: dict[str, Any], backend_name: str, public_name: str) -> bytes:
    """The backend's bytes with ``model`` set to the public name, everything else as it came.

    Spliced into the bytes when the pair can be found there: where it leads the object (Ollama),
    or anywhere else when ``"model": "<backend name>"`` occurs once (a vLLM answer leads with
    ``id``). A JSON string cannot hold an unescaped quote, so such an occurrence is always a real
    member, and the top-level one is among them. Otherwise (the name written with escapes, or the
    same pair nested again, or only nested) the answer is re-encoded from a parse that keeps numbers
    as their text."""
    if backend_name == public_name and answer.get("model") == public_name:
        return body
    public, lead = _model_bytes(backend_name, public_name)
    if answer.get("model") == backend_name:
        stripped = body.lstrip()
        if stripped.startswith(lead):
            return b'{"model":' + public + stripped[len(lead):]
        found = list(_model_pair(backend_name).finditer(body))
        if len(found) == 1:
            value = found[0].span(1)
            spliced = body[:value[0]] + public + body[value[1]:]
            if (_json_object(spliced) or {}).get("model") == public_name:  # it was the top-level one
                return spliced
    try:
        exact = jsonbody.loads(body)
    except ArbiterError:  # a key given twice (orjson kept the last), NaN: what was read will do
        exact = answer
    exact["model"] = public_name
    return jsonbody.dumps(exact)


@functools.lru_cache(maxsize=256)
def _model_bytes(backend_name: str, public_name: str) -> tuple[bytes, bytes]:
    """The public name as JSON, and ``{"model":<backend name>`` as an Ollama answer begins."""
    return orjson.dumps(public_name), b'{"model":' + orjson.dumps(backend_name)


@functools.lru_cache(maxsize=256)
def _model_pair(backend_name: str) -> re.Pattern[bytes]:
    """``"model": "<backend_name>"`` in an answer's bytes; group 1 is the value."""
    return re.compile(rb'"model"[ \t\r\n]*:[ \t\r\n]*(' + re.escape(orjson.dumps(backend_name)) + rb")")


BIGINT_MAX = 2**63 - 1  # the ledger's token columns; past it a count is as good as unknown


def token_count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= BIGINT_MAX else None
