"""TypeSafe's official SDK (``typesafe-sdk``), unchanged, against Arbiter over real HTTP: plain
JSON, its own zstd compression, images as multipart parts, its errors, its default model."""

from __future__ import annotations

import base64
from typing import Any

import httpx2
import pytest
from typesafe_sdk import (
    Choice,
    Image,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafePermissionDeniedError,
)
from typesafe_sdk.constants import DEFAULT_MODEL

from tests.support import Stack, body

# PNG's signature (the SDK labels the part image/png) and bytes that look like a boundary's
# start and line ends, which the multipart parser must keep as data.
PNG = b"\x89PNG\r\n\x1a\n" + b"\r\n--not-a-boundary\r\n" + bytes(range(256))
JPEG = b"\xff\xd8\xff" + bytes(range(255, -1, -1)) * 8


def questions() -> dict[str, Any]:
    return {
        "team": Choice(instructions="Which team?", criteria={"billing": "payments", "shipping": None}),
        "urgent": Noul(instructions="Reply within the hour?", criteria={"true": "money is moving"}),
        "tone": Score(instructions="How upset?", criteria=["calm", "annoyed", "furious"]),
    }


class Wire:
    """The requests the SDK put on the wire (an httpx2 event hook on the client it is given)."""

    def __init__(self) -> None:
        self.requests: list[httpx2.Request] = []

    def client(self) -> httpx2.Client:
        return httpx2.Client(timeout=30, event_hooks={"request": [self.requests.append]})


@pytest.fixture
def wire() -> Wire:
    return Wire()


def sdk(stack: Stack, wire: Wire, key: str | None = None, **options: Any) -> TypeSafeClient:
    options.setdefault("compression", False)
    return TypeSafeClient(api_key=key or stack.project_key, base_url=stack.gateway.url,
                          retry=RetryPolicy(max_retries=0), http_client=wire.client(), **options)


def forwarded(stack: Stack) -> list[dict[str, Any]]:
    return [r.json for r in stack.ollama_state.requests if r.path == "/v1/systemone"]


def test_a_plain_decision(stack: Stack, wire: Wire) -> None:
    with sdk(stack, wire, model="nimble") as client:
        result = client.system_one(state={"ticket": "My card was charged twice."}, questions=questions())
    assert wire.requests[0].headers["content-type"] == "application/json"
    assert result.model == "nimble"
    assert result.choices["team"].choice in {"billing", "shipping"}
    assert 0 <= result.nouls["urgent"].noul <= 1
    assert set(result.scores["tone"].probabilities) == {0, 1, 2}
    assert result.usage.input_tokens
    [sent] = forwarded(stack)
    assert list(sent["questions"]) == ["team", "urgent", "tone"]
    assert sent["state"] == {"ticket": "My card was charged twice."}


def test_a_zstd_compressed_decision(stack: Stack, wire: Wire) -> None:
    ticket = "My card was charged twice, " * 100  # the SDK compresses bodies of 1 KiB or more
    with sdk(stack, wire, model="nimble", compression="zstd") as client:
        result = client.system_one(state=ticket, questions=questions())
    assert wire.requests[0].headers["content-encoding"] == "zstd"
    assert result.choices["team"].choice in {"billing", "shipping"}
    [sent] = forwarded(stack)
    assert sent["state"] == ticket


def test_structured_instructions_and_criteria_reach_the_backend_as_sent(stack: Stack, wire: Wire) -> None:
    structured = {
        "team": Choice(instructions={"task": "route the ticket", "teams": ["billing", "shipping"]},
                       criteria={"billing": {"handles": ["payments", "refunds"]}, "shipping": ["parcels"]}),
        "urgent": Noul(instructions=["Reply within the hour?"], criteria={"true": {"when": "money moves"}}),
        "tone": Score(instructions="How upset?", criteria=[{"level": "calm"}, "annoyed", ["furious"]]),
    }
    with sdk(stack, wire, model="nimble") as client:
        result = client.system_one(state={"ticket": "My card was charged twice."}, questions=structured)
    assert list(result.answers) == ["team", "urgent", "tone"]
    [sent] = forwarded(stack)
    assert sent["questions"]["team"]["instructions"] == {"task": "route the ticket", "teams": ["billing", "shipping"]}
    assert sent["questions"]["team"]["criteria"]["billing"] == {"handles": ["payments", "refunds"]}
    assert sent["questions"]["tone"]["criteria"] == [{"level": "calm"}, "annoyed", ["furious"]]


