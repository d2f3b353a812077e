"""This node's place in the mesh: its peers, their model lists, and the routes they give.

Each configured peer gets a loop that exchanges model lists with it every ``mesh_interval``
seconds (backing off while it is down); a peer that connects to this node is answered by
``receive``. After every change the mesh's models are handed to the registry, which the
forwarding paths read: a model not on this node goes to a peer that has it, as to a replica.

A link opens with an introduction (hello.py): an unsigned ``GET`` whose answer is the peer's
name, proved with the mesh key; every exchange is signed for that name, and a credential for any
node (``*``) is refused. A peer's exchange is proved on its head before its body is read
(``admit``), and its body checked against the signed digest once read (``receive``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import socket
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import httpx
import orjson
from sqlalchemy import select

from app import audit
from app.db.models import MeshPeer
from app.db.session import Database
from app.errors import (
    ArbiterError,
    AuthenticationFailed,
    Conflict,
    InvalidRequest,
    NotFound,
    TooLarge,
)
from app.mesh.auth import (
    NONCE_LIFETIME,
    PROOF_HEADER,
    SCHEME,
    WINDOW,
    Claim,
    MeshAuth,
    refused_for_another_node,
    valid_node_name,
)
from app.mesh.backend import MeshBackend
from app.mesh.hello import IntroductionFailed, introduce
from app.mesh.nonces import nonce_store
from app.mesh.peer import Peer, configured_peers, loopback, normalized_url
from app.mesh.protocol import (
    EXCHANGE_PATH,
    PROTOCOL,
    Announcement,
    BadAnnouncement,
    Reader,
    RemoteModel,
    model_entry,
)
from app.routing.registry import ModelEntry, Registry, Replica
from app.settings import Settings
from app.tenancy.service import Actor
from app.version import VERSION

log = logging.getLogger("arbiter.mesh")
MAX_EXCHANGE_BYTES = 8 * 1024 * 1024
MAX_ROW_ID = 2**31 - 1
IDLE_BACKEND_SECONDS = 60.0
_UNLIMITED_TEXT = 1 << 62  # the node that has the model applies its own text limit
# Added to a mesh route's timeout once per hop: each node on the way waits a little longer than
# the next one, so the node nearest the model times out first and its answer comes back.
HOP_MARGIN = 5.0


class Mesh:
    def __init__(self, settings: Settings, registry: Registry, database: Database, redis: Any = None) -> None:
        self._settings = settings
        self._registry = registry
        self._database = database
        self.enabled = settings.mesh_key is not None
        self.name = settings.mesh_node_name or f"{socket.gethostname()}:{settings.port}"
        host = socket.gethostname() if settings.host in ("0.0.0.0", "::") else settings.host
        self.url = (settings.mesh_url or f"http://{host}:{settings.port}").rstrip("/")
        # Accepted nonces, shared by every process of this node: Redis when it is configured.
        self._nonces = nonce_store(redis, database, NONCE_LIFETIME)
        self.auth = (MeshAuth(settings.mesh_key.get_secret_value(), self.name, self._nonces)
                     if settings.mesh_key else None)
        self.interval = settings.mesh_interval
        self.max_hops = settings.mesh_max_hops
        self._peers: dict[str, Peer] = {}  # "out:<url>" or "in:<node name>"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._reader = Reader()
        self._refused: deque[dict[str, Any]] = deque(maxlen=50)
        self._replicas: dict[tuple[str, str], Replica] = {}
        self._backends: dict[str, MeshBackend] = {}
        self._backend_used: dict[str, float] = {}  # url -> time.monotonic() it last carried a route
        self._closing: set[asyncio.Task[None]] = set()
        self._ids: dict[str, int] = {}
        self._client: httpx.AsyncClient | None = None

    # -- life ------------------------------------------------------------------------

    async def start(self) -> None:
        if not self.enabled:
            return
        timeout = min(5.0, self._settings.backend_admin_timeout)
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 3.0)),
                                         follow_redirects=False)
        if not valid_node_name(self.name):
            raise ValueError(f"ARBITER_MESH_NODE_NAME {self.name!r} is not a valid node name "
                             "(1-100 of A-Z a-z 0-9 . _ : @ -)")
        peers = configured_peers(self._settings.mesh_peers)
        if loopback(self.url) and any(not loopback(url) for url in peers):
            log.warning("this node announces %s, a loopback address, to peers on other hosts: they cannot "
                        "reach it; set ARBITER_MESH_URL", self.url)
        for url in peers:
            self._add_outbound(url, "config", None)
        self._tasks["sweep"] = asyncio.create_task(self._sweep())
        await self.reload_peers()
        self._publish()
        log.info("mesh node %s at %s; peers: %s", self.name, self.url,
                 ", ".join(p.url or "?" for p in self._peers.values()) or "none yet")

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._client is not None:
            await self._client.aclose()
        for backend in self._backends.values():
            await backend.aclose()
        self._backends.clear()
        for task in list(self._closing):
            with contextlib.suppress(Exception):
                await task

    async def reload_peers(self) -> None:
        """Peers added or removed through the admin API (here or on another replica of this node)."""
        if not self.enabled:
            return

        def read() -> list[tuple[int, str]]:
            with self._database.session() as session:
                return [(p.id, p.url) for p in session.scalars(select(MeshPeer))]

        stored = await asyncio.to_thread(read)
        wanted = {url: peer_id for peer_id, url in stored}
        changed = False
        for key, peer in list(self._peers.items()):
            if peer.source == "admin" and peer.url not in wanted:
                self._drop(key)
                changed = True
        for url, peer_id in wanted.items():
            if f"out:{url}" not in self._peers:
                self._add_outbound(url, "admin", peer_id)
                changed = True
        if changed:
            self._publish()

    async def run(self, interval: float) -> None:
        """Reload the admin's peers on a schedule: replicas of this node without Redis (no "mesh"
        message) learn of a peer added or removed on another one within ``interval``."""
        if not self.enabled:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload_peers()
            except Exception:  # the database may be away: keep the peers we have
                log.exception("reloading mesh peers failed; keeping the current ones")

    def _add_outbound(self, url: str, source: str, peer_id: int | None) -> None:
        key = f"out:{url}"
        if key in self._peers:
            return
        peer = self._peers[key] = Peer(url=url, direction="outbound", source=source, peer_id=peer_id)
        self._tasks[key] = asyncio.create_task(self._keep_in_touch(peer))

    def _drop(self, key: str) -> None:
        self._peers.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    # -- the admin API -----------------------------------------------------------------

    def add_peer(self, url: str, actor: Actor) -> dict[str, Any]:
        """Store a peer (in a worker thread); ``reload_peers`` then connects to it."""
        if not self.enabled:
            raise InvalidRequest("this node is not in a mesh: set ARBITER_MESH_KEY first")
        url = normalized_url(url)
        with self._database.session() as session:
            if session.scalar(select(MeshPeer).where(MeshPeer.url == url)) is not None:
                raise Conflict(f"peer {url} is already added")
            row = MeshPeer(url=url)
            session.add(row)
            session.flush()
            audit.record(session, actor=actor.name, action="mesh.peer.add", target=f"mesh-peer:{url}",
                         request_id=actor.request_id)
            return {"id": row.id, "url": url}

    def remove_peer(self, peer_id: int, actor: Actor) -> None:
        with self._database.session() as session:
            # Ids past 32 bits (PostgreSQL's integer) or below 1 name no row; never ask the database.
            row = session.get(MeshPeer, peer_id) if 0 < peer_id <= MAX_ROW_ID else None
            if row is None:
                raise NotFound(f"mesh peer {peer_id} does not exist (peers from ARBITER_MESH_PEERS "
                               "cannot be removed here)")
            audit.record(session, actor=actor.name, action="mesh.peer.remove", target=f"mesh-peer:{row.url}",
                         request_id=actor.request_id)
            session.delete(row)

    def status(self) -> dict[str, Any]:
        return {"enabled": self.enabled,
                "node": {"name": self.name, "url": self.url, "version": VERSION, "decision_models": True},
                "peers": [p.view() for p in self._peers.values()],
                "refused": list(self._refused)}

    def too_old_peers(self) -> list[Peer]:
        """Known peers whose version does not know decision models."""
        return [p for p in list(self._peers.values())
                if p.decision_models is False and p.state in ("connected", "refused_us")]

    def check_decision_install(self, capabilities: list[str]) -> None:
        """Conflict (409, ``mesh_warning``) before a decision model is installed while a known peer
        is too old for it: the peer will refuse this node's model list from then on."""
        if "decision" not in capabilities:
            return
        old = self.too_old_peers()
        if old:
            names = ", ".join(f"{p.name} (version {p.version})" for p in old)
            raise MeshWarning(f"mesh peer {names} does not know decision models: once this node has a "
                              "decision model, that peer refuses this node's model list and the two stop "
                              "sharing models. Send the request again with \"confirm\": true to install anyway.")

    # -- exchanges this node starts --------------------------------------------------

    async def _keep_in_touch(self, peer: Peer) -> None:
        while True:
            try:
                await self._exchange(peer)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one peer's surprise stop the loop
                log.exception("mesh exchange with %s failed unexpectedly", peer.url)
                self._set_state(peer, "error", "internal error in the exchange; see the logs")
            if peer.state in ("connected", "refused_us"):
                peer.failures = 0
                delay = self.interval
            else:
                peer.failures += 1
                delay = min(self.interval * 2 ** min(peer.failures - 1, 16),
                            max(self.interval, self._settings.mesh_max_backoff))
            self._publish()
            await asyncio.sleep(delay * random.uniform(0.85, 1.0))

    async def _exchange(self, peer: Peer) -> None:
        assert self._client is not None and self.auth is not None and peer.url is not None
        if peer.name is None:  # an introduction first: it gives the name the exchange is signed for
            try:
                name, proven = await introduce(self._client, self.auth, peer.url)
            except IntroductionFailed as failure:
                self._lost(peer, failure.message, state=failure.state, level=failure.level)
                return
            # Another mesh key, or not the node it names: an exchange without models, signed for
            # that name, which a node with another key refuses (and both sides say so) and a node
            # that is not the one named cannot answer with a proof.
            if not proven and await self._send(peer, self._introduction(), name) is None:
                return
            peer.name = name
        # The mesh's decision models go only to a peer known to take them (the first exchange
        # says): one that does not would refuse the whole list for another node's model.
        announcement = await self._send(peer, self._announcement(peer.name, peer.decision_models is True),
                                        peer.name)
        if announcement is None:
            return
        self._heard(peer, announcement)
        if announcement.accepted:
            self._set_state(peer, "connected", None)
        else:
            self._set_state(peer, "refused_us", _refusal(announcement, announcement.reason), level=logging.ERROR)

    async def _send(self, peer: Peer, payload: dict[str, Any], target: str) -> Announcement | None:
        """One exchange with ``peer``: its proven answer, or None when there is none (the peer's
        state then says why)."""
        assert self._client is not None and self.auth is not None and peer.url is not None
        body = orjson.dumps(payload)
        signed, nonce = self.auth.sign("POST", EXCHANGE_PATH, body, target=target)
        url = peer.url + EXCHANGE_PATH
        try:
            async with self._client.stream("POST", url, content=body, headers={
                    **signed, "Content-Type": "application/json"}) as response:
                answer = await _read_capped(response)
        except httpx.TimeoutException:
            self._lost(peer, f"{peer.url} did not answer within {self._client.timeout.read:g}s")
            return None
        except (httpx.HTTPError, OSError, ValueError) as exc:
            self._lost(peer, f"cannot reach {peer.url}: {type(exc).__name__}")
            return None
        if response.status_code in (401, 403):
            why = _error_message(answer)
            if refused_for_another_node(response.headers, why):  # a new name: introduce ourselves again
                peer.name = None
                self._lost(peer, f"{peer.url} is now another node; reconnecting", state="connecting")
                return None
            self._set_state(peer, "key_rejected", f"peer {peer.name or peer.url} refused this node's mesh key "
                                                  f"(HTTP {response.status_code}: {why or 'no reason given'}); "
                                                  "every node of a mesh needs the same ARBITER_MESH_KEY and a "
                                                  "clock within a minute of the others", level=logging.ERROR)
            return None
        if response.status_code != 200:
            why = _error_message(answer) or "is it an Arbiter with the mesh on?"
            self._lost(peer, f"{peer.url} answered HTTP {response.status_code} to the model-list exchange ({why})")
            return None
        if not self.auth.answer_valid(nonce, answer, response.headers.get(PROOF_HEADER)):
            self._lost(peer, f"{peer.url} answered without proving it holds the mesh key; ignored",
                       state="unproven", level=logging.ERROR)
            return None
        try:
            announcement = self._reader.read(orjson.loads(answer))
        except (orjson.JSONDecodeError, BadAnnouncement) as exc:
            self._lost(peer, f"{peer.url} sent an unreadable model list: {exc}")
            return None
        if announcement.node == self.name:
            self._lost(peer, f"{peer.url} is this node itself (the same node name {self.name})")
            return None
        return announcement

    def _heard(self, peer: Peer, announcement: Announcement) -> None:
        peer.name, peer.version = announcement.node, announcement.version
        peer.decision_models, peer.models = announcement.decision_models, announcement.models
        peer.last_contact, peer.seen = dt.datetime.now(dt.UTC), time.monotonic()
        peer.refused_by_peer = announcement.refused

    def _lost(self, peer: Peer, error: str, *, state: str = "unreachable", level: int = logging.WARNING) -> None:
        peer.models = []  # withdrawn: requests must not go where nothing answers
        self._set_state(peer, state, error, level=level)

    def _set_state(self, peer: Peer, state: str, error: str | None, *, level: int = logging.WARNING) -> None:
        if (state, error) != (peer.state, peer.error):
            if error is None:
                log.info("mesh peer %s (%s) connected", peer.name, peer.url)
            else:
                log.log(level, "mesh peer %s: %s", peer.name or peer.url, error)
        peer.state, peer.error = state, error

    # -- exchanges peers start -------------------------------------------------------

    async def admit(self, headers: Mapping[str, str], path: str, address: str | None) -> Claim:
        """The claim of an exchange, proved on its head before a byte of its body is read; an
        ArbiterError to answer at once otherwise (no mesh, a credential this node refuses, a body
        over the cap), with ``Connection: close``: the unread body is not taken as a next request."""
        authorization = headers.get("authorization")
        try:
            if self.auth is None:
                raise NotFound("this node is not in a mesh")
            try:
                if authorization is None or not authorization.startswith(SCHEME):
                    raise AuthenticationFailed("a mesh credential is needed")
                claim = await self.auth.admit(authorization, "POST", path, headers)
            except AuthenticationFailed as error:
                self._refuse(_claimed_node(authorization), address, error)
                raise
            if int(headers.get("content-length") or 0) > MAX_EXCHANGE_BYTES:  # admit read its digits
                raise TooLarge(f"a model list is at most {MAX_EXCHANGE_BYTES} bytes")
        except ArbiterError as error:
            error.headers["Connection"] = "close"
            raise
        return claim

    def _refuse(self, claimed: str | None, address: str | None, error: ArbiterError) -> None:
        self._refused.append({"at": dt.datetime.now(dt.UTC).isoformat(), "peer": claimed,
                              "address": address, "reason": error.message})
        log.warning("refused a mesh exchange from %s (claims to be %s): %s", address, claimed, error.message)

    async def receive(self, claim: Claim, body: bytes, address: str | None) -> tuple[int, bytes, dict[str, str]]:
        """A peer's exchange, admitted on its head and now read whole: ``(status, body, headers)``
        of the answer."""
        assert self.auth is not None  # admit let the exchange in
        try:
            self.auth.verify_body(claim, body)
        except AuthenticationFailed as error:
            self._refuse(claim.node, address, error)
            return _error(error)
        try:
            announcement = self._reader.read(orjson.loads(body))
        except (orjson.JSONDecodeError, BadAnnouncement) as exc:
            return _error(InvalidRequest(f"unreadable model list: {exc}"))
        if announcement.node != claim.node:
            return _error(InvalidRequest("the model list's node is not the node that signed it"))
        if announcement.node == self.name:
            return _error(Conflict(f"this node is also called {self.name}; every node needs its own name"))
        key = f"in:{announcement.node}"
        peer = self._peers.get(key)
        if peer is None:  # its state change below says it connected (or was refused)
            peer = self._peers[key] = Peer(url=announcement.url, direction="inbound", source="inbound")
        peer.url = announcement.url
        self._heard(peer, announcement)
        if announcement.refused:  # it refused the model list this node answered with last time
            self._set_state(peer, "refused_us", _refusal(announcement, announcement.refused), level=logging.ERROR)
        else:
            self._set_state(peer, "connected", None)
        self._publish()
        answer = orjson.dumps({**self._announcement(announcement.node, announcement.decision_models),
                               "accepted": True, "reason": None})
        return 200, answer, {PROOF_HEADER: self.auth.answer_proof(claim.nonce, answer)}

    # -- what this node announces, and the routes it takes -----------------------------

    def _introduction(self) -> dict[str, Any]:
        """Who this node is, without its models: what opens a link, and what answers one."""
        return {"protocol": PROTOCOL, "node": self.name, "url": self.url, "version": VERSION,
                "decision_models": True, "refused": None, "models": []}

    def _announcement(self, for_node: str | None, relay_decisions: bool = True) -> dict[str, Any]:
        """This node's models, and the mesh's models it can reach through others than ``for_node``
        (routes through ``for_node`` would send its requests back to it). Without
        ``relay_decisions`` (``for_node`` does not know decision models) the mesh's decision
        models are left out: that node would refuse the whole list for another node's model."""
        models: dict[str, dict[str, Any]] = {}
        for entry in self._registry.entries():
            models[entry.public_name] = model_entry(entry.public_name, entry.replicas[0].service_type,
                                                    entry.capabilities, [self.name],
                                                    max(r.timeout for r in entry.replicas))
        for node, peer in self._usable().items():
            if node == for_node:
                continue
            for model in peer.models:
                path = (*model.path, self.name)
                if model.name in models and len(models[model.name]["path"]) <= len(path):
                    continue
                if not relay_decisions and "decision" in model.capabilities:
                    continue
                if self.name in model.path or (for_node is not None and for_node in model.path):
                    continue
                if len(path) > self.max_hops:
                    continue
                models[model.name] = model_entry(model.name, model.type, model.capabilities, path,
                                                 model.timeout, peer.legacy_route(model))
        return {**self._introduction(), "models": list(models.values())}

    def _usable(self) -> dict[str, Peer]:
        """Per node, the freshest link that may take requests."""
        now = time.monotonic()
        stale = 3 * self.interval
        best: dict[str, Peer] = {}
        for peer in self._peers.values():
            if peer.state != "connected" or peer.name is None or peer.url is None or peer.url == self.url:
                continue
            if peer.direction == "inbound" and now - peer.seen > stale:
                continue
            known = best.get(peer.name)
            # One link per node, and the same one while it works: the link this node opened (its
            # configured URL) over one the peer opened, so routes do not flap between addresses.
            if known is None or (known.direction, peer.direction) == ("inbound", "outbound"):
                best[peer.name] = peer
        return best

    async def _sweep(self) -> None:
        """Peers that connect to this node are dropped when they fall silent; forgotten later.
        Nonces past their lifetime are purged from the store now and then."""
        purged = time.monotonic()
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            if now - purged >= WINDOW:
                purged = now
                await self._nonces.purge()
            for key, peer in list(self._peers.items()):
                if peer.direction != "inbound":
                    continue
                silent = now - peer.seen
                if silent > 600:
                    del self._peers[key]
                elif silent > 3 * self.interval and peer.state in ("connected", "refused_us"):
                    self._lost(peer, f"no model-list exchange from {peer.name} for {silent:.0f}s")
            self._publish()

    def _publish(self) -> None:
        """Hand the mesh's current models to the registry."""
        usable = self._usable()
        entries: dict[str, ModelEntry] = {}
        live: set[tuple[str, str]] = set()
        for node, peer in usable.items():
            assert peer.url is not None
            for model in peer.models:
                if self.name in model.path or len(model.path) > self.max_hops:
                    continue
                replica = self._replica(node, peer.url, model, legacy=peer.legacy_route(model))
                live.add((node, model.name))
                entries.setdefault(model.name, ModelEntry(model.name)).replicas.append(replica)
        blocked: dict[str, dict[str, ArbiterError]] = {}
        for peer in self._peers.values():
            if peer.state not in ("key_rejected", "refused_us") or peer.name in usable:
                continue
            for model in peer.models:
                if model.name not in entries:
                    blocked[model.name] = peer.blocked_errors(model.name)
        self._registry.set_remote(entries, blocked)
        now = time.monotonic()
        for peer in usable.values():
            self._backend_used[peer.url or ""] = now
        busy = {id(r.backend) for r in self._replicas.values() if r.in_flight > 0}
        self._replicas = {k: r for k, r in self._replicas.items() if k in live or r.in_flight > 0}
        for url, backend in list(self._backends.items()):
            # A pool no route uses for a while, and no request still reads from, is closed; never
            # one with requests in flight (closing it would leave them hanging).
            if now - self._backend_used.get(url, 0.0) > IDLE_BACKEND_SECONDS and id(backend) not in busy:
                del self._backends[url]
                self._backend_used.pop(url, None)
                task = asyncio.get_running_loop().create_task(backend.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def _replica(self, node: str, url: str, model: RemoteModel, *, legacy: bool) -> Replica:
        backend = self._backends.get(url)
        if backend is None:
            assert self.auth is not None
            backend = self._backends[url] = MeshBackend(
                url, self.auth, connect_timeout=self._settings.backend_connect_timeout,
                pool_size=self._settings.backend_pool_size)
        backend.target = node
        # The model's own timeout where it runs, and a margin per hop to it; a peer of an earlier
        # version does not say, and this node's default (and one margin) is used.
        timeout = (self._settings.backend_timeout + HOP_MARGIN if model.timeout is None
                   else model.timeout + HOP_MARGIN * len(model.path))
        replica = self._replicas.get((node, model.name))
        if replica is None or replica.backend is not backend:
            replica = self._replicas[(node, model.name)] = Replica(
                self._id(node), node, "mesh", backend, model.name, model.capabilities, _UNLIMITED_TEXT,
                timeout, 0, *self._registry.replica_labels(backend.url, model.name), legacy=legacy)
        else:  # the same object: in-flight counts stay true
            replica.capabilities, replica.legacy, replica.timeout = model.capabilities, legacy, timeout
        return replica

    def _id(self, node: str) -> int:
        """A stable negative id per node, so back-off of a mesh route never meets a service's."""
        if node not in self._ids:
            self._ids[node] = -(len(self._ids) + 1)
        return self._ids[node]


class MeshWarning(Conflict):
    error_type = "mesh_warning"


def _refusal(announcement: Announcement, reason: str | None) -> str:
    return (f"peer {announcement.node} (version {announcement.version}) refused this node's model list: "
            f"{reason or 'no reason given'}")


def _error_message(body: bytes) -> str:
    """The ``error`` text of an Arbiter error answer, cut short; empty when there is none."""
    try:
        message = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return message[:300] if isinstance(message, str) else ""


def _claimed_node(authorization: str | None) -> str | None:
    if not authorization or not authorization.startswith(SCHEME):
        return None
    parts = authorization.split(";")
    return parts[1][:100] if len(parts) > 1 else None


def _error(error: ArbiterError) -> tuple[int, bytes, dict[str, str]]:
    return error.status, error.body(), dict(error.headers or {})


async def _read_capped(response: httpx.Response) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_EXCHANGE_BYTES:
            raise ValueError("model list over the size cap")
        parts.append(chunk)
    return b"".join(parts)
