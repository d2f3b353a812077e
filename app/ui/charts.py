"""Tokens per day as a stacked bar chart, laid out here and drawn as inline SVG by a template
(no script, no external library): one bar a day, one colour a model."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT = 720, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 12, 36
PALETTE_SIZE = 8  # CSS classes series-0 .. series-7


@dataclass
class Chart:
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[dict[str, Any]] = field(default_factory=list)
    ticks: list[dict[str, Any]] = field(default_factory=list)  # y axis
    labels: list[dict[str, Any]] = field(default_factory=list)  # x axis
    legend: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    baseline: int = HEIGHT - BOTTOM
    left: int = LEFT
    right: int = WIDTH - RIGHT


def tokens_per_day(rows: list[dict[str, Any]], first: dt.date, last: dt.date) -> Chart:
    """``rows`` as ``usage.summary`` gives them (day, model, input and output tokens)."""
    days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
    models = sorted({row["model"] for row in rows})
    series = {name: i % PALETTE_SIZE for i, name in enumerate(models)}
    per_day: dict[str, dict[str, int]] = {d.isoformat(): {} for d in days}
    for row in rows:
        tokens = int(row["input_tokens"]) + int(row["output_tokens"])
        bucket = per_day.setdefault(str(row["day"]), {})
        bucket[row["model"]] = bucket.get(row["model"], 0) + tokens
    peak = max((sum(v.values()) for v in per_day.values()), default=0)
    top = _nice(peak)
    chart = Chart(total=sum(sum(v.values()) for v in per_day.values()))
    plot_height = HEIGHT - TOP - BOTTOM
    slot = (WIDTH - LEFT - RIGHT) / max(1, len(days))
    bar_width = max(2.0, slot * 0.7)
    for i, day in enumerate(days):
        x = LEFT + i * slot + (slot - bar_width) / 2
        y = float(HEIGHT - BOTTOM)
        for model in models:
            tokens = per_day[day.isoformat()].get(model, 0)
            if not tokens:
                continue
            h = plot_height * tokens / top
            y -= h
            chart.bars.append({"x": round(x, 1), "y": round(y, 1), "w": round(bar_width, 1), "h": round(h, 1),
                               "series": series[model], "title": f"{day.isoformat()} {model}: {tokens:,} tokens"})
        every = max(1, len(days) // 8)
        if i % every == 0 or i == len(days) - 1:
            chart.labels.append({"x": round(x + bar_width / 2, 1), "text": day.strftime("%m-%d")})
    for step in range(5):
        value = top * step // 4
        chart.ticks.append({"y": round(HEIGHT - BOTTOM - plot_height * step / 4, 1), "text": _short(value)})
    chart.legend = [{"model": name, "series": series[name],
                     "tokens": sum(v.get(name, 0) for v in per_day.values())} for name in models]
    return chart


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


def _short(value: int) -> str:
    for size, unit in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if value >= size:
            return f"{value / size:g}{unit}"
    return str(value)
