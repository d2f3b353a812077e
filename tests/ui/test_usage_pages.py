"""The usage pages over plain HTTP: latency and status charts beside tokens, usage per key, the
request drill-down and one request's page, the CSV downloads, and what each role sees."""

from __future__ import annotations

import csv
import datetime as dt
import html
import io
import math
import re
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import httpx
import pytest

from app.db.models import UsageRecord
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import CLI
from app.ui import usage_csv
from tests.support import Stack, body, decision, wait_for
from tests.ui.conftest import ui_sign_in
from tests.ui.test_roles import admin_key

ALERT = re.compile(r'<p class="error" role="alert" id="([^"]+)-error">([^<]*)</p>')


@pytest.fixture
def ui(stack: Stack) -> Iterator[httpx.Client]:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        yield client


def ids_of(stack: Stack) -> dict[str, int]:
    """Project and key ids by name (a key by its project's name and its own: "acme/")."""
    with stack.db.session() as s:
        found = {p.name: p.id for p in tenancy.list_projects(s)}
        for key in tenancy.list_keys(s, kind="project"):
            found[f"{tenancy.key_project_name(s, key)}/{key.name}"] = key.id
    return found


def add_usage(stack: Stack, project: str, count: int = 1, *, key: str = "", at: dt.datetime | None = None,
              **fields: Any) -> None:
    """``count`` ledger rows of ``project`` (its key named ``key``), as the ledger writes them
    (oldest first); a field given as a list has one value per row."""
    ids = ids_of(stack)
    at = at or dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    rows = []
    for i in range(count):
        values = {"request_id": f"{project}-{i}", "operation": "decision", "model": "nimble", "provider": "ollama",
                  "status": 200, "input_tokens": 10, "output_tokens": 1, "latency_ms": 12.5}
        values.update({k: v[i] if isinstance(v, list) else v for k, v in fields.items()})
        rows.append(UsageRecord(at=at, project_id=ids[project], key_id=ids[f"{project}/{key}"], **values))
    with stack.db.session() as s:
        s.add_all(rows)


def alerts(response: httpx.Response) -> dict[str, str]:
    return {form: html.unescape(text) for form, text in ALERT.findall(response.text)}


def part(page: str, start: str, end: str) -> str:
    assert start in page, start
    return page.split(start, 1)[1].split(end, 1)[0]


def legend(page: str, chart: str) -> dict[str, str]:
    items = re.findall(r'aria-hidden="true"></span>([^:<]+): ([^<]+)</li>', part(page, f'id="{chart}"', "</figure>"))
    return {name: html.unescape(text) for name, text in items}


def milliseconds(text: str) -> float:
    number, unit = re.match(r"([\d.]+) (ms|s)", text).groups()  # type: ignore[union-attr]
    return float(number) * (1000 if unit == "s" else 1)


def read_csv(response: httpx.Response) -> list[list[str]]:
    return list(csv.reader(io.StringIO(response.text)))


def test_the_charts_show_latency_and_statuses_beside_tokens(ui: httpx.Client, stack: Stack) -> None:
    latencies = [float(i) for i in range(1, 101)] + [3.0] * 10 + [2500.0] * 5
    statuses = [200] * 100 + [429] * 10 + [503] * 5
    add_usage(stack, "acme", 3, at=dt.datetime.now(dt.UTC) - dt.timedelta(days=1), latency_ms=40.0)
    add_usage(stack, "acme", 115, latency_ms=latencies, status=statuses)
    page = ui.get("/ui/usage?project=acme&days=7")
    assert page.status_code == 200
    latency = legend(page.text, "latency-chart")
    for name, q in (("p50", 0.5), ("p95", 0.95)):
        values = sorted([40.0] * 3 + latencies)
        exact = values[math.ceil(q * len(values)) - 1]
        assert milliseconds(latency[name]) == pytest.approx(exact, rel=0.1), (name, latency[name], exact)
    chart = part(page.text, 'id="latency-chart"', "</figure>")
    assert chart.count("<polyline") == 2 and chart.count("<circle") == 4  # two days, two lines
    assert legend(page.text, "status-chart") == {"2xx": "103 (87.3 %)", "4xx": "10 (8.5 %)", "5xx": "5 (4.2 %)"}
    assert "118 requests" in page.text
    assert legend(page.text, "tokens-chart") == {"nimble": "1\u202f298 tokens"}  # 118 x 11, as the number filter

    hourly = ui.get("/ui/usage?project=acme&days=1").text
    assert "Tokens per hour" in hourly and '<option value="1" selected>last 24 hours</option>' in hourly
    labels = re.findall(r'text-anchor="middle">([^<]+)</text>', part(hourly, 'id="latency-chart"', "</figure>"))
    assert labels and all(re.fullmatch(r"\d\d:00", label) for label in labels)
    assert part(hourly, 'id="latency-chart"', "</figure>").count("<circle") == 2  # this hour only: one dot a line
    assert legend(hourly, "status-chart")["2xx"] == "100 (87.0 %)"  # yesterday's three are out

    totals = ui.get("/ui/usage/totals.csv?project=acme&days=7")
    assert totals.status_code == 200 and totals.headers["content-type"] == "text/csv; charset=utf-8"
    today = dt.datetime.now(dt.UTC).date()
    first = today - dt.timedelta(days=6)
    assert totals.headers["content-disposition"] == f'attachment; filename="arbiter-usage-acme-{first}-{today}.csv"'
    rows = read_csv(totals)
    assert rows[0] == ["day", "project", "model", "requests", "input_tokens", "output_tokens", "status_2xx",
                       "status_3xx", "status_4xx", "status_5xx", "status_other", "mean_latency_ms"]
    assert sum(int(r[3]) for r in rows[1:]) == 118 and sum(int(r[8]) for r in rows[1:]) == 10
    assert ui.get("/ui/usage/totals.csv?project=nope").status_code == 404


