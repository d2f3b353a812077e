"""The admin API for projects, keys and the audit log (SPEC §3), over real HTTP."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx

from tests.support import Stack, assert_error, body, decision, tampered

JSON = {"Content-Type": "application/json"}
BAD_MODELS = ["some", "", [1], [""], [None], {"nimble": True}, 5, True, None]


def audit_log(stack: Stack, **params: Any) -> list[dict[str, Any]]:
    with stack.client("admin") as admin:
        return body(admin.get("/admin/audit", params=params), 200)["data"]  # type: ignore[no-any-return]


def new_key(stack: Stack, project: str = "acme", **fields: Any) -> dict[str, Any]:
    with stack.client("admin") as admin:
        return body(admin.post(f"/admin/projects/{project}/keys", json=fields), 201)  # type: ignore[no-any-return]


def decide(stack: Stack, key: str, model: str = "nimble") -> httpx.Response:
    with stack.gateway.client(key) as client:
        return client.post("/v1/systemone", json=decision(model))


def model_ids(stack: Stack, key: str) -> list[str]:
    with stack.gateway.client(key) as client:
        return [m["id"] for m in body(client.get("/v1/models"), 200)["data"]]


def secrets_of(*values: str) -> list[str]:
    """A key's value and its stored digest: neither may appear in any response."""
    return [*values, *(hashlib.sha256(v.encode()).hexdigest() for v in values)]


def admin_routes(stack: Stack) -> list[tuple[str, str]]:
    """Every /admin route the app documents, with its path parameters filled in."""
    with stack.gateway.client(stack.admin_key) as client:  # the schema takes an admin key
        spec = body(client.get("/openapi.json"), 200)
    routes = [(method.upper(), path.replace("{name}", "acme").replace("{key_id}", "1"))
              for path, item in spec["paths"].items() if path.startswith("/admin")
              for method in item]
    assert len(routes) >= 19, routes  # every admin route there is today
    return routes


# -- projects -----------------------------------------------------------------


def test_create_list_and_get_projects(stack: Stack) -> None:
    with stack.client("admin") as admin:
        created = body(admin.post("/admin/projects", json={"name": "beta", "models": ["nimble", "clef"]}), 201)
        assert created["name"] == "beta" and created["models"] == ["clef", "nimble"]
        assert created["archived"] is False and created["created_at"]
        default = body(admin.post("/admin/projects", json={"name": "gamma"}), 201)
        assert default["models"] == "all"
        listed = body(admin.get("/admin/projects"), 200)["data"]
        assert [p["name"] for p in listed] == ["acme", "beta", "gamma"]
        assert body(admin.get("/admin/projects/beta"), 200) == created


def test_projects_can_belong_to_an_organization(stack: Stack) -> None:
    with stack.client("admin") as admin:
        assert body(admin.post("/admin/organizations", json={"name": "initech"}), 201)["name"] == "initech"
        assert admin.post("/admin/projects", json={"name": "tps", "organization": "initech"}).status_code == 201
        missing = assert_error(admin.post("/admin/projects", json={"name": "x", "organization": "nope"}), 404)
        assert "nope" in missing["error"]
        assert_error(admin.post("/admin/organizations", json={"name": "initech"}), 409, "conflict_error")


def test_a_new_allowlist_applies_to_the_project_key_at_once(stack: Stack) -> None:
    key = stack.project_key
    assert decide(stack, key, "nimble").status_code == 200
    assert model_ids(stack, key) == ["clef", "llama3.2", "nimble"]
    with stack.client("admin") as admin:
        patched = body(admin.patch("/admin/projects/acme", json={"models": ["clef"]}), 200)
    assert patched["models"] == ["clef"]
    refused = assert_error(decide(stack, key, "nimble"), 403)
    assert "nimble" in refused["error"]
    assert model_ids(stack, key) == ["clef"]
    with stack.client("admin") as admin:
        assert body(admin.patch("/admin/projects/acme", json={"models": "all"}), 200)["models"] == "all"
    assert decide(stack, key, "nimble").status_code == 200
    assert model_ids(stack, key) == ["clef", "llama3.2", "nimble"]


