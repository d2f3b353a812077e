"""POST /v1/chat/completions and POST /api/chat: forwarded to models with `completion`,
streaming passed through chunk by chunk as it arrives (lean ASGI, like /v1/systemone).

A client that hangs up ends its request at once, wherever it is (waiting for the backend's
head, its whole answer, or its next chunk): the backend's connection is closed, so it stops
generating, and the replica's count and the concurrency slot are free again."""

from __future__ import annotations

import asyncio
import logging
import time

from app import jsonbody
from app.api.asgi import Receive, Scope, Send, header_map, send_bytes, send_error, unless_client_leaves
from app.api.public.intake import take
from app.chat import tokens
from app.chat.forward import Answer, ChatForwarder
from app.decisions.budget import DecodeBudget
from app.decisions.offloop import OFF_LOOP_BYTES, OffLoop
from app.errors import ArbiterError, AuthenticationFailed, BackendFailed
from app.mesh.auth import MeshAuth
from app.settings import Settings
from app.telemetry.observer import Observer
from app.telemetry.record import RequestRecord
from app.tenancy.keycache import KeyCache
from app.tenancy.principal import Principal
from app.tenancy.touches import KeyTouches

log = logging.getLogger("arbiter.chat")
PATHS = {"/v1/chat/completions": "openai-chat", "/api/chat": "ollama-chat"}
_AUTHORIZATION = frozenset({b"authorization"})
WATCH_INTERVAL = 1.0  # seconds between two looks at a streaming caller's key (and at once on a change)


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
        intake = await take(scope, receive, send, self.keys, self.max_body, mesh=self.mesh,
                            admit=self.forwarder.admit, budget=self.budget)
        if intake is None:
            return
        principal = intake.principal
        record = intake.record(scope, "chat")
        self.touches.touch(principal.key_id)
        authorization = header_map(scope, _AUTHORIZATION).get("authorization")
        used: list[int] = []  # the tokens to charge, once the answer or stream has ended
        try:
            left = await unless_client_leaves(receive, send, lambda sending: self._serve(
                sending, api, intake.raw, intake.forward_headers, principal, record, authorization, used))
            if left:
                record.status = record.status or 499  # nothing sent yet: nginx's "client closed request"
                record.error_type = record.error_type or "client_closed"
        finally:
            intake.done()
            record.seconds = time.perf_counter() - started
            try:
                if used:  # here, not in _serve: a client gone mid-stream cancelled that
                    await self.forwarder.charge(principal, used[0])
            finally:
                self.observer.finish(record)

    async def _serve(self, send: Send, api: str, raw: bytes, headers: dict[str, str], principal: Principal,
                     record: RequestRecord, authorization: str | None, used: list[int]) -> None:
        try:
            # A big body is decoded off the loop (offloop.py), as a decision's is.
            body = jsonbody.loads(raw) if len(raw) <= OFF_LOOP_BYTES else await self.off_loop.run(jsonbody.loads, raw)
            replicas = self.forwarder.check(principal, body, api)
            record.model = body["model"]  # its request was spent from the rate limits on the head (intake)
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
                if answer.status == 200:  # charged before it is answered: the next request sees it
                    record.input_tokens, record.output_tokens = tokens.of_body(payload)
                    await self.forwarder.charge(principal, tokens.charged(
                        (record.input_tokens, record.output_tokens), len(raw)))
                retry_after = answer.stream.retry_after if answer.status != 200 else None
                await send_bytes(send, answer.status, payload, answer.content_type,
                                 None if retry_after is None else {"Retry-After": retry_after})
                return
            record.status = answer.status
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": [(b"content-type", answer.content_type.encode("latin-1")),
                                    (b"cache-control", b"no-cache")]})
            tally = tokens.StreamTally(sse=api == "openai-chat")
            charged = False
            try:
                complete = await self._stream(send, api, answer, tally, principal, authorization, record)
                record.input_tokens, record.output_tokens = tally.tokens()
                charged = True  # before the stream's end is sent: the next request sees it
                await self.forwarder.charge(principal, tokens.charged(
                    (record.input_tokens, record.output_tokens), len(raw)))
                if complete:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                if not charged:  # cut short by the client leaving: what was counted, charged by __call__
                    record.input_tokens, record.output_tokens = tally.tokens()
                    used.append(tokens.charged((record.input_tokens, record.output_tokens), len(raw)))
        finally:
            record.backend_seconds = answer.waited
            await answer.close()

    async def _stream(self, send: Send, api: str, answer: Answer, tally: tokens.StreamTally,
                      principal: Principal, authorization: str | None, record: RequestRecord) -> bool:
        """The answer's chunks passed on as they arrive, for as long as the caller's key holds: a
        key revoked or a project archived meanwhile ends the stream within ``WATCH_INTERVAL``
        seconds (at once on this replica's key cache being told of a change), with an error event
        in the stream's own dialect. The watch reads the key cache, in memory; the database only
        when the cache was told of a change (one look-up, shared by every stream of the key).
        True when the stream may end as complete (its last chunk is the caller's to send), False
        when the backend broke it off."""
        pump = asyncio.ensure_future(_pump(send, answer, tally))
        watch = asyncio.ensure_future(self._until_revoked(principal, authorization))
        try:
            await asyncio.wait((pump, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not pump.done():
                pump.cancel()
            await asyncio.wait((pump, watch))
        if pump.cancelled():  # the key no longer holds; the backend's connection closes with the answer
            log.info("chat stream of key %d ended: the key was revoked or its project archived", principal.key_id)
            record.error_type = "key_revoked"
            message = "this API key was revoked or expired (or its project archived) while the answer streamed"
            event = (b"data: " + jsonbody.dumps({"error": {"message": message, "type": "authentication_error"}})
                     + b"\n\n" if api == "openai-chat" else jsonbody.dumps({"error": message}) + b"\n")
            await send({"type": "http.response.body", "body": event, "more_body": True})
            return True
        try:
            pump.result()
        except BackendFailed as error:
            # Bytes are out already: the status cannot change. End without the final chunk,
            # so the client sees a broken stream rather than a complete one.
            log.warning("chat stream from %s broke: %s", answer.replica.service_name, error.message)
            return False
        return True

    async def _until_revoked(self, principal: Principal, authorization: str | None) -> None:
        """Return once the key of a running stream no longer holds; a mesh peer's request never
        (its entry node watches the key, and closes this stream by closing its connection)."""
        if principal.kind != "project":
            await asyncio.Event().wait()
        while True:
            await self.keys.changed(WATCH_INTERVAL)
            try:
                current = await self.keys.authenticate(authorization, "project")
            except AuthenticationFailed:
                return
            except BackendFailed:
                continue  # the database is away: the key is not known to be revoked
            if current.archived or current.key_id != principal.key_id:
                return


async def _pump(send: Send, answer: Answer, tally: tokens.StreamTally) -> None:
    async for chunk in answer.chunks():
        tally.add(chunk)  # counted before it goes: a cancel during the send still charges it
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
