"""A least-recently-used cache split per project (issue 30): what the read strategies keep from one
request for the next (embedded passages, calibration baselines) is kept apart for each project, so
that no project gets a hit on another's entries (a hit is faster: it would tell one tenant what
another asked) and no project's entries are evicted by another's traffic.

Each partition (a project's key: its tenant salt) holds at most ``per_partition`` entries and
evicts its own least recently used. All partitions together hold at most ``total``: past it, the
least recently used *partition* gives up its oldest entry, so a project busy within its own bound
never loses entries to one that sends many different texts, as long as the active projects' bounds
fit in ``total``.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PartitionedLru(Generic[K, V]):
    def __init__(self, per_partition: int, total: int) -> None:
        if per_partition < 1 or total < per_partition:
            raise ValueError("a partitioned cache needs 1 <= per_partition <= total")
        self.per_partition, self.total = per_partition, total
        # Partition -> its entries, oldest first; partitions themselves least recently used first.
        self._parts: collections.OrderedDict[str | None, collections.OrderedDict[K, V]] = collections.OrderedDict()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def size_of(self, partition: str | None) -> int:
        part = self._parts.get(partition)
        return len(part) if part is not None else 0

    def get(self, partition: str | None, key: K) -> V | None:
        part = self._parts.get(partition)
        if part is None or key not in part:
            return None
        part.move_to_end(key)
        self._parts.move_to_end(partition)
        return part[key]

    def put(self, partition: str | None, key: K, value: V) -> None:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = collections.OrderedDict()
        self._parts.move_to_end(partition)
        if key not in part:
            self._count += 1
        part[key] = value
        part.move_to_end(key)
        if len(part) > self.per_partition:
            part.popitem(last=False)
            self._count -= 1
        while self._count > self.total:
            oldest, entries = next(iter(self._parts.items()))
            entries.popitem(last=False)
            self._count -= 1
            if not entries:
                del self._parts[oldest]