def test_an_archived_project_is_refused_until_unarchived(stack: Stack) -> None:
    with stack.client("admin") as admin:
        assert body(admin.patch("/admin/projects/acme", json={"archived": True}), 200)["archived"] is True
        refused = assert_error(decide(stack, stack.project_key), 403)
        assert "archived" in refused["error"]
        assert model_ids(stack, stack.project_key) == []
        no_key = assert_error(admin.post("/admin/projects/acme/keys", json={}), 400)
        assert "archived" in no_key["error"]
        assert body(admin.patch("/admin/projects/acme", json={"archived": False}), 200)["archived"] is False
    assert decide(stack, stack.project_key).status_code == 200


def test_a_duplicate_project_name_is_a_conflict(stack: Stack) -> None:
    with stack.client("admin") as admin:
        error = assert_error(admin.post("/admin/projects", json={"name": "acme"}), 409, "conflict_error")
    assert "acme" in error["error"]


UNKNOWN_FIELDS = [
    ("POST", "/admin/projects", {"name": "beta", "colour": "red"}),
    ("PATCH", "/admin/projects/acme", {"archive": True}),
    ("POST", "/admin/projects/acme/keys", {"name": "ci", "scope": "all"}),
    ("POST", "/admin/admin-keys", {"role": "root"}),
    ("POST", "/admin/keys/1/rotate", {"grace": 10}),
    ("POST", "/admin/organizations", {"name": "o", "owner": "me"}),
]


