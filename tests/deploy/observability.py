"""What the observability kit (deploy/observability/) holds, read for the tests: the alert rules,
the Grafana dashboard, their PromQL expressions and the metric names those use."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy" / "observability"
ALERTS = KIT / "alerts.yaml"
ALERT_TESTS = KIT / "alerts.test.yaml"
DASHBOARD = KIT / "grafana-dashboard.json"

# Grafana's variables, as a PromQL parser would take them once Grafana has put values in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
# PromQL's words that look like metric names: functions, aggregations and their modifiers.
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_MATCHERS = re.compile(r"\{[^}]*\}")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
             "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
             "histogram_quantile", "abs", "absent", "absent_over_time", "clamp_min", "clamp_max",
             "label_replace", "label_join", "vector", "scalar", "time", "and", "or", "unless", "bool",
             "offset", "le", "inf", "nan", "sort", "sort_desc", "round", "ceil", "floor",
             "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "changes", "resets"}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def dashboard_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable, Grafana's variables filled in."""
    found = [(f"panel {panel['title']!r}", target["expr"])
             for panel in panels(board) for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
            assert match, f"variable {variable['name']}: {query!r} is not label_values(metric, label)"
            found.append((f"variable {variable['name']!r}", match.group(1)))
    return [(where, fill_variables(expr)) for where, expr in found]


def fill_variables(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return _VARIABLE.sub(".*", expr)  # $job, $instance, ...: only ever inside =~ matchers here


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (label names and PromQL's own words left out)."""
    bare = _GROUPING.sub(" ", _MATCHERS.sub(" ", _STRING.sub('""', expr)))
    bare = re.sub(r"\[[^\]]*\]", " ", bare)  # range selectors: [5m]
    return {word for word in _IDENTIFIER.findall(bare)
            if word not in _KEYWORDS and not re.fullmatch(r"\d+[smhdwy]?", word)}


def exported_names(families: Any) -> set[str]:
    """The sample names a scrape can hold, from its metric families (prometheus_client's parser):
    a family with no series yet still says its names, with their type's suffixes."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
                "unknown": ("",), "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}
    names = set()
    for family in families:
        names |= {family.name + suffix for suffix in suffixes[family.type]}
        names |= {sample.name for sample in family.samples}
    return names
