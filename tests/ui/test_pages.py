"""The web UI's pages and forms over plain HTTP: bad input gets a clear message next to its form,
version gating and the mesh warning show where they apply, and nothing unescaped or secret leaks."""

from __future__ import annotations

import datetime as dt
import html
import re
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import httpx
import pytest

from app.db.models import ApiKey
from app.errors import Conflict
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from tests.support import Gateway, Stack, decision
from tests.ui.conftest import csrf_of, ui_sign_in

ALERT = re.compile(r'<p class="error" role="alert" id="([^"]+)-error">([^<]*)</p>')


@pytest.fixture
def ui(stack: Stack) -> Iterator[httpx.Client]:
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as client:
        yield client


def post(client: httpx.Client, path: str, page: str, **fields: Any) -> httpx.Response:
    """Submit a form the way the browser does: with the CSRF token of the page it is on."""
    token = csrf_of(client.get(page).text)
    return client.post(path, data={"csrf": token, **fields})


def alerts(response: httpx.Response) -> dict[str, str]:
    return {form: html.unescape(text) for form, text in ALERT.findall(response.text)}


def service_id(client: httpx.Client, name: str) -> int:
    found = re.search(rf'<a href="/ui/services/(\d+)">{re.escape(name)}</a>', client.get("/ui/services").text)
    assert found, name
    return int(found.group(1))


def test_bad_service_input_is_shown_next_to_the_form(ui: httpx.Client, stack: Stack) -> None:
    cases = [
        ({"type": "ollama-external", "url": "not a url"}, "URL must be an http(s):// URL"),
        ({"type": "ollama-external", "url": "http://127.0.0.1:9"}, "Cannot add service"),
        ({"type": "ollama-external", "url": stack.ollama.url, "name": "ollama"}, "already exists"),
        ({"type": "ollama-external", "url": stack.ollama.url, "text_limit": "lots"},
         "Text limit must be a whole number"),
        ({"type": "ollama-external", "url": stack.ollama.url, "timeout": "0"}, "timeout: Input should be greater"),
        ({"type": "ollama-cloud"}, "needs its api_key"),
        ({"type": "mainframe", "url": stack.ollama.url}, "unknown service type"),
    ]
    for fields, expected in cases:
        answer = post(ui, "/ui/services", "/ui/services", **fields)
        assert answer.status_code == 400, fields
        shown = alerts(answer)
        assert expected.lower() in shown.get("add-service", "").lower(), (fields, shown)
        assert "Traceback" not in answer.text
        if "url" in fields:
            assert f'value="{fields["url"]}"' in answer.text or fields["url"] == "not a url"  # filled in again
    secret = post(ui, "/ui/services", "/ui/services", type="vllm", url="http://127.0.0.1:9", api_key="s3cr3t-key")
    assert secret.status_code == 400 and "s3cr3t-key" not in secret.text  # never sent back


def test_a_service_is_changed_refreshed_and_removed(ui: httpx.Client, stack: Stack) -> None:
    sid = service_id(ui, "ollama")
    page = f"/ui/services/{sid}"
    nothing = post(ui, page, page)
    assert nothing.status_code == 400 and "Nothing to change" in alerts(nothing)["change"]
    too_long = post(ui, page, page, timeout="99999")
    assert too_long.status_code == 400 and "Timeout: Input should be less than" in alerts(too_long)["change"]
    changed = post(ui, page, page, timeout="42")
    assert changed.status_code == 303
    assert "42.0 s" in ui.get(page).text and "Service changed." in ui.get(changed.headers["location"]).text
    stack.ollama_state.models["tev1"] = ["decision"]
    refreshed = post(ui, f"{page}/refresh", page)
    assert refreshed.status_code == 303 and ">tev1<" in ui.get(page).text
    removed = post(ui, f"{page}/delete", page)
    assert removed.status_code == 303 and removed.headers["location"] == "/ui/services?done=removed"
    assert "No services yet" in ui.get("/ui/services").text
    assert ui.get(page).status_code == 404
    with stack.client("admin") as admin:
        actions = [e["action"] for e in admin.get("/admin/audit").json()["data"][:3]]
    assert actions == ["service.delete", "service.refresh", "service.update"]