def test_unknown_fields_are_a_400(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for method, path, payload in UNKNOWN_FIELDS:
            error = assert_error(admin.request(method, path, json=payload), 400)
            unknown = next(iter(set(payload) - {"name"}))
            assert error["detail"][0]["loc"] == ["body", unknown], (path, error)
            assert unknown in error["error"]


def test_bad_models_values_are_a_400(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for models in BAD_MODELS:
            assert_error(admin.post("/admin/projects", json={"name": "beta", "models": models}), 400)
            if models is not None:  # PATCH {"models": null} is left to mean "every model"
                assert_error(admin.patch("/admin/projects/acme", json={"models": models}), 400)
        assert admin.get("/admin/projects/beta").status_code == 404
        assert body(admin.get("/admin/projects/acme"), 200)["models"] == "all"


def test_bad_bodies_are_a_400_never_a_422(stack: Stack) -> None:
    with stack.client("admin") as admin:
        garbled = assert_error(admin.post("/admin/projects", content=b"{not json", headers=JSON), 400)
        assert garbled["error"] == "the body is not valid JSON"
        assert garbled["detail"] == [{"loc": ["body"], "msg": garbled["error"], "type": "json_invalid"}]
        assert_error(admin.post("/admin/projects", json=["beta"]), 400)
        assert_error(admin.post("/admin/projects", json={}), 400)
        assert_error(admin.post("/admin/projects", json={"name": ""}), 400)
        assert_error(admin.post("/admin/projects", json={"name": "   "}), 400)
        assert_error(admin.post("/admin/keys/1/rotate", json={"grace_seconds": -1}), 400)
        assert_error(admin.post("/admin/projects/acme/keys", json={"expires_at": "soon"}), 400)


def test_unknown_projects_and_keys_are_a_404(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for method, path in (("GET", "/admin/projects/nope"), ("PATCH", "/admin/projects/nope"),
                             ("GET", "/admin/projects/nope/keys"), ("POST", "/admin/projects/nope/keys"),
                             ("POST", "/admin/keys/999999/revoke"), ("POST", "/admin/keys/999999/rotate")):
            error = assert_error(admin.request(method, path, json={} if method != "GET" else None), 404)
            assert "'nope'" in error["error"] or "999999" in error["error"], error


# -- keys ---------------------------------------------------------------------


def test_a_project_key_is_shown_once_and_only_its_prefix_and_last_four_after(stack: Stack) -> None:
    created = new_key(stack, name="ci")
    value = created["key"]
    assert value.startswith("arb_proj_") and len(value) >= 40
    assert created["prefix"] == value[:13] and created["last_four"] == value[-4:]
    assert created["project"] == "acme" and created["kind"] == "project" and created["name"] == "ci"
    assert "digest" not in created
    assert decide(stack, value).status_code == 200
    with stack.client("admin") as admin:
        listed = body(admin.get("/admin/projects/acme/keys"), 200)["data"]
        mine = next(k for k in listed if k["id"] == created["id"])
        assert {k: v for k, v in created.items() if k not in ("key", "last_used_at")} == \
               {k: v for k, v in mine.items() if k != "last_used_at"}
        admin_key = body(admin.post("/admin/admin-keys", json={"name": "ops"}), 201)["key"]
        rotated = body(admin.post(f"/admin/keys/{created['id']}/rotate", json={}), 201)["key"]
        everything = [admin.get(path) for path in (
            "/admin/projects/acme/keys", "/admin/admin-keys", "/admin/projects", "/admin/projects/acme",
            "/admin/audit", "/admin/services", "/admin/models")]
    for response in everything:
        assert response.status_code == 200
        for secret in secrets_of(value, admin_key, rotated, stack.project_key, stack.admin_key):
            assert secret not in response.text, response.request.url
    for item in listed:
        assert set(item) >= {"prefix", "last_four"} and not {"key", "digest"} & set(item)


def test_admin_keys_are_created_listed_and_open_admin_routes(stack: Stack) -> None:
    with stack.client("admin") as admin:
        created = body(admin.post("/admin/admin-keys", json={"name": "ops"}), 201)
        listed = body(admin.get("/admin/admin-keys"), 200)["data"]
    value = created["key"]
    assert value.startswith("arb_admin_") and created["kind"] == "admin" and created["project"] is None
    assert created["prefix"] == value[:14] and created["last_four"] == value[-4:]
    assert [k["id"] for k in listed][-1] == created["id"] and len(listed) == 2
    assert all("key" not in k for k in listed)
    with stack.gateway.client(value) as admin:
        assert admin.get("/admin/projects").status_code == 200


def test_a_revoked_key_is_refused_on_the_next_request(stack: Stack) -> None:
    created = new_key(stack)
    assert decide(stack, created["key"]).status_code == 200
    with stack.client("admin") as admin:
        revoked = body(admin.post(f"/admin/keys/{created['id']}/revoke"), 200)
    assert revoked["revoked_at"] is not None and revoked["project"] == "acme" and "key" not in revoked
    error = assert_error(decide(stack, created["key"]), 401)
    assert created["key"] not in error["error"]
    assert_error(stack.gateway.client(created["key"]).get("/v1/models"), 401)
    assert decide(stack, stack.project_key).status_code == 200  # other keys are untouched


def test_a_rotated_key_keeps_working_for_its_grace_period(stack: Stack) -> None:
    old = new_key(stack)
    with stack.client("admin") as admin:
        new = body(admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 3600}), 201)
        listed = {k["id"]: k for k in body(admin.get("/admin/projects/acme/keys"), 200)["data"]}
    assert new["key"].startswith("arb_proj_") and new["key"] != old["key"] and new["project"] == "acme"
    assert decide(stack, old["key"]).status_code == 200
    assert decide(stack, new["key"]).status_code == 200
    assert listed[old["id"]]["replaced_by"] == new["id"]
    grace_end = dt.datetime.fromisoformat(listed[old["id"]]["revoked_at"])
    assert dt.timedelta(minutes=59) < grace_end - dt.datetime.now(dt.UTC) <= dt.timedelta(hours=1)
    with stack.client("admin") as admin:  # revoking ends the grace period at once
        assert body(admin.post(f"/admin/keys/{old['id']}/revoke"), 200)["project"] == "acme"
    assert_error(decide(stack, old["key"]), 401)
    assert decide(stack, new["key"]).status_code == 200


def test_a_rotation_without_grace_stops_the_old_key_at_once(stack: Stack) -> None:
    old = new_key(stack)
    with stack.client("admin") as admin:
        new = body(admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 0}), 201)
        again = assert_error(admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 0}), 409,
                             "conflict_error")
    assert "rotated already" in again["error"] and f"key {new['id']}" in again["error"]
    assert_error(decide(stack, old["key"]), 401)
    assert decide(stack, new["key"]).status_code == 200


