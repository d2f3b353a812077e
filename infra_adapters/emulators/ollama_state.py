"""What the Ollama emulator serves (`OllamaState`) and helpers its handlers share."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from aiohttp import web

from .faults import Faults
from .recording import RecordedRequest, json_response

# Ollama's router is gin (server/routes.go GenerateRoutes: `r := gin.Default()` with
# `r.HandleMethodNotAllowed = true`). gin answers an unknown route with 404 "404 page not found"
# and a known route asked with another method with 405 "405 method not allowed" plus an `Allow`
# header naming the methods the path has; both with `Content-Type: text/plain`, no charset
# (gin v1.10.0 gin.go: default404Body, default405Body, serveError, `mimePlain`).
GO_404_BODY = b"404 page not found"
GO_404_CONTENT_TYPE = "text/plain"
GO_405_BODY = b"405 method not allowed"
# gin lists the allowed methods in the order of its method trees, which is the order
# server/routes.go first registers each method in: r.HEAD("/"), r.GET("/"), r.POST, r.DELETE.
GIN_METHOD_ORDER = ("HEAD", "GET", "POST", "DELETE")


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
    show_errors: dict[str, str] = field(default_factory=dict)  # model -> its /api/show is 500 {"error": ...}
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

    def show_error(self, name: str) -> str | None:
        key = _find(self.show_errors, name)
        return None if key is None else self.show_errors[key]


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


def go_405(allowed: Iterable[str]) -> web.Response:
    """gin's 405 for a known path asked with a method it does not take."""
    methods = sorted(set(allowed), key=lambda m: (GIN_METHOD_ORDER.index(m) if m in GIN_METHOD_ORDER
                                                 else len(GIN_METHOD_ORDER), m))
    return web.Response(status=405, body=GO_405_BODY,
                        headers={"Content-Type": GO_404_CONTENT_TYPE, "Allow": ", ".join(methods)})
