"""A bound on the memory that request bodies grow to while they are decoded (issue #30).

What a body becomes is not what its caller sent: a zstd body of a kilobyte holds 32 MiB, and an
image part of 24 MiB becomes 32 MiB of base64 and as much again in the JSON that is forwarded.
Each request reserves what its body grows by (its decoded bytes past the first MiB, its images'
base64 twice) from one budget of the process, ``ARBITER_DECODE_BUDGET_BYTES``, and gives its
decoded bytes back as soon as they are parsed, the rest when its answer has gone. A request that
would pass the budget, or take its project past half of it, is refused at once with 503 and
``Retry-After`` (never queued: one waiting while it holds part of the budget could wait on another
that waits on it), unless it is the only one holding any: a body the caps allow is never refused
for its size alone, and no tenant holds the whole budget while others need it.

Bodies that do not grow (a plain JSON body: its bytes arrived on the wire, under
``ARBITER_MAX_BODY_BYTES``) and the first MiB a body grows to (every compressed body of the hot
path) reserve nothing: the budget is not touched on the common path.
"""

from __future__ import annotations

from app.errors import BackendFailed

MiB = 1024 * 1024
FREE_BYTES = MiB  # what a request may grow to without reserving any of the budget


class DecodeBudget:
    """The bytes that bodies under way may grow to, for the whole process."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.refused = 0  # requests refused for it, for the metric
        self._by_project: dict[int | None, int] = {}

    def reservation(self, project: int | None = None) -> Reservation:
        return Reservation(self, project)

    def held_by(self, project: int | None) -> int:
        return self._by_project.get(project, 0)

    def _add(self, project: int | None, size: int) -> None:
        self.used += size
        held = self._by_project.get(project, 0) + size
        if held:
            self._by_project[project] = held
        else:
            self._by_project.pop(project, None)


class Reservation:
    """One request's share of the budget: ``take`` as the body grows, ``give_back`` what is freed,
    ``release`` the rest once."""

    __slots__ = ("_budget", "_project", "held")

    def __init__(self, budget: DecodeBudget, project: int | None) -> None:
        self._budget = budget
        self._project = project
        self.held = 0

    def take(self, size: int) -> None:
        """Reserve ``size`` more bytes, or raise BackendFailed (503) when other requests hold the
        budget, or this request's project would hold over half of it."""
        budget = self._budget
        if budget.used > self.held:  # not alone
            over_all = budget.used + size > budget.capacity
            over_share = budget.held_by(self._project) + size > budget.capacity // 2
            if over_all or over_share:
                budget.refused += 1
                whose = "" if over_all else " for one project"
                raise BackendFailed(
                    503, f"Arbiter is decoding as many large bodies as its memory budget allows{whose} "
                         f"(ARBITER_DECODE_BUDGET_BYTES, {budget.capacity} bytes); retry in a second",
                    retry_after=1)
        budget._add(self._project, size)
        self.held += size

    def give_back(self, size: int) -> None:
        """Return ``size`` of what this request holds (its decoded body, once parsed)."""
        size = min(size, self.held)
        self._budget._add(self._project, -size)
        self.held -= size

    def release(self) -> None:
        self.give_back(self.held)