def test_usage_per_key_from_the_project_page(ui: httpx.Client, stack: Stack) -> None:
    ids = ids_of(stack)
    project_page = ui.get(f"/ui/projects/{ids['acme']}").text
    assert 'href="/ui/usage/keys?project=acme"' in project_page
    with stack.db.session() as s:
        tenancy.create_key(s, KeyHasher(), CLI, kind="project", project="acme", name="batch")
    add_usage(stack, "acme", 4, status=[200, 200, 429, 500], input_tokens=100)
    add_usage(stack, "acme", 2, key="batch", latency_ms=[10.0, 30.0])
    page = ui.get("/ui/usage/keys?project=acme&days=7")
    assert page.status_code == 200 and stack.project_key not in page.text
    first = part(page.text, f'id="usage-key-{ids["acme/"]}"', "</tr>")
    cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", first)]
    assert cells[0] == f"{stack.project_key[:13]}…{stack.project_key[-4:]}"
    assert cells[2:9] == ["active", "4", "400", "4", "2", "1", "12.5 ms"]
    assert f"key={ids['acme/']}" in first  # to its requests
    batch_row = f'id="usage-key-{ids_of(stack)["acme/batch"]}"'
    batch = part(page.text, batch_row, "</tr>")
    assert ">batch<" in batch and ">20.0 ms<" in batch and ">never<" in batch
    assert page.text.index(f'id="usage-key-{ids["acme/"]}"') < page.text.index(batch_row)  # busiest first
    assert ui.get("/ui/usage/keys?project=nope").status_code == 404
    chooser = ui.get("/ui/usage/keys")
    assert chooser.status_code == 200 and 'href="/ui/usage/keys?project=acme&amp;days=14"' in chooser.text


def test_the_drill_down_filters_and_pages(ui: httpx.Client, stack: Stack) -> None:
    stack.new_project("beta")
    ids = ids_of(stack)
    add_usage(stack, "beta", 1, request_id="beta-only")
    add_usage(stack, "acme", 120, status=[(200, 404, 503)[i % 3] for i in range(120)],
              model=[("nimble", "tev1")[i % 2] for i in range(120)])
    first = ui.get("/ui/usage/requests?project=acme")
    assert first.status_code == 200
    seen: list[str] = []
    page = first
    while True:
        seen += re.findall(r'<code class="small">(acme-\d+)</code>', page.text)
        older = re.search(r'href="(/ui/usage/requests\?[^"]*before_id=\d+[^"]*)">Older requests', page.text)
        if older is None:
            break
        page = ui.get(html.unescape(older.group(1)))
        assert ">Newest<" in page.text
    assert seen == [f"acme-{i}" for i in range(119, -1, -1)]  # 50, 50, 20: each once, newest first
    failed = ui.get("/ui/usage/requests?status=5xx").text
    assert set(re.findall(r'<span class="badge bad">(\d+)</span>', failed)) == {"503"} and "beta-only" not in failed
    assert failed.count('<span class="badge bad">503</span>') == 40
    models = ui.get("/ui/usage/requests?model=tev1&status=errors").text
    assert models.count("<tr>") - 1 == 40  # odd rows; 404s and 503s, the header row aside
    by_key = ui.get(f"/ui/usage/requests?key={ids['beta/']}").text
    assert re.findall(r'<code class="small">([^<]+)</code>', by_key) == ["beta-only"]
    assert '<option value="beta" selected>' in by_key  # the key's project is filled in
    cases = [("status=teapot", "Status must be 2xx, 3xx, 4xx, 5xx, errors or a code from 100 to 599"),
             ("key=abc", "Key must be a key's id"), ("project=nope", "There is no project named 'nope'"),
             ("key=99999", "There is no project key with id 99999"),
             (f"project=acme&key={ids['beta/']}", f"Key {ids['beta/']} is not a key of 'acme'"),
             ("model=" + "m" * 201, "Model: at most 200 characters")]
    for query, expected in cases:
        refused = ui.get(f"/ui/usage/requests?{query}")
        assert refused.status_code == 400, query
        assert expected in alerts(refused).get("filters", ""), (query, alerts(refused))
        assert "Traceback" not in refused.text and "<tbody>" not in refused.text
        assert ui.get(f"/ui/usage/requests.csv?{query}").status_code == 400, query
    assert ui.get("/ui/usage/requests?days=abc&before_id=xyz").status_code == 200  # odd values: the defaults


