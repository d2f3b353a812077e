"""POST /v1/chat/completions and POST /api/chat: forwarded to models with `completion`,
streaming passed through chunk by chunk as it arrives (lean ASGI, like /v1/systemone).

A client that hangs up ends its request at once, wherever it is (waiting for the backend's
head, its whole answer, or its next chunk): the backend's connection is closed, so it stops
generating, and the replica's count and the concurrency slot are free again."""

from __future__ import annotations

import logging
import time

from app import jsonbody
from app.api.asgi import Receive, Scope, Send, send_bytes, send_error, unless_client_leaves
from app.api.public.intake import take
from app.chat import tokens
from app.chat.forward import ChatForwarder
from app.decisions.budget import DecodeBudget
from app.decisions.offloop import OFF_LOOP_BYTES, OffLoop
from app.errors import ArbiterError, BackendFailed
from app.mesh.auth import MeshAuth
from app.settings import Settings
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord
from app.tenancy.keycache import KeyCache
from app.tenancy.principal import Principal
from app.tenancy.touches import KeyTouches

log = logging.getLogger("arbiter.chat")
PATHS = {"/v1/chat/completions": "openai-chat", "/api/chat": "ollama-chat"}


class ChatRoute:
    def __init__(self, keys: KeyCache, forwarder: ChatForwarder, touches: KeyTouches, observer: Observer,
                 settings: Settings, mesh: MeshAuth | None = None, budget: DecodeBudget | None = None,
                 off_loop: OffLoop | None = None) -> None:
        self.mesh = mesh
        self.budget = budget or DecodeBudget(settings.decode_budget_bytes)
        self.off_loop = off_loop or OffLoop()
        self.keys = keys
        self.forwarder = forwarder
        self.touches = touches
        self.observer = observer
        self.max_body = settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        api = PATHS[scope["path"]]
        intake = await take(scope, receive, send, self.keys, self.max_body, mesh=self.mesh, budget=self.budget)
        if intake is None:
            return
        principal = intake.principal
        record = intake.record(scope, "chat")
        self.touches.touch(principal.key_id)
        try:
            left = await unless_client_leaves(receive, send, lambda sending: self._serve(
                sending, api, intake.raw, intake.forward_headers, principal, record))
            if left:
                record.status = record.status or 499  # nothing sent yet: nginx's "client closed request"
                record.error_type = "client_closed"
        finally:
            intake.done()
            record.seconds = time.perf_counter() - started
            self.observer.finish(record)

    async def _serve(self, send: Send, api: str, raw: bytes, headers: dict[str, str], principal: Principal,
                     record: RequestRecord) -> None:
        try:
            # A big body is decoded off the loop (offloop.py), as a decision's is.
            body = jsonbody.loads(raw) if len(raw) <= OFF_LOOP_BYTES else await self.off_loop.run(jsonbody.loads, raw)
            replicas = self.forwarder.check(principal, body, api)
            record.model = body["model"]
            await self.forwarder.admit(principal)
            answer = await self.forwarder.open(replicas, body, api, headers, principal)
        except ArbiterError as error:
            record.status, record.error_type = error.status, error.error_type
            record.backend_seconds, record.served_by = error.backend_seconds, error.served_by
            await send_error(send, error)
            return
        except Exception:
            log.exception("unexpected error in a chat request")
            record.status, record.error_type = 500, "internal_error"
            await send_error(send, ArbiterError("internal error; the request id is in X-Request-Id"))
            return
        record.provider = answer.replica.provider
        record.served_by = answer.replica.answered_by
        try:
            if answer.is_json or answer.status != 200:
                try:
                    payload = await answer.whole()
                except BackendFailed as error:
                    record.status, record.error_type = error.status, error.error_type
                    record.served_by = answer.replica.tried_at  # no answer after all
                    await send_error(send, error)
                    return
                record.status = answer.status
                if answer.status == 200:
                    record.input_tokens, record.output_tokens = tokens.of_body(payload)
                retry_after = answer.stream.retry_after if answer.status != 200 else None
                await send_bytes(send, answer.status, payload, answer.content_type,
                                 None if retry_after is None else {"Retry-After": retry_after})
                return
            record.status = answer.status
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": [(b"content-type", answer.content_type.encode("latin-1")),
                                    (b"cache-control", b"no-cache")]})
            previous = last = b""  # the stream's end, where its usage is (nothing parsed per chunk)
            try:
                async for chunk in answer.chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    previous, last = last, chunk
            except BackendFailed as error:
                # Bytes are out already: the status cannot change. End without the final chunk,
                # so the client sees a broken stream rather than a complete one.
                log.warning("chat stream from %s broke: %s", answer.replica.service_name, error.message)
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            record.input_tokens, record.output_tokens = tokens.of_stream_tail(previous + last)
        finally:
            record.backend_seconds = answer.waited
            await answer.close()
