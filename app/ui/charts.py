"""The usage charts, laid out here and drawn as inline SVG by a template (usage_macros.html; no
script, no external library): tokens per bucket (a day, or an hour of the last 24 hours) as bars
stacked by model, requests stacked by status class, and latency (p50 and p95) as two lines. The
three share one horizontal layout, so a bucket sits at the same x in each."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.telemetry.usage_report import STATUS_CLASSES, percentiles

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 80, 8, 12, 36  # LEFT: room for "375 ms" in the larger font of a narrow screen
PALETTE_SIZE = 8  # CSS classes series-0 .. series-7
PLOT_HEIGHT = HEIGHT - TOP - BOTTOM
LINES = (("p50", 0.5), ("p95", 0.95))  # CSS classes line-p50, line-p95


@dataclass
class Chart:
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[dict[str, Any]] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)  # polylines: css, points
    dots: list[dict[str, Any]] = field(default_factory=list)  # a line's points: css, x, y, title
    ticks: list[dict[str, Any]] = field(default_factory=list)  # y axis
    labels: list[dict[str, Any]] = field(default_factory=list)  # x axis
    legend: list[dict[str, Any]] = field(default_factory=list)  # css, name, text (and per chart: model, tokens)
    total: int = 0
    baseline: int = HEIGHT - BOTTOM
    left: int = LEFT
    right: int = WIDTH - RIGHT


@dataclass(frozen=True)
class _Frame:
    """Where each bucket's bar (or point) goes, and which buckets get an x-axis label."""

    buckets: list[str]
    hourly: bool

    @property
    def slot(self) -> float:
        return (WIDTH - LEFT - RIGHT) / max(1, len(self.buckets))

    @property
    def bar_width(self) -> float:
        return max(2.0, self.slot * 0.7)

    def x(self, index: int) -> float:
        return LEFT + index * self.slot + (self.slot - self.bar_width) / 2

    def middle(self, index: int) -> float:
        return self.x(index) + self.bar_width / 2

    def labels(self) -> list[dict[str, Any]]:
        """About eight labels; every other one is ``minor`` (a narrow screen, with a larger font,
        shows only the others)."""
        every = max(1, len(self.buckets) // 8)
        shown = [i for i in range(len(self.buckets)) if i % every == 0 or i == len(self.buckets) - 1]
        return [{"x": round(self.middle(i), 1), "text": _label(self.buckets[i], self.hourly), "minor": j % 2 == 1}
                for j, i in enumerate(shown)]


def _label(bucket: str, hourly: bool) -> str:
    """2025-03-01 as 03-01, 2025-03-01 14:00 as 14:00."""
    return bucket[11:16] if hourly else bucket[5:10]


def tokens(rows: list[dict[str, Any]], buckets: list[str], *, hourly: bool) -> Chart:
    """Tokens (input and output) per bucket, stacked by model: ``rows`` as ``usage_report.series``."""
    models = sorted({row["model"] for row in rows})
    css = {name: f"series-{i % PALETTE_SIZE}" for i, name in enumerate(models)}
    values = _per_bucket(rows, buckets,
                         lambda row: {row["model"]: int(row["input_tokens"]) + int(row["output_tokens"])})
    chart = _stacked(_Frame(buckets, hourly), values, models, css, _short,
                     lambda bucket, name, value: f"{bucket} {name}: {_count(value)} tokens")
    for item in chart.legend:
        item.update(model=item["name"], tokens=item["value"], series=int(item["css"].split("-")[1]),
                    text=f"{_count(item['value'])} tokens")
    return chart


def statuses(rows: list[dict[str, Any]], buckets: list[str], *, hourly: bool) -> Chart:
    """Requests per bucket stacked by status class (CSS status-2xx ... status-other)."""
    values = _per_bucket(rows, buckets, lambda row: row["statuses"])
    always = ("2xx", "4xx", "5xx")  # 3xx and other (outside 200-599) only when there is one
    shown = [name for name in STATUS_CLASSES if name in always or any(v.get(name) for v in values.values())]
    chart = _stacked(_Frame(buckets, hourly), values, shown, {name: f"status-{name}" for name in shown}, _short,
                     lambda bucket, name, value: f"{bucket} {name}: {_count(value)} requests")
    for item in chart.legend:
        share = 100 * item["value"] / chart.total if chart.total else 0.0
        item["text"] = f"{_count(item['value'])} ({share:.1f} %)"
    return chart


def latency(bins: dict[str, list[tuple[int, int, float, float]]], buckets: list[str], *, hourly: bool) -> Chart:
    """p50 and p95 per bucket as two lines, a gap where a bucket has no request: ``bins`` as
    ``usage_report.latency_bins``. The legend gives both over the whole period."""
    frame = _Frame(buckets, hourly)
    found = {name: percentiles(bins.get(name, ()), tuple(q for _, q in LINES)) for name in buckets}
    peak = max((value for p in found.values() if p for value in p.values()), default=0.0)
    top = _nice_float(peak)
    chart = Chart(labels=frame.labels(), ticks=_ticks(top, _ms),
                  total=sum(n for b in bins.values() for _, n, _, _ in b))
    for css, q in LINES:
        segment: list[str] = []
        for i, name in enumerate(buckets):
            values = found[name]
            if values is None:
                _end(chart, css, segment)
                segment = []
                continue
            x, y = round(frame.middle(i), 1), round(HEIGHT - BOTTOM - PLOT_HEIGHT * values[q] / top, 1)
            segment.append(f"{x},{y}")
            count = sum(n for _, n, _, _ in bins[name])
            chart.dots.append({"css": f"line-{css}", "x": x, "y": y,
                               "title": f"{name}: {css} {_ms(values[q])} "
                                        f"({_count(count)} request{'s' if count != 1 else ''})"})
        _end(chart, css, segment)
    overall = percentiles((entry for b in bins.values() for entry in b), tuple(q for _, q in LINES))
    chart.legend = [{"css": f"line-{css}", "name": css, "value": overall[q] if overall else None,
                     "text": f"{_ms(overall[q])} over the period" if overall else "no requests"} for css, q in LINES]
    return chart


def _end(chart: Chart, css: str, segment: list[str]) -> None:
    if len(segment) > 1:  # a lone point is drawn by its dot
        chart.lines.append({"css": f"line-{css}", "points": " ".join(segment)})


def _per_bucket(rows: Iterable[dict[str, Any]], buckets: list[str],
                values: Callable[[dict[str, Any]], dict[str, int]]) -> dict[str, dict[str, int]]:
    summed: dict[str, dict[str, int]] = {name: {} for name in buckets}
    for row in rows:
        into = summed.get(str(row["bucket"]))
        if into is None:  # outside the period's buckets (a clock between two requests' reads)
            continue
        for name, value in values(row).items():
            into[name] = into.get(name, 0) + int(value)
    return summed


def _stacked(frame: _Frame, values: dict[str, dict[str, int]], order: list[str], css: dict[str, str],
             tick: Callable[[int], str], title: Callable[[str, str, int], str]) -> Chart:
    """Bars, one per bucket, stacked in ``order`` from the baseline up, scaled to a round top."""
    top = _nice(max((sum(v.values()) for v in values.values()), default=0))
    chart = Chart(total=sum(sum(v.values()) for v in values.values()), labels=frame.labels(),
                  ticks=_ticks(top, tick))
    for i, name in enumerate(frame.buckets):
        y = float(HEIGHT - BOTTOM)
        for part in order:
            value = values[name].get(part, 0)
            if not value:
                continue
            h = PLOT_HEIGHT * value / top
            y -= h
            chart.bars.append({"x": round(frame.x(i), 1), "y": round(y, 1), "w": round(frame.bar_width, 1),
                               "h": round(h, 1), "css": css[part], "title": title(name, part, value)})
    chart.legend = [{"css": css[part], "name": part, "value": sum(v.get(part, 0) for v in values.values())}
                    for part in order]
    return chart


def _ticks(top: float, text: Callable[[Any], str]) -> list[dict[str, Any]]:
    steps = [top * step // 4 if isinstance(top, int) else top * step / 4 for step in range(5)]
    return [{"y": round(HEIGHT - BOTTOM - PLOT_HEIGHT * step / 4, 1), "text": text(value)}
            for step, value in enumerate(steps)]


def _nice(peak: int) -> int:
    """A round axis top at or above ``peak`` (1, 2 or 5 times a power of ten)."""
    if peak <= 0:
        return 4
    magnitude = 1
    while magnitude * 10 <= peak:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= peak:
            return max(4, step * magnitude)
    return max(4, 10 * magnitude)


def _nice_float(peak: float) -> float:
    """As ``_nice`` for milliseconds, which may be under one: 0.8 -> 1, 37 -> 50, 1,200 -> 2,000."""
    if peak <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(peak))
    return next(step * magnitude for step in (1, 2, 5, 10) if step * magnitude >= peak * (1 - 1e-9))


def _short(value: int) -> str:
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if value >= size:
            return f"{value / size:g}{unit}"
    return str(value)


def _count(value: int) -> str:
    """As the pages' ``number`` filter: 12 345 (a narrow no-break space between thousands)."""
    return f"{value:,}".replace(",", "\u202f")


def _ms(value: float) -> str:
    """A latency: 0.42 ms, 12.3 ms, 250 ms, 1.5 s."""
    if value >= 1000:
        return f"{value / 1000:.3g} s"
    return f"{value:.3g} ms" if value < 100 else f"{value:.0f} ms"
