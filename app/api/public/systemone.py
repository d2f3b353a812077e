"""POST /v1/systemone as a lean ASGI route (the hot path): no framework, no database.

Checks run in SPEC §1's order: 401 -> 413/415 -> 400 -> 403 -> 404 -> 413 (text) -> 400 (capability).
A body over 64 KiB whose text floor is over its limit is refused before it is decoded (``parse_big``).
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any, ClassVar

from app import jsonbody
from app.api import asgi
from app.api.asgi import Receive, Scope, Send, send_bytes
from app.api.public.intake import Intake, take
from app.decisions import assets, multipart, schema, textbound
from app.decisions.budget import DecodeBudget
from app.decisions.forward import Forwarder, Outcome
from app.decisions.offloop import OFF_LOOP_BYTES, OffLoop
from app.decisions.schema import DecisionRequest
from app.errors import ArbiterError, InvalidRequest, TooLarge
from app.mesh.auth import MeshAuth
from app.settings import Settings
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord
from app.telemetry.tracing import Tracing, annotate, current_span
from app.tenancy.keycache import KeyCache
from app.tenancy.principal import Principal
from app.tenancy.touches import KeyTouches

DECISION_PATH = "/v1/systemone"

log = logging.getLogger("arbiter.decisions")
# The text of a multipart body is always measured (forward.py): an image's marker can be longer
# than the reference it replaced, so the body's length bounds nothing.
_MEASURED = sys.maxsize


class SystemOneRoute:
    """The decision route. A subclass speaks another dialect of it (``OpenAIDecisionsRoute``) by
    overriding ``send_error``, ``prepare``, ``reply`` and ``logged``."""

    takes_forms: ClassVar[bool] = True  # multipart bodies, as TypeSafe's SDK sends images

    def __init__(self, keys: KeyCache, forwarder: Forwarder, touches: KeyTouches, observer: Observer,
                 tracing: Tracing, settings: Settings, mesh: MeshAuth | None = None,
                 off_loop: OffLoop | None = None, budget: DecodeBudget | None = None) -> None:
        self.mesh = mesh
        self.off_loop = off_loop or OffLoop()
        self.budget = budget or DecodeBudget(settings.decode_budget_bytes)
        self.tracing = tracing
        self.keys = keys
        self.forwarder = forwarder
        self.touches = touches
        self.observer = observer
        self.max_body = settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        intake = await take(scope, receive, send, self.keys, self.max_body, self.send_error, self.mesh,
                            self.forwarder.admit, self.budget)
        if intake is None:
            return
        try:
            await self._serve(scope, send, intake, started)
        finally:
            intake.done()

    async def _serve(self, scope: Scope, send: Send, intake: Intake, started: float) -> None:
        principal = intake.principal
        record = intake.record(scope, "decision")
        body = None
        error: ArbiterError | None = None
        try:
            raw = intake.raw  # a small body is decoded here, on the loop: no extra await on the hot path
            length = len(raw) if intake.form_type is None else _MEASURED
            if len(raw) <= OFF_LOOP_BYTES and intake.form_type is None:
                body = jsonbody.loads(raw)
            else:
                if intake.form_type is None:
                    body = await self.parse_big(principal, raw, record)
                else:
                    body = await self.parse_form(intake, intake.form_type, raw, record)
                del raw  # the body is parsed: its bytes (up to 32 MiB decoded) need not wait for the answer
                intake.parsed()
            request = self.prepare(body, record)
            outcome = await self.forwarder.decide(principal, body, request, length, intake.forward_headers,
                                                  admitted=True)
        except ArbiterError as exc:
            # Its traceback holds this frame, which holds it: a cycle that keeps the body (up to
            # 32 MiB) until a full collection, rare here (app/main.py's GC thresholds).
            error = exc.with_traceback(None)
        except Exception:
            log.exception("unexpected error in a decision request")
            error = ArbiterError("internal error; the request id is in X-Request-Id")
        if error is not None:
            record.status, record.error_type = error.status, error.error_type
            record.backend_seconds = error.backend_seconds  # a backend that failed was waited on too
            record.served_by = error.served_by
        else:
            record.status, record.provider = outcome.status, outcome.provider
            record.backend_seconds, record.served_by = outcome.backend_seconds, outcome.served_by
            record.input_tokens, record.output_tokens = outcome.input_tokens, outcome.output_tokens
            record.warnings = outcome.warnings
            if outcome.status != 200:
                record.error_type = str(outcome.status)
        if self.tracing.on:  # before the answer goes out: the server span ends with it
            annotate(current_span(), input_tokens=record.input_tokens, output_tokens=record.output_tokens,
                     state=self.tracing.state_text(body), error_type=record.error_type)
        durable = self.observer.durable  # ARBITER_USAGE_DURABLE=always: the record on disk before the answer
        try:
            if durable:
                record.seconds = time.perf_counter() - started
                await self.observer.commit(record, self.logged(body))
            if error is not None:
                await self.send_error(send, error)
            else:
                await self.reply(send, outcome)
        finally:
            self.touches.touch(principal.key_id)
            if not durable:
                record.seconds = time.perf_counter() - started
                self.observer.finish(record, self.logged(body))

    async def send_error(self, send: Send, error: ArbiterError, *, close: bool = False) -> None:
        await asgi.send_error(send, error, close=close)

    async def parse_big(self, principal: Principal, raw: bytes, record: RequestRecord) -> Any:
        """A body over OFF_LOOP_BYTES, parsed: measured first and refused undecoded when its text
        cannot pass (textbound.py), then decoded in a worker thread, off the event loop (offloop.py)."""
        await self.refuse_early(principal, raw, record)
        return await self.off_loop.run(jsonbody.loads, raw)

    async def parse_form(self, intake: Intake, form_type: str, raw: bytes, record: RequestRecord) -> Any:
        """A multipart body (SPEC §1): its parts read (multipart.py: views of the body, no copies),
        its ``request`` part parsed as a JSON body is, its images made base64 ``images``
        (assets.py). Cheap before costly (issue #30): the request is checked (400), its model
        (403, 404) and text limit (413) too, the references replaced in one linear pass, and the
        body it will become held to ARBITER_MAX_BODY_BYTES (413) and the decode budget (503), all
        before an image is encoded; big parts are read and encoded off the loop."""
        if not self.takes_forms:
            raise InvalidRequest("multipart bodies are accepted on /v1/systemone only; send JSON")
        principal = intake.principal
        if len(raw) <= OFF_LOOP_BYTES:
            form = multipart.read_form(raw, form_type)
        else:
            form = await self.off_loop.run(multipart.read_form, raw, form_type)
        request = form.request
        body = jsonbody.loads(request) if len(request) <= OFF_LOOP_BYTES else await self.parse_big(
            principal, request, record)
        planned = assets.plan(body, form.files)
        if planned is None:
            return body
        checked = schema.validate(body)  # its 400s first, as for any body (SPEC §1's order)
        record.model = checked.model
        entry = self.forwarder.entry_for(principal, checked.model)
        self.forwarder.check_text(entry, body, len(request))
        if len(request) <= OFF_LOOP_BYTES:
            grown = planned.mark(body)
        else:
            grown = await self.off_loop.run(planned.mark, body)
        # The body as forwarded: the request's text as it grew, and each new image's base64 in
        # quotes with a comma (and the "images" member itself, when the JSON had none).
        size = len(request) + grown + planned.encoded_bytes + 3 * len(planned.sources) + len(',"images":[]')
        if size > self.max_body:
            raise TooLarge(f"the request with its images as base64 is {size} bytes, over the "
                           f"{self.max_body}-byte limit (ARBITER_MAX_BODY_BYTES); send smaller images")
        if planned.encoded_bytes > OFF_LOOP_BYTES:
            # Its base64, and the JSON it is forwarded in: both held until the answer has gone.
            if intake.grown is None:
                intake.grown = self.budget.reservation(principal.project_id)
            intake.grown.take(2 * planned.encoded_bytes)
            await self.off_loop.run(planned.encode, body)
        else:
            planned.encode(body)
        return body

    async def refuse_early(self, principal: Principal, raw: bytes, record: RequestRecord) -> None:
        """Refuse a big body whose text floor is over the limit it is held to (forward.py's
        ``early_limit``), before it is decoded. A body that names its model first and has no media
        is counted at once; any other is probed first (msgspec: which bytes are media)."""
        probe = textbound.leading(raw)
        floor = None
        if probe is not None:
            limit, refusal = self.forwarder.early_limit(principal, probe)
            floor = await self.off_loop.run(functools.partial(textbound.plain_floor, over=limit), raw)
        if probe is None or floor is None:
            probe = await self.off_loop.run(textbound.probe, raw)
            limit, refusal = self.forwarder.early_limit(principal, probe)
            if probe.can_exceed(limit):
                floor = await self.off_loop.run(functools.partial(textbound.text_floor, probe=probe, over=limit),
                                                raw)
        record.model = probe.model
        if floor is not None and floor > limit:
            raise refusal(floor)

    def prepare(self, body: Any, record: RequestRecord) -> DecisionRequest:
        """Validate the parsed body (ValidationFailed, 400) and note the model on the record."""
        request = schema.validate(body)
        record.model = request.model
        return request

    async def reply(self, send: Send, outcome: Outcome) -> None:
        await send_bytes(send, outcome.status, outcome.body, outcome.content_type, passed_on(outcome))

    def logged(self, body: Any) -> Any:
        """What payload logging sees (its ``state``)."""
        return body


def passed_on(outcome: Outcome) -> dict[str, str] | None:
    """The headers of a backend's error that go back with it: its Retry-After (a 429 or 503 of
    its own says when to come back)."""
    return None if outcome.retry_after is None else {"Retry-After": outcome.retry_after}