def test_a_request_is_found_by_the_id_its_caller_got(ui: httpx.Client, stack: Stack) -> None:
    with stack.client() as tenant:
        named = tenant.post("/v1/systemone", json=decision(), headers={"X-Request-Id": "order-42:try-1"})
        unnamed = tenant.post("/v1/systemone", json=decision("missing"))
    assert named.status_code == 200 and unnamed.status_code == 404
    page = wait_for(lambda: (r := ui.get("/ui/usage/request?id=order-42:try-1")).status_code == 200 and r)
    shown = html.unescape(re.sub(r"<[^>]+>", " ", page.text))
    tokens = named.json()["usage"]
    for fact in ("order-42:try-1", "Status 200", "Backend ollama", "Model nimble",
                 f"{tokens['input_tokens']} in, {tokens['output_tokens']} out"):
        assert fact in " ".join(shown.split()), fact
    assert re.search(r"Latency \d+\.\d ms", " ".join(shown.split()))
    assert f'href="/ui/projects/{ids_of(stack)["acme"]}"' in page.text
    generated = unnamed.headers["x-request-id"]
    other = wait_for(lambda: (r := ui.get(f"/ui/usage/request?id=+{generated}+")).status_code == 200 and r)
    assert "Backend none reached" in " ".join(html.unescape(re.sub(r"<[^>]+>", " ", other.text)).split())
    bad = ui.get("/ui/usage/request", params={"id": "two words"})
    assert bad.status_code == 400 and "A request id is 1 to 64 letters" in alerts(bad)["find"]
    missing = ui.get("/ui/usage/request?id=never-sent")
    assert missing.status_code == 404 and "No request with this id" in missing.text
    assert ui.get("/ui/usage/request").status_code == 200  # the search box alone


def test_the_requests_csv_streams_every_row_with_formulas_defused(ui: httpx.Client, stack: Stack) -> None:
    stack.new_project("=cmd|' -C calc'!A0")
    add_usage(stack, "acme", 2100, status=[500 if i % 7 == 0 else 200 for i in range(2100)])
    add_usage(stack, "=cmd|' -C calc'!A0", 1, request_id="-1+2", model="@SUM(A1)", alias="+alias")
    download = ui.get("/ui/usage/requests.csv?days=7")
    assert download.status_code == 200 and download.headers["content-type"] == "text/csv; charset=utf-8"
    today = dt.datetime.now(dt.UTC).date()
    assert download.headers["content-disposition"] == (
        f'attachment; filename="arbiter-requests-all-{today - dt.timedelta(days=6)}-{today}.csv"')
    rows = read_csv(download)
    assert rows[0][:3] == ["time", "request_id", "project"] and len(rows) == 1 + 2101  # past two 1,000-row reads
    assert len({r[1] for r in rows[1:]}) == 2101
    evil = rows[1]  # newest first
    assert evil[1:3] == ["'-1+2", "'=cmd|' -C calc'!A0"] and evil[7:9] == ["'@SUM(A1)", "'+alias"]
    assert evil[9] == "ollama" and evil[10] == "200"
    failed = read_csv(ui.get("/ui/usage/requests.csv?project=acme&status=5xx"))
    assert len(failed) == 1 + 300 and {r[10] for r in failed[1:]} == {"500"}
    totals = read_csv(ui.get("/ui/usage/totals.csv"))
    assert [r[1] for r in totals[1:]] == ["'=cmd|' -C calc'!A0", "acme"]  # one day, by project


