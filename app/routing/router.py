"""Which replica takes a request: fewest in flight, ties take turns, faulty ones sit out a while.

One router per process, shared by every forwarding path (decisions, chat, Test), so a
replica that failed a chat request is also avoided by decisions. ``attempts()`` gives the
replicas one request tries (SPEC §4); what an attempt's answer or failure means is the forwarding
core's one rule (app/routing/forwarding.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from app.errors import BackendFailed
from app.routing.registry import Replica

ATTEMPTS = 2  # a request is retried once, on another replica, when no byte of the answer was sent


class ReplicaRouter:
    def __init__(self, backoff: float) -> None:
        self.backoff = backoff
        self._out_until: dict[tuple[int, str], float] = {}
        self._turn = 0

    def pick(self, replicas: list[Replica], tried: set[int]) -> Replica | None:
        """The available replica with the fewest requests in flight; ties take turns."""
        now = time.monotonic()
        best: Replica | None = None
        self._turn += 1
        start = self._turn % len(replicas)
        for replica in replicas[start:] + replicas[:start] if start else replicas:
            if id(replica) in tried:
                continue
            if self._out_until.get((replica.service_id, replica.backend_name), 0.0) > now:
                continue
            if best is None or replica.in_flight < best.in_flight:
                best = replica
        return best

    def attempts(self, replicas: list[Replica]) -> Attempts:
        """The replicas one request tries, in turn (see ``Attempts``)."""
        return Attempts(self, replicas)

    def available(self, replicas: list[Replica], tried: set[int]) -> bool:
        """Whether ``pick`` would find one (without taking a turn)."""
        now = time.monotonic()
        return any(id(r) not in tried and self._out_until.get((r.service_id, r.backend_name), 0.0) <= now
                   for r in replicas)

    def take_out(self, replica: Replica) -> None:
        """A connection error, a timeout or a 502/503/504: leave the replica out for a while."""
        self._out_until[(replica.service_id, replica.backend_name)] = time.monotonic() + self.backoff

    def backed_off(self) -> list[dict[str, Any]]:
        """Replicas out right now, for the services' status."""
        now = time.monotonic()
        return [{"service_id": service_id, "model": backend_name, "seconds_left": round(until - now, 1)}
                for (service_id, backend_name), until in self._out_until.items() if until > now]

    @property
    def retry_after(self) -> int:
        return max(1, int(self.backoff))


class Attempts:
    """The replicas one request tries: the one ``pick`` chooses, then, after a fault (the caller
    takes that replica out), one other, at most ``ATTEMPTS`` in all. Iterate to get them."""

    def __init__(self, router: ReplicaRouter, replicas: list[Replica]) -> None:
        self._router = router
        self._replicas = replicas
        self._tried: set[int] = set()

    def __iter__(self) -> Iterator[Replica]:
        while len(self._tried) < ATTEMPTS:
            replica = self._router.pick(self._replicas, self._tried)
            if replica is None:
                return
            self._tried.add(id(replica))
            yield replica

    def another(self) -> bool:
        """Whether iterating goes on to another replica. A caller holding a replica's own error
        (a 502/503/504 answer) gives it back as it came when not, and otherwise keeps it while the
        next replica is tried: when that one gives no answer of its own either (a connection
        error, a timeout), the kept answer still comes back, byte for byte; a backend's own 5xx
        beats a generic error of Arbiter's. The forwarding core (app/routing/forwarding.py) follows
        this rule for decisions and chat."""
        return len(self._tried) < ATTEMPTS and self._router.available(self._replicas, self._tried)

    def none_left(self, model: str) -> BackendFailed:
        """The error when no replica could be tried at all."""
        return BackendFailed(503, f"every backend that serves model '{model}' is down or backed off; "
                                  "try again shortly", retry_after=self._router.retry_after)
