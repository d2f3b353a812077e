"""The usage charts' layout: bars stacked per bucket and scaled to a round axis top, requests by
status class, latency lines with gaps, and one x position per bucket across the three."""

from __future__ import annotations

from typing import Any

from app.ui import charts

WEEK = [f"2025-03-0{d}" for d in range(1, 8)]


def row(day: str, model: str, tokens_in: int, tokens_out: int, **statuses: int) -> dict[str, Any]:
    return {"bucket": day, "model": model, "requests": sum(statuses.values()) or 1, "input_tokens": tokens_in,
            "output_tokens": tokens_out, "statuses": {"2xx": 1, **statuses}}


def test_models_stack_on_their_day_and_the_axis_is_round() -> None:
    chart = charts.tokens([row("2025-03-02", "nimble", 300, 100), row("2025-03-02", "tev1", 500, 300),
                           row("2025-03-05", "nimble", 50, 0)], WEEK, hourly=False)
    assert chart.total == 1250
    assert [t["text"] for t in chart.ticks] == ["0", "500", "1k", "1.5k", "2k"]  # the peak, 1,200, rounds up
    day_two = [b for b in chart.bars if b["title"].startswith("2025-03-02")]
    assert len(day_two) == 2 and day_two[0]["x"] == day_two[1]["x"]
    lower, upper = sorted(day_two, key=lambda b: -b["y"])
    assert abs(upper["y"] + upper["h"] - lower["y"]) < 0.2  # stacked, touching
    assert {item["model"]: item["tokens"] for item in chart.legend} == {"nimble": 450, "tev1": 800}
    assert {b["css"] for b in chart.bars} == {"series-0", "series-1"}
    assert len(chart.labels) == 7 and chart.labels[0]["text"] == "03-01"
    assert [label["minor"] for label in chart.labels] == [False, True] * 3 + [False]  # a narrow screen: every other


def test_an_empty_period_still_draws_its_axis() -> None:
    days = [f"2025-01-{d:02d}" for d in range(1, 32)] + [f"2025-02-{d:02d}" for d in range(1, 29)]
    chart = charts.tokens([], days, hourly=False)
    assert chart.bars == [] and chart.total == 0 and chart.legend == []
    assert 2 <= len(chart.labels) <= 12 and chart.ticks[-1]["text"] == "4"
    assert charts.latency({}, days, hourly=False).dots == []


def test_statuses_stack_by_class_and_say_their_share() -> None:
    chart = charts.statuses([row("2025-03-02", "nimble", 0, 0, **{"2xx": 6, "4xx": 3}),
                             row("2025-03-02", "tev1", 0, 0, **{"2xx": 0, "5xx": 1})], WEEK, hourly=False)
    assert chart.total == 10
    assert [b["css"] for b in chart.bars] == ["status-2xx", "status-4xx", "status-5xx"]  # from the baseline up
    assert [(i["name"], i["text"]) for i in chart.legend] == [("2xx", "6 (60.0 %)"), ("4xx", "3 (30.0 %)"),
                                                                ("5xx", "1 (10.0 %)")]  # no 3xx nor other: none
    assert chart.bars[0]["title"] == "2025-03-02 2xx: 6 requests"


def test_latency_lines_break_where_a_bucket_has_no_request() -> None:
    hours = [f"2025-03-01 {h:02d}:00" for h in range(24)]
    bins = {hours[0]: [(100, 1, 40.0, 40.0)], hours[1]: [(100, 3, 40.0, 60.0)],
            hours[5]: [(80, 1, 12.0, 12.0)]}  # hours 2-4 had none
    chart = charts.latency(bins, hours, hourly=True)
    assert [line["css"] for line in chart.lines] == ["line-p50", "line-p95"]  # hours 0-1 joined; hour 5 alone
    assert all(len(line["points"].split()) == 2 for line in chart.lines)
    assert len(chart.dots) == 6 and chart.dots[-1]["title"] == "2025-03-01 05:00: p95 12 ms (1 request)"
    assert [t["text"] for t in chart.ticks] == ["0 ms", "25 ms", "50 ms", "75 ms", "100 ms"]  # the peak, 60 ms
    p95 = next(d for d in chart.dots if d["css"] == "line-p95" and d["title"].startswith("2025-03-01 01:00"))
    assert p95["y"] == round(charts.HEIGHT - charts.BOTTOM - charts.PLOT_HEIGHT * 60 / 100, 1)
    # Over the period, p50 is the 3rd of 5: the 2nd of bin 100's four, a third of the way from 40 to 60 (geometrically).
    assert [i["text"] for i in chart.legend] == ["45.8 ms over the period", "60 ms over the period"]
    bars = charts.tokens([row(hours[5], "nimble", 1, 1)], hours, hourly=True)
    hour_five = next(d for d in chart.dots if d["title"].startswith("2025-03-01 05:00"))
    assert abs(bars.bars[0]["x"] + bars.bars[0]["w"] / 2 - hour_five["x"]) < 0.1  # the same place in each chart
    assert bars.labels[0]["text"] == "00:00"
