"""The usage reports on the real database (SQLite, or PostgreSQL with ARBITER_TEST_DATABASE_URL):
buckets by UTC day and hour, latency percentiles from the histogram the database counts, status
classes, usage per key, the drill-down's filters and paging, and the statement timeout."""

from __future__ import annotations

import datetime as dt
import math
import random
from typing import Any

import pytest
from sqlalchemy import text

from app.db.models import UsageRecord
from app.db.session import Database
from app.errors import BackendFailed, InvalidRequest
from app.telemetry import usage_report, usage_requests
from app.telemetry.usage_report import Period
from app.telemetry.usage_requests import Filters
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI

NOW = dt.datetime(2025, 3, 14, 15, 30, tzinfo=dt.UTC)
WEEK = Period.last(7, NOW)


def provision(db: Database) -> dict[str, int]:
    """Projects acme (keys a1, a2, and a3 revoked) and beta (key b1): name -> id."""
    ids: dict[str, int] = {}
    with db.session() as s:
        for project in ("acme", "beta"):
            ids[project] = tenancy.create_project(s, project, CLI).id
        for name, project in (("a1", "acme"), ("a2", "acme"), ("a3", "acme"), ("b1", "beta")):
            ids[name] = tenancy.create_key(s, KeyHasher(), CLI, kind="project", project=project, name=name)[0].id
        tenancy.revoke_key(s, ids["a3"], CLI)
    return ids


def record(at: dt.datetime, project_id: int | None, key_id: int | None = None, *, status: int = 200,
           latency: float = 10.0, model: str = "nimble", request_id: str = "r", tokens: tuple[int, int] = (10, 1),
           alias: str | None = None) -> UsageRecord:
    return UsageRecord(at=at, request_id=request_id, project_id=project_id, key_id=key_id, operation="decision",
                       model=model, provider="ollama" if status < 500 else None, status=status,
                       input_tokens=tokens[0], output_tokens=tokens[1], latency_ms=latency, alias=alias)


def store(db: Database, records: list[UsageRecord]) -> None:
    with db.session() as s:
        s.add_all(records)


def read(db: Database, work: Any) -> Any:
    with db.session() as s:
        return usage_report.reading(work)(s)


def nearest_rank(values: list[float], q: float) -> float:
    return sorted(values)[max(1, math.ceil(q * len(values))) - 1]


def test_periods_are_whole_utc_days_or_the_last_24_hours() -> None:
    assert WEEK.buckets()[0] == "2025-03-08" and WEEK.buckets()[-1] == "2025-03-14" and len(WEEK.buckets()) == 7
    assert WEEK.start == dt.datetime(2025, 3, 8, tzinfo=dt.UTC) and WEEK.end == dt.datetime(2025, 3, 15, tzinfo=dt.UTC)
    day = Period.last(1, NOW.astimezone(dt.timezone(dt.timedelta(hours=5))))  # any zone: the same hours
    assert day.hourly and len(day.buckets()) == 24
    assert day.buckets()[0] == "2025-03-13 16:00" and day.buckets()[-1] == "2025-03-14 15:00"
    assert (day.first_day, day.last_day) == (dt.date(2025, 3, 13), dt.date(2025, 3, 14))


def test_latency_percentiles_come_within_a_bin_of_the_exact_ones(db: Database) -> None:
    ids = provision(db)
    draw = random.Random(7)
    today = [draw.lognormvariate(3.0, 1.0) for _ in range(2000)]  # ~20 ms, a long tail
    store(db, [record(NOW - dt.timedelta(minutes=i % 600), ids["acme"], latency=v) for i, v in enumerate(today)]
          + [record(NOW - dt.timedelta(days=2), ids["acme"], latency=123.456)]  # a day of one request
          + [record(NOW - dt.timedelta(days=1), ids["acme"], latency=v) for v in (5.0, 700.0)])
    bins = read(db, lambda s: usage_report.latency_bins(s, WEEK, project="acme"))
    assert set(bins) == {"2025-03-12", "2025-03-13", "2025-03-14"}
    assert sum(n for _, n, _, _ in bins["2025-03-14"]) == 2000
    found = usage_report.percentiles(bins["2025-03-14"])
    assert found is not None
    for q in (0.5, 0.95):
        exact = nearest_rank(today, q)
        assert abs(found[q] - exact) / exact < 0.091, (q, found[q], exact)  # a bin is 2^(1/8) wide
    assert usage_report.percentiles(bins["2025-03-12"]) == {0.5: 123.456, 0.95: 123.456}  # exact: one value
    assert usage_report.percentiles(bins["2025-03-13"]) == {0.5: 5.0, 0.95: 700.0}  # and two
    assert usage_report.percentiles([]) is None
    assert read(db, lambda s: usage_report.latency_bins(s, WEEK, project="beta")) == {}


