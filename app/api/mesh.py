"""The mesh's own endpoints: the introduction that opens a link, and the model-list exchange
(signed with the mesh key, proved on the head before the body is read)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect

from app.api.deps import components
from app.api.errors import error_response
from app.errors import ArbiterError, TooLarge
from app.mesh.auth import request_target
from app.mesh.hello import HELLO_PATH, hello_answer
from app.mesh.node import MAX_EXCHANGE_BYTES
from app.mesh.protocol import EXCHANGE_PATH

router = APIRouter(include_in_schema=False)
log = logging.getLogger("arbiter.mesh")


@router.get(HELLO_PATH)
async def hello(request: Request) -> Response:
    status, answer, headers = hello_answer(components(request).mesh.auth, request.query_params.get("nonce"))
    return Response(answer, status_code=status, media_type="application/json", headers=headers)


@router.post(EXCHANGE_PATH)
async def exchange(request: Request) -> Response:
    mesh = components(request).mesh
    address = request.client.host if request.client else None
    try:  # no byte of the body is read before the credential is proved
        claim = await mesh.admit(request.headers, request_target(request.scope["path"],
                                                                 request.scope.get("query_string", b"")), address)
    except ArbiterError as error:
        return error_response(error)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_EXCHANGE_BYTES:
                raise TooLarge(f"a model list is at most {MAX_EXCHANGE_BYTES} bytes")
    except ClientDisconnect:  # the peer went away mid-list: nobody is left to answer
        log.info("mesh peer at %s went away in the middle of its model list", address)
        return Response(status_code=400)
    status, answer, headers = await mesh.receive(claim, bytes(body), address)
    return Response(answer, status_code=status, media_type="application/json", headers=headers)
