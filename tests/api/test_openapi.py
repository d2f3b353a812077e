"""The OpenAPI document says what the server does (issue #21): it is a valid OpenAPI 3.1
document; every operation that takes a key carries that key's security requirement and the
others none; no operation declares a 422; and one walk over a deployment (an emulated Ollama and
vLLM, a mesh key) provokes, operation by operation, the statuses the server answers, asserting
that each one is declared, that each answer matches the schema declared for it (strictly: a
field the document does not name fails), and that no declared status went unseen unless it is
listed below with the test that provokes it.
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi

from app.db.session import Database
from infra_adapters.emulators.ollama import OllamaState, make_ollama_app
from infra_adapters.emulators.server import EmulatorServer
from infra_adapters.emulators.vllm import VllmState, make_vllm_app
from tests.support import Gateway, Stack, add_service, closed_port, decision, synced, wait_for

MESH_KEY = "the-mesh-key-of-the-openapi-walk-0123456789"
BACKEND_KEY = "the-vllm-api-key-of-the-openapi-walk"
QWEN = "Qwen/Qwen3-0.6B"
MAX_BODY = 64 * 1024
# Each lean route breaks its own model (a backed-off replica stays out for a while).
FAULTY = {"POST /v1/systemone": "faulty-a", "POST /v1/decisions": "faulty-b",
          "POST /v1/chat/completions": "faulty-c", "POST /api/chat": "faulty-d"}
CHAT_OPS = ("POST /v1/chat/completions", "POST /api/chat")
LEAN_OPS = ("POST /v1/systemone", "POST /v1/decisions", *CHAT_OPS)
# Declared statuses the walk does not provoke (it would take the database away, an old mesh
# peer, ...), each with the test that does.
ANY_SECURED = {"503": "the database away, the key cannot be checked: tests/reliability/test_database_away.py"}
NOT_PROVOKED: dict[str, dict[str, str]] = {
    "GET /readyz": {"503": "tests/api/public/test_health.py"},
    "PATCH /admin/models/{model_id}": {"409": "mesh_warning: tests/mesh/test_version_rule.py"},
    **{op: {"409": "the service changed during the backend call: tests/services/test_reads_outside_transactions.py"}
       for op in ("PATCH /admin/services/{name}", "POST /admin/services/{name}/refresh",
                  "DELETE /admin/services/{name}/models/{model}")},
    **{op: {"504": "tests/api/public/test_systemone_errors.py, test_chat_failures.py"} for op in LEAN_OPS},
    "POST /api/chat": {"500": "tests/api/public/test_chat_failures.py (a credential refused)",
                       "504": "tests/api/public/test_chat_failures.py"},
}


# -- the document itself -----------------------------------------------------------------------

def operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield f"{method.upper()} {path}", operation


def served_document(gateway: Gateway, admin_key: str) -> dict[str, Any]:
    with gateway.client(admin_key) as client:
        answer = client.get("/openapi.json")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_the_document_is_valid_openapi_and_declares_no_422(stack: Stack) -> None:
    document = served_document(stack.gateway, stack.admin_key)
    validate_openapi(document)  # raises on any breach of the OpenAPI 3.1 schema
    assert document["openapi"].startswith("3.1")
    declared = {op: set(operation["responses"]) for op, operation in operations(document)}
    assert len(declared) > 40 and not [op for op, statuses in declared.items() if "422" in statuses]
    assert all("400" in statuses for statuses in declared.values()), declared
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert "There is no 422: validation is 400" in document["info"]["description"]  # said once, for all


def test_every_protected_operation_says_which_key_it_takes(stack: Stack) -> None:
    document = served_document(stack.gateway, stack.admin_key)
    schemes = document["components"]["securitySchemes"]
    assert schemes["projectKey"] == schemes["projectKey"] | {"type": "http", "scheme": "bearer"}
    assert schemes["adminKey"] == schemes["adminKey"] | {"type": "http", "scheme": "bearer"}
    assert schemes["meshCredential"] | {"in": "header", "name": "Authorization"} == schemes["meshCredential"]
    for op, operation in operations(document):
        path = op.split(" ", 1)[1]
        names = [name for requirement in operation.get("security", []) for name in requirement]
        if path.startswith("/admin/"):
            assert names == ["adminKey"], op
        elif path in ("/healthz", "/readyz"):
            assert "security" not in operation, op
        elif path in ("/v1/models", "/v1/usage"):
            assert names == ["projectKey"], op
        else:  # the lean routes: a tenant's project key, or a mesh peer's signed credential
            assert names == ["projectKey", "meshCredential"], op
        assert set(names) <= set(schemes), op
        # The key is the security requirement, not a header parameter of its own.
        assert not [p for p in operation.get("parameters", []) if p["name"].lower() == "authorization"], op


def test_the_lean_routes_declare_specs_statuses(stack: Stack) -> None:
    """SPEC §1's table, written down here apart from app/api/public/lean_openapi.py."""
    document = served_document(stack.gateway, stack.admin_key)
    spec = {"200", "400", "401", "403", "404", "405", "413", "415", "429", "500", "502", "503", "504", "4XX", "5XX"}
    for op in LEAN_OPS:
        method, path = op.split(" ")
        declared = set(document["paths"][path][method.lower()]["responses"])
        assert declared == (spec - {"405"} if op in CHAT_OPS else spec), op


