"""A decision whose reading clearly failed is still answered, but says so (issue 20): a label
reading whose ``label_mass`` is under ``ARBITER_LABEL_MASS_WARNING`` carries a ``low_label_mass``
warning in its question's diagnostics, counted in ``arbiter_decision_warnings_total`` and shown
by the model card's Test (the admin API and the web UI's JSON)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from app.db.session import Database
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState
from tests.support import Gateway, Stack, body, decision, synced
from tests.telemetry.test_metrics import scrape
from tests.ui.conftest import csrf_of, ui_sign_in

QWEN = "Qwen/Qwen3-0.6B"
WARNINGS = "arbiter_decision_warnings_total"


def _stack(db: Database, vllm: tuple[EmulatorServer, VllmState], gateway_factory: Callable[..., Gateway],
           **settings: Any) -> Stack:
    server, state = vllm
    built = Stack.provision(db, vllm_url=server.url)
    built.gateway = synced(gateway_factory(**settings))
    built.extra.update(server=server, state=state)
    with built.client("admin") as admin:
        [model] = [m for m in body(admin.get("/admin/models"), 200)["data"] if m["public_name"] == QWEN]
        body(admin.patch(f"/admin/models/{model['id']}", json={"read_strategy": "labels"}), 200)
    built.extra["model_id"] = model["id"]
    return built


@pytest.fixture
def labels_stack(db: Database, vllm: tuple[EmulatorServer, VllmState],
                 gateway_factory: Callable[..., Gateway]) -> Stack:
    """Qwen on the emulated vLLM, read by labels, warning under a label_mass of 0.6."""
    return _stack(db, vllm, gateway_factory, label_mass_warning=0.6)


def _answer(stack: Stack, label_mass: float) -> dict[str, Any]:
    stack.extra["state"].label_mass = label_mass
    with stack.client() as client:
        return body(client.post("/v1/systemone", json=decision(QWEN)), 200)  # type: ignore[no-any-return]


def _warned(stack: Stack) -> float:
    key = (WARNINGS, (("code", "low_label_mass"), ("gen_ai_request_model", QWEN)))
    return scrape(stack).get(key, 0.0)


def test_a_reading_under_the_threshold_is_answered_with_a_warning(labels_stack: Stack) -> None:
    answer = _answer(labels_stack, 0.4)
    assert list(answer["answers"]) == ["team", "urgent", "tone"]  # answered all the same
    for qid, entry in answer["diagnostics"].items():
        [warning] = entry["warnings"]
        assert warning["code"] == "low_label_mass", qid
        assert "0.40" in warning["message"] and "ARBITER_LABEL_MASS_WARNING" in warning["message"]
        assert entry["label_mass"] == pytest.approx(0.4)
    assert set(answer) == {"model", "answers", "usage", "diagnostics"}  # nothing added outside diagnostics
    assert _warned(labels_stack) == 3  # one per question


def test_a_reading_over_the_threshold_has_no_warning_and_counts_none(labels_stack: Stack) -> None:
    answer = _answer(labels_stack, 0.7)
    assert all("warnings" not in entry for entry in answer["diagnostics"].values())
    assert _warned(labels_stack) == 0


def test_no_threshold_no_warning(db: Database, vllm: tuple[EmulatorServer, VllmState],
                                 gateway_factory: Callable[..., Gateway]) -> None:
    stack = _stack(db, vllm, gateway_factory, label_mass_warning=0)
    answer = _answer(stack, 0.01)
    assert all("warnings" not in entry for entry in answer["diagnostics"].values())


def test_the_model_cards_test_shows_the_warning(labels_stack: Stack) -> None:
    labels_stack.extra["state"].label_mass = 0.3
    model_id = labels_stack.extra["model_id"]
    with labels_stack.client("admin") as admin:
        result = body(admin.post(f"/admin/models/{model_id}/test"), 200)
    assert result["ok"] is True and result["choice"] in result["probabilities"]
    [warning] = result["warnings"]
    assert warning["code"] == "low_label_mass" and "0.30" in warning["message"]
    ui = ui_sign_in(labels_stack.gateway.url, labels_stack.admin_key)
    try:  # what the card's script (app/ui/static/arbiter.js) shows
        token = csrf_of(ui.get("/ui/models").text)
        shown = body(ui.post(f"/ui/api/models/{model_id}/test", headers={"X-CSRF-Token": token}), 200)
    finally:
        ui.close()
    assert [w["code"] for w in shown["warnings"]] == ["low_label_mass"]
    assert _warned(labels_stack) == 2  # Tests are counted too (as every Test is in the metrics)

    labels_stack.extra["state"].label_mass = 0.9
    with labels_stack.client("admin") as admin:
        assert body(admin.post(f"/admin/models/{model_id}/test"), 200)["warnings"] == []
