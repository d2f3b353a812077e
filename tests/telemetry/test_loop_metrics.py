"""The lock-free metric families: Prometheus text as prometheus_client would write it."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.telemetry import loop_metrics
from app.telemetry.loop_metrics import LoopCounter, LoopHistogram


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_a_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("h", "doc", ["a"], buckets=(0.1, 1.0), registry=registry)
    series = histogram.labels("x")
    for value in (0.1, 0.5, 1.0, 2.0):
        series.observe(value)
    text = exposition(registry)
    assert 'h_bucket{a="x",le="0.1"} 1.0' in text
    assert 'h_bucket{a="x",le="1.0"} 3.0' in text  # cumulative, as Prometheus reads it
    assert 'h_bucket{a="x",le="+Inf"} 4.0' in text
    assert 'h_count{a="x"} 4.0' in text
    assert 'h_sum{a="x"} 3.6' in text
    assert histogram.labels("x") is series  # one series per label set


def test_past_max_series_new_label_sets_are_dropped_not_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_metrics, "MAX_SERIES", 2)
    registry = CollectorRegistry()
    counter = LoopCounter("c", "doc", ["k"], registry=registry)
    counter.labels("a").inc()
    counter.labels("b").inc(2)
    counter.labels("c").inc(5)  # a third label set: goes nowhere
    counter.labels("a").inc()  # an existing one still counts
    text = exposition(registry)
    assert 'c_total{k="a"} 2.0' in text and 'c_total{k="b"} 2.0' in text
    assert 'k="c"' not in text


def test_the_wrong_number_of_label_values_is_refused() -> None:
    histogram = LoopHistogram("h", "doc", ["a", "b"], buckets=(1.0,), registry=CollectorRegistry())
    with pytest.raises(ValueError, match="takes 2 label values"):
        histogram.labels("only-one")
