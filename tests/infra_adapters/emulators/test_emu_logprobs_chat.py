"""The vLLM emulator's chat with logprobs: the first token's logprobs in vLLM 0.33's shape
(chat_completion/serving.py `_create_chat_logprobs`), gathered as vllm/v1/sample/sampler.py does."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from infra_adapters.emulators.answers import count_tokens, distribution
from infra_adapters.emulators.logprobs_chat import FILLERS, FLOOR, VOCAB_SIZE, token_id
from infra_adapters.emulators.vllm import VllmState

MODEL = "Qwen/Qwen3-0.6B"
PROMPT = "My card was charged twice.\n\nWhich team?\nOptions:\nA: billing\nB: shipping\nC: security\n" \
         "Answer with one label only: A, B, C."
ABC = [token_id("A"), token_id("B"), token_id("C")]


def _read(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 1, "logprobs": True, "top_logprobs": 20,
            "messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Answer:"}],
            "continue_final_message": True, "add_generation_prompt": False, **extra}


def _first(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    first: dict[str, Any] = choice["logprobs"]["content"][0]
    return first


def _probs() -> list[float]:
    return distribution(PROMPT, "choice", None, ["A", "B", "C"]).probs


def test_label_logprobs_follow_the_prompt_distribution(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.label_mass = 0.8
    resp = vllm_client.post("/v1/chat/completions", json=_read())
    first = _first(resp)
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert len(first["top_logprobs"]) == 20  # exactly top_logprobs entries
    assert all(set(e) == {"token", "logprob", "bytes"} for e in first["top_logprobs"])
    top = {e["token"]: e["logprob"] for e in first["top_logprobs"]}
    for label, p in zip("ABC", _probs()):
        assert math.exp(top[label]) == pytest.approx(0.8 * p)
    for filler in FILLERS:
        assert math.exp(top[filler]) == pytest.approx(0.2 / len(FILLERS))
    ranked = [e["logprob"] for e in first["top_logprobs"]]
    assert ranked == sorted(ranked, reverse=True)
    assert ranked[-1] == FLOOR  # the rest of the vocabulary has no probability
    assert first["top_logprobs"][0] == {k: first[k] for k in ("token", "logprob", "bytes")}  # sampled first
    assert first["bytes"] == list(first["token"].encode())
    message = resp.json()["choices"][0]["message"]
    assert message["content"] == first["token"]
    assert "reasoning" in message and "reasoning_content" not in message


def test_top_logprobs_zero_reports_no_alternatives(vllm_client: httpx.Client) -> None:
    assert _first(vllm_client.post("/v1/chat/completions", json=_read(top_logprobs=0)))["top_logprobs"] == []
    assert len(_first(vllm_client.post("/v1/chat/completions", json=_read(top_logprobs=2)))["top_logprobs"]) == 2


def test_logprob_token_ids_are_the_sampled_token_and_exactly_those_ids(vllm_client: httpx.Client,
                                                                        vllm: VllmState) -> None:
    vllm.label_space_share = 0.5
    spaced = [token_id(" A"), token_id(" B"), token_id(" C")]
    first = _first(vllm_client.post("/v1/chat/completions",
                                    json=_read(top_logprobs=1, logprob_token_ids=[*spaced, *ABC],
                                               allowed_token_ids=ABC)))
    assert "logprob_token_ids" not in first and "token_id" not in first["top_logprobs"][0]
    assert first["token"] in ("A", "B", "C")  # allowed_token_ids masks the generated token
    # sampler.py prefers logprob_token_ids over top-k: the sampled token, then every id asked for
    tokens = [e["token"] for e in first["top_logprobs"]]
    assert tokens == [first["token"], *[t for t in (" A", " B", " C", "A", "B", "C") if t != first["token"]]]
    by_token = {e["token"]: e["logprob"] for e in first["top_logprobs"]}
    for label, p in zip("ABC", _probs()):  # raw_logprobs: before the mask
        assert math.exp(by_token[label]) == pytest.approx(0.9 * 0.5 * p)
        assert math.exp(by_token[" " + label]) == pytest.approx(0.9 * 0.5 * p)
    unknown = _first(vllm_client.post("/v1/chat/completions", json=_read(logprob_token_ids=[7])))
    assert [e["logprob"] for e in unknown["top_logprobs"]][1:] == [FLOOR]


def test_raw_logprobs_are_before_the_mask(vllm_client: httpx.Client, vllm: VllmState) -> None:
    probs = _probs()
    worst = min(range(3), key=lambda i: probs[i])
    label = "ABC"[worst]
    first = _first(vllm_client.post("/v1/chat/completions",
                                    json=_read(top_logprobs=3, allowed_token_ids=[ABC[worst]])))
    assert first["token"] == label
    assert math.exp(first["logprob"]) == pytest.approx(0.9 * probs[worst])
    # the sampled token first, then the unmasked top-k, cut to top_logprobs entries
    assert first["top_logprobs"][0]["token"] == label and len(first["top_logprobs"]) == 3
    best = max(range(3), key=lambda i: probs[i])
    assert first["top_logprobs"][1]["token"] == "ABC"[best]


def test_processed_logprobs_are_after_the_mask_and_temperature(vllm_client: httpx.Client, vllm: VllmState) -> None:
    vllm.logprobs_mode = "processed_logprobs"
    probs = _probs()
    only = _first(vllm_client.post("/v1/chat/completions",
                                   json=_read(temperature=0, top_logprobs=3, allowed_token_ids=[ABC[0]])))
    assert (only["token"], only["logprob"]) == ("A", 0.0)
    assert [e["logprob"] for e in only["top_logprobs"]] == [0.0, FLOOR, FLOOR]
    greedy = _first(vllm_client.post("/v1/chat/completions",
                                     json=_read(temperature=0, logprob_token_ids=ABC, allowed_token_ids=ABC)))
    by_token = {e["token"]: e["logprob"] for e in greedy["top_logprobs"]}
    assert [math.exp(by_token[t]) for t in "ABC"] == pytest.approx(probs)  # renormalized over the labels
    sampled = _first(vllm_client.post("/v1/chat/completions",
                                      json=_read(temperature=2.0, logprob_token_ids=ABC, allowed_token_ids=ABC)))
    by_token = {e["token"]: e["logprob"] for e in sampled["top_logprobs"]}
    roots = [math.sqrt(p) for p in probs]
    assert [math.exp(by_token[t]) for t in "ABC"] == pytest.approx([r / sum(roots) for r in roots])


def test_tokens_as_token_ids(vllm_client: httpx.Client, vllm: VllmState) -> None:
    first = _first(vllm_client.post("/v1/chat/completions",
                                    json=_read(top_logprobs=2, return_tokens_as_token_ids=True)))
    sampled = first["top_logprobs"][0]["token"]
    assert first["token"] == sampled and sampled.startswith("token_id:")
    # chat_completion/serving.py: the position's bytes are the decoded token's, its entries' the spelling's
    decoded = {token_id(t): t for t in ("A", "B", "C", *FILLERS)}[int(sampled.split(":")[1])]
    assert first["bytes"] == list(decoded.encode())
    assert all(e["bytes"] == list(e["token"].encode()) for e in first["top_logprobs"])
    vllm.return_tokens_as_token_ids = True  # --return-tokens-as-token-ids
    assert _first(vllm_client.post("/v1/chat/completions", json=_read()))["token"].startswith("token_id:")
    plain = _first(vllm_client.post("/v1/chat/completions", json=_read(return_tokens_as_token_ids=False)))
    assert not plain["token"].startswith("token_id:")  # the request's own setting wins


def _refused(resp: httpx.Response, message: str, param: str | None = None) -> None:
    assert resp.status_code == 400, resp.text
    assert resp.json() == {"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}}


def test_refusals(vllm_client: httpx.Client) -> None:
    post = lambda **extra: vllm_client.post("/v1/chat/completions", json=_read(**extra))
    _refused(post(top_logprobs=21),
             "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)",
             "logprobs")
    assert post(top_logprobs=50, logprob_token_ids=ABC).status_code == 200  # logprobs unset with token ids
    _refused(post(logprobs=False), "when using `top_logprobs`, `logprobs` must be set to true. "
             "(parameter=top_logprobs)", "top_logprobs")
    _refused(post(logprobs=None, top_logprobs=0, logprob_token_ids=ABC),
             "when using `logprob_token_ids`, `logprobs` must be set to true. (parameter=logprob_token_ids)",
             "logprob_token_ids")
    _refused(post(top_logprobs=-2), "`top_logprobs` must be a positive value or -1. (parameter=top_logprobs, "
             "value=-2)", "top_logprobs")
    _refused(post(add_generation_prompt=True),
             "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    body = _read()
    del body["add_generation_prompt"]  # the default True reaches the chat template, which refuses it
    resp = vllm_client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("continue_final_message and add_generation_prompt are not "
                                                      "compatible.")
    _refused(post(allowed_token_ids=[]), "allowed_token_ids is not None and empty! (parameter=allowed_token_ids, "
             "value=[])", "allowed_token_ids")
    _refused(post(logprob_token_ids=[-1, VOCAB_SIZE]),
             f"token_id(s) [-1, {VOCAB_SIZE}] in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: "
             f"{VOCAB_SIZE} (parameter=logprob_token_ids, value=[-1, {VOCAB_SIZE}])", "logprob_token_ids")


def test_plain_chat(vllm_client: httpx.Client) -> None:
    plain = vllm_client.post("/v1/chat/completions", json={"model": MODEL, "top_logprobs": 0, "messages": [
        {"role": "user", "content": "hello"}]}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_prefix_cache_hits_are_reported_per_cache_salt(vllm_client: httpx.Client, vllm: VllmState) -> None:
    def usage(**extra: Any) -> Any:
        resp = vllm_client.post("/v1/chat/completions", json=_read(**extra))
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]

    def details(cached: int, prompt: int) -> dict[str, Any]:
        return {"cached_tokens": cached, "created_cache_tokens": prompt - cached, "multimodal_tokens": None}

    first = usage()
    assert first["prompt_tokens_details"] is None  # no prefix caching: no details, as vLLM
    assert first["completion_tokens_details"] is None
    vllm.prefix_caching = True
    whole = count_tokens(PROMPT + "Answer:")
    prompt = first["prompt_tokens"]
    assert usage(cache_salt="a")["prompt_tokens_details"] == details(0, prompt)
    assert usage(cache_salt="a")["prompt_tokens_details"] == details(whole, prompt)
    assert usage(cache_salt="b")["prompt_tokens_details"] == details(0, prompt)  # a salt keeps its own cache
    other = _read(cache_salt="a")
    other["messages"][0]["content"] = PROMPT.replace("Which team?", "Which queue?")
    resp = vllm_client.post("/v1/chat/completions", json=other)
    shared = count_tokens("My card was charged twice.\n\nWhich ")  # the common prefix
    assert resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == shared


@pytest.mark.parametrize(("prompt", "qtype", "labels"), [
    ("s\n\nQuestion: Which team?\nA: billing - refunds\nB: shipping\nAnswer with the letter of one option only.",
     "choice", ["A", "B"]),
    ("s\n\nyes: money is moving\nno\nAnswer with yes or no only.", "noul", ["yes", "no"]),
    ("s\n\n0: calm\n1: annoyed\n2: furious\nAnswer with the number of one level only.", "score", ["0", "1", "2"]),
])
def test_vllms_own_label_questions_are_read(vllm_client: httpx.Client, prompt: str, qtype: str,
                                            labels: list[str]) -> None:
    # question_types.py writes these prompts; the emulator's model answers them with their labels
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 20,
            "messages": [{"role": "user", "content": prompt}]}
    top = {e["token"]: e["logprob"]
           for e in _first(vllm_client.post("/v1/chat/completions", json=body))["top_logprobs"]}
    for label, p in zip(labels, distribution(prompt, qtype, None, labels).probs):
        assert math.exp(top[label]) == pytest.approx(0.9 * p)
