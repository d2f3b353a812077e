"""Which adapter serves which service type."""

from __future__ import annotations

from app.errors import InvalidRequest
from app.settings import Settings
from infra_adapters.base import Backend
from infra_adapters.ollama import OllamaBackend, OllamaCloudBackend
from infra_adapters.vllm import VllmBackend

SERVICE_TYPES = ("ollama", "ollama-external", "ollama-cloud", "vllm")
_ADAPTERS: dict[str, type[OllamaBackend | VllmBackend]] = {
    "ollama": OllamaBackend, "ollama-external": OllamaBackend, "ollama-cloud": OllamaCloudBackend,
    "vllm": VllmBackend,
}
PROVIDER_NAMES = {"ollama": "ollama", "ollama-external": "ollama", "ollama-cloud": "ollama_cloud",
                  "vllm": "vllm"}


def make_backend(service_type: str, url: str, credential: str | None, settings: Settings) -> Backend:
    adapter = _ADAPTERS.get(service_type)
    if adapter is None:
        raise InvalidRequest(
            f"unknown service type {service_type!r}; use one of: {', '.join(sorted(_ADAPTERS))}")
    return adapter(url, credential=credential, connect_timeout=settings.backend_connect_timeout,
                   admin_timeout=settings.backend_admin_timeout, pool_size=settings.backend_pool_size)
