"""Faithful Ollama and vLLM emulators served over real HTTP (tests and `arbiter emulate`)."""

from .faults import Faults
from .ollama import OllamaState, make_ollama_app, run_ollama_emulator
from .recording import RecordedRequest
from .server import EmulatorServer, serve_forever
from .vllm import VllmState, make_vllm_app, run_vllm_emulator

__all__ = [
    "EmulatorServer",
    "Faults",
    "OllamaState",
    "RecordedRequest",
    "VllmState",
    "make_ollama_app",
    "make_vllm_app",
    "run_ollama_emulator",
    "run_vllm_emulator",
    "serve_forever",
]
