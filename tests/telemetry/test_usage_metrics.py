"""The usage writer's health on /metrics: arbiter_usage_write_errors_total (batch writes that failed
and will be retried) and arbiter_usage_spool_records (records waiting in spool files)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from app.telemetry.spool_watch import SpoolWatch
from app.telemetry.usage import UsageLedger
from tests.support import Stack, decision, wait_for
from tests.telemetry.test_ledger import away, record, rows
from tests.telemetry.test_metrics import samples


def usage_metrics(stack: Stack, gateway: Any = None) -> tuple[float, float, float]:
    """(write errors, spooled records, pending records) as scraped."""
    with (gateway or stack.gateway).client(stack.admin_key) as admin:
        found = samples(admin.get("/metrics").text)
    return (found[("arbiter_usage_write_errors_total", ())], found[("arbiter_usage_spool_records", ())],
            found[("arbiter_usage_pending", ())])


def test_failed_writes_are_counted_while_the_records_wait(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    assert usage_metrics(stack) == (0.0, 0.0, 0.0)
    ledger = stack.gateway.app.components.ledger
    monkeypatch.setattr(ledger, "_write", away)  # the database is away for the writer
    with stack.client() as client:
        assert client.post("/v1/systemone", json=decision()).status_code == 200
    errors, spooled, pending = wait_for(lambda: (found := usage_metrics(stack))[0] >= 2 and found)
    assert (spooled, pending) == (0.0, 1.0)  # kept in memory, tried again every ARBITER_FLUSH_INTERVAL
    monkeypatch.undo()  # it is back
    wait_for(lambda: usage_metrics(stack)[2] == 0.0)
    settled = usage_metrics(stack)[0]
    assert settled >= errors and rows(stack.db) == 1
    assert usage_metrics(stack)[0] == settled  # no new failures once written


def test_records_found_at_start_in_a_spool_that_cannot_be_read_are_shown(
        stack: Stack, gateway_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lines of a spool file a start cannot read are counted as dropped (the metric, and the
    audit log once the database takes a batch) and the file goes: it must not fill the volume; a
    readable one is loaded and written as usual."""
    readable = UsageLedger(stack.db, spool_dir=tmp_path)
    for i in range(4):
        readable.add(record(i))
    monkeypatch.setattr(readable, "_write", away)
    asyncio.run(readable.close(retry_for=0.0))  # what a shutdown with the database away leaves
    (tmp_path / "arbiter-usage-spool-1-torn.jsonl").write_text('["2026-12-01T10:00:00+00:00", "a"]\nnot json\n\n{"x"\n')
    gateway = gateway_factory(usage_spool_dir=str(tmp_path))
    wait_for(lambda: rows(stack.db) == 4)  # the readable one's, written
    with gateway.client(stack.admin_key) as admin:
        found = samples(admin.get("/metrics").text)
    assert found[("arbiter_usage_records_dropped_total", ())] == 3.0  # the torn file's three lines
    wait_for(lambda: [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [])


def test_the_watch_counts_what_a_shutdown_kept_and_what_no_start_took_yet(
        stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[None] = []
    ledger = UsageLedger(stack.db, spool_dir=tmp_path, on_write_error=lambda: errors.append(None))
    for i in range(6):
        ledger.add(record(i))
    monkeypatch.setattr(ledger, "_write", away)
    asyncio.run(ledger.close(retry_for=0.3))
    assert (ledger.pending, ledger.dropped) == (0, 0)
    assert len(errors) >= 2  # the first try and at least one retry, each a failed batch write
    watch = SpoolWatch(tmp_path)
    assert watch.look() == 6
    (tmp_path / "arbiter-usage-spool-9-half.part").write_text("[1]\n[2")  # an older release's, cut short
    (tmp_path / "notes.jsonl").write_text("[1]\n[2]\n")  # not a spool file
    assert watch.look() == 7  # its whole line
    (spooled,) = tmp_path.glob("arbiter-usage-spool-*.journal")
    with spooled.open("a") as more:
        more.write("[1]\n\n")  # changed: counted again
    assert watch.look() == 8
    assert watch.bytes == sum(p.stat().st_size for p in tmp_path.glob("arbiter-usage-spool-*"))
    # The extra line is no record: the start loads the six before it (the .part is too young to
    # be taken: an older release may be writing it).
    assert UsageLedger(stack.db, spool_dir=tmp_path).load_spool() == 6
    assert sorted(p.suffix for p in tmp_path.glob("arbiter-usage-spool-*")) == [".loading", ".lock", ".part"]
    assert watch.look() == 8  # the claimed file's seven lines wait until written; the .part's one
    for left in tmp_path.glob("arbiter-usage-spool-*"):
        left.unlink()
    assert watch.look() == 0 and SpoolWatch(tmp_path / "missing").look() == 0 and SpoolWatch(None).look() == 0


def test_the_watch_looks_again_on_its_schedule(tmp_path: Path) -> None:
    """A file another replica's shutdown leaves in a shared directory is counted at the next look."""
    watch = SpoolWatch(tmp_path)

    async def scenario() -> int:
        task = asyncio.create_task(watch.run(0.02))
        (tmp_path / "arbiter-usage-spool-2-other.jsonl").write_text("[1]\n[2]\n")
        deadline = time.monotonic() + 10
        while watch.waiting != 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        return watch.waiting

    assert asyncio.run(scenario()) == 2
