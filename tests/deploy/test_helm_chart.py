"""The Helm chart (deploy/helm/arbiter), linted and rendered by Helm itself, offline.

No ``helm`` binary can be installed here, so Helm v4's own Go SDK does the work through
helm-python-sdk (``helm_python``, a C ABI over it; in the ``test`` extra): ``helm.lint`` and
``Chart.render`` are ``helm lint`` and ``helm template``, schema validation included. Every rendered
object is then checked against the Kubernetes OpenAPI schemas that kubernetes-validate bundles
(the oldest Kubernetes the chart accepts and the newest it knows), with the network cut, and the
fields Arbiter relies on are checked one by one.
"""

from __future__ import annotations

import base64
import re
import socket
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.settings import Settings
from tests.deploy.test_deploy_files import _assert_real_command

try:
    import helm_python as helm
except ImportError:  # pragma: no cover - depends on the environment
    helm = None
try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - depends on the environment
    kubernetes_validate = None

pytestmark = pytest.mark.skipif(
    helm is None, reason="helm-python-sdk is not installed (it is in the [test] extra: "
                         "pip install -e '.[test]'); it renders and lints the chart without a helm binary")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "arbiter"
ALERTS = ROOT / "deploy" / "observability" / "alerts.yaml"
RELEASE, NAMESPACE = "arbiter", "gateway"
OPERATOR_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}

