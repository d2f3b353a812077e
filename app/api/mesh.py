"""The mesh's own endpoint: peers exchange model lists here (signed with the mesh key)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from starlette.requests import ClientDisconnect

from app.api.deps import components
from app.errors import TooLarge
from app.mesh.node import MAX_EXCHANGE_BYTES
from app.mesh.protocol import EXCHANGE_PATH

router = APIRouter(include_in_schema=False)
log = logging.getLogger("arbiter.mesh")


@router.post(EXCHANGE_PATH)
async def exchange(request: Request) -> Response:
    mesh = components(request).mesh
    address = request.client.host if request.client else None
    authorization = request.headers.get("authorization")
    # The credential's form, time and target are checked before the body is read.
    outcome = mesh.early_refusal(authorization, request.headers.get("content-length"), address)
    if outcome is None:
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_EXCHANGE_BYTES:
                    raise TooLarge(f"a model list is at most {MAX_EXCHANGE_BYTES} bytes")
        except ClientDisconnect:  # the peer went away mid-list: nobody is left to answer
            log.info("mesh peer at %s went away in the middle of its model list", address)
            return Response(status_code=400)
        outcome = await mesh.receive(authorization, bytes(body), address)
    status, answer, headers = outcome
    return Response(answer, status_code=status, media_type="application/json", headers=headers)
