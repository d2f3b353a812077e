"""What the Ollama emulator serves (`OllamaState`) and helpers its handlers share."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from .faults import Faults
from .recording import RecordedRequest, json_response

GO_404_BODY = b"404 page not found"
GO_404_CONTENT_TYPE = "text/plain; charset=utf-8"


def default_models() -> dict[str, list[str]]:
    return {
        "nimble": ["decision"],
        "clef": ["decision", "vision"],
        "llama3.2": ["completion", "tools"],
    }


def default_library() -> dict[str, list[str]]:
    """Models that `/api/pull` can fetch, with the capabilities they come with."""
    return {
        **default_models(),
        "nimble-v3": ["decision"],
        "tev1": ["decision"],
        "clef-flash": ["decision", "vision"],
        "qwen3:0.6b": ["completion", "tools", "thinking"],
        "nomic-embed-text": ["embedding"],
    }


@dataclass
class OllamaState:
    """Everything the Ollama emulator serves; mutate it from tests at run time."""

    version: str = "0.35.0"
    models: dict[str, list[str]] = field(default_factory=default_models)
    faults: Faults = field(default_factory=Faults)
    requests: list[RecordedRequest] = field(default_factory=list)
    required_bearer: str | None = None  # Ollama Cloud stand-in: 401 without it, on every path
    library: dict[str, list[str]] = field(default_factory=default_library)
    text_limit: int = 65536  # bytes of request text (body without media), else 413
    body_limit: int = 32 * 1024 * 1024  # bytes of body, else 413
    pull_seconds: float = 0.3  # how long one `/api/pull` takes from first line to last
    verify_seconds: float = 0.0  # silence after "verifying sha256 digest" (a big model's digest check)
    pull_errors: dict[str, str] = field(default_factory=dict)  # model -> error line mid-pull
    pulling: set[str] = field(default_factory=set)  # models whose pull is in progress
    stream_delay: float = 0.0  # seconds between streamed chat chunks
    label_mass: float = 0.9  # /v1/chat/completions with logprobs: the probability on the labels

    def find_model(self, name: str) -> str | None:
        """The key in `models` for `name` ("nimble" and "nimble:latest" are one model)."""
        return _find(self.models, name)

    def find_in_library(self, name: str) -> str | None:
        return _find(self.library, name)

    def pull_error(self, name: str) -> str | None:
        key = _find(self.pull_errors, name)
        return None if key is None else self.pull_errors[key]


def _find(mapping: Mapping[str, object], name: str) -> str | None:
    wanted = canonical_name(name)
    for key in list(mapping):
        if canonical_name(key) == wanted:
            return key
    return None


STATE_KEY = web.AppKey("ollama_state", OllamaState)


def canonical_name(name: str) -> str:
    """Ollama's short name with its tag: "nimble" -> "nimble:latest"."""
    name = name.strip()
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def model_digest(name: str) -> str:
    """The (fake, stable) sha256 hex digest of a model's manifest."""
    return hashlib.sha256(canonical_name(name).encode()).hexdigest()


def model_size(name: str) -> int:
    """The model's size in bytes, as `/api/tags` and `/api/pull` report it."""
    return 500_000_000 + int(model_digest(name)[:6], 16) * 100


def error(status: int, message: str) -> web.Response:
    return json_response({"error": message}, status=status)


def go_404() -> web.Response:
    return web.Response(status=404, body=GO_404_BODY, headers={"Content-Type": GO_404_CONTENT_TYPE})
