"""The mesh's own endpoint: peers exchange model lists here (signed with the mesh key)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.deps import components
from app.errors import TooLarge
from app.mesh.node import MAX_EXCHANGE_BYTES
from app.mesh.protocol import EXCHANGE_PATH

router = APIRouter(include_in_schema=False)


@router.post(EXCHANGE_PATH)
async def exchange(request: Request) -> Response:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_EXCHANGE_BYTES:
            raise TooLarge(f"a model list is at most {MAX_EXCHANGE_BYTES} bytes")
    status, answer, headers = components(request).mesh.receive(
        request.headers.get("authorization"), bytes(body), request.client.host if request.client else None)
    return Response(answer, status_code=status, media_type="application/json", headers=headers)