def test_failed_keys_throttled_make_429_a_declared_answer(stack: Stack,
                                                          gateway_factory: Callable[..., Gateway]) -> None:
    """With ARBITER_AUTH_FAILURE_LIMIT (on by default; off in the suite) the admin routes declare
    the throttle's 429, and it is what a client past its failures gets."""
    throttled = gateway_factory(auth_failure_limit=2)
    document = served_document(throttled, stack.admin_key)
    assert "429" in document["paths"]["/admin/services"]["get"]["responses"]
    assert "429" not in document["paths"]["/v1/models"]["get"]["responses"]  # project keys are not throttled
    assert "429" not in served_document(stack.gateway, stack.admin_key)["paths"]["/admin/services"]["get"]["responses"]
    with throttled.client("arb_admin_not-a-key-at-all") as guessing:
        statuses = [guessing.get("/admin/services").status_code for _ in range(3)]
    assert statuses == [401, 401, 429]


# -- checking answers against the document -----------------------------------------------------

def strict(schema: Any) -> Any:
    """``schema`` with every object that names its properties closed to any other (unless it
    says it is open): an answer with a field the document does not name then fails. The
    published document leaves them open, so that clients tolerate fields added later."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if isinstance(closed.get("properties"), dict) and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


def media(response: httpx.Response) -> str:
    return response.headers.get("content-type", "").split(";")[0].strip()


class Walk:
    """Sends requests for the document's operations and keeps what each one answered."""

    def __init__(self, document: dict[str, Any], gateway: Gateway, keys: dict[str, str]) -> None:
        self.document = document
        self.gateway = gateway
        self.keys = keys
        self.components = strict(document["components"])
        self.seen: defaultdict[str, set[str]] = defaultdict(set)
        self._clients: dict[str | None, httpx.Client] = {}

    def has(self, op: str) -> bool:
        method, path = op.split(" ", 1)
        return method.lower() in self.document["paths"].get(path, {})

    def operation(self, op: str) -> dict[str, Any]:
        method, path = op.split(" ", 1)
        return self.document["paths"][path][method.lower()]  # type: ignore[no-any-return]

    def default_key(self, op: str) -> str | None:
        names = [name for requirement in self.operation(op).get("security", []) for name in requirement]
        return "admin" if "adminKey" in names else "project" if "projectKey" in names else None

    def client(self, who: str | None) -> httpx.Client:
        if who not in self._clients:
            self._clients[who] = self.gateway.client(self.keys[who] if who else None)
        return self._clients[who]

    def call(self, op: str, status: int | None, path: str | None = None, *, who: str | None = "default",
             **request: Any) -> httpx.Response:
        """Send ``op`` (at ``path``, its template by default) as ``who`` (the operation's kind of
        key by default; None: no key); assert it answers ``status`` (None: any), then ``check``."""
        method, template = op.split(" ", 1)
        who = self.default_key(op) if who == "default" else who
        response = self.client(who).request(method, path or template, **request)
        assert status is None or response.status_code == status, (op, path, response.status_code, response.text)
        self.check(op, response)
        return response

    def check(self, op: str, response: httpx.Response) -> None:
        """The status is declared for ``op``, and the answer is what the document says of it."""
        responses = self.operation(op)["responses"]
        code = str(response.status_code)
        declared = responses.get(code) or responses.get(f"{code[0]}XX")
        assert declared is not None, f"{op} answered {code}, which the document does not declare: {response.text}"
        self.seen[op].add(code)
        content = declared.get("content", {})
        if not content:
            assert response.status_code == 204 and response.content == b"", (op, code, response.text)
            return
        kind = media(response)
        assert kind in content or "*/*" in content, (op, code, kind, list(content))
        schema = content.get(kind, {}).get("schema")
        if schema and kind == "application/json":
            validator = Draft202012Validator({**strict(schema), "components": self.components})
            problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                        for e in validator.iter_errors(response.json())]
            assert not problems, (op, code, problems[:5], response.text[:2000])

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


