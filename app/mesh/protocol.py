"""The mesh's model-list exchange: what a node announces, and how an announcement is read.

    POST /mesh/v1/exchange      (signed: see auth.py)
    {"protocol": 1, "node": "b:8080", "url": "http://b:8080", "version": "0.1.0",
     "decision_models": true, "refused": null,
     "models": [{"name": "nimble", "type": "ollama", "capabilities": ["decision"],
                 "path": ["c:8080", "b:8080"], "timeout": 120}]}

The answer has the same shape plus ``accepted`` (false when the answering node refuses the
caller's model list, with the reason in ``reason``). ``path`` lists the nodes a model's route
passes through, from the node that has it to the announcing node; a node drops routes whose
path holds its own name (no loops) or that are longer than the hop limit. ``timeout`` is the
seconds the node that has the model gives it to answer (passed on unchanged along the path;
absent from earlier versions). ``legacy: true`` marks a route that passes through a node whose
version does not know decision models (absent: it does not), so a node two hops away knows that
such a route cannot answer decisions.

Reading is lenient one entry at a time: a newer peer may send model types, capabilities or
fields this node does not know; each is skipped with a log line (once per peer), never a crash.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from app.mesh.auth import valid_node_name

PROTOCOL = 1
EXCHANGE_PATH = "/mesh/v1/exchange"
KNOWN_TYPES = frozenset({"ollama", "ollama-external", "ollama-cloud", "vllm", "openai", "local"})
KNOWN_CAPABILITIES = frozenset({"decision", "completion", "embedding", "vision", "audio", "video"})
_ANNOUNCEMENT_FIELDS = frozenset({"protocol", "node", "url", "version", "decision_models", "models",
                                  "refused", "accepted", "reason"})
_MODEL_FIELDS = frozenset({"name", "type", "capabilities", "path", "timeout", "legacy"})
MAX_MODELS = 10_000
MAX_TIMEOUT = 86_400.0

log = logging.getLogger("arbiter.mesh")


class BadAnnouncement(ValueError):
    """The announcement as a whole cannot be read (not an object, no node name)."""


@dataclass(frozen=True, slots=True)
class RemoteModel:
    name: str
    type: str
    capabilities: frozenset[str]
    path: tuple[str, ...]  # origin first, the announcing node last
    timeout: float | None = None  # seconds the origin gives the model; None from earlier versions
    legacy: bool = False  # the route passes through a node that does not know decision models

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "capabilities": sorted(self.capabilities),
                "hops": len(self.path), "path": list(self.path)}


@dataclass(slots=True)
class Announcement:
    node: str
    url: str | None
    version: str
    decision_models: bool
    models: list[RemoteModel] = field(default_factory=list)
    accepted: bool = True
    reason: str | None = None
    refused: str | None = None  # the sender refused our last answer's model list, and why


def has_userinfo(url: str) -> bool:
    """Whether ``url`` carries a user or password (``http://user:pass@host``)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unreadable (a bad IPv6 literal): judged by its text
        return "@" in url.split("://", 1)[-1].split("/", 1)[0]
    return bool(parts.username or parts.password)


def model_entry(name: str, type_: str, capabilities: frozenset[str] | set[str],
                path: tuple[str, ...] | list[str], timeout: float | None, legacy: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "type": type_, "capabilities": sorted(capabilities), "path": list(path)}
    if timeout is not None:
        entry["timeout"] = timeout
    if legacy:
        entry["legacy"] = True
    return entry


class Reader:
    """Reads announcements of peers; remembers what it has logged so a peer's every exchange
    does not repeat the same line."""

    def __init__(self) -> None:
        self._logged: set[tuple[str, str]] = set()

    def read(self, data: Any) -> Announcement:
        if not isinstance(data, dict):
            raise BadAnnouncement("the announcement is not a JSON object")
        node = data.get("node")
        if not isinstance(node, str) or not valid_node_name(node):
            raise BadAnnouncement("the announcement has no valid node name")
        for name in sorted(set(data) - _ANNOUNCEMENT_FIELDS):
            self._note(node, f"peer {node} sent the unknown field '{name}'; ignored")
        url = data.get("url")
        version = data.get("version")
        refused = data.get("refused")
        reason = data.get("reason")
        announcement = Announcement(
            node=node,
            url=url if isinstance(url, str) and url.startswith(("http://", "https://")) and not has_userinfo(url)
            else None,
            version=version[:100] if isinstance(version, str) else "unknown",
            decision_models=data.get("decision_models") is True,
            accepted=data.get("accepted") is not False,
            reason=reason[:1000] if isinstance(reason, str) else None,
            refused=refused[:1000] if isinstance(refused, str) else None,
        )
        models = data.get("models")
        if models is None:
            return announcement
        if not isinstance(models, list):
            self._note(node, f"peer {node} sent a model list that is not a list; ignored")
            return announcement
        if len(models) > MAX_MODELS:
            self._note(node, f"peer {node} sent {len(models)} models; only the first {MAX_MODELS} are read")
        for entry in models[:MAX_MODELS]:
            model = self._model(node, entry)
            if model is not None:
                announcement.models.append(model)
        return announcement

    def _model(self, node: str, entry: Any) -> RemoteModel | None:
        if not isinstance(entry, dict):
            self._note(node, f"peer {node} sent a model entry that is not an object; skipped")
            return None
        name, type_, caps, path = entry.get("name"), entry.get("type"), entry.get("capabilities"), entry.get("path")
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            self._note(node, f"peer {node} sent a model without a valid name; skipped")
            return None
        for extra in sorted(set(entry) - _MODEL_FIELDS):
            self._note(node, f"peer {node} sent the unknown model field '{extra}'; ignored")
        if type_ not in KNOWN_TYPES:
            self._note(node, f"peer {node} sent model '{name}' of the unknown type {type_!r}; skipped")
            return None
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            self._note(node, f"peer {node} sent model '{name}' without a list of capabilities; skipped")
            return None
        unknown = sorted(set(caps) - KNOWN_CAPABILITIES)
        if unknown:
            self._note(node, f"peer {node} sent model '{name}' with unknown capabilities {unknown}; "
                             "those are ignored")
        if path is None:
            path = [node]
        if (not isinstance(path, list) or not path or path[-1] != node
                or not all(isinstance(p, str) and valid_node_name(p) for p in path)):
            self._note(node, f"peer {node} sent model '{name}' with a malformed path; skipped")
            return None
        timeout = entry.get("timeout")
        if timeout is not None and (not isinstance(timeout, int | float) or isinstance(timeout, bool)
                                    or not 0 < timeout <= MAX_TIMEOUT):
            self._note(node, f"peer {node} sent model '{name}' with a timeout that is not a number of "
                             f"seconds up to {MAX_TIMEOUT:g}; this node's own is used")
            timeout = None
        return RemoteModel(name, type_, frozenset(caps) & KNOWN_CAPABILITIES, tuple(path),
                           None if timeout is None else float(timeout), entry.get("legacy") is True)

    def _note(self, node: str, message: str) -> None:
        if (node, message) not in self._logged:
            if len(self._logged) > 10_000:
                self._logged.clear()
            self._logged.add((node, message))
            log.warning(message)
