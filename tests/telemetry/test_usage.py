"""The usage ledger: every request of a project recorded once, queryable per day and model."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db.models import Project, UsageRecord
from app.db.session import Database
from tests.support import Gateway, Stack, assert_error, body, decision, wait_for


def count(stack: Stack) -> int:
    with stack.db.session() as session:
        return int(session.scalar(select(func.count()).select_from(UsageRecord)) or 0)


def test_every_request_is_recorded_with_tokens_status_and_latency(stack: Stack) -> None:
    usages = []
    with stack.client() as client:
        for _ in range(3):
            usages.append(client.post("/v1/systemone", json=decision()).json()["usage"])
        assert client.post("/v1/systemone", json=decision("ghost")).status_code == 404
        assert client.post("/v1/systemone", json=decision("clef")).status_code == 200
    stack.gateway.stop()  # a clean shutdown flushes what is pending
    with stack.db.session() as session:
        rows = list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))
    assert [(r.model, r.status) for r in rows] == [("nimble", 200)] * 3 + [("_unknown", 404), ("clef", 200)]
    assert [r.input_tokens for r in rows[:3]] == [u["input_tokens"] for u in usages]
    assert all(r.key_id is not None and r.project_id is not None and r.latency_ms > 0 for r in rows)
    assert rows[3].input_tokens == 0


def test_usage_per_day_and_model_for_a_project_and_the_gateway(stack: Stack) -> None:
    other = stack.new_project("globex")
    with stack.client() as acme, stack.gateway.client(other) as globex:
        tokens = [acme.post("/v1/systemone", json=decision()).json()["usage"] for _ in range(2)]
        acme.post("/v1/systemone", json=decision("clef"))
        globex.post("/v1/systemone", json=decision())
    with stack.client("admin") as admin:
        deadline = time.monotonic() + 15  # the ledger writes every flush_interval (0.1 s here)
        while len(admin.get("/admin/usage").json()["data"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        everything = admin.get("/admin/usage").json()["data"]
        mine = admin.get("/admin/projects/acme/usage").json()["data"]
        today = dt.datetime.now(dt.UTC).date()
        none_yesterday = admin.get(f"/admin/usage?until={today - dt.timedelta(days=1)}").json()["data"]
        assert_error(admin.get("/admin/projects/nobody/usage"), 404)
        assert_error(admin.get("/admin/usage?since=yesterday"), 400)
        recent = admin.get("/admin/usage/recent?project=globex").json()["data"]
    assert {(r["project"], r["model"], r["requests"]) for r in everything} == {
        ("acme", "nimble", 2), ("acme", "clef", 1), ("globex", "nimble", 1)}
    nimble = next(r for r in mine if r["model"] == "nimble")
    assert nimble["day"] == str(today)
    assert nimble["input_tokens"] == sum(t["input_tokens"] for t in tokens)
    assert nimble["output_tokens"] == sum(t["output_tokens"] for t in tokens)
    assert {r["project"] for r in mine} == {"acme"}
    assert none_yesterday == []
    assert len(recent) == 1 and recent[0]["status"] == 200


def test_a_range_may_run_from_the_first_to_the_last_day_there_is(stack: Stack) -> None:
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    with stack.client("admin") as admin:
        wait_for(lambda: body(admin.get("/admin/usage"), 200)["data"])  # the ledger writes every 0.1 s
        for path in ("/admin/usage", "/admin/projects/acme/usage"):
            for params in ({"until": "9999-12-31"}, {"since": "0001-01-01", "until": "9999-12-31"}):
                rows = body(admin.get(path, params=params), 200)["data"]
                assert [(r["project"], r["model"], r["requests"]) for r in rows] == [("acme", "nimble", 1)]


def test_days_and_times_are_utc_whatever_the_database_session_s_time_zone(
        db: Database, monkeypatch: pytest.MonkeyPatch, gateway_factory: Callable[..., Gateway]) -> None:
    """PostgreSQL's date() of a timestamptz is the day in the session's TimeZone: here Tokyo's,
    through libpq's PGTZ, where 23:30 UTC is already the next day."""
    if not db.url.startswith("postgresql"):
        pytest.skip("a session time zone is PostgreSQL's: this runs in the PostgreSQL pass")
    stack = Stack.provision(db)
    with db.session() as session:
        project = session.scalar(select(Project.id).where(Project.name == "acme"))
        for hour in (1, 23):
            session.add(UsageRecord(at=dt.datetime(2024, 1, 1, hour, 30, tzinfo=dt.UTC), request_id=f"r{hour}",
                                    project_id=project, operation="decision", model="nimble", status=200,
                                    input_tokens=10, output_tokens=1, latency_ms=1.0))
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    gateway = gateway_factory()
    with gateway.client(stack.admin_key) as admin:
        for path in ("/admin/usage", "/admin/projects/acme/usage"):
            for params in ({}, {"since": "2024-01-01", "until": "2024-01-01"}):
                rows = body(admin.get(path, params=params), 200)["data"]
                assert [(r["day"], r["requests"]) for r in rows] == [("2024-01-01", 2)], (path, params)
        times = [r["at"] for r in body(admin.get("/admin/usage/recent"), 200)["data"]]
        times += [k["created_at"] for k in body(admin.get("/admin/projects/acme/keys"), 200)["data"]]
        times += [e["at"] for e in body(admin.get("/admin/audit"), 200)["data"]]
    assert times[:2] == ["2024-01-01T23:30:00+00:00", "2024-01-01T01:30:00+00:00"]
    assert all(t.endswith("+00:00") for t in times), times  # shown in UTC too


