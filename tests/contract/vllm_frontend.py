"""vLLM 0.33's real OpenAI-compatible server with only its engine (and its model's weights) stubbed.

Run with the contract virtualenv's Python (``scripts/bootstrap-contract``), never imported by the
Arbiter suite::

    .venv-contract/bin/python tests/contract/vllm_frontend.py --port 8123 [any `vllm serve` flag]
        [--stub-architecture LlamaForCausalLM]   # a model without a decisions read strategy

What is vLLM's own, unchanged: the argument parser and its defaults (``make_arg_parser``), the
engine configuration (``EngineArgs.create_engine_config``: architecture, max_model_len,
logprobs_mode), the renderer and tokenizer wrapper (``renderer_from_config``), the FastAPI app with
every router, exception handler and middleware (``build_app``), the serving classes
(``init_app_state``: chat completions, ``/tokenize``, ``/v1/systemone``, ``/v1/decisions`` with
NextTokenStrategy), and uvicorn as vLLM starts it (``build_and_serve``), as
``vllm/entrypoints/launchers/api_server/entry.py`` runs them.

What is ours: the model directory (a Qwen3 config, so vLLM picks ``NextTokenStrategy``; a small
byte-level BPE tokenizer trained here, with a ChatML template that turns thinking off as Qwen3's
does: no weights, no download) and ``StubEngine``, which stands in for ``AsyncLLM``. The stub's
"model" gives every prompt a fixed pseudo-random logit vector (a hash of the prompt's token ids);
its sampler follows ``vllm/v1/sample/sampler.py``: raw logprobs before the ``allowed_token_ids``
mask (``raw_logprobs``) or after it (``processed_logprobs``), greedy at temperature 0, the sampled
token first, then ``logprob_token_ids`` when asked (preferred over top-k), else the top
``logprobs``; tokens decoded with vLLM's own ``convert_ids_list_to_tokens``.

``/version`` and ``/v1/models`` are vLLM's own routes too (the models' list from
``OpenAIServingModels``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from collections.abc import AsyncGenerator, Iterable
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no GPU here: vLLM's CPU platform
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB_SIZE = 600
# The tokenizer learns its merges from this text: the words of the prompts vLLM and Arbiter write,
# so that "yes", "no" and the labels A-Z, 0-9 come out as single tokens, as in real tokenizers.
CORPUS = [
    "yes no yes no Yes No Answer with yes or no only. Answer with the letter of one option only.",
    "Answer with the number of one level only. Question: Which team? Is it urgent? How upset?",
    "My card was charged twice. billing shipping refund urgent calm annoyed furious ticket",
    "assistant user system The state instructions options label true false",
] * 50
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# ChatML as Qwen3 writes it: with enable_thinking false the generation prompt ends in an empty think
# block, and so does the last assistant turn (Qwen3's template writes one before its content).
CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.role == 'assistant' and loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- if m.content is string %}{{- m.content }}{%- else %}"
    "{%- for part in m.content %}{%- if part.type == 'text' %}{{- part.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- if not (loop.last and m.role == 'assistant') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)


# The architectures the harness can pose as: Qwen3 has vLLM's NextTokenStrategy; Llama has no read
# strategy in vLLM 0.33 (strategies.py READ_STRATEGIES), so both decision routes answer 501.
MODEL_TYPES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}


def make_model_dir(path: str, architecture: str = "Qwen3ForCausalLM") -> None:
    """A model directory vLLM's config and tokenizer loaders read: the architecture (Qwen3's by
    default), a trained byte-level BPE tokenizer, the chat template; no weights (the engine is
    stubbed)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE,
                   "model_max_length": 8192}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": [architecture], "model_type": MODEL_TYPES[architecture],
                   "vocab_size": tokenizer.get_vocab_size(), "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                   "head_dim": 32, "max_position_embeddings": 8192, "torch_dtype": "float32",
                   "eos_token_id": tokenizer.token_to_id("<|im_end|>"), "tie_word_embeddings": True}, f)


def logits_for(prompt_ids: Iterable[int], vocab: int) -> list[float]:
    """The stub model: a fixed logit vector per prompt, spread like a real model's (a few tokens
    stand out), the same on every run."""
    seed = hashlib.blake2b(json.dumps(list(prompt_ids)).encode(), digest_size=8).digest()
    import random

    rng = random.Random(seed)
    return [rng.gauss(0.0, 2.5) for _ in range(vocab)]


def log_softmax(values: list[float]) -> list[float]:
    finite = [v for v in values if v != -math.inf]
    top = max(finite)
    total = math.log(math.fsum(math.exp(v - top) for v in finite)) + top
    return [v - total if v != -math.inf else -math.inf for v in values]


