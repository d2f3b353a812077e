"""A bound on the memory that request bodies grow to while they are decoded (issue #30).

What a body becomes is not what its caller sent: a zstd body of a kilobyte holds 32 MiB, and an
image part of 24 MiB becomes 32 MiB of base64 and as much again in the JSON that is forwarded.
Each request reserves what its body grows by (its decoded bytes past the first MiB, its images'
base64 twice) from one budget of the process, ``ARBITER_DECODE_BUDGET_BYTES``. A request that
would pass it is refused at once with 503 and ``Retry-After`` (never queued: one waiting while it
holds part of the budget could wait on another that waits on it), unless it is the only one
holding any: a body the caps allow is never refused for its size alone. Everything a request
reserved is given back when its answer has gone.

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

    def reservation(self) -> Reservation:
        return Reservation(self)


class Reservation:
    """One request's share of the budget: ``take`` as the body grows, ``release`` once."""

    __slots__ = ("_budget", "held")

    def __init__(self, budget: DecodeBudget) -> None:
        self._budget = budget
        self.held = 0

    def take(self, size: int) -> None:
        """Reserve ``size`` more bytes, or raise BackendFailed (503) when the budget is spent by
        other requests."""
        budget = self._budget
        if budget.used + size > budget.capacity and budget.used > self.held:
            budget.refused += 1
            raise BackendFailed(
                503, "Arbiter is decoding as many large bodies as its memory budget allows "
                     f"(ARBITER_DECODE_BUDGET_BYTES, {budget.capacity} bytes); retry in a second",
                retry_after=1)
        budget.used += size
        self.held += size

    def release(self) -> None:
        self._budget.used -= self.held
        self.held = 0
