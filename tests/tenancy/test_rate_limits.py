"""Rate limits per project and per key, requests and tokens per minute: 429 with Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from app.settings import Settings
from tests.support import Stack, assert_error, closed_port, decision, redis_url, wait_for

REDIS = redis_url(2)


def redis_up() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(params=["local", "redis"])
def limited(request: pytest.FixtureRequest, stack: Stack, gateway_factory: Any) -> Iterator[Any]:
    if request.param == "redis":
        if not redis_up():
            pytest.skip("no Redis at 127.0.0.1:6379")
        redis.Redis.from_url(REDIS).flushdb()
        yield gateway_factory(redis_url=REDIS)
    else:
        yield stack.gateway


def set_project_limits(stack: Stack, gateway: Any = None, **limits: Any) -> None:
    with (gateway or stack.gateway).client(stack.admin_key) as admin:
        response = admin.patch("/admin/projects/acme", json=limits)
        assert response.status_code == 200, response.text
        assert all(response.json()[k] == v for k, v in limits.items())


def test_a_project_limit_lets_exactly_n_through(stack: Stack, limited: Any) -> None:
    set_project_limits(stack, limited, requests_per_minute=5)
    with limited.client(stack.project_key) as client:
        codes = [client.post("/v1/systemone", json=decision()).status_code for _ in range(8)]
        assert codes == [200] * 5 + [429] * 3
        refused = client.post("/v1/systemone", json=decision())
    error = assert_error(refused, 429)
    assert "5 requests per minute" in error["error"]
    assert 1 <= int(refused.headers["retry-after"]) <= 13  # one request every 12 s comes back


def test_a_key_limit_is_its_own(stack: Stack, limited: Any) -> None:
    with limited.client(stack.admin_key) as admin:
        key_id = admin.get("/admin/projects/acme/keys").json()["data"][0]["id"]
        assert admin.patch(f"/admin/keys/{key_id}", json={"requests_per_minute": 2}).status_code == 200
        second = admin.post("/admin/projects/acme/keys", json={}).json()["key"]
    with limited.client(stack.project_key) as client:
        assert [client.post("/v1/systemone", json=decision()).status_code for _ in range(3)] == [200, 200, 429]
    with limited.client(second) as client:  # the project has no limit, the other key none
        assert client.post("/v1/systemone", json=decision()).status_code == 200


def throttled_key(stack: Stack, gateway: Any, **limits: Any) -> tuple[str, str]:
    """A new key of project acme with ``limits`` of its own, and another new key without."""
    with gateway.client(stack.admin_key) as admin:
        throttled = admin.post("/admin/projects/acme/keys", json={}).json()
        assert admin.patch(f"/admin/keys/{throttled['id']}", json=limits).status_code == 200
        return throttled["key"], admin.post("/admin/projects/acme/keys", json={}).json()["key"]


def test_a_refused_request_spends_none_of_the_project_s_requests(stack: Stack, limited: Any) -> None:
    """A key over its own limit does not use up its project's, and so lock out every other key."""
    set_project_limits(stack, limited, requests_per_minute=4)
    throttled, other = throttled_key(stack, limited, requests_per_minute=1)
    with limited.client(throttled) as client:
        assert [client.post("/v1/systemone", json=decision()).status_code for _ in range(6)] == [200] + [429] * 5
    with limited.client(other) as client:  # three of the project's four requests are left
        assert [client.post("/v1/systemone", json=decision()).status_code for _ in range(4)] == [200] * 3 + [429]


def test_a_refused_request_spends_none_of_the_project_s_tokens(stack: Stack, limited: Any) -> None:
    with limited.client(stack.project_key) as client:
        used = client.post("/v1/systemone", json=decision()).json()["usage"]
    per_request = used["input_tokens"] + used["output_tokens"]
    set_project_limits(stack, limited, tokens_per_minute=per_request + 2)
    throttled, other = throttled_key(stack, limited, tokens_per_minute=1)
    with limited.client(throttled) as client:  # the answer puts the key in debt
        assert [client.post("/v1/systemone", json=decision()).status_code for _ in range(6)] == [200] + [429] * 5
    with limited.client(other) as client:  # the project has two tokens left; five refusals took none
        assert client.post("/v1/systemone", json=decision()).status_code == 200


def test_tokens_per_minute_are_charged_after_the_answer(stack: Stack, limited: Any) -> None:
    with limited.client(stack.project_key) as client:
        used = client.post("/v1/systemone", json=decision()).json()["usage"]
    per_request = used["input_tokens"] + used["output_tokens"]
    set_project_limits(stack, limited, tokens_per_minute=per_request * 2)
    with limited.client(stack.project_key) as client:
        codes = [client.post("/v1/systemone", json=decision()).status_code for _ in range(4)]
    # The budget is spent after two answers; the third finds it in debt.
    assert codes[:2] == [200, 200] and codes[2:] == [429, 429]