# -- the walk ----------------------------------------------------------------------------------

@pytest.fixture
def deployment(db: Database, gateway_factory: Callable[..., Gateway]) -> Iterator[tuple[Stack, Walk]]:
    """An emulated Ollama (with a model per lean route to break) and an emulated vLLM behind a
    key of its own, a mesh key, project 'acme' (all models), and an admin key of every role."""
    ollama_state = OllamaState()
    ollama_state.models.update({FAULTY["POST /v1/systemone"]: ["decision"], FAULTY["POST /v1/decisions"]: ["decision"],
                                FAULTY["POST /v1/chat/completions"]: ["completion"],
                                FAULTY["POST /api/chat"]: ["completion"]})
    vllm_state = VllmState(required_bearer=BACKEND_KEY)
    with EmulatorServer(make_ollama_app(ollama_state)) as ollama, EmulatorServer(make_vllm_app(vllm_state)) as vllm:
        stack = Stack.provision(db, ollama_url=ollama.url)
        add_service(db, type="vllm", url=vllm.url, name="vllm", credential=BACKEND_KEY)
        stack.gateway = synced(gateway_factory(mesh_key=MESH_KEY, max_body_bytes=MAX_BODY))
        stack.ollama, stack.ollama_state = ollama, ollama_state
        stack.extra.update(vllm=vllm, vllm_state=vllm_state)
        keys = {"project": stack.project_key, "admin": stack.admin_key, "beta": stack.new_project("beta"),
                "narrow": stack.new_project("narrow", models=["clef"]), "limited": stack.new_project("limited")}
        with stack.client("admin") as owner:
            for role in ("viewer", "operator", "project-admin"):
                fields: dict[str, Any] = {"role": role, "name": role}
                if role == "project-admin":
                    fields["projects"] = ["acme"]
                answer = owner.post("/admin/admin-keys", json=fields)
                assert answer.status_code == 201, answer.text
                keys[role] = answer.json()["key"]
        walk = Walk(served_document(stack.gateway, stack.admin_key), stack.gateway, keys)
        try:
            yield stack, walk
        finally:
            walk.close()