def test_version_gating_is_shown_where_it_applies(ui: httpx.Client, stack: Stack) -> None:
    old = OllamaState(version="0.34.9")
    with EmulatorServer(make_ollama_app(old)) as server:
        assert post(ui, "/ui/services", "/ui/services", type="ollama-external", url=server.url,
                    name="old").status_code == 303
        message = "Decision models need Ollama 0.35.0 or newer; this Ollama is 0.34.9."
        services = ui.get("/ui/services").text
        assert message in services and "Skipped: nimble (" in services
        sid = service_id(ui, "old")
        assert message in ui.get(f"/ui/services/{sid}").text
        models = ui.get("/ui/models").text
        assert f"old: {message}" in models
        refused = post(ui, "/ui/models/install", "/ui/models", model="tev1", service=str(sid))
        assert refused.status_code == 400 and alerts(refused)["install-3"] == message
        old.version = "0.35.1"  # upgraded: Refresh lifts the gate, no restart
        assert post(ui, f"/ui/services/{sid}/refresh", f"/ui/services/{sid}").status_code == 303
        assert message not in ui.get("/ui/services").text


def test_bad_install_input(ui: httpx.Client, stack: Stack) -> None:
    sid = str(service_id(ui, "ollama"))
    cases = [
        ({"form": "custom", "model": "mine", "service": sid}, "custom", "Tick at least one capability"),
        ({"form": "custom", "model": "", "service": sid, "capabilities": "decision"}, "custom",
         "Model: String should have at least 1 character"),
        ({"form": "custom", "model": "mine", "service": "x", "capabilities": "decision"}, "custom",
         "Choose a service"),
        ({"model": "nimble", "service": sid}, "install:nimble", "already installed"),
        ({"model": "clef:27b", "service": sid}, "install:clef:27b", "hosted on Ollama Cloud"),
        ({"model": "nimble", "service": "99999"}, "install:nimble", "does not exist any more"),
    ]
    for fields, form, expected in cases:
        answer = post(ui, "/ui/models/install", "/ui/models", **fields)
        assert answer.status_code == 400, fields
        shown = alerts(answer)
        where = "custom" if form == "custom" else next(k for k in shown if k.startswith("install-"))
        assert expected in shown[where], (fields, shown)
    custom = post(ui, "/ui/models/install", "/ui/models", form="custom", model="nimble", service=sid,
                  public_name="nimble-custom", capabilities="decision")
    assert custom.status_code == 400 and "already installed" in custom.text  # Ollama: by backend name