def test_a_rotated_or_revoked_key_cannot_be_rotated_again(stack: Stack) -> None:
    """Its grace period ends when the first rotation said: a second one neither extends it nor
    makes another live successor."""
    old, revoked = new_key(stack), new_key(stack)
    with stack.client("admin") as admin:
        new = body(admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 1}), 201)
        grace_end = listed_key(stack, old["id"])["revoked_at"]
        again = admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 2592000})
        assert "rotated already" in assert_error(again, 409, "conflict_error")["error"]
        assert body(admin.post(f"/admin/keys/{revoked['id']}/revoke"), 200)["revoked_at"]
        dead = admin.post(f"/admin/keys/{revoked['id']}/rotate", json={})
        assert "revoked" in assert_error(dead, 409, "conflict_error")["error"]
        keys = body(admin.get("/admin/projects/acme/keys"), 200)["data"]
    assert listed_key(stack, old["id"])["revoked_at"] == grace_end
    assert [k["id"] for k in keys if k["id"] > revoked["id"]] == [new["id"]]  # one successor only
    time.sleep(max(0.0, (dt.datetime.fromisoformat(grace_end) - dt.datetime.now(dt.UTC)).total_seconds()))
    assert_error(decide(stack, old["key"]), 401)
    assert decide(stack, new["key"]).status_code == 200


def test_rotations_at_once_make_one_successor(stack: Stack) -> None:
    old = new_key(stack)

    def rotate(_: int) -> int:
        with stack.client("admin") as admin:
            return admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 600}).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(rotate, range(8)))
    assert codes == [201] + [409] * 7
    with stack.client("admin") as admin:
        keys = body(admin.get("/admin/projects/acme/keys"), 200)["data"]
    assert len([k for k in keys if k["id"] > old["id"]]) == 1


def test_a_rotated_key_keeps_its_name_expiry_and_limits(stack: Stack) -> None:
    expires_at = (dt.datetime.now(dt.UTC) + dt.timedelta(days=3)).isoformat()
    old = new_key(stack, name="ci", expires_at=expires_at)
    with stack.client("admin") as admin:
        limits = {"requests_per_minute": 2, "tokens_per_minute": 100000}
        assert body(admin.patch(f"/admin/keys/{old['id']}", json=limits), 200)["requests_per_minute"] == 2
        new = body(admin.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 0}), 201)
    assert (new["name"], new["expires_at"]) == ("ci", old["expires_at"])
    assert (new["requests_per_minute"], new["tokens_per_minute"]) == (2, 100000)
    assert [decide(stack, new["key"]).status_code for _ in range(3)] == [200, 200, 429]


def test_an_admin_key_can_be_rotated(stack: Stack) -> None:
    with stack.client("admin") as admin:
        spare = body(admin.post("/admin/admin-keys", json={}), 201)
        new = body(admin.post(f"/admin/keys/{spare['id']}/rotate", json={"grace_seconds": 0}), 201)
    assert new["key"].startswith("arb_admin_") and new["kind"] == "admin"
    assert_error(stack.gateway.client(spare["key"]).get("/admin/projects"), 401)
    assert stack.gateway.client(new["key"]).get("/admin/projects").status_code == 200


def test_expiry(stack: Stack) -> None:
    now = dt.datetime.now(dt.UTC)
    with stack.client("admin") as admin:
        past = admin.post("/admin/projects/acme/keys", json={"expires_at": (now - dt.timedelta(minutes=1)).isoformat()})
    assert "in the past" in assert_error(past, 400)["error"]
    expired = new_key(stack, expires_at=(now + dt.timedelta(seconds=1.5)).isoformat())
    current = new_key(stack, expires_at=(now + dt.timedelta(days=1)).isoformat())
    assert dt.datetime.fromisoformat(current["expires_at"]) > now
    assert decide(stack, expired["key"]).status_code == 200  # cached now, and still honoured below
    time.sleep(max(0.0, (now + dt.timedelta(seconds=1.6) - dt.datetime.now(dt.UTC)).total_seconds()))
    error = assert_error(decide(stack, expired["key"]), 401)
    assert "expired" in error["error"]
    assert_error(stack.gateway.client(expired["key"]).get("/v1/models"), 401)
    assert decide(stack, current["key"]).status_code == 200


def listed_key(stack: Stack, key_id: int) -> dict[str, Any]:
    with stack.client("admin") as admin:
        return next(k for k in body(admin.get("/admin/projects/acme/keys"), 200)["data"] if k["id"] == key_id)