def test_every_status_the_server_answers_is_declared_and_every_declared_one_is_real(
        deployment: tuple[Stack, Walk]) -> None:
    stack, walk = deployment
    every = [op for op, _ in operations(walk.document)]
    with stack.client("admin") as owner:
        beta_key = owner.post("/admin/projects/beta/keys", json={"name": "target"}).json()["id"]
        owner.patch("/admin/projects/limited", json={"requests_per_minute": 1}).raise_for_status()
    for op in every:
        probe_credentials(walk, op)
        probe_bad_input(walk, op)
        probe_roles(walk, op, beta_key)
    for op in LEAN_OPS:
        provoke_lean(walk, stack, op)
    provoke_tenancy(walk)
    provoke_services(walk, stack)
    provoke_rest(walk, stack)
    unseen = {}
    for op in every:
        responses = walk.operation(op)["responses"]
        excused = {**(ANY_SECURED if "security" in walk.operation(op) else {}), **NOT_PROVOKED.get(op, {})}
        assert set(excused) <= set(responses), (op, "excused statuses it does not declare", excused)
        missing = {code for code in responses if "XX" not in code} - walk.seen[op] - set(excused)
        if missing:
            unseen[op] = sorted(missing)
    # A new operation fails here until the walk provokes its success and its own refusals.
    assert not unseen, f"declared, never answered in the walk: {unseen}"
    assert set(walk.seen) == set(every)


def filled(template: str, value: str = "1") -> str:
    return re.sub(r"\{[^}]+\}", value, template)


def probe_credentials(walk: Walk, op: str) -> None:
    """No key, a key of the other kind, a mesh credential that proves nothing, and two
    Authorization headers (refused on every route, before any key is looked up)."""
    template = op.split(" ", 1)[1]
    path = filled(template)
    kind = walk.default_key(op)
    if kind is None:
        walk.call(op, None, path, who=None)  # public: whatever it answers, declared
    else:
        walk.call(op, 401, path, who=None)
        walk.call(op, 401, path, who="project" if kind == "admin" else "admin")
    if "meshCredential" in str(walk.operation(op).get("security")):
        walk.call(op, 401, path, who=None, headers={"Authorization": "ArbiterMesh 1;forged;nothing"})
    walk.call(op, 400, path, who=None, headers=[("Authorization", "Bearer one"), ("Authorization", "Bearer two")])


def probe_bad_input(walk: Walk, op: str) -> None:
    """A body that is not JSON, one with a field nobody knows, and an id that is not a number."""
    template = op.split(" ", 1)[1]
    operation = walk.operation(op)
    name = "acme" if template.startswith("/admin/projects/") else "nosuch"
    if "requestBody" in operation:
        walk.call(op, 400, filled(template, name), content=b"{not json", headers={"Content-Type": "application/json"})
        if op not in CHAT_OPS:  # a chat body's other fields are the backend's
            walk.call(op, 400, filled(template, name), json={"unknown": 1})
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path" and parameter["schema"].get("type") == "integer":
            walk.call(op, 400, template.replace("{" + parameter["name"] + "}", "not-a-number"),
                      json={} if "requestBody" in operation else None)


def probe_roles(walk: Walk, op: str, beta_key: int) -> None:
    """Each role below owner, on another project than the project-admin's and on ids that do
    not exist, with a body that breaks the rules: what it may not do is 403, before the body is
    read; what it may is anything but a change (and declared too)."""
    method, template = op.split(" ", 1)
    if not template.startswith("/admin/"):
        return
    path = filled(template.replace("{key_id}", str(beta_key)), "beta" if template.startswith("/admin/projects/")
                  else "nosuch" if "{name" in template or "{alias" in template or "{model}" in template else "999999")
    for role in ("viewer", "operator", "project-admin"):
        walk.call(op, None, path, who=role, json={"unknown": 1} if method in ("POST", "PATCH") else None)


