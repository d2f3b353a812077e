"""The organizations page over HTTP: each organization with links to its projects; adding and
renaming one (owner only, audited as the admin API audits it); bad input next to its form."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import closing

import httpx
import pytest

from tests.support import Stack, body
from tests.ui.conftest import csrf_of, ui_sign_in
from tests.ui.test_roles import FORMS, admin_key

ALERT = re.compile(r'<p class="error" role="alert" id="([^"]+)-error">([^<]*)</p>')


@pytest.fixture
def ui(stack: Stack) -> Iterator[httpx.Client]:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        yield client


def post(client: httpx.Client, path: str, **fields: str) -> httpx.Response:
    return client.post(path, data={"csrf": csrf_of(client.get("/ui/organizations").text), **fields})


def org_id(stack: Stack, name: str) -> int:
    with stack.client("admin") as admin:
        return next(int(o["id"]) for o in body(admin.get("/admin/organizations"), 200)["data"] if o["name"] == name)


def card(page: httpx.Response, org: int) -> str:
    return page.text.split(f'<article class="card" id="org-{org}"')[1].split("</article>")[0]


def test_each_organization_links_its_projects(ui: httpx.Client, stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/organizations", json={"name": "northwind"}), 201)
        made = body(admin.post("/admin/projects", json={"name": "triage", "organization": "northwind"}), 201)
        body(admin.post("/admin/organizations", json={"name": "empty-co"}), 201)
    page = ui.get("/ui/organizations")
    assert page.status_code == 200
    assert '<a href="/ui/organizations" aria-current="page">Organizations</a>' in page.text  # in the navigation
    assert f'<a href="/ui/projects/{made["id"]}">triage</a>' in card(page, org_id(stack, "northwind"))
    assert ">acme</a>" in card(page, org_id(stack, "default"))
    assert "No projects yet" in card(page, org_id(stack, "empty-co"))


def test_an_owner_renames_one_and_it_is_audited(ui: httpx.Client, stack: Stack) -> None:
    default = org_id(stack, "default")
    renamed = post(ui, f"/ui/organizations/{default}/rename", name="acme-corp")
    assert renamed.status_code == 303 and renamed.headers["location"] == f"/ui/organizations?done=renamed#org-{default}"
    page = ui.get(renamed.headers["location"])
    assert "Organization renamed" in page.text and ">acme-corp</h2>" in card(page, default)
    assert ">acme</a>" in card(page, default)  # its projects follow it
    with stack.client("admin") as admin:
        [entry] = [e for e in body(admin.get("/admin/audit"), 200)["data"] if e["action"] == "organization.rename"]
    assert entry["target"] == "organization:acme-corp" and entry["details"] == {"from": "default", "to": "acme-corp"}
    assert entry["actor"].startswith("admin-key:") and entry["request_id"] == renamed.headers["x-request-id"]


def test_adding_one_and_bad_input_beside_its_form(ui: httpx.Client, stack: Stack) -> None:
    added = post(ui, "/ui/organizations", name="globex")
    assert added.status_code == 303 and ">globex</h2>" in ui.get("/ui/organizations").text
    default, globex = org_id(stack, "default"), org_id(stack, "globex")
    rename, globex_form = f"/ui/organizations/{globex}/rename", f"org-{globex}"
    cases = [
        (rename, {"name": "default"}, globex_form, "organization 'default' already exists"),
        (rename, {"name": ""}, globex_form, "Name: String should have at least 1 character"),
        (rename, {"name": "x" * 201}, globex_form, "at most 200 characters"),
        (rename, {"name": "a\x00b"}, globex_form, "Name: must not contain control characters"),
        ("/ui/organizations/999/rename", {"name": "new"}, "org-999", "does not exist any more"),
        ("/ui/organizations", {"name": "globex"}, "add-organization", "organization 'globex' already exists"),
        ("/ui/organizations", {"name": ""}, "add-organization", "Name: String should have at least 1 character"),
    ]
    for path, fields, form, expected in cases:
        answer = post(ui, path, **fields)
        assert answer.status_code == 400, (path, fields, answer.status_code)
        assert expected in html.unescape(answer.text.split('id="error-summary"')[1]), fields  # summed up at the top
        if form != "org-999":  # a form that is on the page: the reason is beside it too
            shown = {k: html.unescape(v) for k, v in ALERT.findall(answer.text)}
            assert expected in shown.get(form, ""), (fields, shown)
        assert "Traceback" not in answer.text
    kept = post(ui, f"/ui/organizations/{globex}/rename", name="default")
    assert 'value="default"' in card(kept, globex) and "<details open>" in card(kept, globex)  # what was typed
    assert {o["name"] for o in body(stack.client("admin").get("/admin/organizations"), 200)["data"]} == {
        "default", "globex"}
    assert default != globex


def test_only_an_owner_changes_them(stack: Stack) -> None:
    default = org_id(stack, "default")
    for role in ("operator", "viewer"):
        with closing(ui_sign_in(stack.gateway.url, admin_key(stack, role))) as client:
            page = client.get("/ui/organizations")
            assert page.status_code == 200 and ">default</h2>" in page.text
            assert FORMS.findall(page.text) == ["/ui/sign-out"], role
            token = csrf_of(page.text)
            assert client.post(f"/ui/organizations/{default}/rename",
                               data={"csrf": token, "name": "taken-over"}).status_code == 403
            assert client.post("/ui/organizations", data={"csrf": token, "name": "new"}).status_code == 403
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "project-admin", projects=["acme"]))) as client:
        assert client.get("/ui/organizations").status_code == 403
        assert "/ui/organizations" not in client.get("/ui/projects").text
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as owner:
        forged = owner.post(f"/ui/organizations/{default}/rename", data={"name": "forged"})  # no CSRF token
        assert forged.status_code == 403
    assert org_id(stack, "default") == default
    with stack.client("admin") as admin:
        names = {o["name"] for o in body(admin.get("/admin/organizations"), 200)["data"]}
    assert names == {"default"}