def test_limits_apply_to_chat_and_not_to_the_test_action(stack: Stack, limited: Any) -> None:
    set_project_limits(stack, limited, requests_per_minute=1)
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}
    with limited.client(stack.project_key) as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.post("/v1/chat/completions", json=chat).status_code == 429
    with limited.client(stack.admin_key) as admin:
        model = next(m["id"] for m in admin.get("/admin/models").json()["data"] if m["public_name"] == "nimble")
        assert admin.post(f"/admin/models/{model}/test").json()["ok"] is True


CHATS = [("/v1/chat/completions", False), ("/v1/chat/completions", True), ("/api/chat", False),
         ("/api/chat", True)]


@pytest.mark.parametrize(("path", "stream"), CHATS)
def test_chat_pays_its_tokens(stack: Stack, limited: Any, path: str, stream: bool) -> None:
    """Any chat uses more than five tokens (its answer's usage, or for an OpenAI stream without
    include_usage its events and the request's size): the first spends the minute's budget."""
    set_project_limits(stack, limited, tokens_per_minute=5)
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with limited.client(stack.project_key) as client:
        codes = [client.post(path, json=chat).status_code for _ in range(3)]
        assert codes == [200, 429, 429]
        refused = client.post("/v1/systemone", json=decision())  # one budget for both
    assert "5 tokens per minute" in assert_error(refused, 429)["error"]


def chats_finished(gateway: Any) -> float:
    registry = gateway.app.components.metrics.registry
    return sum(sample.value for metric in registry.collect() for sample in metric.samples
               if sample.name == "gen_ai_client_operation_duration_seconds_count"
               and sample.labels.get("gen_ai_operation_name") == "chat")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_stream_left_early_pays_what_was_sent(stack: Stack, limited: Any, path: str) -> None:
    set_project_limits(stack, limited, tokens_per_minute=5)
    stack.ollama_state.stream_delay = 0.5
    chat = {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with limited.client(stack.project_key) as client:
        with client.stream("POST", path, json=chat) as response:
            assert response.status_code == 200
            next(response.iter_raw())  # the first event, then the client goes away
        stack.ollama_state.stream_delay = 0.0
        wait_for(lambda: chats_finished(limited) == 1)  # charged before its record is finished
        assert_error(client.post(path, json=chat), 429)


def test_limits_can_be_lifted_and_bad_values_are_400(stack: Stack) -> None:
    set_project_limits(stack, requests_per_minute=1)
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        assert client.post("/v1/systemone", json=decision()).status_code == 429
    set_project_limits(stack, requests_per_minute=None)
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    with stack.client("admin") as admin:
        for bad in ({"requests_per_minute": 0}, {"tokens_per_minute": -5}, {"requests_per_minute": "lots"}):
            assert_error(admin.patch("/admin/projects/acme", json=bad), 400)
        assert_error(admin.patch("/admin/keys/999999", json={"requests_per_minute": 3}), 404)


def test_redis_unreachable_can_fail_closed(stack: Stack, gateway_factory: Any) -> None:
    """By default each replica counts a share (tests/reliability/test_redis_away.py)."""
    set_project_limits(stack, requests_per_minute=100)
    unlimited = stack.new_project("free")
    gateway = gateway_factory(redis_url=f"redis://127.0.0.1:{closed_port()}/0", rate_limit_fallback="closed")
    with gateway.client(stack.project_key) as client:
        response = client.post("/v1/systemone", json=decision())
        ready = client.get("/readyz")
    assert_error(response, 503)
    assert response.headers["retry-after"] == "5"
    assert ready.status_code == 200 and ready.json()["redis"] == "unreachable"
    assert "refused" in ready.json()["degraded"] and ready.json()["rate_limits"] == "closed"
    with gateway.client(unlimited) as client:  # no limits: Redis is not needed
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    with gateway.client(stack.admin_key) as admin:
        assert "arbiter_redis_up 0.0" in admin.get("/metrics").text


def test_redis_unreachable_can_fail_open(stack: Stack, gateway_factory: Any) -> None:
    set_project_limits(stack, requests_per_minute=100)
    gateway = gateway_factory(redis_url=f"redis://127.0.0.1:{closed_port()}/0", rate_limit_fail_open=True)
    with gateway.client(stack.project_key) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
        ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["redis"] == "unreachable"
    assert ready.json()["rate_limits"] == "open"


def test_the_fallback_setting_and_fail_open_cannot_contradict() -> None:
    assert Settings(rate_limit_fail_open=True).rate_limit_mode == "open"  # the older spelling of open
    assert Settings().rate_limit_mode == "share"
    with pytest.raises(ValidationError, match="contradicts ARBITER_RATE_LIMIT_FAIL_OPEN"):
        Settings(rate_limit_fail_open=True, rate_limit_fallback="closed")
    with pytest.raises(ValidationError):
        Settings(rate_limit_fallback="sometimes")