def provoke_lean(walk: Walk, stack: Stack, op: str) -> None:
    """What SPEC §1's table lists, route by route."""
    body = lean_body(op)
    faulty = FAULTY[op]
    walk.call(op, 200, json=body("nimble" if op not in CHAT_OPS else "llama3.2"))
    if op != "POST /api/chat":  # vLLM speaks only /v1/chat/completions
        walk.call(op, 200, json=body(QWEN))
    walk.call(op, 403, json=body("nimble" if op not in CHAT_OPS else "llama3.2"), who="narrow")
    walk.call(op, 404, json=body("nosuch"))
    walk.call(op, 413, content=b'{"model": "' + b"x" * MAX_BODY + b'"}', headers={"Content-Type": "application/json"})
    walk.call(op, 415, content=gzip.compress(b"{}"), headers={"Content-Type": "application/json",
                                                              "Content-Encoding": "br"})
    walk.call(op, None, json=body(faulty), who="limited")  # spends the project's one request a minute
    walk.call(op, 429, json=body(faulty), who="limited")
    if op == "POST /api/chat":
        walk.call(op, 400, json=body(QWEN))
    else:
        vllm_state: VllmState = stack.extra["vllm_state"]
        vllm_state.required_bearer = "rotated-elsewhere"  # Arbiter's own credential refused
        try:
            assert walk.call(op, 500, json=body(QWEN)).json()
        finally:
            vllm_state.required_bearer = BACKEND_KEY
    if op not in CHAT_OPS:
        stack.ollama_state.version = "0.34.9"  # downgraded since: its plain-text 404 for the route
        try:
            walk.call(op, 405, json=body("nimble"))
        finally:
            stack.ollama_state.version = "0.35.0"
    stack.ollama_state.faults.drop_connection = True
    try:
        walk.call(op, 502, json=body(faulty))
    finally:
        stack.ollama_state.faults.reset()
    walk.call(op, 503, json=body(faulty))  # its only replica is backed off after that
    walk.call(op, 400, content=b"[]", headers={"Content-Type": "application/json"})


def lean_body(op: str) -> Callable[[str], dict[str, Any]]:
    if op == "POST /v1/systemone":
        return decision
    if op == "POST /v1/decisions":
        return lambda model: {"model": model, "input": "My card was charged twice.",
                              "questions": [{"type": "predicate", "name": "money", "instructions": "Money?"}]}
    return lambda model: {"model": model, "messages": [{"role": "user", "content": "Hello"}]}


