"""What the vLLM emulator serves (`VllmState`) and its OpenAI-style errors."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .answers import count_tokens
from .faults import Faults
from .recording import RecordedRequest, json_response

JSON = "application/json"


def default_model_options() -> dict[str, Any]:
    """Options of one served model; any key may be left out of `VllmState.models`."""
    return {
        "read_strategy": True,  # False: /v1/systemone answers 501
        "max_model_len": 4096,  # a read longer than this is a 400
        "max_options": 26,  # labels A-Z
        "instructions": True,  # False: question instructions are a 400 (fixed-prompt models)
        "media": [],  # which of "images", "audio", "videos" the model takes
        "root": None,  # model path shown by /v1/models (default: the id)
        "task": "generate",  # "generate": chat + decisions; "embed": embeddings only
    }


def default_vllm_models() -> dict[str, dict[str, Any]]:
    return {"Qwen/Qwen3-0.6B": {"read_strategy": True, "max_model_len": 4096}}


@dataclass
class VllmState:
    """Everything the vLLM emulator serves; mutate it from tests at run time."""

    version: str = "0.11.0"
    models: dict[str, dict[str, Any]] = field(default_factory=default_vllm_models)
    faults: Faults = field(default_factory=Faults)
    requests: list[RecordedRequest] = field(default_factory=list)
    required_bearer: str | None = None  # vLLM --api-key
    created: int = field(default_factory=lambda: int(time.time()))
    stream_delay: float = 0.0  # seconds between streamed chat chunks
    label_mass: float = 0.9  # chat with logprobs: the probability on the labels (logprobs_chat)
    label_space_share: float = 0.0  # of each label's probability, the share on its " X" variant
    # --enable-prefix-caching with prompt token details: chat with logprobs reports
    # usage.prompt_tokens_details.cached_tokens (see `cached_tokens`); off: the details are null.
    prefix_caching: bool = False
    read_prompts: dict[str, list[str]] = field(default_factory=dict)  # per cache_salt, prompts read
    openai_decisions: bool = True  # False: a vLLM that predates /v1/decisions (FastAPI's route 404)

    def options(self, model_id: str) -> dict[str, Any]:
        return {**default_model_options(), **self.models.get(model_id, {})}

    def cached_tokens(self, salt: str | None, prompt: str) -> int:
        """The tokens of ``prompt`` found in the prefix cache: its longest common prefix with a
        prompt read before under the same ``cache_salt`` (a salt keeps its own cache)."""
        seen = self.read_prompts.setdefault(salt or "", [])
        shared = max((len(os.path.commonprefix([prompt, old])) for old in seen), default=0)
        seen.append(prompt)
        return count_tokens(prompt[:shared])


STATE_KEY = web.AppKey("vllm_state", VllmState)


class VllmError(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param

    def response(self) -> web.Response:
        return error_response(self.message, self.status, self.err_type, self.param)


def error_response(
    message: str, status: int = 400, err_type: str = "BadRequestError", param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return json_response(body, status=status, content_type=JSON)
