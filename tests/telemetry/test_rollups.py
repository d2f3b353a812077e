"""The usage rollups (app/db/rollups.py) on the real database (SQLite, or PostgreSQL with
ARBITER_TEST_DATABASE_URL): kept by the ledger as it writes, a replayed batch counted once, the
same answers as the raw rows give, rebuilt identically, the same again once the days are merged
(the day level), and the reports that read them paged."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import random
from collections import defaultdict
from typing import Any

import pytest
from sqlalchemy import delete, select

from app.db import rollups
from app.db.models import UsageLatencyRollup, UsageRecord, UsageRollup
from app.db.session import Database
from app.errors import InvalidRequest
from app.telemetry import retention, usage, usage_report, usage_requests
from app.telemetry.record import RequestRecord
from app.telemetry.usage import UsageLedger, _with_uids
from app.telemetry.usage_report import Period
from app.telemetry.usage_requests import Filters
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI

NOW = dt.datetime(2025, 3, 14, 15, 30, tzinfo=dt.UTC)
MONTH = Period.last(30, NOW)


def provision(db: Database) -> dict[str, int]:
    ids: dict[str, int] = {}
    with db.session() as s:
        for project in ("acme", "beta"):
            ids[project] = tenancy.create_project(s, project, CLI).id
        for name, project in (("a1", "acme"), ("a2", "acme"), ("b1", "beta")):
            ids[name] = tenancy.create_key(s, KeyHasher(), CLI, kind="project", project=project, name=name)[0].id
    return ids


def records(ids: dict[str, int], n: int = 600, days: int = 20) -> list[RequestRecord]:
    """``n`` records over the last ``days`` days: two projects, three keys, two models, an alias, statuses
    of every class, latencies from 0.05 ms to minutes (bin edges among them)."""
    draw = random.Random(31)
    found = []
    for i in range(n):
        project, key = draw.choice([("acme", "a1"), ("acme", "a2"), ("beta", "b1"), ("acme", None)])
        latency = draw.choice([0.05, 0.1, 1.0, rollups.LATENCY_EDGES[40], 12.5, 250.0, 90_000.0,
                               round(draw.lognormvariate(3, 1), 3)])
        found.append(RequestRecord(
            request_id=f"r{i}", operation=draw.choice(["decision", "chat"]), route="/v1/systemone",
            model=draw.choice(["nimble", "tev1"]), project_id=ids[project], key_id=ids[key] if key else None,
            status=draw.choice([200, 200, 200, 302, 404, 429, 503, 504, 99]),
            input_tokens=draw.randint(0, 500), output_tokens=draw.randint(0, 50), seconds=latency / 1000,
            provider=draw.choice(["ollama", None]), alias=draw.choice([None, None, "fast"]),
            at=NOW - dt.timedelta(minutes=draw.randint(0, days * 24 * 60))))
    return found


def raw(db: Database) -> list[UsageRecord]:
    with db.session() as s:
        return list(s.scalars(select(UsageRecord)))


def day_of(at: dt.datetime) -> str:
    return (at if at.tzinfo is None else at.astimezone(dt.UTC)).strftime("%Y-%m-%d")


def oracle_summary(rows: list[UsageRecord], names: dict[int, str]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """``usage.summary`` computed in Python from the raw rows."""
    groups: dict[tuple[Any, ...], list[UsageRecord]] = defaultdict(list)
    for r in rows:
        groups[(day_of(r.at), r.model, names.get(r.project_id or 0))].append(r)
    return {k: (len(g), sum(r.input_tokens for r in g), sum(r.output_tokens for r in g),
                sum(1 for r in g if r.status >= 400), round(sum(r.latency_ms for r in g) / len(g), 3))
            for k, g in groups.items()}


def got_summary(found: list[dict[str, Any]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {(r["day"], r["model"], r["project"]): (r["requests"], r["input_tokens"], r["output_tokens"],
                                                   r["errors"], r["mean_latency_ms"]) for r in found}


def same(got: dict[tuple[Any, ...], tuple[Any, ...]], expected: dict[tuple[Any, ...], tuple[Any, ...]]) -> None:
    """Equal counts; means equal but for the last digit (sums of floats added in another order)."""
    assert {k: v[:-1] for k, v in got.items()} == {k: v[:-1] for k, v in expected.items()}
    assert all(got[k][-1] == pytest.approx(v[-1], abs=0.0015) for k, v in expected.items())


def write_twice(db: Database, ids: dict[str, int]) -> UsageLedger:
    """The records through the ledger, then the same batches again with the same uids: a retried
    batch whose first COMMIT landed (its answer lost)."""
    ledger = UsageLedger(db)
    for record in records(ids):
        ledger.add(record)
    batch = _with_uids(ledger._pending)
    ledger._pending = []
    ledger._write(batch)
    ledger._write(batch[:250])  # replayed whole
    ledger._write([*batch[100:300], *_with_uids([batch[5][:-1]])])  # replayed in part, with one new row
    return ledger


def test_rollups_give_the_raw_rows_answers_with_duplicates_replayed(db: Database) -> None:
    ids = provision(db)
    write_twice(db, ids)
    rows = raw(db)
    assert len(rows) == 601  # 600, once each, and the one new row
    names = {ids["acme"]: "acme", ids["beta"]: "beta"}
    with db.session() as s:
        summary = usage.summary(s)
        acme = usage.summary(s, project="acme", since=dt.date(2025, 3, 1), until=dt.date(2025, 3, 10))
        totals = usage_report.totals(s, MONTH)
        per_key = usage_report.per_key(s, MONTH, "acme")
        series = usage_report.series(s, MONTH, projects={"beta"})
        bins = usage_report.latency_bins(s, MONTH, project="acme")
    same(got_summary(summary), oracle_summary(rows, names))
    same(got_summary(acme), oracle_summary(
        [r for r in rows if r.project_id == ids["acme"] and "2025-03-01" <= day_of(r.at) <= "2025-03-10"], names))
    assert sum(t["requests"] for t in totals) == 601
    assert {(t["project"], t["model"]): t["errors"] for t in totals} == {
        (names[p], m): sum(1 for r in rows if r.project_id == p and r.model == m and r.status >= 400)
        for p in names for m in ("nimble", "tev1")}
    assert {k["key_id"]: (k["requests"], k["rate_limited"]) for k in per_key} == {
        key: (sum(1 for r in rows if r.project_id == ids["acme"] and r.key_id == key),
              sum(1 for r in rows if r.project_id == ids["acme"] and r.key_id == key and r.status == 429))
        for key in (ids["a1"], ids["a2"], None)}
    beta = [r for r in rows if r.project_id == ids["beta"]]
    assert sum(s["statuses"]["other"] for s in series) == sum(1 for r in beta if not 200 <= r.status <= 599)
    assert sum(s["statuses"]["5xx"] for s in series) == sum(1 for r in beta if 500 <= r.status <= 599)
    acme_rows = [r for r in rows if r.project_id == ids["acme"]]
    for day, histogram in bins.items():  # the same bins, counts, lowest and highest as the raw rows
        values = sorted(r.latency_ms for r in acme_rows if day_of(r.at) == day)
        expected: dict[int, list[float]] = defaultdict(list)
        for v in values:
            expected[rollups.latency_bin(v)].append(v)
        assert sorted(histogram) == sorted((b, len(v), min(v), max(v)) for b, v in expected.items())
        p95 = usage_report.percentiles(histogram)
        assert p95 is not None and p95[0.95] <= values[max(1, math.ceil(0.95 * len(values))) - 1] * 1.1


def test_a_rebuild_gives_the_rollups_the_ledger_kept(db: Database) -> None:
    ids = provision(db)
    write_twice(db, ids)

    def kept() -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
        with db.session() as s:
            totals = {(*(getattr(r, k) for k in rollups.KEY), r.requests, r.input_tokens, r.output_tokens,
                       round(r.latency_ms, 6)) for r in s.scalars(select(UsageRollup))}
            latency = {(r.hour, r.project_id, r.bin, r.requests, r.low, r.high)
                       for r in s.scalars(select(UsageLatencyRollup))}
        return totals, latency
    before = kept()
    assert len(before[0]) > 100 and len(before[1]) > 100
    with db.engine.begin() as connection:
        for start, end in rollups.days(dt.date(2025, 2, 20), dt.date(2025, 3, 14)):
            rollups.rebuild(connection, start, end)
    assert kept() == before
    with db.engine.begin() as connection:  # a day whose records are gone: its rollups go too
        connection.execute(delete(UsageRecord).where(UsageRecord.at >= dt.datetime(2025, 3, 14, tzinfo=dt.UTC)))
        rollups.rebuild(connection, dt.datetime(2025, 3, 14, tzinfo=dt.UTC), dt.datetime(2025, 3, 15, tzinfo=dt.UTC))
    with db.session() as s:
        assert not any(usage_report.label(r.hour, False) == "2025-03-14" for r in s.scalars(select(UsageRollup)))


def answers(db: Database) -> dict[str, Any]:
    """Every report over 90 days (and the last 24 hours, by the hour), the means apart: a sum of
    floats added in another order may differ in its last digit."""
    quarter, day = Period.last(90, NOW), Period.last(1, NOW)
    means: dict[str, Any] = {}

    def apart(name: str, rows: list[dict[str, Any]], *key: str) -> list[dict[str, Any]]:
        means[name] = {tuple(r[k] for k in key): r.pop("mean_latency_ms") for r in rows}
        return rows
    with db.session() as s:
        found = {
            "summary": apart("summary", usage.summary(s), "day", "model", "project"),
            "acme": apart("acme", usage.summary(s, project="acme", since=dt.date(2025, 1, 1),
                                                 until=dt.date(2025, 2, 20)), "day", "model", "project"),
            "series": usage_report.series(s, quarter),
            "hours": usage_report.series(s, day, projects={"acme"}),
            "totals": apart("totals", usage_report.totals(s, quarter), "project", "model"),
            "csv": apart("csv", usage_report.totals_per_bucket(s, quarter), "bucket", "project", "model"),
            "keys": apart("keys", usage_report.per_key(s, quarter, "acme"), "key_id"),
            "bins": usage_report.latency_bins(s, quarter),
            "hour bins": usage_report.latency_bins(s, day, project="beta"),
        }
    found["series"].sort(key=lambda r: (r["bucket"], r["model"]))
    found["hours"].sort(key=lambda r: (r["bucket"], r["model"]))
    found["bins"] = {k: sorted(v) for k, v in found["bins"].items()}
    found["hour bins"] = {k: sorted(v) for k, v in found["hour bins"].items()}
    found["p95"] = usage_report.percentiles([b for v in found["bins"].values() for b in v])
    found["means"] = means
    return found


def same_answers(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert {k: v for k, v in got.items() if k != "means"} == {k: v for k, v in expected.items() if k != "means"}
    for name, means in expected["means"].items():
        assert got["means"][name].keys() == means.keys()
        assert all(got["means"][name][k] == pytest.approx(v, abs=0.0015) for k, v in means.items() if v is not None)


def test_the_day_level_gives_the_answers_the_hours_gave(db: Database) -> None:
    ids = provision(db)
    ledger = UsageLedger(db)
    for record in records(ids, 3000, days=90):
        ledger.add(record)
    asyncio.run(ledger.flush())

    def stored() -> int:
        with db.session() as s:
            return len(list(s.scalars(select(UsageRollup))))
    by_the_hour, hours = answers(db), stored()
    assert len(by_the_hour["csv"]) > 300 and len(by_the_hour["hours"]) > 5
    before = rollups.by_the_hour_from(NOW.date())
    outcome = retention.Outcome()
    retention.merge_old_days(db.engine, before, outcome)
    assert outcome.days_merged == 89 and not outcome.more  # 90 days and a part of one, yesterday and today kept
    assert stored() < hours  # (a few: this ledger is sparse, most keys are seen once a day)
    same_answers(answers(db), by_the_hour)
    with db.session() as s:  # one row per key at the day's 00:00; the last two days by the hour
        for r in s.scalars(select(UsageRollup)):
            hour = r.hour if r.hour.tzinfo is None else r.hour.astimezone(dt.UTC)
            assert hour.hour == 0 or hour.replace(tzinfo=dt.UTC) >= before
        assert {h.hour for h in s.scalars(select(UsageLatencyRollup.hour)).all()
                if h.replace(tzinfo=dt.UTC) < before} == {0}

    again = retention.Outcome()
    retention.merge_old_days(db.engine, before, again)
    assert again.days_merged == 0 and stored() < hours  # nothing left to merge: nothing changes
    same_answers(answers(db), by_the_hour)

    # A record written late (a spool replayed) into a merged day: counted at once, merged at the next run.
    late = RequestRecord(request_id="late", operation="decision", route="/v1/systemone", model="nimble",
                         project_id=ids["acme"], key_id=ids["a1"], status=200, input_tokens=5, output_tokens=1,
                         seconds=0.002, at=NOW - dt.timedelta(days=30, hours=3))
    ledger.add(late)
    asyncio.run(ledger.flush())
    with_late = answers(db)
    assert sum(r["requests"] for r in with_late["totals"]) == sum(r["requests"] for r in by_the_hour["totals"]) + 1
    retention.merge_old_days(db.engine, before, again)
    assert again.days_merged == 1
    same_answers(answers(db), with_late)


def test_a_batch_that_fails_adds_nothing_to_the_rollups(db: Database) -> None:
    """The rollups are written in the batch's transaction: a row the database refuses undoes both."""
    ids = provision(db)
    ledger = UsageLedger(db)
    ledger.add(RequestRecord(request_id="big", operation="decision", route="/v1/systemone", model="nimble",
                             project_id=ids["acme"], status=200, input_tokens=2**63, output_tokens=1))
    ledger.add(RequestRecord(request_id="ok", operation="decision", route="/v1/systemone", model="nimble",
                             project_id=ids["acme"], status=200, input_tokens=7, output_tokens=1))
    asyncio.run(ledger.flush())
    with db.session() as s:
        assert [(r["requests"], r["input_tokens"]) for r in usage.summary(s)] == [(1, 7)]


