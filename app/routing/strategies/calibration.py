"""Contextual calibration of label reading: a small model's bias towards some labels, measured
on states that say nothing, divided out of every answer (Zhao et al. 2021, "Calibrate Before Use").

A small model asked to pick a letter favours some letters whatever the state says (SmolLM2-135M
puts 0.41 on ``B`` for the empty state). For each question the reader also reads the same
question over content-free states (``N/A``, the empty string, ``[MASK]``), averages their label
probabilities into a baseline, and answers with each label's probability divided by its baseline,
renormalised. Measured on bench/data's tickets (docs/labels.md): SmolLM2-135M 18/60 right plain,
21/60 calibrated.

The baseline depends only on what the prompt holds besides the state (the instructions, the
question, the way values are shown, the chat template's arguments), so it is read once per such
prompt and kept, a bounded number of them, per model and per cache salt: a project never learns
from a first request's speed that another project asked the same question. The kept baselines are
split per project (``partitioned.PartitionedLru``), each project with a bound of its own: one
project's many questions never evict another's baselines and make it pay their reads again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson

from app.routing.strategies.partitioned import PartitionedLru

# The content-free states of the paper's recipe; their probabilities are averaged.
CONTENT_FREE_STATES = ("N/A", "", "[MASK]")
# Baselines kept per model and project (a prompt shape, its question's labels, a salt), and per
# model across all projects (past it, the least recently active project gives up its oldest).
KEPT = 512
KEPT_TOTAL = 8192
# How much of the baseline any label keeps at least: a label the model never says on empty states
# would otherwise be divided by nearly zero and win every answer.
FLOOR = 1e-4

Probabilities = list[float]
# Reads one question over one state: the labels' probabilities and the prompt tokens it took.
ReadOver = Callable[[Any], Awaitable[tuple[Probabilities, int]]]


class Baselines:
    """The content-free baselines of one model's questions, read once each and kept (LRU)."""

    def __init__(self, kept: int = KEPT, total: int = KEPT_TOTAL) -> None:
        self._known: PartitionedLru[bytes, Probabilities] = PartitionedLru(kept, max(kept, total))

    def __len__(self) -> int:
        return len(self._known)

    async def baseline(self, key: bytes, read_over: ReadOver,
                       partition: str | None = None) -> tuple[Probabilities, int]:
        """The question's baseline and the prompt tokens read to find it (0 when it was kept), kept
        in ``partition`` (the calling project's key). Concurrent first requests for one key each
        read it (a few reads more, once), rather than one waiting on another's reads that its own
        cancellation could fail."""
        known = self._known.get(partition, key)
        if known is not None:
            return known, 0
        reads = await asyncio.gather(*(read_over(state) for state in CONTENT_FREE_STATES))
        probs = [sum(p[i] for p, _ in reads) / len(reads) for i in range(len(reads[0][0]))]
        self._known.put(partition, key, probs)
        return probs, sum(tokens for _, tokens in reads)


def key(instructions: Any, question: Mapping[str, Any], labels: Sequence[str],
        template_kwargs: Mapping[str, Any] | None, salt: str | None) -> bytes:
    """What a baseline depends on: everything of a read's prompt but its state, and the salt."""
    return orjson.dumps([instructions, dict(question), list(labels), dict(template_kwargs or {}), salt],
                        option=orjson.OPT_SORT_KEYS)


def calibrated(probs: Sequence[float], baseline: Sequence[float]) -> Probabilities:
    """Each probability divided by its baseline (at least ``FLOOR``), renormalised."""
    ratios = [p / max(b, FLOOR) for p, b in zip(probs, baseline)]
    total = sum(ratios)
    return [r / total for r in ratios] if total > 0 else list(probs)