def test_an_expiry_with_a_utc_offset_is_the_instant_it_names(stack: Stack) -> None:
    """SQLite keeps a time's digits and drops its zone: an expiry must be stored in UTC."""
    now = dt.datetime.now(dt.UTC)
    east, west = dt.timezone(dt.timedelta(hours=5)), dt.timezone(dt.timedelta(hours=-5))
    soon_at, later_at = now + dt.timedelta(seconds=1.5), now + dt.timedelta(hours=2)
    soon = new_key(stack, expires_at=soon_at.astimezone(east).isoformat())
    later = new_key(stack, expires_at=later_at.astimezone(west).isoformat())
    assert dt.datetime.fromisoformat(listed_key(stack, soon["id"])["expires_at"]) == soon_at
    assert dt.datetime.fromisoformat(listed_key(stack, later["id"])["expires_at"]) == later_at
    assert decide(stack, later["key"]).status_code == 200  # not dead 5 hours early
    time.sleep(max(0.0, (soon_at + dt.timedelta(seconds=0.1) - dt.datetime.now(dt.UTC)).total_seconds()))
    assert "expired" in assert_error(decide(stack, soon["key"]), 401)["error"]  # nor alive 5 hours late


def test_an_expiry_more_than_a_hundred_years_ahead_is_a_400(stack: Stack) -> None:
    now = dt.datetime.now(dt.UTC)
    with stack.client("admin") as admin:
        for far in ("9999-12-31T23:59:59-12:00", "9999-12-31T23:59:59",
                    (now + dt.timedelta(days=101 * 365)).isoformat()):
            for path in ("/admin/projects/acme/keys", "/admin/admin-keys"):
                error = assert_error(admin.post(path, json={"expires_at": far}), 400)
                assert "100 years" in error["error"], (far, error)
    distant = new_key(stack, expires_at=(now + dt.timedelta(days=99 * 365)).isoformat())
    assert listed_key(stack, distant["id"])["expires_at"] == distant["expires_at"]
    assert decide(stack, distant["key"]).status_code == 200
    with stack.client("admin") as admin:
        assert body(admin.post(f"/admin/keys/{distant['id']}/revoke"), 200)["revoked_at"]


def test_project_keys_never_open_an_admin_route(stack: Stack) -> None:
    """Nor does no key, an unknown or a tampered admin key; and auth comes before the body."""
    for method, path in admin_routes(stack):
        bodies: list[dict[str, Any]] = [{}]
        if method in ("POST", "PATCH"):
            bodies = [{"json": {"unknown": 1}}, {"content": b"{not json", "headers": JSON}]
        for key in (stack.project_key, None, "arb_admin_" + "x" * 43, tampered(stack.admin_key)):
            with stack.gateway.client(key) as client:
                for extra in bodies:
                    response = client.request(method, path, **extra)
                    error = assert_error(response, 401)
                    assert response.headers["WWW-Authenticate"] == "Bearer", (method, path)
                    assert stack.project_key not in error["error"]


def test_admin_keys_never_call_a_model(stack: Stack) -> None:
    with stack.client("admin") as admin:
        error = assert_error(admin.post("/v1/systemone", json=decision()), 401)
        assert stack.admin_key not in error["error"]
        assert_error(admin.get("/v1/models"), 401)
    forged = tampered(stack.project_key)
    for key in (None, forged, "sk-not-arbiter"):
        with stack.gateway.client(key) as client:
            response = client.post("/v1/systemone", json=decision())
            assert_error(response, 401)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert_error(client.get("/v1/models"), 401)


# -- audit ----------------------------------------------------------------------


