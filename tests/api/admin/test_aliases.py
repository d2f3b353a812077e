"""Model aliases through the admin API (SPEC §1): add, list, remove, every change audited; the
refusals (an installed model's name, an alias of an alias, a model not installed, bad names);
a model that appears later under an alias's name wins, and the alias says it is shadowed."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support import Stack, assert_error, body, decision, wait_for

JEV = {"alias": "jev-latest", "model": "nimble"}


def aliases(admin: httpx.Client) -> list[dict[str, Any]]:
    return list(body(admin.get("/admin/aliases"), 200)["data"])


def audited(admin: httpx.Client, prefix: str) -> list[dict[str, Any]]:
    entries = body(admin.get("/admin/audit", params={"limit": 1000}), 200)["data"]
    return [e for e in entries if e["action"].startswith(prefix)]


def test_add_list_remove_each_audited(stack: Stack) -> None:
    with stack.client("admin") as admin:
        made = body(admin.post("/admin/aliases", json=JEV), 201)
        assert (made["alias"], made["model"], made["status"]) == ("jev-latest", "nimble", "active")
        assert made["created_at"]
        assert [(a["alias"], a["model"], a["status"]) for a in aliases(admin)] == [("jev-latest", "nimble", "active")]
        assert admin.delete("/admin/aliases/jev-latest").status_code == 204
        assert aliases(admin) == []
        assert_error(admin.delete("/admin/aliases/jev-latest"), 404, "not_found_error")
        entries = audited(admin, "alias.")
    assert [(e["action"], e["target"], e["details"]) for e in reversed(entries)] == [
        ("alias.create", "alias:jev-latest", {"model": "nimble"}),
        ("alias.remove", "alias:jev-latest", {"model": "nimble"})]
    assert all(e["actor"].startswith("admin-key:") and e["request_id"] for e in entries)


def test_an_alias_may_hold_a_slash_and_is_removed_by_its_path(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json={"alias": "typesafe/jev-latest", "model": "nimble"}), 201)
        assert admin.delete("/admin/aliases/typesafe/jev-latest").status_code == 204
        assert aliases(admin) == []


def test_refusals_change_nothing(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json=JEV), 201)
        refused = [
            ({"alias": "clef", "model": "nimble"}, 409, "shadow"),  # an installed model's name
            ({"alias": "jev-latest", "model": "clef"}, 409, "already exists"),
            ({"alias": "jev-2", "model": "jev-latest"}, 400, "use 'nimble'"),  # an alias of an alias
            ({"alias": "nimble-next", "model": "ghost"}, 400, "not installed"),
            ({"alias": "self", "model": "self"}, 400, None),
            ({"alias": "", "model": "nimble"}, 400, None),
            ({"alias": "   ", "model": "nimble"}, 400, None),
            ({"alias": "..", "model": "nimble"}, 400, None),
            ({"alias": "bad\nname", "model": "nimble"}, 400, None),
            ({"alias": "x" * 201, "model": "nimble"}, 400, None),
            ({"alias": "ok", "model": "nimble", "extra": 1}, 400, None),
            ({"alias": "ok"}, 400, None),
        ]
        for fields, status, words in refused:
            error = assert_error(admin.post("/admin/aliases", json=fields), status,
                                 "conflict_error" if status == 409 else None)
            assert words is None or words in error["error"], (fields, error)
        assert [a["alias"] for a in aliases(admin)] == ["jev-latest"]
        assert len(audited(admin, "alias.")) == 1


def test_an_alias_cannot_take_the_name_another_alias_points_at(stack: Stack) -> None:
    """Else removing the model and adding the alias would make a chain: one step only."""
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json={"alias": "old-name", "model": "nimble-v3-soon"}), 400)
        body(admin.post("/admin/aliases", json=JEV), 201)
        [nimble] = [m for m in body(admin.get("/admin/models"), 200)["data"] if m["public_name"] == "nimble"]
        body(admin.patch(f"/admin/models/{nimble['id']}", json={"public_name": "nimble-2"}), 200)
        assert aliases(admin)[0]["status"] == "target_missing"
        error = assert_error(admin.post("/admin/aliases", json={"alias": "nimble", "model": "clef"}), 400)
        assert "chain" in error["error"]


def test_a_model_that_appears_under_an_aliass_name_wins(stack: Stack) -> None:
    with stack.client("admin") as admin:
        body(admin.post("/admin/aliases", json={"alias": "tev1", "model": "nimble"}), 201)
    with stack.client() as tenant:
        through = body(tenant.post("/v1/systemone", json=decision("tev1")), 200)
        assert through["model"] == "tev1"
        assert stack.ollama_state.requests[-1].json["model"] == "nimble:latest"
    stack.ollama_state.models["tev1"] = ["decision"]  # the backend now has a model of that name
    with stack.client("admin") as admin:
        body(admin.post("/admin/services/ollama/refresh"), 200)
        wait_for(lambda: aliases(admin)[0]["status"] == "shadowed")
    with stack.client() as tenant:
        own = body(tenant.post("/v1/systemone", json=decision("tev1")), 200)
    assert own["model"] == "tev1"
    assert stack.ollama_state.requests[-1].json["model"] == "tev1:latest"  # the model, not the alias
