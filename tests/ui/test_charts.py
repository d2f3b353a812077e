"""The usage chart's layout: one stacked bar a day, scaled to a round axis top."""

from __future__ import annotations

import datetime as dt

from app.ui import charts


def row(day: str, model: str, tokens_in: int, tokens_out: int) -> dict[str, object]:
    return {"day": day, "model": model, "project": "p", "requests": 1, "input_tokens": tokens_in,
            "output_tokens": tokens_out, "errors": 0, "mean_latency_ms": 1.0}


def test_models_stack_on_their_day_and_the_axis_is_round() -> None:
    first, last = dt.date(2025, 3, 1), dt.date(2025, 3, 7)
    chart = charts.tokens_per_day([row("2025-03-02", "nimble", 300, 100), row("2025-03-02", "tev1", 500, 300),
                                   row("2025-03-05", "nimble", 50, 0)], first, last)
    assert chart.total == 1250
    assert [t["text"] for t in chart.ticks] == ["0", "500", "1k", "1.5k", "2k"]  # the peak, 1,200, rounds up
    day_two = [b for b in chart.bars if b["title"].startswith("2025-03-02")]
    assert len(day_two) == 2 and day_two[0]["x"] == day_two[1]["x"]
    lower, upper = sorted(day_two, key=lambda b: -b["y"])
    assert abs(upper["y"] + upper["h"] - lower["y"]) < 0.2  # stacked, touching
    assert {item["model"]: item["tokens"] for item in chart.legend} == {"nimble": 450, "tev1": 800}
    assert len(chart.labels) == 7 and chart.labels[0]["text"] == "03-01"


def test_an_empty_period_still_draws_its_axis() -> None:
    chart = charts.tokens_per_day([], dt.date(2025, 1, 1), dt.date(2025, 3, 31))
    assert chart.bars == [] and chart.total == 0 and chart.legend == []
    assert 2 <= len(chart.labels) <= 12 and chart.ticks[-1]["text"] == "4"
