"""The issue's yardstick: a plain ASGI route under uvicorn forwarding through one aiohttp session.

    python bench/reference.py --port P --backend http://127.0.0.1:B --public nimble --backend-model nimble:latest

Nothing else is on its path: no key, no validation, no metrics, no usage; the body's
``model`` is swapped by a byte replace on the way in and back on the way out (so the
load generator's answer check passes), the backend's status and body pass through.
It runs as its own process, like the gateways, so bench/run.py can put its CPU time
and added latency next to Arbiter's: the figures of a thinnest-possible Python forwarder
on the same machine, in the same run, say how fast the machine is.
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn


def make_app(backend: str, public: str, backend_model: str) -> Any:
    to_backend = (f'"model":"{public}"'.encode(), f'"model":"{backend_model}"'.encode())
    to_client = (to_backend[1], to_backend[0])
    session: aiohttp.ClientSession | None = None

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    if session is not None:
                        await session.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if session is None:  # as many pooled connections as Arbiter's default (ARBITER_BACKEND_POOL_SIZE)
            connector = aiohttp.TCPConnector(limit=256, limit_per_host=256)
            session = aiohttp.ClientSession(connector=connector)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        async with session.post(backend + scope["path"], data=body.replace(*to_backend, 1),
                                headers={"Content-Type": "application/json"}) as response:
            answer = (await response.read()).replace(*to_client, 1)
            status = response.status
            content_type = response.headers.get("Content-Type", "application/json").encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--public", required=True)
    parser.add_argument("--backend-model", required=True)
    args = parser.parse_args()
    uvicorn.run(make_app(args.backend.rstrip("/"), args.public, args.backend_model), host="127.0.0.1",
                port=args.port, loop="uvloop", http="httptools", lifespan="on", access_log=False,
                log_level="warning")


if __name__ == "__main__":
    main()
