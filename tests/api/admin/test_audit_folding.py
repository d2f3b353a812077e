"""The audit log cannot be flooded: texts a caller controls are cut to 512 characters, and a key's
refusals on one route within a minute are one entry with a count, shown to an owner (admin API
and UI). On PostgreSQL the append-only trigger lets the count grow and nothing else."""

from __future__ import annotations

import datetime as dt
import json
from contextlib import closing
from typing import Any

from sqlalchemy import select

from app import audit
from app.db.models import AuditEntry
from tests.support import Stack, assert_error, body
from tests.ui.conftest import ui_sign_in
from tests.ui.test_roles import admin_key

LONG = "a" * 60_000


def table(stack: Stack) -> tuple[int, int]:
    """(rows, the longest row's size in characters) of the audit log."""
    with stack.db.session() as session:
        rows = session.scalars(select(AuditEntry)).all()
        return len(rows), max(len(r.actor) + len(r.target) + len(json.dumps(r.details)) for r in rows)


def refusals(stack: Stack, actor: str) -> list[dict[str, Any]]:
    with stack.client("admin") as owner:
        entries = body(owner.get("/admin/audit", params={"limit": 1000}), 200)["data"]
    return [e for e in entries if e["action"] == "permission.denied" and e["actor"] == actor]


def test_200_refusals_with_60000_character_paths_are_a_few_small_rows_with_their_count(stack: Stack) -> None:
    viewer = admin_key(stack, "viewer", name="flooder")
    before, _ = table(stack)
    started = dt.datetime.now(dt.UTC)
    with stack.gateway.client(viewer) as client:
        for _ in range(200):
            assert_error(client.delete(f"/admin/aliases/{LONG}"), 403, "permission_error")
    ended = dt.datetime.now(dt.UTC)
    rows, largest = table(stack)
    minutes = int((ended.replace(second=0, microsecond=0) - started.replace(second=0, microsecond=0))
                  .total_seconds() // 60) + 1
    assert rows - before <= minutes  # one row per minute the 200 took (one or two), not 200
    assert largest < 1024
    with stack.client("admin") as owner:
        me = next(k for k in body(owner.get("/admin/admin-keys"), 200)["data"] if k["name"] == "flooder")
    folded = refusals(stack, f"admin-key:{me['id']}:{me['prefix']}")
    assert sum(e["count"] for e in folded) == 200 and len(folded) <= minutes
    entry = folded[-1]
    assert entry["target"] == "route:DELETE /admin/aliases/{alias:path}" and entry["request_id"]
    path = entry["details"]["path"]
    assert len(path) == audit.CUT and path.endswith(audit.CUT_MARK) and path.startswith("/admin/aliases/aaa")
    # Another route in the same minute folds into the same entry: cycling through every route a
    # key may not use is still one entry a minute.
    with stack.gateway.client(viewer) as client:
        for route in ("/admin/services/x", "/admin/aliases/y", "/admin/mesh/peers/z"):
            assert_error(client.delete(route), 403, "permission_error")
    again = refusals(stack, entry["actor"])
    assert sum(e["count"] for e in again) == 203 and len(again) <= len(folded) + 1


def test_the_audit_page_shows_the_count_of_a_folded_entry(stack: Stack) -> None:
    viewer = admin_key(stack, "viewer")
    with stack.gateway.client(viewer) as client:
        for _ in range(3):
            assert_error(client.post("/admin/projects", json={}), 403, "permission_error")
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as ui:
        page = ui.get("/ui/audit", params={"action": "permission.denied"})
    # Three refusals: one entry "× 3", or, when they straddle a minute's end, "× 2" and one of 1.
    assert page.status_code == 200 and ("× 3" in page.text or "× 2" in page.text), page.text


def test_a_fold_is_one_entry_per_actor_action_and_minute(stack: Stack) -> None:
    minute = dt.datetime(2030, 1, 1, 12, 0, 5, tzinfo=dt.UTC)
    times = [minute, minute + dt.timedelta(seconds=50), minute + dt.timedelta(seconds=60)]
    with stack.db.session() as session:
        for at in times:
            audit.fold(session, actor="admin-key:9:x", action="permission.denied", target="route:GET /a", at=at,
                       details={"path": "/a", LONG: LONG, "list": [LONG]})
        audit.fold(session, actor="admin-key:9:x", action="permission.denied", target="route:GET /b", at=minute)
        audit.fold(session, actor="admin-key:8:y", action="permission.denied", target="route:GET /b", at=minute)
    with stack.db.session() as session:
        rows = session.scalars(select(AuditEntry).where(AuditEntry.actor == "admin-key:9:x")
                               .order_by(AuditEntry.id)).all()
        # Another route in the same minute adds to the first entry; the next minute is an entry of its own.
        assert [(r.target, r.count) for r in rows] == [("route:GET /a", 3), ("route:GET /a", 1)]
        other = session.scalars(select(AuditEntry).where(AuditEntry.actor == "admin-key:8:y")).all()
        assert [(r.target, r.count) for r in other] == [("route:GET /b", 1)]
        key = next(k for k in rows[0].details if k != "path" and k != "list")
        assert len(key) == audit.CUT and rows[0].details[key].endswith(audit.CUT_MARK)
        assert len(rows[0].details["list"][0]) == audit.CUT


def test_a_long_target_is_cut_to_its_column() -> None:
    assert audit.cut("x" * 600, 400) == "x" * (400 - len(audit.CUT_MARK)) + audit.CUT_MARK
    assert audit.cut("short") == "short"