def test_a_request_without_a_valid_key_is_not_billed(stack: Stack) -> None:
    with stack.client("arb_proj_" + "y" * 43) as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 401
    stack.gateway.stop()
    assert count(stack) == 0


def test_chat_is_recorded_too(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json={
            "model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 200
    stack.gateway.stop()
    with stack.db.session() as session:
        row: Any = session.scalar(select(UsageRecord))
    assert (row.operation, row.model, row.status) == ("chat", "llama3.2", 200)


def test_made_up_model_names_never_reach_the_ledger_or_metrics(stack: Stack) -> None:
    """A 403/404 for any name a caller sends is billed as `_unknown`: a 10,000-character name
    must not block the ledger (PostgreSQL's column is 200) or create a metric series."""
    narrow = stack.new_project("narrow", models=["clef"])
    long_name = "m" * 10_000
    with stack.gateway.client(narrow) as client:
        assert client.post("/v1/systemone", json=decision(long_name)).status_code == 403
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision(long_name)).status_code == 404
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    stack.gateway.stop()
    with stack.db.session() as session:
        models = list(session.scalars(select(UsageRecord.model).order_by(UsageRecord.id)))
    assert models == ["_unknown", "_unknown", "nimble"]


def test_chat_tokens_are_recorded_from_whole_answers_and_the_end_of_streams(stack: Stack) -> None:
    """OpenAI's usage (a stream's only with include_usage) and Ollama's prompt_eval_count/eval_count."""
    import orjson

    messages = [{"role": "user", "content": "hi there"}]
    expected = []
    with stack.client() as client:
        whole = client.post("/v1/chat/completions", json={"model": "llama3.2", "messages": messages}).json()
        expected.append((whole["usage"]["prompt_tokens"], whole["usage"]["completion_tokens"]))
        ollama = client.post("/api/chat", json={"model": "llama3.2", "messages": messages, "stream": False}).json()
        expected.append((ollama["prompt_eval_count"], ollama["eval_count"]))
        streamed = client.post("/v1/chat/completions", json={
            "model": "llama3.2", "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}}).content
        usage = [orjson.loads(e[6:]) for e in streamed.split(b"\n\n") if e.startswith(b"data: {")][-1]["usage"]
        expected.append((usage["prompt_tokens"], usage["completion_tokens"]))
        lines = client.post("/api/chat", json={"model": "llama3.2", "messages": messages}).content
        done = orjson.loads(lines.strip().splitlines()[-1])
        expected.append((done["prompt_eval_count"], done["eval_count"]))
        bare = client.post("/v1/chat/completions", json={"model": "llama3.2", "messages": messages,
                                                          "stream": True}).content
        # An OpenAI stream without include_usage says nothing: its events are counted as output.
        expected.append((0, bare.count(b"data: {")))
    stack.gateway.stop()
    with stack.db.session() as session:
        rows = list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))
    assert [(r.input_tokens, r.output_tokens) for r in rows] == expected
    assert all(i > 0 and o > 0 for i, o in expected[:4])
