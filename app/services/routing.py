"""Which replica takes a request: fewest in flight, ties take turns, faulty ones sit out a while.

One router per process, shared by every forwarding path (decisions, chat, Test), so a
replica that failed a chat request is also avoided by decisions.
"""

from __future__ import annotations

import time
from typing import Any

from app.services.registry import Replica


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
