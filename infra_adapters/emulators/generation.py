"""Deterministic chat replies and embeddings shared by the Ollama and vLLM emulators.

A reply is `"Echo: " + the first 40 characters of the last user message`,
streamed in up to `REPLY_PIECES` pieces. An embedding is a unit-length vector
of `EMBEDDING_DIM` floats, a hashed bag of the text's words (each lower-cased word adds
+1 or -1 at two places that sha256 of the word picks), so texts that share words are
similar and a decision by similarity means something; a text without words gets a
vector from sha256 of the whole text. A test computes what any backend returns for a
text with `embedding_vector(text)`.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from datetime import UTC, datetime
from typing import Any

from .answers import count_tokens, text_of

REPLY_PREFIX = "Echo: "
REPLY_CHARS = 40
REPLY_PIECES = 5
EMBEDDING_DIM = 256
WORD = re.compile(r"\w+")
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators of the chat template


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or OpenAI's list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str))
    return "" if content is None else text_of(content)


def last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return message_text(message.get("content"))
    return ""


def reply_text(messages: list[Any]) -> str:
    """The whole assistant reply to `messages`."""
    return REPLY_PREFIX + last_user_text(messages)[:REPLY_CHARS]


def split_pieces(text: str, pieces: int = REPLY_PIECES) -> list[str]:
    """`text` cut into at most `pieces` non-empty consecutive parts ("" -> [])."""
    if not text:
        return []
    size = math.ceil(len(text) / min(pieces, len(text)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def reply_pieces(messages: list[Any], max_pieces: int | None = None) -> tuple[list[str], bool]:
    """The reply's pieces (one piece counts as one generated token) and whether
    `max_pieces` cut it short (finish reason "length")."""
    pieces = split_pieces(reply_text(messages))
    if max_pieces is not None and 0 <= max_pieces < len(pieces):
        return pieces[:max_pieces], True
    return pieces, False


def prompt_tokens(messages: list[Any]) -> int:
    total = 0
    for message in messages:
        if isinstance(message, dict):
            total += count_tokens(message_text(message.get("content")))
        total += MESSAGE_OVERHEAD_TOKENS
    return total


def embedding_vector(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """A deterministic unit-length vector for `text`: a hashed bag of its words."""
    values = [0.0] * dim
    for word in WORD.findall(text.lower()):
        digest = hashlib.sha256(word.encode()).digest()
        for at in (0, 4):
            index = int.from_bytes(digest[at:at + 2], "big") % dim
            values[index] += 1.0 if digest[at + 2] & 1 else -1.0
    if not any(values):
        return _hashed_vector(text, dim)
    norm = math.sqrt(math.fsum(v * v for v in values))
    return [v / norm for v in values]


def _hashed_vector(text: str, dim: int) -> list[float]:
    """A unit-length vector from sha256 of the whole text (a text without words)."""
    raw = b""
    counter = 0
    while len(raw) < 2 * dim:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    values = [(n / 32767.5) - 1.0 for n in struct.unpack(f">{dim}H", raw[: 2 * dim])]
    norm = math.sqrt(math.fsum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embedding_base64(vector: list[float]) -> str:
    """OpenAI's `encoding_format: "base64"`: little-endian float32s, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embedding_inputs(value: Any) -> list[str] | None:
    """The texts of an embeddings `input` (a string or a list of strings), else None."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def created_at() -> str:
    """Now as Ollama writes it: RFC 3339 with nanoseconds, UTC ("...Z")."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond:06d}000Z"


def fake_durations(prompt_count: int, eval_count: int) -> dict[str, int]:
    """Ollama's `*_duration` fields (nanoseconds), plausible and deterministic."""
    prompt_ns = 2_000_000 + prompt_count * 150_000
    eval_ns = eval_count * 12_000_000
    load_ns = 15_000_000
    return {
        "total_duration": load_ns + prompt_ns + eval_ns,
        "load_duration": load_ns,
        "prompt_eval_duration": prompt_ns,
        "eval_duration": eval_ns,
    }