def test_every_change_is_audited_with_its_request_id(stack: Stack) -> None:
    with stack.client("admin") as admin:
        me = next(k for k in body(admin.get("/admin/admin-keys"), 200)["data"]
                  if stack.admin_key.startswith(k["prefix"]))
        before = audit_log(stack)[0]["id"]
        changes: list[tuple[httpx.Response, str, str]] = []

        def change(method: str, path: str, payload: Any, action: str, target: str) -> dict[str, Any]:
            response = admin.request(method, path, json=payload)
            assert response.status_code in (200, 201), response.text
            changes.append((response, action, target))
            return response.json()  # type: ignore[no-any-return]

        change("POST", "/admin/organizations", {"name": "initech"}, "organization.create", "organization:initech")
        change("POST", "/admin/projects", {"name": "beta"}, "project.create", "project:beta")
        change("PATCH", "/admin/projects/beta", {"models": ["nimble"]}, "project.update", "project:beta")
        key = admin.post("/admin/projects/beta/keys", json={"name": "ci"}, headers={"X-Request-Id": "req-key-1"})
        changes.append((key, "project_key.create", f"key:{key.json()['id']}:{key.json()['prefix']}"))
        target = f"key:{key.json()['id']}:{key.json()['prefix']}"
        change("POST", f"/admin/keys/{key.json()['id']}/rotate", {}, "key.rotate", target)
        change("POST", f"/admin/keys/{key.json()['id']}/revoke", None, "key.revoke", target)
        ops = admin.post("/admin/admin-keys", json={"name": "ops"})
        changes.append((ops, "admin_key.create", f"key:{ops.json()['id']}:{ops.json()['prefix']}"))
        change("PATCH", "/admin/projects/beta", {"archived": True}, "project.update", "project:beta")
    entries = [e for e in audit_log(stack) if e["id"] > before]
    assert [e["id"] for e in entries] == sorted((e["id"] for e in entries), reverse=True)
    assert key.headers["X-Request-Id"] == "req-key-1"
    rotation = [e for e in entries if e["request_id"] == changes[4][0].headers["X-Request-Id"]]
    assert [e["action"] for e in rotation] == ["key.rotate", "project_key.create"]  # newest first
    entries = [e for e in entries if e not in rotation[1:]]
    assert len(entries) == len(changes)
    for entry, (response, action, target) in zip(entries, reversed(changes), strict=True):
        if response is key:  # the caller named it: Arbiter's own id, and the caller's beside it
            assert entry["client_request_id"] == "req-key-1" and entry["request_id"] != "req-key-1"
        else:
            assert entry["request_id"] == response.headers["X-Request-Id"] and entry["client_request_id"] is None
        assert (entry["action"], entry["target"]) == (action, target)
        assert entry["actor"] == f"admin-key:{me['id']}:{me['prefix']}"
        assert dt.datetime.fromisoformat(entry["at"]).tzinfo is not None
    assert entries[0]["details"] == {"archived": True}
    assert entries[-3]["details"] == {"models": ["nimble"]}


def test_reads_and_failed_changes_write_no_entries(stack: Stack) -> None:
    before = audit_log(stack)
    with stack.client("admin") as admin:
        for path in ("/admin/projects", "/admin/projects/acme", "/admin/projects/acme/keys",
                     "/admin/admin-keys", "/admin/audit", "/admin/services", "/admin/services/ollama",
                     "/admin/services/ollama/models", "/admin/models"):
            assert admin.get(path).status_code == 200, path
        assert admin.post("/admin/projects", json={"name": "acme"}).status_code == 409
        assert admin.post("/admin/projects", json={"name": "x", "models": 5}).status_code == 400
        assert admin.patch("/admin/projects/nope", json={"archived": True}).status_code == 404
        assert admin.post("/admin/keys/999999/revoke").status_code == 404
    assert stack.client("project").get("/v1/models").status_code == 200
    assert audit_log(stack) == before