DATABASE_URL = "postgresql://arbiter:db-password-for-chart-tests@db.internal:5432/arbiter"
REDIS_URL = "redis://:redis-password-for-chart-tests@redis.internal:6379/0"
SECRET_KEY = "secret-key-for-the-chart-tests-0123456789"
PEPPER = "key-pepper-for-the-chart-tests-9876543210"
ADMIN_KEY = "arb_admin_bootstrap-key-for-the-chart-tests"
SECRETS = {"ARBITER_DATABASE_URL": DATABASE_URL, "ARBITER_REDIS_URL": REDIS_URL,
           "ARBITER_SECRET_KEY": SECRET_KEY, "ARBITER_KEY_PEPPER": PEPPER,
           "ARBITER_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY}
# What docs/deploy.md says must be set: the image, the database, the secret key and the pepper.
REQUIRED: dict[str, Any] = {"image": {"repository": "registry.internal/platform/arbiter"},
                            "database": {"url": DATABASE_URL},
                            "secretKey": {"value": SECRET_KEY}, "pepper": {"value": PEPPER}}
EXISTING: dict[str, Any] = {
    "image": {"repository": "registry.internal/platform/arbiter"},
    "database": {"existingSecret": {"name": "pg-app", "key": "uri"}},
    "redis": {"existingSecret": {"name": "redis-auth", "key": "url"}},
    "secretKey": {"existingSecret": {"name": "arbiter-keys", "key": "secret-key"}},
    "pepper": {"existingSecret": {"name": "arbiter-keys", "key": "pepper"}},
    "bootstrapAdminKey": {"existingSecret": {"name": "arbiter-keys", "key": "admin"}},
}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Values files given one after the other (as ``-f a.yaml -f b.yaml``): later ones win."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
                else value
    return out


ALL_ON = merged(REQUIRED, {
    "redis": {"url": REDIS_URL}, "bootstrapAdminKey": {"value": ADMIN_KEY},
    "autoscaling": {"enabled": True}, "usageSpool": {"type": "persistentVolumeClaim"},
    "ingress": {"enabled": True, "className": "nginx",
                "hosts": [{"host": "arbiter.example.org", "paths": [{"path": "/", "pathType": "Prefix"}]}],
                "tls": [{"secretName": "arbiter-tls", "hosts": ["arbiter.example.org"]}]},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "forwardedAllowIps": "10.0.0.0/8",
    "extraEnv": [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector:4318"}],
})
VARIANTS = {"required only": REQUIRED, "existing secrets": EXISTING, "everything on": ALL_ON,
            "autoscaling": merged(REQUIRED, {"autoscaling": {"enabled": True}}),
            "pvc spool, existing claim": merged(REQUIRED, {"usageSpool": {
                "type": "persistentVolumeClaim", "persistentVolumeClaim": {"existingClaim": "spool-rwx"}}}),
            "pdb minAvailable": merged(REQUIRED, {"podDisruptionBudget": {"minAvailable": 2, "maxUnavailable": None}}),
            "no pdb, no metrics, no migrations": merged(REQUIRED, {
                "podDisruptionBudget": {"enabled": False}, "metrics": {"enabled": False},
                "migrations": {"enabled": False}})}


@dataclass
class Rendered:
    """One `helm template`: the objects, and NOTES.txt as an install would print it."""

    objects: list[dict[str, Any]]
    texts: dict[str, str]  # template path -> rendered text
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        (found,) = [o for o in self.all(kind) if name is None or o["metadata"]["name"] == name]
        return found

    def kinds(self) -> set[str]:
        return {o["kind"] for o in self.objects}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    helm.disable_logging()  # lint mode logs each fail() it tolerates to stderr
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: Any, values: dict[str, Any]) -> Rendered:
    texts = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    objects, notes = [], ""
    for path, text in texts.items():
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                assert isinstance(doc, dict) and {"apiVersion", "kind", "metadata"} <= set(doc), (path, doc)
                objects.append(doc)
    assert notes, "NOTES.txt renders"
    return Rendered(objects, texts, notes)


def server(rendered: Rendered) -> dict[str, Any]:
    (container,) = pod(rendered.one("Deployment"))["containers"]
    return container


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def secret_ref(container: dict[str, Any], name: str) -> tuple[str, str]:
    ref = env(container)[name]["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


def render_error(chart: Any, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return str(caught.value)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connection can be opened: what is checked here is checked without a network."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a network connection was attempted: {args!r}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# -- helm lint ------------------------------------------------------------------------------


def test_lint_finds_nothing_but_the_missing_icon() -> None:
    """helm lint, with the chart's defaults (lint tolerates the required values' fail) and with
    each variant. The one finding left is INFO "icon is recommended": no icon is published."""
    for values in (None, *VARIANTS.values()):
        report = helm.lint(CHART, values, strict=True)
        assert report["errors"] == [], report
        findings = [(m["severity"], m["path"], m["error"]) for m in report["messages"]]
        assert findings == [(1, "Chart.yaml", "icon is recommended")], findings


def test_lint_reports_a_broken_chart(tmp_path: Path) -> None:
    """The lint above can fail: the same chart with one template broken is an error."""
    broken = Path(helm.Chart.load(CHART).save_dir(tmp_path))
    (broken / "templates" / "service.yaml").write_text("{{ .Values.service.port | nosuchfunction }}\n")
    report = helm.lint(broken, REQUIRED)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"]), report


# -- what renders -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_is_valid_kubernetes(chart: Any, variant: str, offline: None) -> None:
    if kubernetes_validate is None:  # pragma: no cover - it is in the [test] extra
        pytest.skip("kubernetes-validate is not installed (it is in the [test] extra)")
    rendered = render(chart, VARIANTS[variant])
    for version in ("1.25.0", kubernetes_validate.latest_version()):  # Chart.yaml: kubeVersion >=1.25
        for obj in rendered.objects:
            if (obj["apiVersion"], obj["kind"]) in OPERATOR_KINDS:
                continue  # no schema bundled: checked by hand below
            kubernetes_validate.validate(obj, version, strict=True)
    names = [(o["kind"], o["metadata"]["name"]) for o in rendered.objects]
    assert len(names) == len(set(names)), names
    for obj in rendered.objects:
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"]), obj["metadata"]
        assert "namespace" not in obj["metadata"], "the release's namespace applies"


def test_defaults_render_the_server_its_config_and_the_migration(chart: Any) -> None:
    rendered = render(chart, REQUIRED)
    assert rendered.kinds() == {"ConfigMap", "Secret", "Deployment", "Service", "ServiceAccount",
                                "PodDisruptionBudget", "Job"}
    deployment = rendered.one("Deployment")
    assert deployment["spec"]["replicas"] == 2
    container = server(rendered)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == version, \
        "the chart deploys the release this tree builds: bump appVersion with pyproject.toml"
    assert container["image"] == f"registry.internal/platform/arbiter:{version}"  # the appVersion
    _assert_real_command(container["command"], "the chart's Deployment")
    assert container["command"] == ["arbiter", "serve"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9090}
    config = rendered.one("ConfigMap")["data"]
    assert config["ARBITER_PORT"] == "8080" and config["ARBITER_HOST"] == "0.0.0.0"
    assert config["ARBITER_METRICS_PORT"] == "9090" and config["ARBITER_METRICS_HOST"] == "0.0.0.0"
    assert config["ARBITER_AUTO_MIGRATE"] == "false", "migrations run in the hook Job only"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9090"
    assert re.fullmatch(r"[0-9a-f]{64}", annotations["checksum/secret"])
    service = rendered.one("Service")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"], "never the metrics port"


def test_pods_are_locked_down_and_probed(chart: Any) -> None:
    rendered = render(chart, REQUIRED)
    spec = pod(rendered.one("Deployment"))
    container = server(rendered)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == rendered.one("ServiceAccount")["metadata"]["name"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop == ["sleep", "5"]
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + 35
    assert {"requests", "limits"} <= set(container["resources"])


def test_autoscaling_on_means_no_replicas_field(chart: Any) -> None:
    on = render(chart, merged(REQUIRED, {"autoscaling": {"enabled": True}, "replicaCount": 4}))
    deployment = on.one("Deployment")
    assert "replicas" not in deployment["spec"], "a replicas field beside the HPA undoes it on every upgrade"
    hpa = on.one("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": deployment["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    off = render(chart, merged(REQUIRED, {"replicaCount": 4}))
    assert off.one("Deployment")["spec"]["replicas"] == 4
    assert not off.all("HorizontalPodAutoscaler")
    memory = render(chart, merged(REQUIRED, {"autoscaling": {"enabled": True,
                                                             "targetMemoryUtilizationPercentage": 80}}))
    assert [m["resource"]["name"] for m in memory.one("HorizontalPodAutoscaler")["spec"]["metrics"]] == [
        "cpu", "memory"]


def test_secrets_given_as_values_reach_the_pods_through_the_charts_secret(chart: Any) -> None:
    rendered = render(chart, ALL_ON)
    fullname = rendered.one("Deployment")["metadata"]["name"]
    secret = rendered.one("Secret", fullname)
    assert secret_data(secret) == SECRETS
    assert "stringData" not in secret
    container = server(rendered)
    for name in SECRETS:
        assert secret_ref(container, name) == (fullname, name)
    assert env(container)["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector:4318"


def test_existing_secrets_are_referenced_never_copied(chart: Any) -> None:
    rendered = render(chart, EXISTING)
    assert not rendered.all("Secret"), "nothing for the chart to hold"
    container = server(rendered)
    assert secret_ref(container, "ARBITER_DATABASE_URL") == ("pg-app", "uri")
    assert secret_ref(container, "ARBITER_REDIS_URL") == ("redis-auth", "url")
    assert secret_ref(container, "ARBITER_SECRET_KEY") == ("arbiter-keys", "secret-key")
    assert secret_ref(container, "ARBITER_KEY_PEPPER") == ("arbiter-keys", "pepper")
    assert secret_ref(container, "ARBITER_BOOTSTRAP_ADMIN_KEY") == ("arbiter-keys", "admin")
    (migrate,) = pod(rendered.one("Job"))["containers"]
    assert secret_ref(migrate, "ARBITER_DATABASE_URL") == ("pg-app", "uri")
    # A mix: the database from a Secret of its own, the keys as values.
    mixed = render(chart, merged(REQUIRED, {"database": {"url": "",
                                                         "existingSecret": {"name": "pg-app", "key": "uri"}}}))
    assert set(secret_data(mixed.one("Secret"))) == {"ARBITER_SECRET_KEY", "ARBITER_KEY_PEPPER"}
    assert secret_ref(server(mixed), "ARBITER_DATABASE_URL") == ("pg-app", "uri")
    assert "ARBITER_REDIS_URL" not in env(server(mixed)), "no Redis given: none set"


def test_migrations_are_a_hook_job_running_arbiter_migrate(chart: Any) -> None:
    rendered = render(chart, REQUIRED)
    job = rendered.one("Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert "ttlSecondsAfterFinished" not in job["spec"], "Helm deletes it; a TTL would race Helm's watch"
    (migrate,) = pod(job)["containers"]
    assert migrate["command"] == ["arbiter", "migrate"]
    _assert_real_command(migrate["command"], "the chart's migration Job")
    assert migrate["image"] == server(rendered)["image"]
    assert migrate["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod(job)["restartPolicy"] == "Never" and "serviceAccountName" not in pod(job), \
        "the release's ServiceAccount does not exist yet when pre-install hooks run"
    # The release's own Secret does not exist yet either: the URL comes from a hook Secret made first.
    secret_name, key = secret_ref(migrate, "ARBITER_DATABASE_URL")
    hook_secret = rendered.one("Secret", secret_name)
    assert secret_data(hook_secret) == {key: DATABASE_URL}
    hook = hook_secret["metadata"]["annotations"]
    assert hook["helm.sh/hook"] == annotations["helm.sh/hook"]
    assert int(hook["helm.sh/hook-weight"]) < int(annotations.get("helm.sh/hook-weight", "0"))
    assert hook["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    off = render(chart, merged(REQUIRED, {"migrations": {"enabled": False}}))
    assert not off.all("Job") and len(off.all("Secret")) == 1


def test_the_usage_spool_is_on_a_volume_the_setting_points_at(chart: Any) -> None:
    for values, kind in ((REQUIRED, "emptyDir"), (ALL_ON, "persistentVolumeClaim")):
        rendered = render(chart, values)
        container = server(rendered)
        spool_dir = env(container)["ARBITER_USAGE_SPOOL_DIR"]["value"]
        assert "ARBITER_USAGE_SPOOL_DIR" not in rendered.one("ConfigMap")["data"], "one place sets it"
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == spool_dir]
        assert not mount.get("readOnly")
        (volume,) = [v for v in pod(rendered.one("Deployment"))["volumes"] if v["name"] == mount["name"]]
        assert kind in volume, volume
    rendered = render(chart, REQUIRED)
    (volume,) = [v for v in pod(rendered.one("Deployment"))["volumes"] if v["name"] == "usage-spool"]
    assert volume["emptyDir"] == {"sizeLimit": "256Mi"}
    assert not rendered.all("PersistentVolumeClaim")


def test_a_pvc_spool_is_shared_and_kept(chart: Any) -> None:
    rendered = render(chart, ALL_ON)
    claim = rendered.one("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every pod mounts the one claim"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (volume,) = [v for v in pod(rendered.one("Deployment"))["volumes"] if v["name"] == "usage-spool"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    existing = render(chart, VARIANTS["pvc spool, existing claim"])
    assert not existing.all("PersistentVolumeClaim")
    (volume,) = [v for v in pod(existing.one("Deployment"))["volumes"] if v["name"] == "usage-spool"]
    assert volume["persistentVolumeClaim"]["claimName"] == "spool-rwx"


def test_ingress(chart: Any) -> None:
    rendered = render(chart, ALL_ON)
    ingress = rendered.one("Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "arbiter-tls", "hosts": ["arbiter.example.org"]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "arbiter.example.org"
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"] == {
        "name": rendered.one("Service", ingress["metadata"]["name"])["metadata"]["name"], "port": {"name": "http"}}
    assert "https://arbiter.example.org/" in rendered.notes
    assert not render(chart, REQUIRED).all("Ingress")


def test_pod_disruption_budget(chart: Any) -> None:
    selector = render(chart, REQUIRED).one("Deployment")["spec"]["selector"]["matchLabels"]
    default = render(chart, REQUIRED).one("PodDisruptionBudget")["spec"]
    assert default == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    pinned = render(chart, VARIANTS["pdb minAvailable"]).one("PodDisruptionBudget")["spec"]
    assert pinned == {"minAvailable": 2, "selector": {"matchLabels": selector}}
    assert not render(chart, VARIANTS["no pdb, no metrics, no migrations"]).all("PodDisruptionBudget")


def test_selectors_match_the_server_pods_only(chart: Any) -> None:
    rendered = render(chart, ALL_ON)
    labels = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    job_labels = rendered.one("Job")["spec"]["template"]["metadata"]["labels"]
    fullname = rendered.one("Deployment")["metadata"]["name"]
    for selector in (rendered.one("Deployment")["spec"]["selector"]["matchLabels"],
                     rendered.one("Service", fullname)["spec"]["selector"],
                     rendered.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
        assert not selector.items() <= job_labels.items(), "the migration pod takes no traffic"


def test_metrics_off_serves_them_on_the_main_port(chart: Any) -> None:
    rendered = render(chart, VARIANTS["no pdb, no metrics, no migrations"])
    container = server(rendered)
    assert [p["name"] for p in container["ports"]] == ["http"]
    assert "ARBITER_METRICS_PORT" not in rendered.one("ConfigMap")["data"]
    assert "prometheus.io/scrape" not in rendered.one("Deployment")["spec"]["template"]["metadata"]["annotations"]


def test_service_monitor_and_prometheus_rule(chart: Any) -> None:
    rendered = render(chart, ALL_ON)
    monitor = rendered.one("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (metrics_service,) = [s for s in rendered.all("Service") if s["metadata"]["name"].endswith("-metrics")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    assert metrics_service["spec"]["clusterIP"] == "None"
    assert [p["targetPort"] for p in metrics_service["spec"]["ports"]] == ["metrics"]
    for other in rendered.all("Service"):
        if other is not metrics_service:
            assert not monitor["spec"]["selector"]["matchLabels"].items() <= other["metadata"]["labels"].items()
    rule = rendered.one("PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text()), "the rules are deploy/observability/alerts.yaml's"
    assert (CHART / "files" / "alerts.yaml").read_text() == ALERTS.read_text(), \
        "deploy/helm/arbiter/files/alerts.yaml is a copy of deploy/observability/alerts.yaml: copy it again"
    off = render(chart, REQUIRED)
    assert not off.all("ServiceMonitor") and not off.all("PrometheusRule")


def test_image_tag_and_digest(chart: Any) -> None:
    tagged = render(chart, merged(REQUIRED, {"image": {"tag": "0.2.0", "pullPolicy": "Always"}}))
    assert server(tagged)["image"] == "registry.internal/platform/arbiter:0.2.0"
    assert server(tagged)["imagePullPolicy"] == "Always"
    digest = "sha256:" + "ab" * 32
    pinned = render(chart, merged(REQUIRED, {"image": {"digest": digest}}))
    assert server(pinned)["image"] == f"registry.internal/platform/arbiter@{digest}"
    (migrate,) = pod(pinned.one("Job"))["containers"]
    assert migrate["image"] == server(pinned)["image"]


def test_every_setting_the_chart_sets_is_real(chart: Any) -> None:
    settings = {f"ARBITER_{name.upper()}" for name in Settings.model_fields}
    rendered = render(chart, merged(ALL_ON, {"config": {"ARBITER_MAX_CONCURRENCY": 200}}))
    assert rendered.one("ConfigMap")["data"]["ARBITER_MAX_CONCURRENCY"] == "200"
    names = set(rendered.one("ConfigMap")["data"]) | set(env(server(rendered)))
    assert {n for n in names if n.startswith("ARBITER_")} - settings == set()


# -- secrets never leak ---------------------------------------------------------------------


def test_no_secret_value_outside_a_secret(chart: Any) -> None:
    for values in (ALL_ON, REQUIRED):
        rendered = render(chart, values)
        leaks = {value for value in SECRETS.values() for text in
                 [rendered.notes, *(yaml.safe_dump(o) for o in rendered.objects if o["kind"] != "Secret")]
                 if value in text or base64.b64encode(value.encode()).decode() in text}
        assert not leaks, f"secret values outside Secrets: {leaks}"
        config = rendered.one("ConfigMap")["data"]
        assert not set(SECRETS) & set(config)
    # The check can fail: they are in the Secret, both as values.
    assert SECRET_KEY in secret_data(render(chart, ALL_ON).one("Secret", RELEASE)).values()


def test_notes_say_what_to_do_next_and_warn(chart: Any) -> None:
    notes = render(chart, REQUIRED).notes
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in notes
    assert f"port-forward service/{RELEASE} 8080:8080" in notes
    (command,) = re.findall(r"-- (arbiter admin create-key[^\n]*)", notes)
    _assert_real_command(command.split(), "NOTES.txt")
    assert "no Redis" in notes and "emptyDir" in notes
    quiet = render(chart, ALL_ON).notes
    assert "no Redis" not in quiet and "emptyDir" not in quiet
    assert "bootstrap admin key you gave (it is not shown here)" in quiet


# -- bad values are refused, with what to do -------------------------------------------------


@pytest.mark.parametrize(("values", "message"), [
    ({**REQUIRED, "image": {"repository": ""}}, "image.repository is required"),
    ({k: v for k, v in REQUIRED.items() if k != "database"}, "database is required"),
    ({k: v for k, v in REQUIRED.items() if k != "secretKey"}, "secretKey is required"),
    ({k: v for k, v in REQUIRED.items() if k != "pepper"}, "pepper is required"),
    (merged(REQUIRED, {"database": {"existingSecret": {"name": "pg"}}}),
     "database.url or database.existingSecret.name, not both"),
    (merged(REQUIRED, {"database": {"url": "sqlite:////data/arbiter.db"}}), "database.url must be a PostgreSQL URL"),
    (merged(REQUIRED, {"redis": {"url": "http://redis:6379"}}), "redis.url must be a Redis URL"),
    (merged(REQUIRED, {"secretKey": {"value": "too-short-0123456789"}}), "secretKey.value is too short"),
    (merged(REQUIRED, {"pepper": {"value": "CHANGE-ME-CHANGE-ME-CHANGE-ME-CHANGE-ME"}}),
     "pepper is still a CHANGE-ME placeholder"),
    (merged(REQUIRED, {"bootstrapAdminKey": {"value": "not-an-admin-key-at-all-0123456789"}}),
     "bootstrapAdminKey.value must be an admin key"),
    (merged(REQUIRED, {"config": {"ARBITER_SECRET_KEY": SECRET_KEY}}), "config.ARBITER_SECRET_KEY"),
    (merged(REQUIRED, {"config": {"ARBITER_USAGE_SPOOL_DIR": "/tmp"}}), "config.ARBITER_USAGE_SPOOL_DIR"),
    (merged(REQUIRED, {"podDisruptionBudget": {"minAvailable": 1}}), "minAvailable or maxUnavailable, not both"),
    (merged(REQUIRED, {"ingress": {"enabled": True}}), "ingress.enabled needs at least one entry in ingress.hosts"),
    (merged(REQUIRED, {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}), "minReplicas is above"),
    (merged(REQUIRED, {"terminationGracePeriodSeconds": 10}), "terminationGracePeriodSeconds must be at least"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_values_stop_the_install_with_a_message(chart: Any, values: dict[str, Any], message: str) -> None:
    error = render_error(chart, values)
    assert message in error, error
    for secret in (*SECRETS.values(), "too-short-0123456789", "not-an-admin-key-at-all-0123456789"):
        assert secret not in error, "a refused value is never echoed"


@pytest.mark.parametrize(("values", "where"), [
    ({**REQUIRED, "replicas": 3}, "additional properties 'replicas' not allowed"),
    (merged(REQUIRED, {"usageSpool": {"type": "hostPath"}}), "/usageSpool/type"),
    (merged(REQUIRED, {"config": {"max_body_bytes": "1"}}), "'max_body_bytes' does not match pattern '^ARBITER_"),
    (merged(REQUIRED, {"logLevel": "loud"}), "/logLevel"),
    (merged(REQUIRED, {"metrics": {"port": 8080}}), "/metrics/port"),
    (merged(REQUIRED, {"image": {"digest": "latest"}}), "/image/digest"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_schema_refuses_misspelt_and_malformed_values(chart: Any, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    assert where in str(caught.value), str(caught.value)
    assert where in render_error(chart, values), "an install checks the schema too"
