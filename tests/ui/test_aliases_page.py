"""The Aliases section of the web UI's Models page: listed with their status, added and removed
with the same rules as the admin API, offered only to a role that may operate."""

from __future__ import annotations

from contextlib import closing

from tests.support import Stack, body
from tests.ui.conftest import csrf_of, ui_sign_in
from tests.ui.test_roles import admin_key


def test_add_list_and_remove_an_alias(stack: Stack) -> None:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as ui:
        page = ui.get("/ui/models")
        assert page.status_code == 200 and "No aliases." in page.text
        token = csrf_of(page.text)
        added = ui.post("/ui/models/aliases", data={"csrf": token, "alias": "jev-latest", "model": "nimble"})
        assert added.status_code == 303 and added.headers["location"] == "/ui/models?done=alias-added#aliases"
        shown = ui.get("/ui/models?done=alias-added").text
        assert 'data-alias="jev-latest"' in shown and "Alias added." in shown and ">active<" in shown
        refused = ui.post("/ui/models/aliases", data={"csrf": token, "alias": "clef", "model": "nimble"})
        assert refused.status_code == 400
        assert "an alias cannot shadow a model" in refused.text and 'id="alias-error"' in refused.text
        removed = ui.post("/ui/models/aliases/remove", data={"csrf": token, "alias": "jev-latest"})
        assert removed.status_code == 303
        assert "No aliases." in ui.get("/ui/models").text
        gone = ui.post("/ui/models/aliases/remove", data={"csrf": token, "alias": "jev-latest"})
        assert gone.status_code == 400 and "does not exist" in gone.text
    with stack.client("admin") as admin:
        actions = [e["action"] for e in body(admin.get("/admin/audit"), 200)["data"]
                   if e["action"].startswith("alias.")]
    assert actions == ["alias.remove", "alias.create"]


def test_a_viewer_sees_the_aliases_but_no_form(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json={"alias": "jev-latest", "model": "nimble"}), 201)
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "viewer"))) as ui:
        page = ui.get("/ui/models").text
    assert 'data-alias="jev-latest"' in page
    assert 'action="/ui/models/aliases' not in page
