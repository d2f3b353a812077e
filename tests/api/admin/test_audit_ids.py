"""The audit log's request id is Arbiter's own; the X-Request-Id a caller sent is kept beside it,
so no caller can make its change look like another request (SPEC §3)."""

from __future__ import annotations

import re
from contextlib import closing

from tests.support import Stack, body
from tests.ui.conftest import csrf_of, ui_sign_in

OWN_ID = re.compile(r"^[0-9a-f]{32}$")


def entry_for(stack: Stack, target: str) -> dict[str, object]:
    with stack.client("admin") as admin:
        entries = body(admin.get("/admin/audit"), 200)["data"]
    return next(e for e in entries if e["target"] == target)  # type: ignore[no-any-return]


def test_the_audit_log_keeps_arbiters_request_id_and_the_callers_beside_it(stack: Stack) -> None:
    with stack.client("admin") as admin:
        plain = admin.post("/admin/projects", json={"name": "plain"})
        named = admin.post("/admin/projects", json={"name": "named"}, headers={"X-Request-Id": "caller-42"})
        # A caller naming its change after someone else's request.
        mimic = admin.post("/admin/projects", json={"name": "mimic"},
                           headers={"X-Request-Id": plain.headers["x-request-id"]})
    assert plain.status_code == named.status_code == mimic.status_code == 201
    assert named.headers["x-request-id"] == "caller-42"  # still echoed (and logged) as before
    first = entry_for(stack, "project:plain")
    assert first["request_id"] == plain.headers["x-request-id"] and first["client_request_id"] is None
    second = entry_for(stack, "project:named")
    assert second["client_request_id"] == "caller-42"
    assert OWN_ID.match(str(second["request_id"])), second
    third = entry_for(stack, "project:mimic")
    assert third["client_request_id"] == first["request_id"]
    assert third["request_id"] != first["request_id"] and OWN_ID.match(str(third["request_id"]))


def test_the_ui_audit_page_shows_both_ids(stack: Stack) -> None:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        csrf = csrf_of(client.get("/ui/projects").text)
        made = client.post("/ui/projects", data={"name": "from-ui", "scope": "all", "csrf": csrf},
                           headers={"X-Request-Id": "ui-caller-7"})
        assert made.status_code == 303
        page = client.get("/ui/audit")
    own = entry_for(stack, "project:from-ui")["request_id"]
    assert OWN_ID.match(str(own)) and str(own) in page.text and "ui-caller-7" in page.text
