"""deploy/observability/grafana-dashboard.json: a dashboard Grafana 10+ imports as it is (its
data source an input and a variable, DS_PROMETHEUS), with the panels a platform team looks for, laid
out without overlaps, and every query valid PromQL (promtool parses them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.observability import dashboard, dashboard_queries, metric_names, panels

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
PROMTOOL = shutil.which("promtool")


def _visible(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(board) if p["type"] != "row"]


def test_it_imports_with_a_prometheus_input_and_variable() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36, "Grafana 10's dashboard schema"
    assert board["uid"] == "arbiter-overview" and board["title"] == "Arbiter"
    (source,) = board["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == ("DS_PROMETHEUS", "datasource", "prometheus")
    grafana = [r for r in board["__requires"] if r["type"] == "grafana"]
    assert grafana and int(grafana[0]["version"].split(".")[0]) >= 10
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    for panel in _visible(board):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
        assert panel["description"], f"{panel['title']}: say what it shows"


def test_panels_are_laid_out_without_overlaps() -> None:
    board = dashboard()
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(board):
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    assert {p["type"] for p in panels(board)} <= {"row", "timeseries", "stat"}


def test_it_has_the_panels_a_platform_team_looks_for() -> None:
    queries = {panel["title"]: " ".join(t["expr"] for t in panel["targets"]) for panel in _visible(dashboard())}

    def panel_with(*needles: str) -> str:
        found = [title for title, expr in queries.items() if all(n in expr for n in needles)]
        assert found, f"no panel queries {needles}"
        return found[0]

    panel_with('arbiter_http_requests_total', 'route=~"/v1/systemone|/v1/decisions"')  # decisions/s
    panel_with("histogram_quantile(0.5", "histogram_quantile(0.99", "arbiter_gateway_overhead_seconds_bucket")
    panel_with("histogram_quantile(0.5", "histogram_quantile(0.99", "gen_ai_client_operation_duration_seconds_bucket")
    panel_with("sum by (status", "arbiter_http_requests_total", '"[45].."')
    panel_with("by (project, gen_ai_request_model", "gen_ai_client_token_usage_sum")
    panel_with("arbiter_service_up")
    panel_with("arbiter_rate_limited_total", "arbiter_shed_total")
    panel_with("arbiter_usage_pending", "arbiter_usage_spool_records")
    panel_with("process_cpu_seconds_total")
    panel_with("process_resident_memory_bytes")
    panel_with("process_open_fds")
    panel_with("arbiter_redis_up")


def test_queries_filter_by_the_job_and_pod_variables() -> None:
    for panel in _visible(dashboard()):
        for target in panel["targets"]:
            for selector in re.findall(r"[a-z_:]+\{[^}]*\}", target["expr"]):
                assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, (panel["title"], selector)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install -y prometheus)")
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (Grafana's variables filled in) as a recording rule's expression."""
    queries = dashboard_queries(dashboard())
    assert all(metric_names(expr) for _, expr in queries)
    recording = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]}]}
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump(recording))
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "check", "rules", "queries.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_metric_names_are_read_from_queries() -> None:
    """The reader the metric-name test relies on: label names and PromQL's words are not metrics."""
    expr = ('histogram_quantile(0.99, sum by (le, gen_ai_request_model) (rate('
            'gen_ai_client_operation_duration_seconds_bucket{job=~".*", status=~"5.."}[5m]))) '
            '/ ignoring (x) max without (instance, pod) (arbiter_service_up) > 0.05')
    assert metric_names(expr) == {"gen_ai_client_operation_duration_seconds_bucket", "arbiter_service_up"}