def test_a_cell_a_spreadsheet_splits_at_a_semicolon_is_quoted_and_defused(ui: httpx.Client, stack: Stack) -> None:
    """A spreadsheet in a locale whose separator is ';' splits an unquoted cell there: the part
    after it must not start a formula."""
    name = "ops;=cmd|' /C calc'!A0"
    with stack.client("admin") as owner:
        body(owner.post("/admin/projects/acme/keys", json={"name": name}), 201)
    add_usage(stack, "acme", 1, key=name, model="nimble\t-2+3")
    download = ui.get("/ui/usage/requests.csv?days=7")
    assert download.status_code == 200
    assert "\"ops;'=cmd|' /C calc'!A0\"" in download.text and "\"nimble\t'-2+3\"" in download.text
    for separator in (",", ";", "\t"):
        cells = [c for row in csv.reader(io.StringIO(download.text), delimiter=separator) for c in row]
        assert not [c for c in cells if c.lstrip(" ").startswith(usage_csv.FORMULA_START)], separator
    row = read_csv(download)[1]
    assert row[5] == "ops;'=cmd|' /C calc'!A0" and row[7] == "nimble\t'-2+3"  # read back as one cell each


def test_an_id_of_a_digit_that_is_no_number_is_never_a_500(ui: httpx.Client, stack: Stack) -> None:
    """"²" is a digit to str.isdigit() and no number to int()."""
    for path in ("/ui/usage/requests?key=%C2%B2", "/ui/usage/requests.csv?key=%C2%B2"):
        assert ui.get(path).status_code == 400, path
    for path in ("/ui/audit?before_id=%C2%B2", "/ui/usage/requests?before_id=%C2%B2", "/ui/usage?days=%C2%B2"):
        assert ui.get(path).status_code == 200, path  # page 1 and the default period, as for any other text
    assert ui.get("/ui/projects/%C2%B2").status_code in (400, 404)


def test_each_role_sees_the_usage_it_may(stack: Stack) -> None:
    stack.new_project("beta")
    ids = ids_of(stack)
    add_usage(stack, "acme", 3, model="acme-model")
    add_usage(stack, "beta", 2, model="beta-model", request_id="beta-req")
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "project-admin", projects=["acme"]))) as ui:
        charts = ui.get("/ui/usage").text
        assert "acme-model" in charts and "beta-model" not in charts and '<option value="beta"' not in charts
        assert "There is no such project" in ui.get("/ui/usage?project=beta").text  # as before: never whose it is
        assert "beta-model" not in ui.get("/ui/usage?project=beta").text
        assert ui.get("/ui/usage/keys?project=acme").status_code == 200
        for path in ("/ui/usage/keys?project=beta", "/ui/usage/requests?project=beta",
                     f"/ui/usage/requests?key={ids['beta/']}", "/ui/usage/requests.csv?project=beta"):
            assert ui.get(path).status_code == 403, path
        listed = ui.get("/ui/usage/requests").text
        assert "acme-0" in listed and "beta-req" not in listed
        assert ui.get("/ui/usage/request?id=beta-req").status_code == 404
        assert ui.get("/ui/usage/request?id=acme-0").status_code == 200
        assert ui.get("/ui/usage/totals.csv?project=beta").status_code == 404
        assert {r[1] for r in read_csv(ui.get("/ui/usage/totals.csv"))[1:]} == {"acme"}
        assert {r[2] for r in read_csv(ui.get("/ui/usage/requests.csv"))[1:]} == {"acme"}
    with stack.client("admin") as owner:
        entries = body(owner.get("/admin/audit", params={"limit": 100}), 200)["data"]
    refused = [e for e in entries if e["action"] == "permission.denied" and e["details"]["role"] == "project-admin"]
    # Folded per key and minute (app/audit.py fold_key): each entry names its minute's first refused
    # page, and the counts add up to every refusal.
    assert {e["details"]["path"] for e in refused} <= {"/ui/usage/keys", "/ui/usage/requests", "/ui/usage/requests.csv"}
    assert sum(e["count"] for e in refused) == 4  # the four pages above
    with closing(ui_sign_in(stack.gateway.url, admin_key(stack, "viewer"))) as viewer:
        assert "beta-req" in viewer.get("/ui/usage/requests?project=beta").text
        assert viewer.get("/ui/usage/keys?project=beta").status_code == 200
        assert viewer.get("/ui/usage/request?id=beta-req").status_code == 200
