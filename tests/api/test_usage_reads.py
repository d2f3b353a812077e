"""Usage reads cannot hurt the hot path: they run on a pool of their own (a report storm leaves key
lookups and decisions alone), each query has a timeout told as a 504 that says what to narrow, a
key's reads are rate limited, and /admin/usage pages instead of answering megabytes at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import threading
from typing import Any

import pytest
from sqlalchemy import text

from app.db.models import UsageRecord
from app.db.reports import Reports
from app.errors import BackendFailed
from app.telemetry import usage
from tests.support import Stack, assert_error, body, decision, wait_for


def test_a_storm_of_usage_reads_leaves_other_tenants_decisions_alone(
        stack: Stack, gateway_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve usage reads stuck in the database (here: held on an event) used to fill the thread
    pool key lookups wait on, and another tenant's decisions got 503 "cannot verify the API key"."""
    release, entered = threading.Event(), []
    real = usage.summary

    def stuck(*args: Any, **kwargs: Any) -> Any:
        entered.append(None)
        release.wait(30)
        return real(*args, **kwargs)
    monkeypatch.setattr(usage, "summary", stuck)
    gateway = gateway_factory(report_pool_size=1)
    other = stack.new_project("other")  # a key no cache holds yet: its lookup goes to the database

    def read() -> int:
        with gateway.client(stack.project_key, timeout=60) as client:
            return client.get("/v1/usage", params={"days": 90}).status_code
    try:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            storm = [pool.submit(read) for _ in range(12)]
            wait_for(lambda: entered)
            with gateway.client(other) as client:
                answers = [client.post("/v1/systemone", json=decision()).status_code for _ in range(5)]
            release.set()
            statuses = sorted(f.result(timeout=60) for f in storm)
    finally:
        release.set()
    assert answers == [200] * 5, answers
    # One report at a time, four more waiting; the rest told at once to come back (503, Retry-After).
    assert statuses == [200] * 5 + [503] * 7, statuses


def test_usage_reads_are_rate_limited_per_key(stack: Stack, gateway_factory: Any) -> None:
    gateway = gateway_factory(usage_reads_per_minute=2)
    with gateway.client(stack.project_key) as client:
        assert [client.get("/v1/usage").status_code for _ in range(2)] == [200, 200]
        limited = client.get("/v1/usage")
        assert_error(limited, 429, "rate_limit_error")
        assert 1 <= int(limited.headers["Retry-After"]) <= 61
        assert "at most 2 a minute" in limited.json()["error"]
    with gateway.client(stack.admin_key) as admin:  # another key: its own count
        assert admin.get("/admin/usage").status_code == 200
    with gateway.client(stack.project_key) as client:  # decisions are not usage reads
        assert client.get("/v1/models").status_code == 200


def test_admin_usage_pages_with_a_cursor(stack: Stack) -> None:
    with stack.db.session() as s:
        s.add_all([UsageRecord(at=dt.datetime(2025, 3, day, 12, tzinfo=dt.UTC), request_id=f"p{day}{m}",
                               project_id=1, operation="decision", model=m, status=200, input_tokens=1,
                               output_tokens=1, latency_ms=2.0) for day in range(1, 6) for m in ("a", "b")])
    with stack.client("admin") as admin:
        whole = body(admin.get("/admin/usage"), 200)
        assert whole["next"] is None and len(whole["data"]) == 10
        seen, cursor = [], None
        while True:
            page = body(admin.get("/admin/usage", params={"limit": 3, **({"cursor": cursor} if cursor else {})}), 200)
            seen += page["data"]
            cursor = page["next"]
            if cursor is None:
                break
        assert seen == whole["data"]
        assert_error(admin.get("/admin/usage", params={"cursor": "nope"}), 400)
        assert_error(admin.get("/admin/usage", params={"limit": 0}), 400)
    with stack.client() as client:
        page = body(client.get("/v1/usage", params={"limit": 4}), 200)
        assert len(page["data"]) == 4 and page["next"]
        rest = body(client.get("/v1/usage", params={"cursor": page["next"]}), 200)
        assert page["data"] + rest["data"] == whole["data"]


def test_a_report_past_its_time_is_a_504_that_says_what_to_narrow(database_url: str) -> None:
    reports = Reports(database_url, pool_size=1, timeout=0.3, per_minute=0)
    slow = ("SELECT pg_sleep(3)" if database_url.startswith("postgresql") else
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000) "
            "SELECT count(*) FROM n")
    try:
        with pytest.raises(BackendFailed, match=r"\(90 days of every project\) ran longer than 0.3 s") as stopped:
            asyncio.run(reports.run(lambda s: s.execute(text(slow)).all(), what="90 days of every project"))
        assert stopped.value.status == 504 and "choose a shorter period" in stopped.value.message
        assert asyncio.run(reports.run(lambda s: s.execute(text("SELECT 1")).scalar())) == 1  # the pool goes on
    finally:
        reports.dispose()