def provoke_tenancy(walk: Walk) -> None:
    walk.call("POST /admin/organizations", 201, json={"name": "north"})
    walk.call("POST /admin/organizations", 409, json={"name": "north"})
    if walk.has("GET /admin/organizations"):  # the organizations' reads and rename
        walk.call("GET /admin/organizations", 200)
        walk.call("GET /admin/organizations/{name}", 200, "/admin/organizations/north")
        walk.call("GET /admin/organizations/{name}", 404, "/admin/organizations/nosuch")
        walk.call("PATCH /admin/organizations/{name}", 200, "/admin/organizations/north", json={"name": "south"})
        walk.call("PATCH /admin/organizations/{name}", 409, "/admin/organizations/south", json={"name": "default"})
        walk.call("PATCH /admin/organizations/{name}", 404, "/admin/organizations/nosuch", json={"name": "x"})
        walk.call("PATCH /admin/organizations/{name}", 200, "/admin/organizations/south", json={"name": "north"})
    walk.call("GET /admin/projects", 200)
    walk.call("POST /admin/projects", 201, json={"name": "gamma", "organization": "north", "models": ["nimble"]})
    walk.call("POST /admin/projects", 409, json={"name": "gamma"})
    walk.call("POST /admin/projects", 404, json={"name": "delta", "organization": "nosuch"})
    walk.call("GET /admin/projects/{name}", 200, "/admin/projects/gamma")
    walk.call("GET /admin/projects/{name}", 404, "/admin/projects/nosuch")
    walk.call("PATCH /admin/projects/{name}", 200, "/admin/projects/gamma", json={"tokens_per_minute": 1000})
    walk.call("PATCH /admin/projects/{name}", 404, "/admin/projects/nosuch", json={})
    walk.call("GET /admin/projects/{name}/keys", 200, "/admin/projects/acme/keys")
    walk.call("GET /admin/projects/{name}/keys", 404, "/admin/projects/nosuch/keys")
    made = walk.call("POST /admin/projects/{name}/keys", 201, "/admin/projects/gamma/keys", json={"name": "ci"}).json()
    walk.call("POST /admin/projects/{name}/keys", 404, "/admin/projects/nosuch/keys", json={})
    walk.call("GET /admin/admin-keys", 200)
    admin = walk.call("POST /admin/admin-keys", 201, json={"name": "reader", "role": "viewer"}).json()
    walk.call("POST /admin/admin-keys", 404, json={"role": "project-admin", "projects": ["nope"]})
    if walk.has("GET /admin/keys/{key_id}"):
        for key_id in (made["id"], admin["id"]):  # either kind
            walk.call("GET /admin/keys/{key_id}", 200, f"/admin/keys/{key_id}")
        walk.call("GET /admin/keys/{key_id}", 404, "/admin/keys/999999")
    walk.call("PATCH /admin/keys/{key_id}", 200, f"/admin/keys/{made['id']}", json={"requests_per_minute": 5})
    walk.call("PATCH /admin/keys/{key_id}", 404, "/admin/keys/999999", json={})
    walk.call("POST /admin/keys/{key_id}/rotate", 201, f"/admin/keys/{made['id']}/rotate", json={"grace_seconds": 0})
    walk.call("POST /admin/keys/{key_id}/rotate", 409, f"/admin/keys/{made['id']}/rotate", json={})
    walk.call("POST /admin/keys/{key_id}/rotate", 404, "/admin/keys/999999/rotate", json={})
    walk.call("POST /admin/keys/{key_id}/revoke", 200, f"/admin/keys/{admin['id']}/revoke")
    walk.call("POST /admin/keys/{key_id}/revoke", 404, "/admin/keys/999999/revoke")
    walk.call("GET /admin/audit", 200, params={"limit": 1000})
    walk.call("GET /admin/audit", 400, params={"before_id": 0})


def provoke_services(walk: Walk, stack: Stack) -> None:
    walk.call("GET /admin/services", 200)
    walk.call("POST /admin/services", 201, json={"type": "ollama-external", "url": stack.ollama.url, "name": "second"})
    walk.call("POST /admin/services", 409, json={"type": "ollama-external", "url": stack.ollama.url, "name": "second"})
    walk.call("POST /admin/services", 400, json={"type": "vllm", "url": f"http://127.0.0.1:{closed_port()}"})
    walk.call("DELETE /admin/services/{name}", 204, "/admin/services/second")
    for op in ("GET /admin/services/{name}", "POST /admin/services/{name}/refresh",
               "GET /admin/services/{name}/models", "DELETE /admin/services/{name}"):
        if not op.startswith("DELETE"):
            walk.call(op, 200, filled(op.split(" ")[1], "ollama"))
        walk.call(op, 404, filled(op.split(" ")[1], "nosuch"))
    walk.call("PATCH /admin/services/{name}", 200, "/admin/services/ollama", json={"timeout": 60})
    walk.call("PATCH /admin/services/{name}", 404, "/admin/services/nosuch", json={})
    walk.call("GET /admin/models", 200)
    walk.call("GET /admin/catalog", 200)
    stack.ollama_state.pull_seconds = 60  # still running when it is cancelled
    install = walk.call("POST /admin/services/{name}/models", 202, "/admin/services/ollama/models",
                        json={"model": "tev1"}).json()
    walk.call("POST /admin/services/{name}/models", 409, "/admin/services/ollama/models", json={"model": "nimble"})
    walk.call("POST /admin/services/{name}/models", 404, "/admin/services/nosuch/models", json={"model": "nimble"})
    walk.call("POST /admin/services/{name}/models", 201, "/admin/services/vllm/models",
              json={"model": QWEN, "capabilities": ["completion", "decision"]})
    walk.call("GET /admin/installs", 200)
    walk.call("GET /admin/installs/{install_id}", 200, f"/admin/installs/{install['id']}")
    walk.call("GET /admin/installs/{install_id}", 404, "/admin/installs/999999")
    walk.call("POST /admin/installs/{install_id}/cancel", 200, f"/admin/installs/{install['id']}/cancel")
    walk.call("POST /admin/installs/{install_id}/cancel", 409, f"/admin/installs/{install['id']}/cancel")
    walk.call("POST /admin/installs/{install_id}/cancel", 404, "/admin/installs/999999/cancel")
    walk.call("DELETE /admin/services/{name}/models/{model}", 204, f"/admin/services/vllm/models/{QWEN}")
    walk.call("DELETE /admin/services/{name}/models/{model}", 404, "/admin/services/ollama/models/nosuch")
    cards = walk.call("GET /admin/models", 200).json()["data"]
    nimble = next(card["id"] for card in cards if card["public_name"] == "nimble")
    for op in ("GET /admin/models/{model_id}", "POST /admin/models/{model_id}/test"):
        walk.call(op, 200, filled(op.split(" ")[1], str(nimble)))
        walk.call(op, 404, filled(op.split(" ")[1], "999999"))
    walk.call("PATCH /admin/models/{model_id}", 200, f"/admin/models/{nimble}", json={"timeout": 30})
    walk.call("PATCH /admin/models/{model_id}", 404, "/admin/models/999999", json={})


