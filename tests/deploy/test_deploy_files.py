"""Offline checks of deploy/ (and docs/deploy.md): nothing here builds an image or starts a
container. The files parse, have the services, replicas, probes and commands they should,
name only real ``ARBITER_*`` settings and real ``arbiter`` subcommands, and carry no secrets
other than obvious placeholders (CHANGE-ME)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from app.cli import _parser
from app.settings import Settings

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the environment
    yaml = None

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
NGINX = DEPLOY / "nginx.conf"
DOCS = ROOT / "docs" / "deploy.md"

needs_yaml = pytest.mark.skipif(
    yaml is None,
    reason="PyYAML is not installed (it is neither a dependency of Arbiter nor in its [test] "
           "extra); add pyyaml to the test extra to run the YAML structure checks of deploy/",
)

PLACEHOLDER = "change-me"
SECRET_SETTINGS = ("ARBITER_SECRET_KEY", "ARBITER_BOOTSTRAP_ADMIN_KEY", "ARBITER_KEY_PEPPER",
                   "ARBITER_METRICS_TOKEN", "ARBITER_DATABASE_URL", "ARBITER_REDIS_URL")
ARBITER_IMAGE_K8S = "arbiter"  # the image name kustomization.yaml's `images` rewrites


def _deploy_files() -> list[Path]:
    # deploy/.env is the operator's own secrets file (git-ignored, never committed).
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name != ".env")


def _yaml_files() -> list[Path]:
    # A Helm chart's templates are Go templates, YAML only once rendered: test_helm_chart.py renders them.
    return [p for p in _deploy_files() if p.suffix in (".yaml", ".yml") and "templates" not in p.parts]


def _load_all(path: Path) -> list[Any]:
    assert yaml is not None
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def _compose() -> dict[str, Any]:
    (doc,) = _load_all(COMPOSE)
    return doc


def _k8s_objects() -> list[dict[str, Any]]:
    (kustomization,) = _load_all(K8S / "kustomization.yaml")
    objects: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        objects += _load_all(K8S / resource)
    return objects


def _one(kind: str) -> dict[str, Any]:
    (obj,) = [o for o in _k8s_objects() if o["kind"] == kind]
    return obj


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _arbiter_replicas(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services built from deploy/Dockerfile that run the image's own CMD (arbiter serve)."""
    return {name: svc for name, svc in compose["services"].items()
            if (svc.get("build") or {}).get("dockerfile") == "deploy/Dockerfile"
            and "command" not in svc}


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per logical line: continuations joined, comments dropped."""
    instructions, pending = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


def _assert_real_command(argv: list[str], where: str) -> None:
    assert argv and argv[0] == "arbiter", f"{where}: {argv!r} is not an arbiter command"
    try:
        namespace = _parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way of refusing
        raise AssertionError(f"{where}: `{shlex.join(argv)}` is not a valid arbiter command") from exc
    assert getattr(namespace, "run", None) is not None, f"{where}: `{shlex.join(argv)}` runs nothing"


# -- every file ------------------------------------------------------------------------------


def test_deploy_holds_what_the_docs_promise() -> None:
    for path in (DOCKERFILE, COMPOSE, NGINX, DEPLOY / "arbiter.env.example", K8S / "kustomization.yaml",
                 DOCS):
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing"


@needs_yaml
@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    assert _load_all(path), f"{path} has no document"


# What the `arbiter` command line reads as a client of a remote server (app/cli/connection.py), beside
# the server's settings.
CLIENT_VARIABLES = ("ARBITER_URL", "ARBITER_ADMIN_KEY", "ARBITER_ADMIN_KEY_FILE")


def test_every_arbiter_variable_is_a_real_setting() -> None:
    cli = " ".join(p.read_text() for p in (ROOT / "app").glob("cli*/**/*.py")) + (
        (ROOT / "app" / "cli.py").read_text() if (ROOT / "app" / "cli.py").is_file() else "")
    clients = {name for name in CLIENT_VARIABLES if name in cli}
    settings = {f"ARBITER_{name.upper()}" for name in Settings.model_fields} | clients
    if "redis_url" not in Settings.model_fields:
        # ARBITER_REDIS_URL (shared rate limits, change notifications) was being added to
        # app/settings.py while deploy/ was written: tolerate exactly that one name until it lands.
        settings.add("ARBITER_REDIS_URL")
    unknown = {}
    for path in [*_deploy_files(), DOCS]:
        for name in set(re.findall(r"\bARBITER_[A-Z0-9_]+\b", path.read_text())) - settings:
            unknown.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not unknown, f"not settings of app/settings.py: {unknown}"


# -- the image -------------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_on_slim_python_311() -> None:
    instructions = _dockerfile()
    args = dict(rest.split("=", 1) for kw, rest in instructions if kw == "ARG" and "=" in rest)
    stages = [rest for kw, rest in instructions if kw == "FROM"]
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    assert re.search(r"\bAS\s+builder\b", stages[0], re.IGNORECASE)

    def image(from_line: str) -> str:
        ref = from_line.split()[0]
        return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), ref)

    runtime = image(stages[-1])
    assert runtime.startswith("python:3.11") and "slim" in runtime, runtime
    copies = [rest for kw, rest in instructions if kw == "COPY"]
    assert any("--from=builder" in rest and "/opt/arbiter" in rest for rest in copies), \
        "the runtime stage copies the builder's venv"
    runs = " ".join(rest for kw, rest in instructions if kw == "RUN")
    assert "pip wheel" in runs and "venv" in runs


def test_dockerfile_copies_only_what_the_wheel_needs() -> None:
    allowed = {"pyproject.toml", "README.md", "app", "infra_adapters", "migrations"}
    for keyword, rest in _dockerfile():
        if keyword not in ("COPY", "ADD"):
            continue
        assert keyword == "COPY", "ADD fetches and unpacks: use COPY"
        tokens = shlex.split(rest)
        if any(t.startswith("--from") for t in tokens):
            continue
        sources = [t for t in tokens if not t.startswith("--")][:-1]
        for source in sources:
            assert source.rstrip("/") in allowed, f"COPY {source}: keep the build context narrow"
            assert (ROOT / source).exists(), f"COPY {source}: no such path at the repository root"


def test_dockerfile_runs_as_a_non_root_user_with_a_healthcheck() -> None:
    instructions = _dockerfile()
    users = [rest for kw, rest in instructions if kw == "USER"]
    assert users, "the image needs a USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1]} is root"
    (healthcheck,) = [rest for kw, rest in instructions if kw == "HEALTHCHECK"]
    assert healthcheck.upper() != "NONE" and " CMD " in f" {healthcheck} "
    assert "/healthz" in healthcheck and "curl" not in healthcheck and "python" in healthcheck
    assert ("EXPOSE", "8080") in instructions
    envs = " ".join(rest for kw, rest in instructions if kw == "ENV")
    assert re.search(r"\bARBITER_HOST=0\.0\.0\.0\b", envs)


def test_dockerfile_cmd_is_arbiter_serve() -> None:
    cmds = [rest for kw, rest in _dockerfile() if kw == "CMD"]
    argv = json.loads(cmds[-1])  # exec form, so SIGTERM reaches arbiter itself
    assert argv == ["arbiter", "serve"]
    _assert_real_command(argv, "deploy/Dockerfile CMD")


# -- compose ---------------------------------------------------------------------------------


@needs_yaml
def test_compose_has_its_services() -> None:
    services = _compose()["services"]
    assert {"migrate", "lb", "postgres", "redis", "ollama"} <= set(services)
    assert services["postgres"]["image"].startswith("postgres:16")
    assert "pg_isready" in json.dumps(services["postgres"]["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    assert services["redis"]["image"].startswith("redis:7")
    assert "healthcheck" in services["redis"]
    assert services["lb"]["image"].startswith("nginx:")
    assert any("nginx.conf" in v for v in services["lb"]["volumes"])
    assert services["lb"].get("ports"), "the load balancer is the one published port"


@needs_yaml
def test_compose_runs_ollama_0_35_or_newer_with_a_context_length() -> None:
    ollama = _compose()["services"]["ollama"]
    name, _, tag = ollama["image"].rpartition(":")
    assert name == "ollama/ollama"
    assert tuple(int(part) for part in tag.split(".")[:3]) >= (0, 35, 0), ollama["image"]
    assert "OLLAMA_CONTEXT_LENGTH" in _environment(ollama)
    assert any(v.endswith(":/root/.ollama") for v in ollama["volumes"]), "models survive a restart"


@needs_yaml
def test_compose_has_two_arbiter_replicas_behind_the_migration() -> None:
    compose = _compose()
    replicas = _arbiter_replicas(compose)
    assert len(replicas) == 2, sorted(replicas)
    images = {svc["image"] for svc in replicas.values()} | {compose["services"]["migrate"]["image"]}
    assert len(images) == 1, "the replicas and migrate run one image"
    for name, svc in replicas.items():
        env = _environment(svc)
        assert env["ARBITER_DATABASE_URL"] == "postgresql://arbiter:arbiter@postgres/arbiter", name
        assert env["ARBITER_REDIS_URL"] == "redis://redis:6379/0", name
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert "/readyz" in json.dumps(svc["healthcheck"]["test"]), name
    lb_depends = compose["services"]["lb"]["depends_on"]
    assert set(replicas) <= set(lb_depends)
    nginx = NGINX.read_text()
    for name in replicas:
        server = rf"^\s*server\s+{re.escape(name)}:8080\b"
        assert re.search(server, nginx, re.MULTILINE), f"nginx skips {name}"


@needs_yaml
def test_compose_replicas_spool_usage_on_a_shared_volume() -> None:
    """A re-created container (`up --build`) keeps what a shutdown spooled, and any replica writes it."""
    compose = _compose()
    for name, svc in _arbiter_replicas(compose).items():
        spool_dir = _environment(svc)["ARBITER_USAGE_SPOOL_DIR"]
        (volume,) = [v.split(":")[0] for v in svc["volumes"] if v.split(":")[1] == spool_dir]
        assert volume in compose["volumes"], f"{name}: {volume} is a named volume"
    assert "install -d -o 10001 -g 10001" in DOCKERFILE.read_text(), "the image gives the user the directory"


@needs_yaml
def test_compose_commands_are_arbiter_subcommands() -> None:
    compose = _compose()
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["arbiter", "migrate"]
    arbiter_image = migrate["image"]
    for name, svc in compose["services"].items():
        if svc.get("image") == arbiter_image and "command" in svc:
            command = svc["command"]
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            _assert_real_command(argv, f"compose service {name}")


@needs_yaml
def test_compose_takes_secrets_from_the_environment_without_defaults() -> None:
    for name, svc in _compose()["services"].items():
        for key, value in _environment(svc).items():
            if key in ("ARBITER_SECRET_KEY", "ARBITER_BOOTSTRAP_ADMIN_KEY", "ARBITER_KEY_PEPPER",
                       "ARBITER_METRICS_TOKEN"):
                assert re.fullmatch(rf"\$\{{{key}(:\?[^}}]*)?\}}", value), \
                    f"{name}: {key} must come from the env file, with no default"


def test_nginx_balances_and_passes_what_arbiter_needs() -> None:
    nginx = NGINX.read_text()
    assert re.search(r"upstream\s+arbiter\s*\{", nginx)
    assert len(re.findall(r"^\s*server\s+arbiter-\d+:8080\b", nginx, re.MULTILINE)) >= 2
    assert re.search(r"proxy_pass\s+http://arbiter;", nginx)
    assert re.search(r"client_max_body_size\s+32m;", nginx)
    assert re.search(r"proxy_buffering\s+off;", nginx)
    assert re.search(r"proxy_set_header\s+X-Request-Id\s", nginx, re.IGNORECASE)
    assert re.search(r"proxy_set_header\s+traceparent\s", nginx, re.IGNORECASE)
    assert nginx.count("{") == nginx.count("}")


# -- Kubernetes ------------------------------------------------------------------------------


@needs_yaml
def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = _load_all(K8S / "kustomization.yaml")
    listed = set(kustomization["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    kinds = {o["kind"] for o in _k8s_objects()}
    assert {"Namespace", "ConfigMap", "Secret", "Job", "Deployment", "Service",
            "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds


@needs_yaml
def test_deployment_replicas_probes_and_shutdown() -> None:
    deployment = _one("Deployment")
    # The HPA owns the count: a replicas field would set it back on every `kubectl apply`.
    assert "replicas" not in deployment["spec"]
    assert _one("HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2
    pod = _pod_spec(deployment)
    (container,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        port = container[probe]["httpGet"]["port"]
        assert port in ports or port in ports.values(), f"{probe} port {port}"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # The preStop sleep plus uvicorn's 30 s drain fit in the grace period.
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + 30
    assert pod["terminationGracePeriodSeconds"] == 40


@needs_yaml
def test_deployment_is_locked_down_and_configured() -> None:
    pod = _pod_spec(_one("Deployment"))
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"requests", "limits"} <= set(container["resources"])
    sources = {(k, v["name"]) for item in container["envFrom"] for k, v in item.items()}
    assert sources == {("configMapRef", _one("ConfigMap")["metadata"]["name"]),
                       ("secretRef", _one("Secret")["metadata"]["name"])}
    config = _one("ConfigMap")["data"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(config["ARBITER_METRICS_PORT"])
    assert ports["http"] == int(config.get("ARBITER_PORT", 8080))
    annotations = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == config["ARBITER_METRICS_PORT"]
    assert config["ARBITER_AUTO_MIGRATE"] == "false", "migrations run in the Job only"


@needs_yaml
def test_the_usage_spool_is_on_a_writable_volume() -> None:
    """The root filesystem is read-only: without a volume and ARBITER_USAGE_SPOOL_DIR pointing at it,
    the records a shutdown keeps while the database is away could not be written."""
    pod = _pod_spec(_one("Deployment"))
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    spool_dir = env["ARBITER_USAGE_SPOOL_DIR"]
    assert "ARBITER_USAGE_SPOOL_DIR" not in _one("ConfigMap")["data"], "one place sets it"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == spool_dir]
    assert not mount.get("readOnly")
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume or "persistentVolumeClaim" in volume, volume


@needs_yaml
def test_migration_job_cleans_itself_up() -> None:
    job = _one("Job")
    # A finished Job's pod template cannot change: deleted after a while, the next release's apply
    # makes it anew instead of failing on an immutable field.
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 3600
    assert job["spec"]["activeDeadlineSeconds"] > 0


@needs_yaml
def test_kustomization_images_point_at_no_placeholder_registry() -> None:
    (kustomization,) = _load_all(K8S / "kustomization.yaml")
    (image,) = kustomization["images"]
    assert image["name"] == ARBITER_IMAGE_K8S
    reference = f"{image.get('newName', image['name'])}:{image['newTag']}"
    assert PLACEHOLDER not in reference.lower() and "example." not in reference, reference
    assert image["newTag"] == _project_version(), "the release this tree builds (pyproject.toml)"


@needs_yaml
def test_k8s_objects_are_valid_kubernetes() -> None:
    """Against the OpenAPI schemas kubernetes-validate bundles (offline), unknown fields refused."""
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (it is in the [test] extra)")
    for obj in _k8s_objects():
        for version in ("1.25.0", kubernetes_validate.latest_version()):
            kubernetes_validate.validate(obj, version, strict=True)


@needs_yaml
def test_selectors_match_the_pods() -> None:
    deployment = _one("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (deployment["spec"]["selector"]["matchLabels"], _one("Service")["spec"]["selector"],
                     _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    pdb = _one("PodDisruptionBudget")["spec"]
    assert pdb.get("minAvailable", 0) >= 2 or pdb.get("maxUnavailable") == 1
    hpa = _one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["averageUtilization"] == 70


@needs_yaml
def test_k8s_commands_are_arbiter_subcommands() -> None:
    job = _one("Job")
    (migrate,) = _pod_spec(job)["containers"]
    assert migrate["command"] == ["arbiter", "migrate"]
    seen = 0
    for obj in _k8s_objects():
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        for container in _pod_spec(obj).get("initContainers", []) + _pod_spec(obj)["containers"]:
            if container["image"] == ARBITER_IMAGE_K8S and "command" in container:
                _assert_real_command(container["command"] + container.get("args", []),
                                     f"{obj['kind']} {obj['metadata']['name']}")
                seen += 1
    assert seen >= 2


@needs_yaml
def test_k8s_secret_holds_placeholders_only() -> None:
    secret = _one("Secret")
    assert "data" not in secret, "stringData placeholders only (data is base64 and hides values)"
    values = secret["stringData"]
    assert {"ARBITER_DATABASE_URL", "ARBITER_SECRET_KEY", "ARBITER_BOOTSTRAP_ADMIN_KEY",
            "ARBITER_REDIS_URL", "ARBITER_METRICS_TOKEN"} <= set(values)
    for key, value in values.items():
        assert PLACEHOLDER in value.lower(), f"{key} must be a CHANGE-ME placeholder"
    config = _one("ConfigMap")["data"]
    assert not set(SECRET_SETTINGS) & set(config), "secrets belong in the Secret"


# -- commands in the docs, and secrets anywhere ---------------------------------------------


def test_docs_commands_are_arbiter_subcommands() -> None:
    text = DOCS.read_text()
    # `arbiter ...` in inline code, at a line's start, in $(...), or after `exec [-T] arbiter-N`
    # or an image name; "kubectl -n arbiter wait" and prose are not commands.
    # `kubectl exec deploy/arbiter -- arbiter ...` too.
    command = r"(?:^|`|\$\(|arbiter-\d+ |arbiter:local |deploy/[a-z-]+ -- )arbiter ([a-z][^`|)\n]*)"
    found = re.findall(command, text, re.MULTILINE)
    assert len(found) >= 5
    for rest in found:
        _assert_real_command(["arbiter", *shlex.split(rest)], "docs/deploy.md")


_ASSIGNMENT = re.compile(
    r"\b((?:ARBITER_(?:SECRET_KEY|BOOTSTRAP_ADMIN_KEY|KEY_PEPPER|METRICS_TOKEN))|[A-Z_]*PASSWORD"
    r"|[A-Z_]*API_KEY|[A-Z_]*_TOKEN)\b[\"']?\s*[:=]\s*[\"']?([^\s\"'#,]*)")
_URL_PASSWORD = re.compile(r"\b[a-z][a-z0-9+.-]*://[^:/@\s'\"]*:([^@/\s'\"]+)@")
# The one credential in the files on purpose: compose's PostgreSQL, which publishes no port
# and is reachable only on the compose network (the brief's postgresql://arbiter:arbiter@...).
_ALLOWED = {("compose.yaml", "POSTGRES_PASSWORD", "arbiter"), ("compose.yaml", "url", "arbiter")}


def _placeholder(value: str) -> bool:
    if not value or PLACEHOLDER in value.lower() or value in ("...", "$"):
        return True
    # Made from a reference: ${VAR}, ${VAR:?message}, $VAR or $(command); never ${VAR:-default}.
    return "$" in value and not re.search(r"\$\{\w+:?-", value)


def test_no_secret_values_in_committed_files() -> None:
    problems = []
    for path in [*_deploy_files(), DOCS]:
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        for name, value in _ASSIGNMENT.findall(text):
            if not _placeholder(value) and (path.name, name, value) not in _ALLOWED:
                problems.append(f"{where}: {name}={value}")
        for password in _URL_PASSWORD.findall(text):
            if not _placeholder(password) and (path.name, "url", password) not in _ALLOWED:
                problems.append(f"{where}: a password in a URL ({password})")
        for pattern, what in ((r"arb_(?:admin|proj)_[A-Za-z0-9_-]{20,}", "an Arbiter key"),
                              (r"-----BEGIN [A-Z ]*PRIVATE KEY-----", "a private key"),
                              (r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}=(?![A-Za-z0-9_=-])", "a Fernet key")):
            problems += [f"{where}: {what}" for _ in re.findall(pattern, text)]
    assert not problems, problems
    ignored = (DEPLOY / ".gitignore").read_text().split()
    assert ".env" in ignored, "deploy/.env holds real secrets: keep it out of git"