def test_the_mesh_warning_offers_install_anyway(ui: httpx.Client, stack: Stack,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """When the mesh warns (HTTP 409 mesh_warning) the page says why and offers "Install anyway",
    which sends the install again with confirm=true."""
    calls = _warn_always(stack, monkeypatch)
    sid = str(service_id(ui, "ollama"))
    warned = post(ui, "/ui/models/install", "/ui/models", model="tev1", service=sid)
    assert warned.status_code == 409 and calls == [["decision"]]
    assert "old-node (version 0.1.0) does not know decision models" in warned.text
    assert "confirm" not in warned.text.split("mesh-warning-title")[1].split("</p>")[0]  # no API hint
    form = warned.text.split('id="mesh-warning"')[1].split("</form>")[0]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    assert fields["confirm"] == "true" and fields["model"] == "tev1" and fields["service"] == sid
    assert "Install anyway" in form
    anyway = ui.post("/ui/models/install", data=fields)
    assert anyway.status_code == 303 and anyway.headers["location"].startswith("/ui/models?install=")
    assert calls == [["decision"]]  # confirmed: not asked again


def test_projects_allowlists_limits_and_keys(ui: httpx.Client, stack: Stack) -> None:
    bad = [({"name": ""}, "Name: String should have at least 1 character"),
           ({"name": "acme"}, "already exists"),
           ({"name": "x", "organization": "nowhere"}, "does not exist; create it first")]
    for fields, expected in bad:
        answer = post(ui, "/ui/projects", "/ui/projects", scope="all", **fields)
        assert answer.status_code == 400 and expected in alerts(answer)["create-project"], (fields, alerts(answer))
    made = post(ui, "/ui/projects", "/ui/projects", name="<img src=x onerror=alert(1)>", scope="list", models="nimble",
                more_models="clef, other")
    assert made.status_code == 303
    page = made.headers["location"].split("?")[0]
    text = ui.get(page).text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "<img src=x" not in text  # autoescaped
    with stack.client("admin") as admin:
        project = next(p for p in admin.get("/admin/projects").json()["data"]
                       if p["name"] == "<img src=x onerror=alert(1)>")
    assert project["models"] == ["clef", "nimble", "other"]
    limits = post(ui, f"{page}/limits", page, requests_per_minute="-1")
    assert limits.status_code == 400 and "Requests per minute: Input should be" in alerts(limits)["limits"]
    limits = post(ui, f"{page}/limits", page, tokens_per_minute="many")
    assert "Tokens per minute must be a whole number" in alerts(limits)["limits"]
    assert post(ui, f"{page}/limits", page, requests_per_minute="60").status_code == 303
    assert post(ui, f"{page}/models", page, scope="all").status_code == 303
    past = post(ui, f"{page}/keys", page, expires_at="2001-01-01T00:00")
    assert past.status_code == 400 and "expires_at is in the past" in alerts(past)["key"]
    key = post(ui, f"{page}/keys", page, name="ci", expires_at="2099-01-01T00:00")
    assert key.status_code == 303 and "arb_proj_" not in key.headers["location"]  # never in the URL
    value = re.search(r'value="(arb_proj_[A-Za-z0-9]{43})"',  # type: ignore[union-attr]
                      ui.get(key.headers["location"]).text).group(1)
    later = ui.get(page).text
    assert value not in later and f"{value[:13]}…{value[-4:]}" in later  # prefix and last four only
    archived = post(ui, f"{page}/archive", page, archived="true")
    assert archived.status_code == 303 and "archived" in ui.get(archived.headers["location"]).text
    with httpx.Client(base_url=stack.gateway.url, headers={"Authorization": f"Bearer {value}"}) as tenant:
        assert tenant.post("/v1/systemone", json=decision()).status_code == 403
    assert post(ui, f"{page}/archive", page, archived="maybe").status_code == 400


def test_usage_audit_and_unknown_pages(ui: httpx.Client, stack: Stack) -> None:
    with stack.client() as tenant:
        for _ in range(3):
            assert tenant.post("/v1/systemone", json=decision()).status_code == 200
        assert tenant.post("/v1/systemone", json=decision("missing")).status_code == 404
    deadline = time.monotonic() + 15  # generous: a loaded host (CI runs two passes at once)
    # The ledger writes in batches, and the page's chart and its list of requests are two queries:
    # a batch may land between them, so wait for both to show it.
    while (usage := ui.get("/ui/usage?project=acme&days=7")).text.count('<span class="badge ok">200</span>') < 3 \
            or '<span class="badge bad">404</span>' not in usage.text or "<rect" not in usage.text:
        assert time.monotonic() < deadline, "usage never showed"
        time.sleep(0.1)
    tokens_chart = usage.text.split('id="tokens-chart"')[1].split("</figure>")[0]
    assert tokens_chart.count("<rect") == 1 and "nimble" in tokens_chart  # the 404 has no tokens
    status_chart = usage.text.split('id="status-chart"')[1].split("</figure>")[0]
    assert status_chart.count('<rect class="status-2xx"') == 1 and status_chart.count('<rect class="status-4xx"') == 1
    assert usage.text.count('<span class="badge ok">200</span>') == 3
    assert ui.get("/ui/usage?project=nope").text.count("There is no such project") == 1
    assert "last 14 days" in ui.get("/ui/usage?days=13").text  # an odd period falls back
    audit = ui.get("/ui/audit").text
    assert "project.create" in audit and "service.create" in audit
    assert ui.get("/ui/audit?before_id=1").status_code == 200
    missing = ui.get("/ui/does-not-exist")
    assert missing.status_code == 404 and "There is no page at this address" in missing.text
    for path in ("/ui/static/../session.py", "/ui/static/nothing.css", "/ui/static/%2e%2e%2fweb.py"):
        assert ui.get(path).status_code == 404, path
    css = ui.get("/ui/static/arbiter.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")


def test_the_mesh_page(ui: httpx.Client, stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    standalone = "This node is standalone (no mesh configured: set ARBITER_MESH_KEY and ARBITER_MESH_PEERS)"
    assert standalone in ui.get("/ui/mesh").text
    mesh = getattr(stack.gateway.app.components, "mesh", None)
    if mesh is None:
        return
    status = {"enabled": True,
              "node": {"name": "node-a", "url": "http://a:8080", "version": "0.2.0", "decision_models": True},
              "peers": [{"name": "node-b", "url": "http://b:8080", "direction": "outbound", "state": "connected",
                         "version": "0.2.0", "decision_models": True, "last_contact": "2025-01-02T03:04:05+00:00",
                         "error": None, "models": [{"name": "tev1", "type": "decision",
                                                    "capabilities": ["decision"], "hops": 1}]},
                        {"name": "node-c", "url": "http://c:8080", "direction": "inbound", "state": "refused_us",
                         "version": "0.1.0", "decision_models": False, "last_contact": None,
                         "error": "node-c refused our model list: it does not know decision models", "models": []}],
              "refused": [{"at": "2025-01-02T03:04:05+00:00", "peer": "node-c", "address": "10.0.0.3",
                           "reason": "decision models unknown"}]}
    monkeypatch.setattr(mesh, "status", lambda: status)
    page = ui.get("/ui/mesh").text
    assert standalone not in page
    for text in ("node-a", "node-b", "node-c", "refused_us", "tev1", "2025-01-02 03:04:05 UTC",
                 "node-c refused our model list", "decision models unknown", "10.0.0.3"):
        assert text in page, text

    def broken() -> dict[str, Any]:
        raise RuntimeError("boom")
    monkeypatch.setattr(mesh, "status", broken)
    failed = ui.get("/ui/mesh")
    assert failed.status_code == 200 and "could not be read" in failed.text and "boom" not in failed.text


def test_label_reading_is_turned_on_and_off_on_a_card(ui: httpx.Client, stack: Stack) -> None:
    models = stack.client("admin").get("/admin/models").json()["data"]
    llama = next(m for m in models if m["public_name"] == "llama3.2")
    assert stack.client().post("/v1/systemone", json=decision("llama3.2")).status_code == 400
    page = ui.get("/ui/models").text
    assert f'id="read-strategy-{llama["id"]}"' in page
    nimble = next(m for m in models if m["public_name"] == "nimble")
    assert f'id="read-strategy-{nimble["id"]}"' not in page  # a decision model has no such choice
    on = post(ui, f"/ui/models/{llama['id']}", "/ui/models", read_strategy="labels")
    assert on.status_code == 303, alerts(on)
    assert "decisions by label reading" in ui.get("/ui/models").text
    assert stack.client().post("/v1/systemone", json=decision("llama3.2")).status_code == 200
    off = post(ui, f"/ui/models/{llama['id']}", "/ui/models", read_strategy="native")
    assert off.status_code == 303
    assert stack.client().post("/v1/systemone", json=decision("llama3.2")).status_code == 400


def test_embedding_similarity_and_its_temperature_are_set_on_a_card(ui: httpx.Client, stack: Stack) -> None:
    stack.ollama_state.models["nomic-embed-text"] = ["embedding"]
    assert stack.client("admin").post("/admin/services/ollama/refresh").status_code == 200
    models = stack.client("admin").get("/admin/models").json()["data"]
    nomic = next(m for m in models if m["public_name"] == "nomic-embed-text")
    assert f'id="read-strategy-{nomic["id"]}"' in ui.get("/ui/models").text
    on = post(ui, f"/ui/models/{nomic['id']}", "/ui/models", read_strategy="embeddings",
              embedding_temperature="0.05")
    assert on.status_code == 303, alerts(on)
    page = ui.get("/ui/models").text
    assert "decisions by embedding similarity" in page and "temperature 0.05" in page
    assert stack.client().post("/v1/systemone", json=decision("nomic-embed-text")).status_code == 200


def _warn_always(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The mesh warns before every decision model (a known peer too old for them)."""
    class MeshWarning(Conflict):
        error_type = "mesh_warning"

    calls: list[list[str]] = []

    def check(capabilities: list[str]) -> None:
        calls.append(capabilities)
        if "decision" in capabilities:
            raise MeshWarning("mesh peer old-node (version 0.1.0) does not know decision models. "
                              "Send the request again with \"confirm\": true to install anyway.")

    mesh = getattr(stack.gateway.app.components, "mesh", None)
    if mesh is None:
        pytest.skip("this build has no mesh")
    monkeypatch.setattr(mesh, "check_decision_install", check)
    return calls


def _anyway(page: httpx.Response) -> list[tuple[str, str]]:
    form = page.text.split('id="mesh-warning"')[1].split("</form>")[0]
    return re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)


def test_the_mesh_warns_before_a_service_with_decision_models(ui: httpx.Client, stack: Stack,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a service that serves decision models: the same 409 mesh_warning as POST /admin/services,
    nothing added, and "Add anyway" adds it with confirm=true."""
    calls = _warn_always(stack, monkeypatch)
    with EmulatorServer(make_ollama_app(OllamaState())) as server:
        warned = post(ui, "/ui/services", "/ui/services", type="ollama-external", url=server.url,
                      name="second", timeout="33")
        assert warned.status_code == 409 and calls and "decision" in calls[0]
        assert "old-node (version 0.1.0) does not know decision models" in warned.text
        assert "second</a>" not in warned.text  # nothing added
        fields = dict(_anyway(warned))
        assert fields["confirm"] == "true" and fields["url"] == server.url and fields["timeout"] == "33"
        assert "Add anyway" in warned.text
        secret = post(ui, "/ui/services", "/ui/services", type="ollama-external", url=server.url, name="second",
                      api_key="s3cr3t-key")
        assert secret.status_code == 409 and "s3cr3t-key" not in secret.text  # never sent back: asked again
        assert 'id="mesh-warning-api_key" name="api_key" type="password"' in secret.text
        anyway = ui.post("/ui/services", data=fields)
        assert anyway.status_code == 303, alerts(anyway)
        assert "second</a>" in ui.get("/ui/services").text


def test_the_mesh_warns_before_label_reading(ui: httpx.Client, stack: Stack,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Label reading makes a decision model: the card's change warns as PATCH /admin/models does."""
    calls = _warn_always(stack, monkeypatch)
    models = stack.client("admin").get("/admin/models").json()["data"]
    llama = next(m for m in models if m["public_name"] == "llama3.2")
    warned = post(ui, f"/ui/models/{llama['id']}", "/ui/models", read_strategy="labels")
    assert warned.status_code == 409 and calls
    assert "decisions by label reading" not in warned.text  # nothing changed
    fields = dict(_anyway(warned))
    assert fields["confirm"] == "true" and fields["read_strategy"] == "labels" and "Save anyway" in warned.text
    assert f'action="/ui/models/{llama["id"]}"' in warned.text.split('id="mesh-warning"')[1]
    assert ui.post(f"/ui/models/{llama['id']}", data=fields).status_code == 303
    assert "decisions by label reading" in ui.get("/ui/models").text


def test_the_mesh_warning_keeps_custom_capabilities(ui: httpx.Client, stack: Stack,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _warn_always(stack, monkeypatch)
    sid = str(service_id(ui, "ollama"))
    token = csrf_of(ui.get("/ui/models").text)
    warned = ui.post("/ui/models/install", data={"csrf": token, "form": "custom", "model": "mine", "service": sid,
                                                 "capabilities": ["decision", "embedding"]})
    assert warned.status_code == 409
    assert ("capabilities", "decision") in _anyway(warned) and ("capabilities", "embedding") in _anyway(warned)
    custom = warned.text.split('id="custom"')[1]
    assert custom.count(" checked>") == 2 and 'value="mine"' in custom  # the form below keeps them too


def test_failed_changes_keep_what_was_typed(ui: httpx.Client, stack: Stack) -> None:
    sid = service_id(ui, "ollama")
    page = f"/ui/services/{sid}"
    bad = post(ui, page, page, timeout="99999", text_limit="4096")
    assert bad.status_code == 400
    change = bad.text.split('id="change"')[1]
    assert 'value="99999"' in change and 'value="4096"' in change
    models = stack.client("admin").get("/admin/models").json()["data"]
    nimble = next(m for m in models if m["public_name"] == "nimble")
    card = post(ui, f"/ui/models/{nimble['id']}", "/ui/models", public_name="renamed", timeout="-3")
    assert card.status_code == 400
    form = card.text.split(f'action="/ui/models/{nimble["id"]}"')[1].split("</form>")[0]
    assert 'value="renamed"' in form and 'value="-3"' in form
    assert "<details open>" in card.text.split(f'data-model="{nimble["id"]}"')[1].split("</details>")[0]


def test_a_model_timeout_is_removed(ui: httpx.Client, stack: Stack) -> None:
    models = stack.client("admin").get("/admin/models").json()["data"]
    nimble = next(m for m in models if m["public_name"] == "nimble")
    assert 'name="clear_timeout"' not in ui.get("/ui/models").text  # nothing to remove yet
    assert post(ui, f"/ui/models/{nimble['id']}", "/ui/models", timeout="12").status_code == 303
    page = ui.get("/ui/models").text
    assert "timeout 12.0 s" in page and 'name="clear_timeout"' in page
    assert post(ui, f"/ui/models/{nimble['id']}", "/ui/models", clear_timeout="1").status_code == 303
    assert stack.client("admin").get(f"/admin/models/{nimble['id']}").json()["timeout"] is None


def test_refresh_of_a_service_that_is_down_says_so(ui: httpx.Client, stack: Stack) -> None:
    with EmulatorServer(make_ollama_app(OllamaState())) as server:
        assert post(ui, "/ui/services", "/ui/services", type="ollama-external", url=server.url,
                    name="brief", confirm="true").status_code == 303
        sid = service_id(ui, "brief")
    down = post(ui, f"/ui/services/{sid}/refresh", f"/ui/services/{sid}")
    assert down.status_code == 502 and "Could not read the service" in alerts(down)["refresh"]
    assert "Version and models read again." not in down.text


def test_a_failed_project_form_keeps_its_allowlist(ui: httpx.Client, stack: Stack) -> None:
    """A failed create gives back the allowlist as submitted, never "All models": fixing only the
    name and sending it again must not make a project that may use every model."""
    failed = post(ui, "/ui/projects", "/ui/projects", name="acme", scope="list", models="nimble",
                  more_models="typed-one")
    assert failed.status_code == 400 and "already exists" in alerts(failed)["create-project"]
    form = failed.text.split('id="create-project"')[1].split("</form>")[0]
    assert 'value="all" checked' not in form and 'value="list" checked' in form
    ticked = re.findall(r'name="models" value="([^"]+)" checked', form)
    assert ticked == ["nimble", "typed-one"]
    fixed = dict(re.findall(r'name="(name|organization)" type="text" value="([^"]*)"', form))
    assert fixed["name"] == "acme"


def test_failed_project_changes_keep_what_was_typed(ui: httpx.Client, stack: Stack) -> None:
    made = post(ui, "/ui/projects", "/ui/projects", name="typed", scope="all")
    page = made.headers["location"].split("?")[0]
    assert post(ui, f"{page}/limits", page, requests_per_minute="60").status_code == 303
    limits = post(ui, f"{page}/limits", page, requests_per_minute="90", tokens_per_minute="many")
    assert limits.status_code == 400
    form = limits.text.split('id="limits"')[1].split("</form>")[0]
    assert 'value="90"' in form and 'value="many"' in form and 'value="60"' not in form
    key = post(ui, f"{page}/keys", page, name="ci-key", expires_at="2001-01-01T00:00")
    assert key.status_code == 400
    form = key.text.split('id="key"')[1].split("</form>")[0]
    assert 'value="ci-key"' in form and 'value="2001-01-01T00:00"' in form


def _keys_of(stack: Stack, project: str) -> list[dict[str, Any]]:
    with stack.client("admin") as admin:
        return admin.get(f"/admin/projects/{project}/keys").json()["data"]  # type: ignore[no-any-return]


def test_a_new_key_is_shown_once_and_a_reload_makes_no_other(ui: httpx.Client, stack: Stack) -> None:
    """Post/Redirect/Get: the key is kept for one display; reloading the page it landed on shows
    nothing new and creates nothing."""
    made = post(ui, "/ui/projects", "/ui/projects", name="prg", scope="all")
    page = made.headers["location"].split("?")[0]
    created = post(ui, f"{page}/keys", page, name="once")
    assert created.status_code == 303
    landing = created.headers["location"]
    first = ui.get(landing)
    value = re.search(r'value="(arb_proj_[A-Za-z0-9]{43})"', first.text)
    assert first.status_code == 200 and value is not None and "Key created." in first.text
    again = ui.get(landing)  # the reload
    assert value.group(1) not in again.text and 'id="new-key-value"' not in again.text
    assert "shown once already" in again.text
    assert len(_keys_of(stack, "prg")) == 1
    with closing(ui_sign_in(stack.gateway.url, stack.admin_key)) as other:  # another session: nothing
        created = post(ui, f"{page}/keys", page, name="twice")
        assert 'id="new-key-value"' not in other.get(created.headers["location"]).text
        assert 'id="new-key-value"' in ui.get(created.headers["location"]).text


def test_a_new_key_is_shown_by_another_replica_without_redis(
        ui: httpx.Client, stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    """Two replicas sharing ARBITER_SECRET_KEY but no Redis, behind a balancer: the redirect after
    the POST lands on the other one, which shows the key (the browser carried it, sealed), once."""
    made = post(ui, "/ui/projects", "/ui/projects", name="lb", scope="all")
    page = made.headers["location"].split("?")[0]
    created = post(ui, f"{page}/keys", page, name="balanced")
    carried = created.headers["set-cookie"]
    assert carried.startswith("arbiter_new_key=") and "arb_proj_" not in carried  # sealed
    assert all(part in carried for part in ("HttpOnly", f"Path={page}", "SameSite=strict", "Max-Age=300"))
    replica = gateway_factory()
    with httpx.Client(base_url=replica.url, cookies=ui.cookies) as other:
        shown = other.get(created.headers["location"])
        assert shown.status_code == 200 and 'id="new-key-value"' in shown.text, shown.text[:500]
        value = re.search(r'value="(arb_proj_[A-Za-z0-9]{43})"', shown.text)
        assert value is not None and [k["last_four"] for k in _keys_of(stack, "lb")] == [value.group(1)[-4:]]
        assert 'arbiter_new_key=""' in shown.headers["set-cookie"]  # cleared
        assert 'id="new-key-value"' not in other.get(created.headers["location"]).text  # the reload
    replayed = carried.split(";")[0].split("=", 1)[1]
    for where in (stack.gateway, replica):  # the same session sends the spent cookie again, to either replica
        with httpx.Client(base_url=where.url, cookies=ui.cookies) as again:
            again.cookies.set("arbiter_new_key", replayed, path=page)
            answer = again.get(created.headers["location"])
            assert answer.status_code == 200 and 'id="new-key-value"' not in answer.text
            assert value.group(1) not in answer.text
    with closing(ui_sign_in(replica.url, stack.admin_key)) as stranger:  # another session, same cookie
        stranger.cookies.set("arbiter_new_key", carried.split(";")[0].split("=", 1)[1])
        assert 'id="new-key-value"' not in stranger.get(created.headers["location"]).text


def test_key_states_and_rotation(ui: httpx.Client, stack: Stack) -> None:
    made = post(ui, "/ui/projects", "/ui/projects", name="rot", scope="all")
    page = made.headers["location"].split("?")[0]
    pid = page.rsplit("/", 1)[1]
    with stack.client("admin") as admin:
        expired = admin.post("/admin/projects/rot/keys", json={"name": "old",
                                                                "expires_at": "2099-01-01T00:00:00Z"}).json()
        by_api = admin.post("/admin/projects/rot/keys", json={"name": "api"}).json()
        assert admin.post(f"/admin/keys/{by_api['id']}/rotate", json={"grace_seconds": 3600}).status_code == 201
    with stack.db.session() as s:  # expire one in the past (the API refuses past expiries)
        s.get(ApiKey, expired["id"]).expires_at = dt.datetime(2001, 1, 1)  # type: ignore[union-attr]
    text = ui.get(page).text
    row = text.split(f'id="key-{expired["id"]}"')[1].split("</tr>")[0]
    assert ">expired<" in row and "badge ok" not in row and "Revoke" not in row and "Rotate" not in row
    row = text.split(f'id="key-{by_api["id"]}"')[1].split("</tr>")[0]
    assert "rotated: works until" in row and "Rotate" not in row and "Revoke now" in row
    fresh = post(ui, f"{page}/keys", page, name="to-rotate")
    ui.get(fresh.headers["location"])
    key = next(k for k in _keys_of(stack, "rot") if k["name"] == "to-rotate")
    rotated = post(ui, f"/ui/keys/{key['id']}/rotate", page, project=pid, grace_minutes="5")
    assert rotated.status_code == 303, alerts(rotated)
    shown = ui.get(rotated.headers["location"]).text
    assert re.search(r'value="arb_proj_[A-Za-z0-9]{43}"', shown) and "Key rotated." in shown
    assert f"It replaces <code>{key['prefix']}…{key['last_four']}</code>" in shown
    row = shown.split(f'id="key-{key["id"]}"')[1].split("</tr>")[0]
    assert "rotated: works until" in row
    assert 'id="new-key-value"' not in ui.get(rotated.headers["location"]).text  # once
    twice = post(ui, f"/ui/keys/{key['id']}/rotate", page, project=pid, grace_minutes="5")
    assert twice.status_code == 400 and "rotated already" in alerts(twice)[f"key-{key['id']}"]
    fresh = post(ui, f"{page}/keys", page, name="second")
    ui.get(fresh.headers["location"])
    second = next(k for k in _keys_of(stack, "rot") if k["name"] == "second")
    bad = post(ui, f"/ui/keys/{second['id']}/rotate", page, project=pid, grace_minutes="-1")
    assert bad.status_code == 400 and "from 0 to 43200 minutes" in alerts(bad)[f"key-{second['id']}"]


def test_odd_query_values_fall_back_and_error_pages_keep_the_navigation(ui: httpx.Client, stack: Stack,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    usage = ui.get("/ui/usage?days=abc")
    assert usage.status_code == 200 and "last 14 days" in usage.text
    audit = ui.get("/ui/audit?before_id=abc")
    assert audit.status_code == 200 and "service.create" in audit.text
    # Ids past the 32-bit columns too: no such row, not a database error (PostgreSQL's int range).
    for path in ("/ui/does-not-exist", "/ui/services/99999", f"/ui/services/{2**31}", "/ui/projects/99999",
                 f"/ui/projects/{2**31}"):
        failed = ui.get(path)
        assert failed.status_code == 404 and 'aria-label="Main"' in failed.text, path  # signed in: the nav
    with httpx.Client(base_url=stack.gateway.url) as stranger:
        assert 'aria-label="Main"' not in stranger.get("/ui/does-not-exist").text
    mesh = getattr(stack.gateway.app.components, "mesh", None)
    if mesh is None:
        return
    peer = {"name": "node-u", "url": "http://u:8080", "direction": "outbound", "state": "connecting",
            "version": None, "decision_models": None, "last_contact": None, "error": None, "models": []}
    monkeypatch.setattr(mesh, "status", lambda: {
        "enabled": True, "refused": [], "peers": [peer],
        "node": {"name": "node-a", "url": "http://a:8080", "version": "0.2.0", "decision_models": True}})
    page = ui.get("/ui/mesh").text.split("node-u")[1]
    assert "<dd>unknown</dd>" in page and "not supported" not in page