def test_the_usage_summary_pages_with_a_cursor(db: Database) -> None:
    ids = provision(db)
    write_twice(db, ids)
    with db.session() as s:
        whole = usage.summary(s)
        pages, after = [], None
        while True:
            page = usage.summary(s, limit=7, after=after)
            pages += page
            if len(page) < 7:
                break
            after = usage.after_cursor(usage.cursor(page[-1]))
    assert len(whole) > 40
    same(got_summary(pages), got_summary(whole))  # float sums added in another order may differ in the last digit
    assert [(r["day"], r["model"], r["project"]) for r in pages] == [
        (r["day"], r["model"], r["project"]) for r in whole]
    assert [(r["day"], r["model"], r["project"] or "") for r in whole] == sorted(
        (r["day"], r["model"], r["project"] or "") for r in whole)
    with pytest.raises(InvalidRequest, match="cursor is not one this API gave"):
        usage.after_cursor("not-a-cursor")


def test_the_requests_export_pages_by_time_and_id_once_each(db: Database) -> None:
    """Many records at one instant: paging by (at, id) neither skips nor repeats one."""
    ids = provision(db)
    at = NOW - dt.timedelta(hours=1)
    with db.session() as s:
        s.add_all([UsageRecord(at=at if i % 3 else at - dt.timedelta(seconds=i), request_id=f"e{i}",
                               project_id=ids["acme" if i % 4 else "beta"], operation="decision", model="nimble",
                               status=200, input_tokens=1, output_tokens=1, latency_ms=1.0) for i in range(95)])
    for filters, expected in ((Filters(), 95), (Filters(project="acme"), 71)):
        seen, before = [], None
        while True:
            with db.session() as s:
                page = usage_requests.export(s, filters, MONTH, before=before, limit=10)
            seen += page
            if len(page) < 10:
                break
            before = usage_requests.position(page[-1])
        assert len(seen) == expected and len({r["id"] for r in seen}) == expected
        assert [(r["time"], r["id"]) for r in seen] == sorted(((r["time"], r["id"]) for r in seen), reverse=True)


def test_recent_reads_a_project_by_its_id(db: Database) -> None:
    ids = provision(db)
    with db.session() as s:
        s.add_all([UsageRecord(at=NOW - dt.timedelta(minutes=i), request_id=f"q{i}",
                               project_id=ids["beta" if i in (3, 70) else "acme"], operation="decision",
                               model="nimble", status=200, input_tokens=1, output_tokens=1, latency_ms=1.0)
                   for i in range(100)])
    with db.session() as s:
        assert [r["request_id"] for r in usage.recent(s, project="beta")] == ["q3", "q70"]
        assert [r["request_id"] for r in usage.recent(s, projects={"beta", "acme"}, limit=5)] == [
            "q0", "q1", "q2", "q3", "q4"]
        assert usage.recent(s, project="nope") == []
