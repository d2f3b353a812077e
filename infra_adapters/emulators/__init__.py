"""Faithful Ollama and vLLM emulators served over real HTTP (tests and `arbiter emulate`)."""

from .faults import Faults
from .generation import embedding_vector, reply_text
from .ollama import OllamaState, make_ollama_app, ollama_cloud_state, run_ollama_emulator
from .recording import RecordedRequest
from .server import EmulatorServer, serve_forever
from .vllm import VllmState, make_vllm_app, run_vllm_emulator

__all__ = [
    "EmulatorServer",
    "Faults",
    "OllamaState",
    "RecordedRequest",
    "VllmState",
    "embedding_vector",
    "make_ollama_app",
    "make_vllm_app",
    "ollama_cloud_state",
    "reply_text",
    "run_ollama_emulator",
    "run_vllm_emulator",
    "serve_forever",
]