def test_percentiles_of_a_merged_histogram_match_the_whole_period(db: Database) -> None:
    # under the first edge, past the last
    values = [0.05, 0.5, 3.0, 3.0, 40.0, 40.5, 41.0, 900.0, 12_000.0, 2_000_000.0]
    ids = provision(db)
    store(db, [record(NOW - dt.timedelta(days=i % 3), ids["acme"], latency=v) for i, v in enumerate(values)])
    bins = read(db, lambda s: usage_report.latency_bins(s, WEEK))
    merged = usage_report.percentiles(entry for per_day in bins.values() for entry in per_day)
    assert merged is not None
    assert merged[0.5] == pytest.approx(nearest_rank(values, 0.5), rel=0.091)
    assert merged[0.95] == 2_000_000.0  # the last bin holds it alone: exact


def test_days_hours_status_classes_and_totals(db: Database) -> None:
    ids = provision(db)
    store(db, [record(NOW, ids["acme"], ids["a1"], tokens=(100, 5)),
               record(NOW - dt.timedelta(hours=2), ids["acme"], ids["a1"], status=429, tokens=(0, 0)),
               record(NOW - dt.timedelta(hours=2), ids["acme"], ids["a2"], status=502, model="tev1", tokens=(0, 0)),
               record(NOW - dt.timedelta(days=3), ids["beta"], ids["b1"], tokens=(7, 7)),
               record(NOW - dt.timedelta(days=3), None, None, status=0, tokens=(1, 1)),  # a deleted project's
               record(NOW - dt.timedelta(days=8), ids["acme"], ids["a1"])])  # before the period
    week = read(db, lambda s: usage_report.series(s, WEEK))
    by = {(r["bucket"], r["model"]): r for r in week}
    assert set(by) == {("2025-03-14", "nimble"), ("2025-03-14", "tev1"), ("2025-03-11", "nimble")}
    assert by["2025-03-14", "nimble"]["statuses"] == {"2xx": 1, "3xx": 0, "4xx": 1, "5xx": 0, "other": 0}
    assert by["2025-03-14", "tev1"]["statuses"]["5xx"] == 1
    assert by["2025-03-11", "nimble"]["statuses"] == {"2xx": 1, "3xx": 0, "4xx": 0, "5xx": 0, "other": 1}
    assert by["2025-03-14", "nimble"]["input_tokens"] == 100
    day = Period.last(1, NOW)
    hours = read(db, lambda s: usage_report.series(s, day, project="acme"))
    assert {(r["bucket"], r["model"], r["requests"]) for r in hours} == {
        ("2025-03-14 15:00", "nimble", 1), ("2025-03-14 13:00", "nimble", 1), ("2025-03-14 13:00", "tev1", 1)}
    only_beta = read(db, lambda s: usage_report.series(s, WEEK, projects={"beta"}))
    assert [(r["bucket"], r["requests"]) for r in only_beta] == [("2025-03-11", 1)]  # no deleted project's
    totals = read(db, lambda s: usage_report.totals(s, WEEK))
    assert [(t["project"], t["model"], t["requests"], t["errors"]) for t in totals] == [
        ("acme", "nimble", 2, 1), ("acme", "tev1", 1, 1), ("beta", "nimble", 1, 0), (None, "nimble", 1, 0)]
    per = read(db, lambda s: usage_report.totals_per_bucket(s, WEEK, project="acme"))
    assert [(r["bucket"], r["model"], r["2xx"], r["4xx"], r["5xx"]) for r in per] == [
        ("2025-03-14", "nimble", 1, 1, 0), ("2025-03-14", "tev1", 0, 0, 1)]


def test_usage_per_key_lists_every_key_of_the_project(db: Database) -> None:
    ids = provision(db)
    store(db, [record(NOW, ids["acme"], ids["a1"], tokens=(10, 2)), record(NOW, ids["acme"], ids["a1"], status=429),
               record(NOW, ids["acme"], ids["a3"], status=401 + 1, latency=4.0),
               record(NOW, ids["acme"], None),  # its key deleted since
               record(NOW, ids["beta"], ids["b1"])])
    keys = read(db, lambda s: usage_report.per_key(s, WEEK, "acme"))
    assert [(k["name"], k["requests"], k["errors"], k["rate_limited"], k["state"]) for k in keys] == [
        ("a1", 2, 1, 1, "active"), ("a3", 1, 1, 0, "revoked"), ("", 1, 0, 0, "gone"), ("a2", 0, 0, 0, "active")]
    first = keys[0]
    assert first["input_tokens"] == 20 and first["shown"].startswith("arb_proj_") and "…" in first["shown"]
    assert len(first["shown"].split("…")[1]) == 4  # the last four only
    assert keys[-1]["mean_latency_ms"] is None and keys[1]["mean_latency_ms"] == 4.0
    assert read(db, lambda s: usage_report.per_key(s, WEEK, "nope")) == []