def test_an_image_reaches_a_vision_model_as_base64(stack: Stack, wire: Wire) -> None:
    photo = Image(PNG)
    with sdk(stack, wire, model="clef") as client, client.attach_assets(photo):
        result = client.system_one(state=f"Product: {photo}",
                                   questions={"damaged": Noul(instructions="Is it damaged?")})
    assert wire.requests[0].headers["content-type"].startswith("multipart/form-data; boundary=")
    assert result.model == "clef" and 0 <= result.nouls["damaged"].noul <= 1
    [sent] = forwarded(stack)
    assert sent["images"] == [base64.b64encode(PNG).decode()]
    assert sent["state"] == "Product: [img-0]"
    assert "assets" not in sent


def test_images_keep_their_order_and_places_under_zstd(stack: Stack, wire: Wire) -> None:
    front, back = Image(PNG), Image(JPEG)
    state = {"photos": [front, back], "note": "Compare the two photos of the parcel. " * 40}
    ask = {"same": Noul(instructions=f"Does {back} show the same parcel as {front}?"),
           "side": Choice(instructions="Which side is torn?",
                          criteria={"front": front, "back": f"as in {back}"})}
    with sdk(stack, wire, model="clef", compression="zstd") as client:
        result = client.system_one(state=state, questions=ask)
    assert wire.requests[0].headers["content-encoding"] == "zstd"  # the whole multipart body
    assert result.choices["side"].choice in {"front", "back"}
    [sent] = forwarded(stack)
    assert sent["images"] == [base64.b64encode(PNG).decode(), base64.b64encode(JPEG).decode()]
    assert sent["state"]["photos"] == ["[img-0]", "[img-1]"]
    assert sent["questions"]["same"]["instructions"] == "Does [img-1] show the same parcel as [img-0]?"
    assert sent["questions"]["side"]["criteria"] == {"front": "[img-0]", "back": "as in [img-1]"}


def test_an_image_for_a_model_without_vision_is_the_sdks_bad_request(stack: Stack, wire: Wire) -> None:
    photo = Image(PNG)
    with sdk(stack, wire, model="nimble") as client, pytest.raises(TypeSafeBadRequestError) as raised:
        client.system_one(state=photo, questions={"damaged": Noul(instructions="Is it damaged?")})
    assert raised.value.status == 400
    assert "vision" in str(raised.value)
    assert not forwarded(stack)


def test_a_model_the_project_may_not_use_is_the_sdks_permission_denied(stack: Stack, wire: Wire) -> None:
    key = stack.new_project("narrow", models=["nimble"])
    with sdk(stack, wire, key=key, model="clef") as client, \
            pytest.raises(TypeSafePermissionDeniedError) as raised:
        client.system_one(state="s", questions={"q": Noul(instructions="Yes?")})
    assert raised.value.status == 403
    assert "model 'clef' is not allowed for this project" in str(raised.value)


def test_the_sdks_default_model_through_an_alias(stack: Stack, wire: Wire) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json={"alias": DEFAULT_MODEL, "model": "nimble"}), 201)
    with sdk(stack, wire) as client:  # no model: the SDK sends its default, jev-latest
        result = client.system_one(state="My card was charged twice.", questions=questions())
    assert result.model == DEFAULT_MODEL
    [sent] = forwarded(stack)
    assert sent["model"] in ("nimble", "nimble:latest")  # the target, as its backend names it
