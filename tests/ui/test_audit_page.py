"""The audit log page over HTTP: details read as ``key: value`` (JSON as JSON, never a Python
repr), filters by actor, action and target that the paging links keep, and a clear 400 for a
filter that cannot be used."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import closing

import httpx
import pytest

from app.tenancy import service as tenancy
from tests.support import Stack, body
from tests.ui.conftest import ui_sign_in
from tests.ui.test_roles import admin_key

ROW = re.compile(r'<tr data-entry="(\d+)">(.*?)</tr>', re.DOTALL)
OLDER = re.compile(r'<a class="button secondary" href="([^"]+)">Older entries</a>')


@pytest.fixture
def ui(stack: Stack) -> Iterator[httpx.Client]:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        yield client


def rows(page: httpx.Response) -> list[str]:
    """Each entry's row as text (tags dropped), newest first."""
    assert page.status_code == 200, page.text
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", cells)).split()) for _, cells in ROW.findall(page.text)]


def actions(page: httpx.Response) -> list[str]:
    assert page.status_code == 200, page.text
    return [html.unescape(a)
            for a in re.findall(r'<td data-label="Action"><a [^>]*><code>([^<]+)</code></a></td>', page.text)]


def test_details_read_as_key_value_with_json_for_what_is_not_text(ui: httpx.Client, stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/projects", json={"name": "listed", "models": ["nimble", "clef"]}), 201)
        body(admin.patch("/admin/projects/listed", json={"requests_per_minute": 5, "tokens_per_minute": None}), 200)
    page = ui.get("/ui/audit")
    update, create = rows(page)[:2]
    assert "project.update" in update and "requests_per_minute: 5" in update and "tokens_per_minute: null" in update
    assert "None" not in update
    assert 'models: ["clef", "nimble"]' in create and "organization: default" in create
    assert "['nimble'" not in page.text and "{'" not in html.unescape(page.text)  # no Python repr anywhere
    assert '<code class="json">[&#34;clef&#34;, &#34;nimble&#34;]</code>' in page.text  # marked as JSON


def test_filters_by_actor_action_and_target(ui: httpx.Client, stack: Stack) -> None:
    other = admin_key(stack, "owner")
    with stack.client("admin") as admin:
        for name in ("alpha", "beta"):
            body(admin.post("/admin/projects", json={"name": name}), 201)
        body(admin.patch("/admin/projects/alpha", json={"requests_per_minute": 7}), 200)
        body(admin.post("/admin/projects/alpha/keys", json={}), 201)
    with stack.client(other) as second:
        body(second.post("/admin/projects", json={"name": "gamma"}), 201)

    assert actions(ui.get("/ui/audit", params={"action": "project.create"})) == ["project.create"] * 4  # acme too
    assert actions(ui.get("/ui/audit", params={"action": "project"})) == [
        "project.create", "project.update", "project.create", "project.create", "project.create"]
    assert actions(ui.get("/ui/audit", params={"action": "project.cre"})) == []  # a family ends at a dot
    alpha = rows(ui.get("/ui/audit", params={"target": "ALPHA"}))  # part of it, any case
    assert len(alpha) == 2 and all("project:alpha" in row for row in alpha)  # the key's target is key:<id>
    mine = rows(ui.get("/ui/audit", params={"actor": other[:14]}))
    assert len(mine) == 1 and "project:gamma" in mine[0]
    both = ui.get("/ui/audit", params={"action": "project.update", "target": "alpha"})
    assert actions(both) == ["project.update"]
    assert 'value="project.update"' in both.text and 'value="alpha"' in both.text  # the form keeps them
    assert "Clear the filters" in both.text
    none = ui.get("/ui/audit", params={"target": "%"})  # a wildcard is a plain character
    assert rows(none) == [] and "No entries match these filters." in none.text
    # A cell's link filters by it, keeping the filters in use.
    assert '<a href="/ui/audit?action=project.update&amp;target=project%3Aalpha"' in both.text


def test_paging_keeps_the_filters(ui: httpx.Client, stack: Stack) -> None:
    with stack.db.session() as session:
        for n in range(105):
            tenancy.create_project(session, f"bulk-{n:03d}", tenancy.CLI)
        tenancy.create_key(session, tenancy.KeyHasher(), tenancy.CLI, kind="project", project="bulk-000")
    first = ui.get("/ui/audit", params={"action": "project.create", "target": "bulk"})
    assert len(rows(first)) == 100 and "bulk-104" in rows(first)[0]
    older = OLDER.search(first.text)
    assert older, "no link to older entries"
    link = html.unescape(older.group(1))
    assert "action=project.create" in link and "target=bulk" in link and "before_id=" in link
    second = ui.get(link)
    assert [row.split("project:")[1].split()[0] for row in rows(second)] == [
        "bulk-004", "bulk-003", "bulk-002", "bulk-001", "bulk-000"]
    assert not OLDER.search(second.text)
    assert ('<a class="button secondary" href="/ui/audit?action=project.create&amp;target=bulk">Newest</a>'
            in second.text)


@pytest.mark.parametrize(("params", "expected"), [
    ({"actor": "x" * 201}, "The actor filter is longer than 200 characters"),
    ({"target": "project:\x00acme"}, "The target filter holds a control character"),
    ({"action": "project\n.create"}, "The action filter holds a control character"),
])
def test_a_filter_that_cannot_be_used_is_a_400_beside_the_form(ui: httpx.Client, params: dict[str, str],
                                                               expected: str) -> None:
    page = ui.get("/ui/audit", params=params)
    assert page.status_code == 400 and expected in html.unescape(page.text)
    assert 'id="audit-filters-error"' in page.text and 'href="#audit-filters-error"' in page.text  # summed up too
    assert "Traceback" not in page.text


def test_odd_paging_values_show_the_first_page(ui: httpx.Client) -> None:
    for value in ("abc", "-1", "0", str(2**70)):
        page = ui.get("/ui/audit", params={"before_id": value})
        assert page.status_code == 200 and rows(page), value