def test_the_drill_down_filters_and_pages(db: Database) -> None:
    ids = provision(db)
    rows = [record(NOW - dt.timedelta(minutes=i), ids["acme"], ids["a1" if i % 2 else "a2"],
                   status=(200, 404, 503)[i % 3], model=("nimble", "tev1")[i % 2], request_id=f"req-{i}",
                   alias="fast" if i == 4 else None) for i in range(120)]
    store(db, [*reversed(rows), record(NOW, ids["beta"], ids["b1"], request_id="req-0")])  # as the ledger: oldest first

    def page(filters: Filters, **kwargs: Any) -> list[dict[str, Any]]:
        return read(db, lambda s: usage_requests.page(s, filters, WEEK, **kwargs))
    first = page(Filters(project="acme"))
    assert len(first) == 50 and first[0]["request_id"] == "req-0" and first[0]["project"] == "acme"
    second = page(Filters(project="acme"), before_id=first[-1]["id"])
    assert [r["request_id"] for r in second] == [f"req-{i}" for i in range(50, 100)]
    assert len(page(Filters(project="acme"), before_id=second[-1]["id"])) == 20
    assert {r["key_name"] for r in page(Filters(key_id=ids["a1"]), limit=500)} == {"a1"}
    assert {r["status"] for r in page(Filters(status="errors"), limit=500)} == {404, 503}
    assert {r["status"] for r in page(Filters(status="404"), limit=500)} == {404}
    assert len(page(Filters(status="5xx", model="tev1"), limit=500)) == 20  # odd i, i % 3 == 2
    assert [r["request_id"] for r in page(Filters(model="fast"))] == ["req-4"]  # the alias the caller named
    assert len(page(Filters(), projects={"beta"})) == 1
    both = read(db, lambda s: usage_requests.with_request_id(s, "req-0"))
    assert [r["project"] for r in both] == ["beta", "acme"]  # newest first
    assert read(db, lambda s: usage_requests.with_request_id(s, "req-0", projects={"acme"}))[0]["project"] == "acme"
    assert read(db, lambda s: usage_requests.with_request_id(s, "req-0", projects=set())) == []


@pytest.mark.parametrize(("check", "value", "expected"), [
    (usage_requests.checked_status, "teapot", "Status must be 2xx, 3xx, 4xx, 5xx, errors or a code"),
    (usage_requests.checked_status, "99", "a code from 100 to 599"),
    (usage_requests.checked_key, "abc", "Key must be a key's id"),
    (usage_requests.checked_key, "99999999999", "Key must be a key's id"),
    (usage_requests.checked_model, "x" * 201, "at most 200 characters"),
    (usage_requests.checked_model, "a\x00b", "must not contain control characters"),
    (usage_requests.checked_request_id, "two words", "A request id is 1 to 64 letters"),
    (usage_requests.checked_request_id, "x" * 65, "A request id is 1 to 64 letters"),
])
def test_a_bad_filter_says_what_is_accepted(check: Any, value: str, expected: str) -> None:
    with pytest.raises(InvalidRequest, match=expected.replace("(", r"\(")):
        check(value)


def test_good_filters_pass_trimmed() -> None:
    assert usage_requests.checked_status(" 5XX ") == "5xx" and usage_requests.checked_status("429") == "429"
    assert usage_requests.checked_status("") is None and usage_requests.checked_key(" 12 ") == 12
    assert usage_requests.checked_request_id("  3f2a:b-c_d.e  ") == "3f2a:b-c_d.e"
    assert Filters(status="429").status_range() == (429, 429) and Filters(status="errors").status_range() == (400, 599)


def test_a_report_query_past_its_time_is_stopped_and_told_as_such(db: Database) -> None:
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no statement timeout")
    with pytest.raises(BackendFailed, match="ran longer than") as stopped, db.session() as s:
        usage_report.limit(s, 50)
        with usage_report.translated():
            s.execute(text("SELECT pg_sleep(2)"))
    assert stopped.value.status == 504
