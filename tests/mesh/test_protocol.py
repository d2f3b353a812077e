"""Reading peers' announcements, and the mesh credential, without a network."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from app.errors import AuthenticationFailed
from app.mesh.auth import Claim, MeshAuth, MeshCredentialRefused, Refusal, refused_for_another_node
from app.mesh.protocol import BadAnnouncement, Reader
from tests.mesh.old_peer import MemoryNonces


def _announcement(**extra: Any) -> dict[str, Any]:
    return {"protocol": 1, "node": "node-b", "url": "http://b:8080", "version": "0.2.0",
            "decision_models": True, "models": [], **extra}


def test_a_newer_peers_unknown_types_and_fields_are_skipped_one_by_one(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="arbiter.mesh")
    reader = Reader()
    read = reader.read(_announcement(quorum=3, models=[
        {"name": "nimble", "type": "ollama", "capabilities": ["decision"], "path": ["node-b"]},
        {"name": "quantum-1", "type": "qpu", "capabilities": ["decision"]},
        {"name": "clef", "type": "vllm", "capabilities": ["decision", "vision", "smell"], "price": 3},
        {"name": "", "type": "ollama", "capabilities": []},
        "not an object",
        {"name": "loop", "type": "ollama", "capabilities": [], "path": ["node-b", "node-c"]},
        {"name": "caps", "type": "ollama", "capabilities": "decision"},
    ]))
    assert [(m.name, sorted(m.capabilities), m.path) for m in read.models] == [
        ("nimble", ["decision"], ("node-b",)), ("clef", ["decision", "vision"], ("node-b",))]
    messages = [r.getMessage() for r in caplog.records]
    for expected in ("unknown field 'quorum'", "unknown type 'qpu'", "unknown capabilities ['smell']",
                     "unknown model field 'price'", "without a valid name", "not an object",
                     "malformed path", "without a list of capabilities"):
        assert any(expected in m for m in messages), (expected, messages)
    # The same surprise every second is logged once.
    count = len(caplog.records)
    reader.read(_announcement(quorum=3))
    assert len(caplog.records) == count


def test_a_models_timeout_and_legacy_flag_are_read_when_valid(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="arbiter.mesh")
    entries = [{"name": name, "type": "ollama", "capabilities": ["decision"], **extra} for name, extra in (
        ("given", {"timeout": 30, "legacy": True}), ("absent", {}), ("text", {"timeout": "30"}),
        ("zero", {"timeout": 0}), ("flag", {"timeout": True}))]
    read = Reader().read(_announcement(models=entries))
    assert [(m.name, m.timeout, m.legacy) for m in read.models] == [
        ("given", 30.0, True), ("absent", None, False), ("text", None, False), ("zero", None, False),
        ("flag", None, False)]
    assert not any("unknown model field" in r.getMessage() for r in caplog.records)
    assert any("'text' with a timeout" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("data", [[], "x", {"node": ""}, {"node": "bad name with spaces"}, {"models": []}])
def test_an_announcement_without_a_node_is_refused_whole(data: Any) -> None:
    with pytest.raises(BadAnnouncement):
        Reader().read(data)


def test_an_answer_without_accepted_counts_as_accepted() -> None:
    assert Reader().read(_announcement()).accepted is True
    refused = Reader().read(_announcement(accepted=False, reason="too new for me"))
    assert (refused.accepted, refused.reason) == (False, "too new for me")


def _admit(auth: MeshAuth, headers: dict[str, str], body: bytes, method: str = "POST",
           path: str = "/v1/systemone", length: int | None = None) -> Claim:
    """The receiver's head check, as a route runs it: the signed headers and the body's length."""
    head = {k.lower(): v for k, v in headers.items()}
    head["content-length"] = str(len(body) if length is None else length)
    return asyncio.run(auth.admit(head["authorization"], method, path, head))


def test_signatures_bind_key_path_length_digest_hops_and_salt() -> None:
    sender, receiver = MeshAuth("k", "node-a"), MeshAuth("k", "node-b", MemoryNonces())
    headers, _ = sender.sign("POST", "/v1/systemone", b"{}", hops=2, salt="ab" * 16, target="node-b")
    assert headers["Authorization"].startswith("ArbiterMesh v2;node-a;node-b;")
    claim = _admit(receiver, headers, b"{}")
    assert (claim.node, claim.hops, claim.salt) == ("node-a", 2, "ab" * 16)
    receiver.verify_body(claim, b"{}")
    with pytest.raises(AuthenticationFailed, match="not the one that was signed"):
        receiver.verify_body(claim, b"{ }")
    other_digest = {"X-Arbiter-Mesh-Body-Digest": "sha256=" + "0" * 64}
    for changed in ({"method": "PUT"}, {"path": "/api/chat"}, {"path": "/v1/systemone?x=1"}, {"length": 3}):
        fresh, _ = sender.sign("POST", "/v1/systemone", b"{}", hops=2, target="node-b")
        with pytest.raises(AuthenticationFailed, match="wrong mesh key"):
            _admit(receiver, fresh, b"{}", **changed)  # type: ignore[arg-type]
    fresh, _ = sender.sign("POST", "/v1/systemone", b"{}", hops=2, target="node-b")
    with pytest.raises(AuthenticationFailed, match="wrong mesh key"):
        _admit(receiver, {**fresh, **other_digest}, b"{}")
    tampered, _ = sender.sign("POST", "/v1/systemone", b"{}", hops=2, target="node-b")
    tampered["Authorization"] = tampered["Authorization"].replace(";2;", ";1;")
    with pytest.raises(AuthenticationFailed, match="wrong mesh key"):
        _admit(receiver, tampered, b"{}")


def test_old_credentials_and_malformed_ones_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = MeshAuth("k", "node-a")
    receiver = MeshAuth("k", "node-b", MemoryNonces())
    headers, _ = auth.sign("POST", "/p", b"", target="node-b")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 120)
    with pytest.raises(AuthenticationFailed, match="time window"):
        _admit(receiver, headers, b"", path="/p")
    monkeypatch.setattr(time, "time", real)
    for bad in ("ArbiterMesh ", "ArbiterMesh v2;a;b;1;2;3;-;4", "ArbiterMesh v3;a;node-b;1;2;3;-;4",
                "ArbiterMesh v2;a b;node-b;1;" + "0" * 32 + ";1;-;" + "0" * 64):
        with pytest.raises(AuthenticationFailed, match="malformed"):
            _admit(receiver, {**headers, "Authorization": bad}, b"", path="/p")
    # No length (a chunked body) or no digest: the credential cannot be checked on the head.
    unsent = {k.lower(): v for k, v in auth.sign("POST", "/p", b"", target="node-b")[0].items()}
    with pytest.raises(AuthenticationFailed, match="Content-Length"):
        asyncio.run(receiver.admit(unsent["authorization"], "POST", "/p", unsent))
    with pytest.raises(AuthenticationFailed, match="Body-Digest"):
        _admit(receiver, {"Authorization": unsent["authorization"]}, b"", path="/p")


def test_a_v1_credential_is_refused_naming_the_node_to_upgrade() -> None:
    receiver = MeshAuth("k", "node-b", MemoryNonces())
    v1 = "ArbiterMesh v1;old-node;node-b;1;" + "0" * 32 + ";1;-;" + "0" * 64
    with pytest.raises(AuthenticationFailed, match="v1 refused.*old-node .*must be upgraded"):
        _admit(receiver, {"Authorization": v1, "X-Arbiter-Mesh-Body-Digest": "sha256=" + "0" * 64}, b"")


def test_a_credential_is_good_only_at_its_target_and_once() -> None:
    sender = MeshAuth("k", "node-a")
    b, c = MeshAuth("k", "node-b", MemoryNonces()), MeshAuth("k", "node-c", MemoryNonces())
    headers, _ = sender.sign("POST", "/v1/systemone", b"{}", target="node-b")
    with pytest.raises(AuthenticationFailed, match="another node"):
        _admit(c, headers, b"{}")
    anywhere, _ = sender.sign("POST", "/mesh/v1/exchange", b"{}", target="*")
    with pytest.raises(AuthenticationFailed, match=r"any node \(\*\) refused"):
        _admit(c, anywhere, b"{}", path="/mesh/v1/exchange")
    _admit(b, headers, b"{}")
    with pytest.raises(AuthenticationFailed, match="replayed"):
        _admit(b, headers, b"{}")


def test_each_refusal_names_its_reason_in_a_header() -> None:
    sender = MeshAuth("k", "node-a")
    b, c = MeshAuth("k", "node-b", MemoryNonces()), MeshAuth("other", "node-c", MemoryNonces())
    for_b, _ = sender.sign("POST", "/v1/systemone", b"{}", target="node-b")
    for_c, _ = sender.sign("POST", "/v1/systemone", b"{}", target="node-c")
    claim = _admit(b, for_b, b"{}")
    for refuse, reason in ((lambda: _admit(c, for_b, b"{}"), Refusal.OTHER_NODE),
                           (lambda: _admit(c, for_c, b"{}"), Refusal.WRONG_KEY),
                           (lambda: _admit(b, for_b, b"{}"), Refusal.REPLAYED),
                           (lambda: b.verify_body(claim, b"[]"), Refusal.BODY)):
        with pytest.raises(MeshCredentialRefused) as refused:
            refuse()
        assert refused.value.headers["X-Arbiter-Mesh-Refused"] == "1"
        assert refused.value.headers["X-Arbiter-Mesh-Refusal"] == reason == refused.value.reason


@pytest.mark.parametrize(("headers", "message", "renamed"), [
    ({"X-Arbiter-Mesh-Refusal": "other-node"}, "not accepted here", True),  # whatever the words
    ({"X-Arbiter-Mesh-Refusal": "wrong-key"}, "mesh credential meant for another node (node-b)", False),
    ({}, "mesh credential meant for another node (node-b)", True),  # a build from before the header
    ({}, "mesh credential refused: wrong mesh key", False),
])
def test_a_renamed_peer_is_told_by_its_refusals_reason(headers: dict[str, str], message: str, renamed: bool) -> None:
    assert refused_for_another_node(headers, message) is renamed


def test_an_answer_proves_the_peer_holds_the_key() -> None:
    ours, theirs, impostor = MeshAuth("k", "a"), MeshAuth("k", "b"), MeshAuth("other", "b")
    _, nonce = ours.sign("POST", "/mesh/v1/exchange", b"{}", target="b")
    assert ours.answer_valid(nonce, b"answer", theirs.answer_proof(nonce, b"answer"))
    assert not ours.answer_valid(nonce, b"answer", impostor.answer_proof(nonce, b"answer"))
    assert not ours.answer_valid(nonce, b"changed", theirs.answer_proof(nonce, b"answer"))
    assert not ours.answer_valid(nonce, b"answer", None)
    # An introduction's proof (which anyone may ask for) never stands for an answer's, nor back.
    assert ours.answer_valid(nonce, b"hi", theirs.introduction_proof(nonce, b"hi"), introduction=True)
    assert not ours.answer_valid(nonce, b"hi", theirs.introduction_proof(nonce, b"hi"))
    assert not ours.answer_valid(nonce, b"hi", theirs.answer_proof(nonce, b"hi"), introduction=True)
