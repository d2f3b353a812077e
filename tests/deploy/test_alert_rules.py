"""deploy/observability/alerts.yaml: checked by promtool (Prometheus' own checker, Debian's
`prometheus` package; .ci/run installs it), unit-tested by promtool on synthetic series
(alerts.test.yaml), and every rule complete: a `for`, a severity, a summary, a description and a
runbook that docs/deploy.md really has."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.observability import ALERT_TESTS, ALERTS, ROOT, rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install -y prometheus; .ci/run does)")
DOCS = ROOT / "docs" / "deploy.md"
EXPECTED = {"ArbiterBackendDown", "ArbiterHighErrorRatio", "ArbiterGatewayOverheadHigh",
            "ArbiterUsageWritesFailing", "ArbiterUsageSpoolNotEmpty", "ArbiterUsageRecordsDropped",
            "ArbiterRedisDown"}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    result = promtool("check", "rules", str(ALERTS), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: the same file with one expression broken does not pass."""
    broken = ALERTS.read_text().replace("max without (instance, pod) (arbiter_service_up) == 0",
                                        "max without (instance, pod) (arbiter_service_up == 0", 1)
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yaml").write_text(broken)
    assert promtool("check", "rules", "alerts.yaml", cwd=tmp_path).returncode != 0


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_the_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """With the backend alert's `for` cut to 1 minute, the test that it is still pending at 5m fails."""
    rules_text = ALERTS.read_text()
    start = rules_text.index("alert: ArbiterBackendDown")
    changed = rules_text[:start] + rules_text[start:].replace("for: 5m", "for: 1m", 1)
    (tmp_path / "alerts.yaml").write_text(changed)
    (tmp_path / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    result = promtool("test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0 and "ArbiterBackendDown" in result.stdout + result.stderr


def test_the_unit_tests_cover_backend_down_and_the_spool() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    assert tests["rule_files"] == [ALERTS.name]
    fired = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if not case["exp_alerts"]}
    assert {"ArbiterBackendDown", "ArbiterUsageSpoolNotEmpty"} <= fired & quiet, (fired, quiet)


def test_every_rule_is_complete() -> None:
    found = rules()
    assert EXPECTED <= {rule["alert"] for rule in found}
    anchors = _anchors(DOCS.read_text())
    for rule in found:
        name = rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: a `for` so one bad scrape does not page"
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], name
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/deploy.md" and anchor == name.lower(), annotations["runbook_url"]
        assert anchor in anchors, f"{name}: docs/deploy.md has no section #{anchor}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
