"""Ollama's `/api/pull`: a paced NDJSON progress stream, as `ollama pull` sees it.

    {"status":"pulling manifest"}
    {"status":"pulling <digest12>","digest":"sha256:...","total":N,"completed":k}  x20
    {"status":"verifying sha256 digest"}
    {"status":"writing manifest"}
    {"status":"success"}

The lines are spread over `OllamaState.pull_seconds`, then the stream is silent
for `OllamaState.verify_seconds` after "verifying" (as Ollama is while it checks
a big model's digest). The model joins
`state.models` once the last line is written, before the response ends; a
client that goes away first leaves it uninstalled. While a pull runs, its name
(as requested) is in `state.pulling` (gone by the time the response ends). `state.pull_errors[model]` makes the pull
fail halfway with an `{"error": ...}` line, as Ollama does. An unknown model is
a 200 stream that ends in an error line; with `"stream": false` every outcome is
one JSON body at the end (errors: 500 `{"error": ...}`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from .ollama_state import STATE_KEY, OllamaState, error, model_digest, model_size
from .recording import json_response, parse_json
from .streaming import NDJSON, client_gone, ndjson_line, stream_events

PROGRESS_STEPS = 20
MANIFEST_ERROR = "pull model manifest: file does not exist"


def progress_lines(name: str) -> list[dict[str, Any]]:
    digest = model_digest(name)
    total = model_size(name)
    return [
        {
            "status": f"pulling {digest[:12]}",
            "digest": f"sha256:{digest}",
            "total": total,
            "completed": total * step // PROGRESS_STEPS,
        }
        for step in range(1, PROGRESS_STEPS + 1)
    ]


def _install(state: OllamaState, name: str, library_key: str) -> None:
    if state.find_model(name) is None:
        state.models[name] = list(state.library.get(library_key, []))


async def _streamed(
    request: web.Request, state: OllamaState, name: str, library_key: str
) -> web.StreamResponse:
    failure = state.pull_error(name)
    progress = progress_lines(name)
    if failure is not None:
        progress = progress[: PROGRESS_STEPS // 2]
    # One pause before each progress line and one before "verifying".
    pause = max(0.0, state.pull_seconds) / (PROGRESS_STEPS + 1)
    response = web.StreamResponse(status=200)
    response.headers["Content-Type"] = NDJSON
    await response.prepare(request)
    try:
        await response.write(ndjson_line({"status": "pulling manifest"}))
        for line in progress:
            await asyncio.sleep(pause)
            await response.write(ndjson_line(line))
        await asyncio.sleep(pause)
        if failure is not None:
            await response.write(ndjson_line({"error": failure}))
            state.pulling.discard(name)  # before the client sees the end
            await response.write_eof()
            return response
        await response.write(ndjson_line({"status": "verifying sha256 digest"}))
        await asyncio.sleep(state.verify_seconds)  # Ollama says nothing while it checks the digest
        for status in ("writing manifest", "success"):
            await response.write(ndjson_line({"status": status}))
        if client_gone(request):
            return response
        _install(state, name, library_key)
        state.pulling.discard(name)
        await response.write_eof()
    except ConnectionError:
        pass  # the client went away mid-pull: nothing is installed
    return response


async def _quiet(
    request: web.Request, state: OllamaState, name: str, library_key: str
) -> web.Response:
    failure = state.pull_error(name)
    seconds = max(0.0, state.pull_seconds)
    await asyncio.sleep(seconds / 2 if failure is not None else seconds)
    if failure is not None:
        return error(500, failure)
    if client_gone(request):
        return error(499, "client disconnected")  # nobody reads it
    _install(state, name, library_key)
    return json_response({"status": "success"})


async def handle_pull(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    parsed = parse_json(await request.read())
    payload = parsed if isinstance(parsed, dict) else {}
    name = payload.get("model") or payload.get("name")
    if not isinstance(name, str) or not name:
        return error(400, "model is required")
    streamed = payload.get("stream") is not False
    library_key = state.find_in_library(name)
    if library_key is None:
        if not streamed:
            return error(500, MANIFEST_ERROR)
        lines = [
            ndjson_line({"status": "pulling manifest"}),
            ndjson_line({"error": MANIFEST_ERROR}),
        ]
        return await stream_events(request, lines, content_type=NDJSON)
    state.pulling.add(name)
    try:
        if streamed:
            return await _streamed(request, state, name, library_key)
        return await _quiet(request, state, name, library_key)
    finally:
        state.pulling.discard(name)
