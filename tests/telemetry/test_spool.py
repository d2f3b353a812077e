"""The usage spool (app/telemetry/spool.py): a journal of every record, a full volume that keeps
what fit, files left by dead processes taken back at start, and two replicas in one directory."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db.models import AuditEntry
from app.db.session import Database
from app.telemetry import spool
from app.telemetry.spool import Journal
from app.telemetry.usage import UsageLedger
from tests.support import Stack
from tests.telemetry.test_ledger import away, record, rows


@pytest.fixture
def db(db: Database) -> Database:
    """The test database with a project the records belong to."""
    Stack.provision(db)
    return db


def lines(directory: Path, suffix: str = ".journal") -> list[bytes]:
    return [line for path in sorted(directory.glob(f"arbiter-usage-spool-*{suffix}"))
            for line in path.read_bytes().splitlines(keepends=True)]


def full_after(monkeypatch: pytest.MonkeyPatch, budget: list[int]) -> None:
    """The volume takes ``budget[0]`` bytes more, then answers ENOSPC (a short write first, as a
    disk does when the last blocks go)."""
    def write(fd: int, data: Any) -> int:
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = os.write(fd, bytes(data[:budget[0]]))
        budget[0] -= taken
        return taken
    monkeypatch.setattr(spool, "_write", write)


def journaled(db: Database, directory: Path, **options: Any) -> UsageLedger:
    journal = Journal(directory, **options)
    journal.open()
    return UsageLedger(db, journal=journal)


def killed(ledger: UsageLedger) -> None:
    """What SIGKILL does to a ledger's files: its descriptors closed (its lock with them), nothing else."""
    journal = ledger.journal
    assert journal is not None and journal._lock_fd is not None
    for segment in journal._segments:
        os.close(segment.fd)
    os.close(journal._lock_fd)
    journal._segments, journal._lock_fd = [], None


def test_records_are_on_disk_once_the_writer_ran(db: Database, tmp_path: Path) -> None:
    ledger = journaled(db, tmp_path)
    for i in range(20):
        ledger.add(record(i))
    assert lines(tmp_path) == []  # add() writes nothing itself
    assert ledger.journal is not None
    ledger.journal.sync_now()
    assert len(lines(tmp_path)) == 20 and ledger.journal.pending_records() == 20
    asyncio.run(ledger.flush())
    ledger.journal.sync_now()  # in the database: the segment is emptied
    assert lines(tmp_path) == [] and ledger.journal.pending_records() == 0
    asyncio.run(ledger.close())
    assert list(tmp_path.iterdir()) == [] and rows(db) == 20