class StubEngine:
    """Stands in for ``vllm.v1.engine.async_llm.AsyncLLM`` (the ``EngineClient`` the serving classes
    talk to): vLLM's own config, renderer and input processor; a stub model and sampler."""

    def __init__(self, vllm_config: Any) -> None:
        from vllm.renderers import renderer_from_config
        from vllm.v1.engine.input_processor import InputProcessor

        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer_from_config(vllm_config)
        self.input_processor = InputProcessor(vllm_config, self.renderer)
        self.tokenizer = self.renderer.get_tokenizer()
        self.vocab = len(self.tokenizer)
        self.calls: list[dict[str, Any]] = []

    # -- what the serving classes ask of an engine -------------------------------------------
    is_running = True
    is_stopped = False
    errored = False
    dead_error = RuntimeError("the stub engine does not die")
    should_keep_api_server_alive = False

    def check_admission(self, n: int = 1, request_id: str | None = None) -> None:
        return None

    def get_kv_event_sources(self) -> dict[int, Any]:
        return {}

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    async def is_tracing_enabled(self) -> bool:
        return False

    async def do_log_stats(self) -> None:
        return None

    async def check_health(self) -> None:
        return None

    async def reset_mm_cache(self) -> None:
        return None

    async def abort(self, request_id: Any) -> None:
        return None

    async def get_weight_version(self) -> str:
        return "stub"

    def shutdown(self, timeout: float | None = None) -> None:
        return None

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str,
                       **_: Any) -> AsyncGenerator[Any, None]:
        from vllm.renderers.inputs.preprocess import (
            extract_prompt_components,
            extract_target_prompt,
        )

        prompt_ids = list(extract_prompt_components(self.model_config, prompt).token_ids or ())
        salt = extract_target_prompt(self.model_config, prompt).get("cache_salt")
        yield self._output(request_id, prompt_ids, sampling_params, salt)

    def _output(self, request_id: str, prompt_ids: list[int], params: Any, salt: str | None = None) -> Any:
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens

        logits = logits_for(prompt_ids, self.vocab)
        raw = log_softmax(logits)
        allowed = getattr(params, "allowed_token_ids", None)
        masked = ([v if i in set(allowed) else -math.inf for i, v in enumerate(logits)]
                  if allowed else logits)
        processed = log_softmax(masked)
        # sampler.py: the logprobs reported are the raw ones unless the mode says processed.
        reported = processed if self.model_config.logprobs_mode == "processed_logprobs" else raw
        sampled = max(range(self.vocab), key=lambda i: masked[i])  # greedy (temperature 0 here)
        asked_ids = list(getattr(params, "logprob_token_ids", None) or ())
        top_k = getattr(params, "logprobs", None)
        logprobs = None
        if asked_ids or top_k is not None:
            if asked_ids:  # preferred over top-k when both are asked (sampler.py)
                ids = [sampled, *asked_ids]
            else:
                ranked = sorted(range(self.vocab), key=lambda i: -reported[i])
                ids = [sampled, *ranked[:top_k]] if top_k and top_k > 0 else [sampled]
            texts = convert_ids_list_to_tokens(self.tokenizer, ids)
            position: dict[int, Any] = {}
            for token, text in zip(ids, texts):
                if token not in position:
                    rank = 1 + sum(1 for v in reported if v > reported[token])
                    position[token] = Logprob(logprob=reported[token], rank=rank, decoded_token=text)
            logprobs = [position]
        self.calls.append({"prompt_ids": prompt_ids, "sampled": sampled, "logprob_token_ids": asked_ids,
                           "allowed_token_ids": list(allowed or ()), "cache_salt": salt})
        text = self.tokenizer.decode([sampled])
        output = CompletionOutput(index=0, text=text, token_ids=[sampled], cumulative_logprob=raw[sampled],
                                  logprobs=logprobs, finish_reason="length")
        return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=prompt_ids,
                             prompt_logprobs=None, outputs=[output], finished=True, num_cached_tokens=0)


def _install_stub_calls_route(app: Any, engine: StubEngine) -> None:
    """``GET /stub/calls``: what the engine was asked (the tests read the prompts Arbiter's reader
    made). Not a vLLM route; it lives under its own prefix."""
    from fastapi.responses import JSONResponse

    @app.get("/stub/calls")
    async def calls() -> Any:  # pragma: no cover - served in the contract venv
        return JSONResponse(engine.calls)

    @app.delete("/stub/calls")
    async def clear() -> Any:  # pragma: no cover
        engine.calls.clear()
        return JSONResponse({})


async def serve(argv: list[str]) -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers import app as app_module
    from vllm.entrypoints.launchers.api_server import entry
    from vllm.entrypoints.launchers.launcher import setup_server
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM's server, engine stubbed"))
    model_dir = tempfile.mkdtemp(prefix="vllm-contract-model-")
    architecture = "Qwen3ForCausalLM"
    if "--stub-architecture" in argv:  # ours, not vLLM's: taken out before vLLM's parser
        at = argv.index("--stub-architecture")
        architecture = argv[at + 1]
        argv = argv[:at] + argv[at + 2:]
    make_model_dir(model_dir, architecture)
    args = parser.parse_args(["--model", model_dir, "--enforce-eager", *argv])
    validate_parsed_serve_args(args)
    engine = StubEngine(AsyncEngineArgs.from_cli_args(args).create_engine_config())

    build_app = app_module.build_app

    def build_app_with_stub_routes(*a: Any, **kw: Any) -> Any:
        app = build_app(*a, **kw)
        _install_stub_calls_route(app, engine)
        return app

    entry.build_app = build_app_with_stub_routes  # type: ignore[attr-defined]
    listen_address, sock = setup_server(args, reuse_port=False)
    shutdown = await entry.build_and_serve(engine, listen_address, sock, args)  # type: ignore[arg-type]
    try:
        await shutdown
    finally:
        sock.close()


def main() -> None:
    import uvloop

    uvloop.run(serve(sys.argv[1:]))


if __name__ == "__main__":
    main()