def test_the_audit_log_pages_newest_first(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for name in ("p1", "p2", "p3"):
            assert admin.post("/admin/projects", json={"name": name}).status_code == 201
    first = audit_log(stack, limit=2)
    assert [e["target"] for e in first] == ["project:p3", "project:p2"]
    rest = audit_log(stack, limit=2, before_id=first[-1]["id"])
    assert rest[0]["target"] == "project:p1" and rest[0]["id"] < first[-1]["id"]


def test_the_audit_log_filters_as_the_ui_does(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for name in ("p1", "p2"):
            assert admin.post("/admin/projects", json={"name": name}).status_code == 201
        assert admin.post("/admin/projects/p2/keys", json={"name": "ci"}).status_code == 201
        assert [e["target"] for e in audit_log(stack, target="P2")][-1] == "project:p2"  # any case
        assert {e["action"] for e in audit_log(stack, action="project")} == {"project.create"}  # a family
        assert {e["action"] for e in audit_log(stack, action="project_key")} == {"project_key.create"}
        assert audit_log(stack, action="project.cre") == []  # a family is whole words
        assert audit_log(stack, actor="no-such-actor") == []
        assert len(audit_log(stack, actor="ADMIN", target="p1")) == 1
        for bad in ({"actor": "x" * 201}, {"target": "a\x01b"}):
            assert "filter" in assert_error(admin.get("/admin/audit", params=bad), 400)["error"]


def test_a_null_allowlist_is_refused(stack: Stack) -> None:
    with stack.client("admin") as admin:
        response = admin.patch("/admin/projects/acme", json={"models": None})
    assert "not null" in assert_error(response, 400)["error"]


def test_key_ids_out_of_range_are_404(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for path in ("/admin/keys/100000000000000000000/revoke", "/admin/keys/0/revoke", "/admin/keys/-5/rotate"):
            assert_error(admin.post(path, json={}), 404)


def test_control_characters_in_names_are_400(stack: Stack) -> None:
    with stack.client("admin") as admin:
        for path, body in (("/admin/organizations", {"name": "a\x00b"}), ("/admin/projects", {"name": "p\x00"}),
                           ("/admin/projects/acme/keys", {"name": "k\x00"})):
            response = admin.post(path, json=body)
            assert_error(response, 400)


def raw_json(text: str) -> dict[str, Any]:
    """A request body sent as it is written: JSON escapes such as a lone "\\ud800" reach the
    server unchanged (httpx would refuse to encode them)."""
    return {"content": text.encode(), "headers": JSON}


UNSAFE_TEXT = [r"\ud800", r"\udfff", r"\u0000", r"\u001b", r"\u007f", r"\u0085"]
TENANCY_FIELDS = [  # <u> is where the unsafe text goes
    ("POST", "/admin/organizations", '{"name": "o<u>"}'),
    ("POST", "/admin/projects", '{"name": "p<u>"}'),
    ("POST", "/admin/projects", '{"name": "q", "models": ["nimble", "m<u>"]}'),
    ("POST", "/admin/projects", '{"name": "r", "organization": "o<u>"}'),
    ("PATCH", "/admin/projects/acme", '{"models": ["m<u>"]}'),
    ("POST", "/admin/projects/acme/keys", '{"name": "k<u>"}'),
    ("POST", "/admin/admin-keys", '{"name": "k<u>"}'),
]


def test_lone_surrogates_and_control_characters_in_any_field_are_400_and_write_nothing(stack: Stack) -> None:
    """A lone surrogate can be stored but never encoded again: it once made every page that
    showed it a 500, for good."""
    before = audit_log(stack)
    with stack.client("admin") as admin:
        for method, path, template in TENANCY_FIELDS:
            for unsafe in UNSAFE_TEXT:
                response = admin.request(method, path, **raw_json(template.replace("<u>", unsafe)))
                assert_error(response, 400)
        for path in ("/admin/projects", "/admin/projects/acme", "/admin/projects/acme/keys", "/admin/audit"):
            assert admin.get(path).status_code == 200
        assert [p["name"] for p in body(admin.get("/admin/projects"), 200)["data"]] == ["acme"]
        assert body(admin.get("/admin/projects/acme"), 200)["models"] == "all"
    assert audit_log(stack) == before


def test_a_project_name_is_one_that_its_url_can_reach(stack: Stack) -> None:
    """/admin/projects/{name}: a '/' (even as %2F) or a '.' / '..' segment cannot name it; any
    other character can, percent-encoded."""
    with stack.client("admin") as admin:
        for name in ("a/b", "/", ".", ".."):
            error = assert_error(admin.post("/admin/projects", json={"name": name}), 400)
            assert "URL" in error["error"], (name, error)
        for name in ("50%", "q?x", "h#1", "two words", "a\\b", "..x", "zażółć"):
            assert body(admin.post("/admin/projects", json={"name": name}), 201)["name"] == name
            assert body(admin.get(f"/admin/projects/{quote(name, safe='')}"), 200)["name"] == name
            assert body(admin.get(f"/admin/projects/{quote(name, safe='')}/keys"), 200)["data"] == []
