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


BYTES_PER_TOKEN = 4  # a request's tokens when its answer does not say: its bytes over this


class StreamTally:
    """What a chat stream carried so far: its last two chunks (where the usage is) and its events
    counted (``data:`` lines of SSE, lines of NDJSON: one token each, about what a backend sends
    per event). A byte count per chunk, nothing parsed: the end alone is read, once."""

    __slots__ = ("_sse", "events", "last", "previous")

    def __init__(self, *, sse: bool) -> None:
        self._sse = sse
        self.events = 0
        self.previous = self.last = b""

    def add(self, chunk: bytes) -> None:
        if self._sse:
            self.events += chunk.count(b"data:") - chunk.count(b"[DONE]")
        else:
            self.events += chunk.count(b"\n")
        self.previous, self.last = self.last, chunk

    def tokens(self) -> tuple[int | None, int | None]:
        """The usage the stream's end reports; else (a stream cut short, or an OpenAI stream
        without ``stream_options.include_usage``) its events counted as output, input unknown."""
        reported = of_stream_tail(self.previous + self.last)
        if reported != (None, None):
            return reported
        return None, max(0, self.events)


def charged(tokens: tuple[int | None, int | None], request_bytes: int) -> int:
    """The tokens a chat is charged against ``tokens_per_minute``: what its answer reports, the
    input estimated from the request's size where the answer does not say it."""
    tokens_in, tokens_out = tokens
    if tokens_in is None:
        tokens_in = request_bytes // BYTES_PER_TOKEN
    return tokens_in + (tokens_out or 0)
