"""The tokens of a chat answer, for the usage ledger: from a whole JSON answer, or from the end of
a stream (only its last chunks are looked at, never every chunk).

OpenAI's chat completions carry ``usage.prompt_tokens`` and ``usage.completion_tokens`` (a stream
only with ``stream_options.include_usage``, in the chunk before ``data: [DONE]``); Ollama's
/api/chat carries ``prompt_eval_count`` and ``eval_count`` in its answer, or on the last line
(``"done": true``) of its NDJSON stream."""

from __future__ import annotations

from typing import Any

from app import jsonbody
from app.routing.answers import token_count

TAIL_BYTES = 8192  # the end of a stream searched for the usage


def of_answer(answer: Any) -> tuple[int | None, int | None]:
    """(input, output) tokens of a decoded answer; None where it does not say."""
    if not isinstance(answer, dict):
        return None, None
    usage = answer.get("usage")
    if isinstance(usage, dict):
        return token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))
    if "eval_count" in answer or "prompt_eval_count" in answer:
        return token_count(answer.get("prompt_eval_count")), token_count(answer.get("eval_count"))
    return None, None


def of_body(body: bytes) -> tuple[int | None, int | None]:
    try:
        return of_answer(jsonbody.loads(body))
    except Exception:  # noqa: BLE001 - not JSON, or not what we expect: tokens unknown
        return None, None


def of_stream_tail(tail: bytes) -> tuple[int | None, int | None]:
    """The last JSON object of a stream's end that says anything about tokens (SSE ``data:`` lines
    or NDJSON lines), searched from the end."""
    for line in reversed(tail[-TAIL_BYTES:].splitlines()):
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if not line.startswith(b"{"):
            continue  # [DONE], an event name, a line cut at the start of the tail
        tokens = of_body(line)
        if tokens != (None, None):
            return tokens
    return None, None
