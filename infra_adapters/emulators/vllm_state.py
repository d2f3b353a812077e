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
from .vllm_validation import ParamError, StructuredDecisionError, sanitize_message

JSON = "application/json"
MAX_QUESTIONS = 64  # DecisionLimits.max_questions of every read strategy (decisions/strategies.py)
DECISION_LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")  # strategies.py LOGPROBS_MODES


def default_model_options() -> dict[str, Any]:
    """Options of one served model; any key may be left out of `VllmState.models`."""
    return {
        "read_strategy": True,  # False: no read strategy, /v1/systemone and /v1/decisions answer 501
        "max_model_len": 4096,  # a read longer than this is a 400
        "max_options": 26,  # at most this many options (labelled models: also at most their labels)
        # False: a fixed-prompt model (vLLM's D3Strategy): the request's top-level `instructions`
        # are a 400, options are scored without labels (up to `max_options`), and its read task is
        # classify, so it serves no /v1/decisions (501).
        "instructions": True,
        "media": [],  # which of "images", "audio", "videos" the model takes
        "root": None,  # model path shown by /v1/models (default: the id)
        "task": "generate",  # "generate": chat + decisions; "embed": embeddings only
    }


def default_vllm_models() -> dict[str, dict[str, Any]]:
    return {"Qwen/Qwen3-0.6B": {"read_strategy": True, "max_model_len": 4096}}


@dataclass
class VllmState:
    """Everything the vLLM emulator serves; mutate it from tests at run time."""

    version: str | None = "0.11.0"  # None: no /version route (another OpenAI-compatible server)
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
    # --return-tokens-as-token-ids: chat logprobs spell tokens "token_id:N" (a request's own
    # `return_tokens_as_token_ids` overrides it).
    return_tokens_as_token_ids: bool = False
    # --logprobs-mode: "raw_logprobs" (vLLM's default; logprobs before allowed_token_ids and
    # temperature), "processed_logprobs" (after them), "raw_logits" / "processed_logits" (logits;
    # structured decisions need a logprobs mode, so both decision APIs answer 501).
    logprobs_mode: str = "raw_logprobs"

    def options(self, model_id: str) -> dict[str, Any]:
        return {**default_model_options(), **self.models.get(model_id, {})}

    def valid_aliases(self) -> str:
        """The served names, as vLLM lists them when a request names another model."""
        return ", ".join(self.models)

    def unknown_model(self, model: Any) -> VllmError:
        """BaseServing._check_model (vllm/entrypoints/serve/engine/serving.py): the 404."""
        return VllmError(f"The model `{model}` does not exist. Valid aliases: {self.valid_aliases()}.",
                         404, "NotFoundError", param="model")

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
        # error_response.py create_error_response: every message is sanitized
        return error_response(sanitize_message(self.message), self.status, self.err_type, self.param)


def error_response(
    message: str, status: int = 400, err_type: str = "BadRequestError", param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return json_response(body, status=status, content_type=JSON)


def decisions_unsupported(opts: dict[str, Any], state: VllmState) -> bool:
    """No read strategy (decisions/state.py `init_decisions_state` gets a ValueError): an
    architecture without one, a pooling model, or a logits mode (strategies.py `select_read_strategy`)."""
    return (not opts["read_strategy"] or opts["task"] == "embed"
            or state.logprobs_mode not in DECISION_LOGPROBS_MODES)


def context_error(qid: str, tokens: int, opts: dict[str, Any]) -> StructuredDecisionError | ParamError | None:
    """A read of `tokens` prompt tokens the model cannot take. A next-token read fails in the engine
    (vllm/v1/engine/input_processor.py `_validate_prompt_len`, a VLLMValidationError with no
    parameter); D3Strategy.read checks it itself (decisions/strategies.py)."""
    limit = int(opts["max_model_len"])
    if not opts["instructions"]:
        if tokens > limit:
            return StructuredDecisionError(f"question {qid!r}: the prompt has {tokens} tokens, more than "
                                           f"max_model_len={limit}; nothing is truncated")
        return None
    if tokens > limit:
        suggestion = ("Make sure that `max_model_len` is no smaller than the number of text tokens plus "
                      "multimodal tokens. For image inputs, the number of image tokens depends on the number "
                      "of images, and possibly their aspect ratios as well." if "images" in opts["media"] else
                      "Make sure that `max_model_len` is no smaller than the number of text tokens.")
        return ParamError(f"The decoder prompt (length {tokens}) is longer than the maximum model length of "
                          f"{limit}. {suggestion}")
    if tokens == limit:
        return ParamError(f"The decoder prompt (length {tokens}) plus the number of requested output tokens "
                          f"(at least 1) is longer than the maximum model length of {limit}. Make sure that "
                          "`max_model_len` is no smaller than the number of text tokens (prompt + requested "
                          "output tokens).")
    return None
