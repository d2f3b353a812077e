"""The web UI under admin roles: what a role may not do is not offered, and posting it anyway is
a 403 (audited), on every form."""

from __future__ import annotations

import re
from contextlib import closing
from typing import Any

from fastapi.routing import iter_route_contexts

from tests.support import Stack, body
from tests.ui.conftest import csrf_of, ui_sign_in

FORMS = re.compile(r'<form(?: class="[^"]*")? method="post" action="([^"]+)"')
OPEN_TO_ALL = {"/ui/sign-in", "/ui/sign-out"}


def admin_key(stack: Stack, role: str, **fields: Any) -> str:
    with stack.client("admin") as owner:
        return str(body(owner.post("/admin/admin-keys", json={"role": role, **fields}), 201)["key"])


def ui_posts(stack: Stack) -> list[str]:
    """Every POST route of the UI (its forms and the JSON its scripts post), ids filled in."""
    paths = [context.path or "" for context in iter_route_contexts(stack.gateway.app.fastapi.routes)
             if "POST" in (context.methods or ()) and (context.path or "").startswith("/ui/")]
    assert len(paths) > 10, paths
    return [re.sub(r"\{[a-z_]+\}", "1", p) for p in paths if p not in OPEN_TO_ALL]


def test_a_viewer_sees_no_forms_and_cannot_post_any(stack: Stack) -> None:
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "viewer"))) as ui:
        project_id = re.search(r'href="/ui/projects/(\d+)"', ui.get("/ui/projects").text)
        assert project_id
        for page in ("/ui/services", "/ui/models", "/ui/projects", f"/ui/projects/{project_id.group(1)}"):
            shown = ui.get(page)
            assert shown.status_code == 200, page
            assert FORMS.findall(shown.text) == ["/ui/sign-out"], (page, FORMS.findall(shown.text))
        token = csrf_of(ui.get("/ui/services").text)
        for path in ui_posts(stack):
            answer = ui.post(path, data={"csrf": token, "name": "x", "project": "1"},
                             headers={"X-CSRF-Token": token})
            assert answer.status_code == 403, (path, answer.status_code)
    with stack.client("admin") as owner:
        entries = body(owner.get("/admin/audit", params={"limit": 1000}), 200)["data"]
    refused = [e for e in entries if e["action"] == "permission.denied" and e["details"]["role"] == "viewer"]
    # Every refusal counted, folded into one entry per key and minute (app/audit.py fold_key).
    assert sum(e["count"] for e in refused) == len(ui_posts(stack)), refused


def test_a_project_admin_has_its_projects_only(stack: Stack) -> None:
    stack.new_project("beta")
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "project-admin", projects=["acme"]))) as ui:
        assert ui.get("/ui/services").headers["location"] == "/ui/projects"  # its home
        listing = ui.get("/ui/projects").text
        ids = {name: pid for pid, name in re.findall(r'href="/ui/projects/(\d+)">([^<]+)</a>', listing)}
        assert set(ids) == {"acme"}, ids
        assert "/ui/audit" not in listing and "/ui/models" not in listing  # not in its navigation
        page = ui.get(f"/ui/projects/{ids['acme']}").text
        forms = FORMS.findall(page)
        assert f"/ui/projects/{ids['acme']}/keys" in forms and f"/ui/projects/{ids['acme']}/limits" in forms
        assert f"/ui/projects/{ids['acme']}/models" not in forms and f"/ui/projects/{ids['acme']}/archive" not in forms
        token = csrf_of(page)
        made = ui.post(f"/ui/projects/{ids['acme']}/keys", data={"csrf": token, "name": "ci"})
        assert made.status_code == 303
        for path in ("/ui/models", "/ui/audit", "/ui/mesh"):
            assert ui.get(path).status_code == 403, path
        with stack.client("admin") as owner:
            beta = next(p["id"] for p in body(owner.get("/admin/projects"), 200)["data"] if p["name"] == "beta")
        assert ui.get(f"/ui/projects/{beta}").status_code == 403
        assert ui.post(f"/ui/projects/{beta}/keys", data={"csrf": token, "name": "x"}).status_code == 403
        assert ui.post(f"/ui/projects/{ids['acme']}/archive",
                       data={"csrf": token, "archived": "true"}).status_code == 403
