"""The forwarding path of a decision: the checks after parsing, the replica, the call,
and what comes back. No database here: the registry and the principal are in memory. The
failover rule over replicas is the forwarding core's (app/routing/forwarding.py); a decision's
attempt reads the answer whole, its usage and warnings, in a CLIENT span of its own."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
)
from app.routing.answers import json_object, token_count, with_model
from app.routing.forwarding import (
    FAULT_STATUSES,
    FaultAnswer,
    TryAnother,
    Waited,
    credential_refused,
    failover,
    failure_verdict,
)
from app.routing.registry import ModelEntry, Registry, Replica
from app.routing.router import ReplicaRouter
from app.routing.strategies import answer_warnings
from app.settings import Settings
from app.telemetry.tracing import Tracing, annotate
from app.tenancy.limits import RateLimiter, limits_of
from app.tenancy.principal import Principal
from app.tenancy.salts import TenantSalts
from infra_adapters.base import BackendError, CallOptions, Reply


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
                 tracing: Tracing | None = None, limiter: RateLimiter | None = None, *,
                 salts: TenantSalts | None = None) -> None:
        self._limiter = limiter
        self._registry = registry
        self._router = router
        self._settings = settings
        self._tracing = tracing or Tracing(None, state=False, state_max_bytes=0)
        self._salts = salts or TenantSalts(settings)  # the app's one, keyed at start-up (salts.py)

    async def admit(self, principal: Principal) -> None:
        """Spend one request from the principal's rate limits (RateLimited, 429, when one is spent).
        The public routes call it before the body is read: nothing that grows with a body is done
        for a caller whose limit is spent (issue #30)."""
        requests, tokens = limits_of(principal)
        if self._limiter is not None and (requests or tokens):
            await self._limiter.admit(requests, tokens)

    def entry_for(self, principal: Principal, model: str) -> ModelEntry:
        """The model a caller named, as this node serves it: 403 when the principal may not use
        it (whether or not it exists), 404 when no node has it. In memory: no parsing, no I/O."""
        target = self._registry.resolve(model)
        principal.authorize(target, model)
        return self._registry.find(target, principal.mesh_hops)

    def check_text(self, entry: ModelEntry, body: dict[str, Any], raw_length: int) -> list[Replica]:
        """The replicas whose text limit the body's text fits (SPEC §1: the body without its media
        fields, as compact JSON; measured only when ``raw_length`` is over the smallest limit), or
        TooLarge (413) when none does."""
        replicas = entry.replicas
        if raw_length <= min(r.text_limit for r in replicas):
            return replicas
        text = len(jsonbody.dumps({k: v for k, v in body.items() if k not in MEDIA_FIELDS}))
        replicas = [r for r in replicas if text <= r.text_limit]
        if not replicas:
            raise TooLarge(f"the request's text is {text} bytes, over the "
                           f"{max(r.text_limit for r in entry.replicas)}-byte limit of "
                           f"model '{entry.public_name}' (media fields do not count; the limit is a "
                           "setting of the service that runs the model)")
        return replicas

    async def decide(self, principal: Principal, body: dict[str, Any], request: DecisionRequest,
                     raw_length: int, headers: dict[str, str], *, only: int | None = None,
                     admitted: bool = False) -> Outcome:
        """Check and forward one decision. ``only`` (a service id) pins the replica (the Test
        action); ``admitted``: the route spent the request from the rate limits already."""
        model = request.model  # the answer's ``model``: the name the caller sent, an alias's too
        entry = self.entry_for(principal, model)
        replicas = self._eligible(entry, self.check_text(entry, body, raw_length), request)
        # A media check, so after 403, 404 and the text limit (SPEC §1's order).
        if request.remote_media and not self._settings.allow_remote_media_urls:
            raise InvalidRequest("remote media URLs are not accepted; send base64 or data: URLs "
                                 "(an admin can allow URLs with ARBITER_ALLOW_REMOTE_MEDIA_URLS)")
        if only is not None:
            replicas = [r for r in replicas if r.service_id == only]
            if not replicas:
                raise NotFound(f"model '{model}' is not served by that service")
        if not admitted and principal.limited:
            await self.admit(principal)
        tokens = limits_of(principal)[1] if principal.limited else None
        options = CallOptions(timeout=0.0, max_reply_bytes=self._settings.max_response_bytes,
                              headers=headers, tenant_salt=self._salts.of_caller(principal),
                              mesh_hops=principal.mesh_hops)
        waited: Waited = [0.0]
        outcome = await failover(self, self._router, replicas, model, body, options, waited)
        outcome.backend_seconds = waited[0]  # every attempt's wait, not only the last one's
        if tokens and self._limiter is not None and outcome.input_tokens is not None:
            await self._limiter.charge(tokens, outcome.input_tokens + (outcome.output_tokens or 0))
        return outcome

    def early_limit(self, principal: Principal, probe: Probe) -> tuple[int, Callable[[int], ArbiterError]]:
        """The text limit a body is held to before it is decoded, and its refusal for a text
        floor over it: its model's limit (413); and when its model is no use (missing, 403, 404),
        the smallest limit of any service here, with that refusal (no body is decoded to be
        refused, and none bigger than every model takes). A body under it is decoded and checked
        in full, in SPEC §1's order."""
        if probe.model is None:
            problem = probe.model_problem()
            return self._smallest_limit(), lambda _floor: problem
        try:
            entry = self.entry_for(principal, probe.model)
        except ArbiterError as error:
            refusal = error
            return self._smallest_limit(), lambda _floor: refusal
        limit = max(r.text_limit for r in entry.replicas)
        return limit, lambda floor: TooLarge(
            f"the request's text is at least {floor} bytes, over the {limit}-byte limit of "
            f"model '{entry.public_name}' (media fields do not count; the limit is a setting of the "
            "service that runs the model)")

    def _smallest_limit(self) -> int:
        return min((r.text_limit for e in self._registry.entries() for r in e.replicas),
                   default=self._settings.default_text_limit)

    def _eligible(self, entry: ModelEntry, replicas: list[Replica], request: DecisionRequest) -> list[Replica]:
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

    async def attempt(self, model: str, replica: Replica, forwarded: dict[str, Any],
                      options: CallOptions, waited: Waited) -> Outcome:
        """One replica's try at the decision (``forwarding.Forwarding``), in its own CLIENT span."""
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
            except TryAnother as verdict:
                annotate(span, error_type=verdict.error.error_type)
                raise
            except FaultAnswer as fault:
                annotate(span, status=fault.answer.status)
                raise
            except ArbiterError as error:
                annotate(span, error_type=error.error_type)
                raise
            if span is not None:
                annotate(span, input_tokens=outcome.input_tokens, output_tokens=outcome.output_tokens,
                         state=self._tracing.state_text(forwarded), status=outcome.status,
                         response_model=replica.backend_name if outcome.status == 200 else None)
            return outcome

    async def hold(self, outcome: Outcome, waited: Waited) -> Outcome:
        """A replica's 502/503/504 kept while another is tried (``forwarding.Forwarding``): a decision's
        answer is read whole already, so it is kept as it is."""
        return outcome

    async def _exchange(self, model: str, replica: Replica, forwarded: dict[str, Any],
                        call: CallOptions, waited: Waited) -> Outcome:
        replica.in_flight += 1
        started = time.perf_counter()
        try:
            reply = await self._send(replica, forwarded, call)
        except BackendError as exc:
            raise failure_verdict(model, replica, exc, call.max_reply_bytes) from exc
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
            raise TryAnother(Unsupported(f"model '{model}' cannot answer decisions: service "
                                         f"'{replica.service_name}' does not serve /v1/systemone "
                                         "(an Ollama older than 0.35.0 or a vLLM without decisions)"),
                             take_out=False)
        if backend.rejected_own_credential(reply):
            raise credential_refused(self._registry, replica, reply.status)
        if reply.status != 200:
            outcome = Outcome(reply.status, reply.content_type or "application/octet-stream",
                              reply.body, replica.provider, waited, retry_after=reply.retry_after,
                              served_by=replica.answered_by)
            if reply.status in FAULT_STATUSES:
                raise FaultAnswer(outcome)
            return outcome
        answer = json_object(reply.body)
        if answer is None:
            raise BackendFailed(502, f"the backend of model '{model}' answered something that is "
                                     "not a JSON object")
        usage = answer.get("usage")
        tokens_in = tokens_out = None
        if isinstance(usage, dict):
            tokens_in = token_count(usage.get("input_tokens"))
            tokens_out = token_count(usage.get("output_tokens"))
        return Outcome(200, "application/json", with_model(reply.body, answer, replica.backend_name, model),
                       replica.provider, waited, tokens_in, tokens_out,
                       warnings=answer_warnings.codes_of(answer), served_by=replica.answered_by)

