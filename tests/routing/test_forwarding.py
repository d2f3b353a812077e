"""The forwarding core's one failover rule (SPEC §4), driven directly: fake replicas, a path that
plays a script of what each attempt does, the real replica router. Decisions and chat over real
HTTP are in tests/routing/test_replicas.py and tests/api/public/test_chat_failures.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from app.errors import ArbiterError, BackendFailed, UpstreamAuthFailed
from app.routing.forwarding import FaultAnswer, TryAnother, Waited, failover, failure_verdict
from app.routing.registry import Replica
from app.routing.router import ReplicaRouter
from infra_adapters.base import (
    BackendBroken,
    BackendError,
    BackendTimeout,
    BackendUnreachable,
    CallOptions,
    ReplyTooLarge,
)

MODEL = "nimble"
BODY = {"model": MODEL, "state": "s"}
OPTIONS = CallOptions(timeout=0.0, max_reply_bytes=1000)


@dataclass
class Answer:
    status: int
    body: bytes
    held: bool = False


def replica(n: int) -> Replica:
    no_backend: Any = None  # the path under test makes the calls
    return Replica(n, f"service-{n}", "ollama-external", no_backend, f"nimble:{n}",
                   capabilities=frozenset({"decision"}), text_limit=1000, timeout=5.0, created=0,
                   answered_by=("host", str(n), "nimble"), tried_at=("host", str(n), ""))


# What one attempt does, given the replica it is on: return an answer or raise a verdict.
Step = Callable[[Replica], Answer]


class ScriptedPath:
    """A forwarding path whose attempts follow ``steps`` in turn, each waiting ``wait`` seconds."""

    def __init__(self, *steps: Step, wait: float = 0.25, hold_keeps: bool = True) -> None:
        self.steps = list(steps)
        self.wait = wait
        self.hold_keeps = hold_keeps
        self.tried: list[Replica] = []
        self.sent: list[dict[str, Any]] = []
        self.held: list[Answer] = []

    async def attempt(self, model: str, replica: Replica, forwarded: dict[str, Any],
                      options: CallOptions, waited: Waited) -> Answer:
        self.tried.append(replica)
        self.sent.append(forwarded)
        waited[0] += self.wait
        return self.steps.pop(0)(replica)

    async def hold(self, answer: Answer, waited: Waited) -> Answer | None:
        self.held.append(answer)
        waited[0] += self.wait  # reading it whole is waiting on its backend too
        return Answer(answer.status, answer.body, held=True) if self.hold_keeps else None


def answers(replica: Replica) -> Answer:
    return Answer(200, replica.backend_name.encode())


def own_400(replica: Replica) -> Answer:
    return Answer(400, b"bad question")


def unreachable(replica: Replica) -> Answer:
    raise TryAnother(BackendFailed(502, f"{replica.service_name} could not be reached"))


def refuses_credential(replica: Replica) -> Answer:
    raise TryAnother(UpstreamAuthFailed(f"{replica.service_name} rejected Arbiter's credential"), take_out=False)


def own_503(replica: Replica) -> Answer:
    raise FaultAnswer(Answer(503, f"{replica.service_name} overloaded".encode()))


def not_json(replica: Replica) -> Answer:
    raise BackendFailed(502, "answered something that is not a JSON object")


def forward(path: ScriptedPath, router: ReplicaRouter, replicas: list[Replica],
            waited: Waited | None = None) -> Answer:
    return asyncio.run(failover(path, router, replicas, MODEL, BODY, OPTIONS, waited if waited is not None else [0.0]))


def forward_fails(path: ScriptedPath, router: ReplicaRouter, replicas: list[Replica]) -> ArbiterError:
    with pytest.raises(ArbiterError) as caught:
        forward(path, router, replicas)
    return caught.value


def backed_off(router: ReplicaRouter) -> set[int]:
    return {entry["service_id"] for entry in router.backed_off()}


@pytest.fixture
def router() -> ReplicaRouter:
    return ReplicaRouter(backoff=30)


def test_the_first_answer_is_the_answer_and_each_replica_gets_its_own_model_name(router: ReplicaRouter) -> None:
    replicas = [replica(1), replica(2)]
    path = ScriptedPath(unreachable, answers)
    answer = forward(path, router, replicas)
    assert answer.body == path.tried[1].backend_name.encode()
    assert [sent["model"] for sent in path.sent] == [r.backend_name for r in path.tried]
    assert all(sent["state"] == "s" for sent in path.sent) and BODY["model"] == MODEL  # a copy each


def test_a_backends_own_4xx_is_the_answer_and_the_replica_stays_in(router: ReplicaRouter) -> None:
    path = ScriptedPath(own_400)
    assert forward(path, router, [replica(1), replica(2)]).status == 400
    assert len(path.tried) == 1 and backed_off(router) == set()


def test_a_failed_replica_is_taken_out_and_another_tried(router: ReplicaRouter) -> None:
    path = ScriptedPath(unreachable, answers)
    assert forward(path, router, [replica(1), replica(2)]).status == 200
    assert backed_off(router) == {path.tried[0].service_id}
    assert path.tried[0] is not path.tried[1]


def test_a_refused_credential_tries_another_and_the_replica_stays_in(router: ReplicaRouter) -> None:
    path = ScriptedPath(refuses_credential, answers)
    assert forward(path, router, [replica(1), replica(2)]).status == 200
    assert len(path.tried) == 2 and backed_off(router) == set()


def test_when_none_answers_the_last_error_leaves_with_its_replicas_labels(router: ReplicaRouter) -> None:
    path = ScriptedPath(refuses_credential, unreachable)
    error = forward_fails(path, router, [replica(1), replica(2)])
    assert isinstance(error, BackendFailed) and path.tried[1].service_name in error.message
    assert error.served_by == path.tried[1].tried_at
    assert backed_off(router) == {path.tried[1].service_id}


def test_a_kept_5xx_beats_a_generic_error_of_ours(router: ReplicaRouter) -> None:
    path = ScriptedPath(own_503, unreachable)
    answer = forward(path, router, [replica(1), replica(2)])
    assert (answer.status, answer.held) == (503, True)
    assert answer.body == f"{path.tried[0].service_name} overloaded".encode()
    assert backed_off(router) == {1, 2}


def test_the_latest_5xx_is_the_one_that_goes_back(router: ReplicaRouter) -> None:
    path = ScriptedPath(own_503, own_503)
    answer = forward(path, router, [replica(1), replica(2)])
    assert answer.body == f"{path.tried[1].service_name} overloaded".encode()
    assert not answer.held and len(path.held) == 1  # the last replica's goes back as it came, unheld


def test_a_5xx_with_no_other_replica_goes_back_as_it_came(router: ReplicaRouter) -> None:
    path = ScriptedPath(own_503)
    answer = forward(path, router, [replica(1)])
    assert (answer.status, answer.held, path.held) == (503, False, [])
    assert backed_off(router) == {1}


def test_a_5xx_that_cannot_be_held_leaves_the_next_replicas_error(router: ReplicaRouter) -> None:
    path = ScriptedPath(own_503, unreachable, hold_keeps=False)
    error = forward_fails(path, router, [replica(1), replica(2)])
    assert error.served_by == path.tried[1].tried_at


def test_an_error_about_the_answer_stops_at_once(router: ReplicaRouter) -> None:
    path = ScriptedPath(not_json, answers)
    error = forward_fails(path, router, [replica(1), replica(2)])
    assert error.status == 502 and "not a JSON object" in error.message
    assert len(path.tried) == 1 and backed_off(router) == set()
    assert error.served_by == path.tried[0].tried_at and error.backend_seconds == 0.25


def test_every_attempts_wait_is_summed(router: ReplicaRouter) -> None:
    waited = [0.0]
    forward(ScriptedPath(unreachable, answers, wait=0.5), router, [replica(1), replica(2)], waited)
    assert waited == [1.0]
    error = forward_fails(ScriptedPath(own_503, unreachable, wait=0.5, hold_keeps=False), ReplicaRouter(30),
                          [replica(1), replica(2)])
    assert error.backend_seconds == 1.5  # two attempts and the read of the 503 that could not be held


def test_two_attempts_at_most(router: ReplicaRouter) -> None:
    path = ScriptedPath(unreachable, unreachable, answers)
    forward_fails(path, router, [replica(1), replica(2), replica(3)])
    assert len(path.tried) == 2


def test_with_every_replica_out_none_is_tried_and_the_routers_503_says_when_to_come_back(
        router: ReplicaRouter) -> None:
    replicas = [replica(1), replica(2)]
    for out in replicas:
        router.take_out(out)
    path = ScriptedPath(answers)
    error = forward_fails(path, router, replicas)
    assert (error.status, error.headers.get("Retry-After"), path.tried) == (503, "30", [])
    assert error.backend_seconds == 0.0


@pytest.mark.parametrize("exc, status, words", [
    (BackendTimeout("slow"), 504, "did not answer within 5s"),
    (BackendUnreachable("refused"), 502, "could not be reached"),
    (BackendBroken("reset"), 502, "broke the connection"),
])
def test_a_failure_to_answer_tries_another(exc: BackendError, status: int, words: str) -> None:
    verdict = failure_verdict(MODEL, replica(1), exc, 1000)
    assert isinstance(verdict, TryAnother) and verdict.take_out
    assert (verdict.error.status, verdict.error.__cause__) == (status, exc) and words in verdict.error.message


def test_an_answer_over_the_cap_stops() -> None:
    verdict = failure_verdict(MODEL, replica(1), ReplyTooLarge("big"), 1000)
    assert isinstance(verdict, BackendFailed) and verdict.status == 502
    assert "more than the 1000-byte response cap" in verdict.message