def provoke_rest(walk: Walk, stack: Stack) -> None:
    walk.call("GET /admin/aliases", 200)
    walk.call("POST /admin/aliases", 201, json={"alias": "jev-latest", "model": "nimble"})
    walk.call("POST /admin/aliases", 409, json={"alias": "jev-latest", "model": "nimble"})
    walk.call("POST /admin/aliases", 400, json={"alias": "other", "model": "nosuch"})
    walk.call("GET /admin/aliases", 200)
    walk.call("DELETE /admin/aliases/{alias}", 204, "/admin/aliases/jev-latest")
    walk.call("DELETE /admin/aliases/{alias}", 404, "/admin/aliases/jev-latest")
    peer = {"url": f"http://127.0.0.1:{closed_port()}"}
    added = walk.call("POST /admin/mesh/peers", 201, json=peer).json()
    walk.call("POST /admin/mesh/peers", 409, json=peer)
    wait_for(lambda: walk.call("GET /admin/mesh", 200).json()["peers"])  # with the peer, trying to connect
    walk.call("DELETE /admin/mesh/peers/{peer_id}", 204, f"/admin/mesh/peers/{added['id']}")
    walk.call("DELETE /admin/mesh/peers/{peer_id}", 404, "/admin/mesh/peers/999999")
    # Usage is written in batches: once the walk's requests are in, every kind of row is checked.
    wait_for(lambda: walk.call("GET /admin/usage/recent", 200).json()["data"])
    walk.call("GET /admin/usage/recent", 200, params={"limit": 1000})
    walk.call("GET /admin/usage/recent", 403, params={"project": "beta"}, who="project-admin")
    walk.call("GET /admin/usage", 200)
    walk.call("GET /admin/projects/{name}/usage", 200, "/admin/projects/acme/usage")
    walk.call("GET /admin/projects/{name}/usage", 404, "/admin/projects/nosuch/usage")
    walk.call("GET /v1/models", 200)
    wait_for(lambda: walk.call("GET /v1/usage", 200).json()["data"])
    walk.call("GET /v1/usage", 400, params={"days": 0})
    walk.call("GET /v1/usage", 400, params={"days": 1, "since": "2025-01-01"})
    walk.call("GET /healthz", 200)
    walk.call("GET /readyz", 200)