def test_a_full_volume_keeps_every_record_that_fit_and_holds_the_rest_in_memory(
        db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = journaled(db, tmp_path)
    journal = ledger.journal
    assert journal is not None
    budget = [2000]
    full_after(monkeypatch, budget)
    for i in range(100):
        ledger.add(record(i))
    journal.sync_now()
    fit = lines(tmp_path)
    assert 0 < len(fit) < 100 and all(line.endswith(b"\n") for line in fit)  # whole records only
    assert journal.failing and ledger.pending == 100 and ledger.dropped == 0
    journal.sync_now()  # still full: tried again, nothing lost, nothing doubled
    assert lines(tmp_path) == fit
    budget[0] = 1 << 20  # room again: the rest goes in
    journal.sync_now()
    assert len(lines(tmp_path)) == 100 and not journal.failing
    asyncio.run(ledger.flush())
    asyncio.run(ledger.close())
    assert (rows(db), ledger.dropped, list(tmp_path.iterdir())) == (100, 0, [])


def test_a_shutdown_on_a_full_volume_keeps_what_fit_and_counts_only_the_rest(
        db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's measure: ENOSPC dropped all of a replica's records and left a .part file
    filling the volume. Now what fit is a loadable file and only what did not is counted."""
    total = 0
    for journaling in (False, True):
        directory = tmp_path / str(journaling)
        ledger = journaled(db, directory) if journaling else UsageLedger(db, spool_dir=directory)
        full_after(monkeypatch, [3000])
        for i in range(50):
            ledger.add(record(i))
        monkeypatch.setattr(ledger, "_write", away)
        asyncio.run(ledger.close(retry_for=0.0))
        kept = lines(directory)
        assert 0 < len(kept) < 50 and all(line.endswith(b"\n") for line in kept)
        assert ledger.dropped == 50 - len(kept)
        monkeypatch.undo()
        again = UsageLedger(db, spool_dir=directory)
        assert again.load_spool() == len(kept)
        asyncio.run(again.close())
        total += len(kept)
        assert list(directory.iterdir()) == [] and rows(db) == total


def test_leftovers_are_loaded_or_removed_at_start(db: Database, tmp_path: Path) -> None:
    """An older release's .part (cut short by a full disk), a dead process's journal and an empty
    file: loaded, the cut record and the unreadable line counted as dropped, and all removed."""
    row = ('["2026-12-01T10:00:00+00:00", "{id}", 1, null, "decision", "nimble", "ollama", 200, 3, 1, 2.5, null, '
           '"{uid}"]')
    part = tmp_path / "arbiter-usage-spool-7-aaaa.part"
    part.write_text("\n".join(row.format(id=f"p{i}", uid=f"{i:032x}") for i in range(3)) + '\n["2026-12-')
    old = time.time() - 3600
    os.utime(part, (old, old))
    (tmp_path / "arbiter-usage-spool-8-bbbb.lock").write_text("")  # its process is gone: nothing holds it
    (tmp_path / "arbiter-usage-spool-8-bbbb-000001.journal").write_text(
        row.format(id="j1", uid="b" * 32) + "\nnot json\n" + row.format(id="p1", uid=f"{1:032x}") + "\n")
    (tmp_path / "arbiter-usage-spool-9-cccc-000001.journal").write_text("")
    ledger = UsageLedger(db, spool_dir=tmp_path)
    assert ledger.load_spool() == 4  # p0-p2 and j1; p1 twice is one record
    assert ledger.dropped == 2  # the cut record and the line that is not one
    asyncio.run(ledger.flush())
    asyncio.run(ledger.close())
    assert rows(db) == 4 and list(tmp_path.iterdir()) == []
    with db.session() as session:
        entry = session.scalars(select(AuditEntry).where(AuditEntry.action == "usage.records_dropped")).one()
        assert entry.details["records"] == 2  # written once the database took a batch


def test_two_replicas_never_take_each_others_files_and_a_dead_ones_are_taken(
        db: Database, tmp_path: Path) -> None:
    first = journaled(db, tmp_path)
    for i in range(5):
        first.add(record(i))
    assert first.journal is not None
    first.journal.sync_now()
    second = journaled(db, tmp_path)
    assert second.load_spool() == 0  # the first runs: its journal is its own
    asyncio.run(first.flush())  # in the database, then killed before its journal heard of it
    killed(first)
    third = journaled(db, tmp_path)
    assert third.load_spool() == 5 and second.load_spool() == 0
    asyncio.run(third.flush())  # written again: stored once (record_uid)
    asyncio.run(third.close())
    asyncio.run(second.close())
    assert rows(db) == 5 and list(tmp_path.iterdir()) == []


def test_records_dropped_from_memory_stay_in_the_journal_for_the_next_start(
        db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.telemetry.usage.MAX_PENDING", 10)
    ledger = journaled(db, tmp_path)
    assert ledger.journal is not None
    for i in range(10):
        ledger.add(record(i))
    ledger.journal.sync_now()
    for i in range(10, 15):
        ledger.add(record(i))  # five of the first leave memory: they are on disk, not lost
    assert (ledger.pending, ledger.dropped) == (10, 0)
    asyncio.run(ledger.close())
    assert rows(db) == 10 and len(lines(tmp_path)) == 15  # the journal kept: five wait in it
    again = UsageLedger(db, spool_dir=tmp_path)
    assert again.load_spool() == 15
    asyncio.run(again.close())
    assert rows(db) == 15 and list(tmp_path.iterdir()) == []


def test_always_waits_for_the_fsync(db: Database, tmp_path: Path) -> None:
    ledger = journaled(db, tmp_path, always=True, interval=3600)  # no timer would write in time

    async def scenario() -> int:
        assert ledger.journal is not None
        ledger.journal.start()
        ledger.add(record(1))
        ledger.add(record(2))
        await ledger.durable()
        return len(lines(tmp_path))

    assert asyncio.run(scenario()) == 2
    asyncio.run(ledger.close())
