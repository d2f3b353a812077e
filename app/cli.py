"""The ``arbiter`` command line.

    arbiter --version
    arbiter serve [--host H] [--port P]
    arbiter migrate
    arbiter admin create-key [--name N] [--role owner|operator|viewer|project-admin] [--project P ...]
    arbiter key create --project NAME [--name N]
    arbiter project create NAME [--models all|m1,m2] [--organization ORG]
    arbiter organization create NAME
    arbiter service add --type ollama-external|vllm|openai|local --url URL [--name NAME] [--api-key KEY]
    arbiter alias add ALIAS --model MODEL | arbiter alias list | arbiter alias remove ALIAS
    arbiter emulate ollama --port N [--version X.Y.Z]
    arbiter emulate vllm --port N [--version X.Y.Z]

Commands that create a key print it alone on their last line of output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy.exc
from pydantic import ValidationError

from app.errors import ArbiterError
from app.settings import Settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except ArbiterError as exc:
        print(f"arbiter: {exc.message}", file=sys.stderr)
        return 1
    except ValidationError as exc:  # a setting out of its range: say which, in the operator's terms
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]) or "settings"
            print(f"arbiter: ARBITER_{field.upper()}: {error['msg']}", file=sys.stderr)
        return 2
    except sqlalchemy.exc.ArgumentError:  # its message may hold the URL, password and all
        print("arbiter: ARBITER_DATABASE_URL is not a database URL "
              "(sqlite:///path/arbiter.db or postgresql://user@host/db)", file=sys.stderr)
        return 2
    except sqlalchemy.exc.OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else "no reason given"
        print(f"arbiter: cannot use the database: {reason}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbiter", description="A gateway for decision models.")
    parser.add_argument("--version", action="version", version=f"arbiter {_version()}")
    sub = parser.add_subparsers(metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to bind (default: ARBITER_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: ARBITER_PORT or 8080)")
    serve.set_defaults(run=_serve)

    sub.add_parser("migrate", help="apply database migrations").set_defaults(run=_migrate)

    admin = sub.add_parser("admin", help="admin keys").add_subparsers(metavar="ACTION")
    create_admin = admin.add_parser("create-key", help="create an admin key (printed once)")
    create_admin.add_argument("--name", default="", help="a label for the key")
    create_admin.add_argument("--role", default="owner", choices=["owner", "operator", "viewer", "project-admin"],
                              help="what the key may do (default: owner, everything)")
    create_admin.add_argument("--project", action="append", default=[], dest="projects", metavar="NAME",
                              help="a project a project-admin key manages (repeat for several; project-admin only)")
    create_admin.set_defaults(run=_admin_create_key)

    key = sub.add_parser("key", help="project keys").add_subparsers(metavar="ACTION")
    create_key = key.add_parser("create", help="create a project key (printed once)")
    create_key.add_argument("--project", required=True, help="the project's name")
    create_key.add_argument("--name", default="", help="a label for the key")
    create_key.set_defaults(run=_key_create)

    project = sub.add_parser("project", help="projects").add_subparsers(metavar="ACTION")
    create_project = project.add_parser("create", help="create a project")
    create_project.add_argument("name")
    create_project.add_argument("--models", default="all", help="'all' or a comma-separated list")
    create_project.add_argument("--organization", default=None)
    create_project.set_defaults(run=_project_create)

    organization = sub.add_parser("organization", help="organizations").add_subparsers(metavar="ACTION")
    create_organization = organization.add_parser("create", help="create an organization")
    create_organization.add_argument("name")
    create_organization.set_defaults(run=_organization_create)

    service = sub.add_parser("service", help="services (backends)").add_subparsers(metavar="ACTION")
    add = service.add_parser("add", help="register a backend and its models")
    add.add_argument("--type", required=True, choices=["ollama", "ollama-external", "ollama-cloud", "vllm", "openai", "local"])
    add.add_argument("--url", default=None, help="the backend's URL (ollama-cloud: https://ollama.com)")
    add.add_argument("--name", default=None)
    add.add_argument("--api-key", default=None, help="the backend's bearer key, if it needs one")
    add.add_argument("--context-length", type=int, default=None,
                     help="type ollama: the context length of every model on it")
    add.set_defaults(run=_service_add)

    _alias_parsers(sub)
    _model_parsers(sub)

    emulate = sub.add_parser("emulate", help="run a backend emulator (tests, local trials)")
    kinds = emulate.add_subparsers(metavar="BACKEND")
    for kind, default_version in (("ollama", "0.35.0"), ("vllm", "0.11.0")):
        emu = kinds.add_parser(kind, help=f"emulate {kind}")
        emu.add_argument("--host", default="127.0.0.1")
        emu.add_argument("--port", type=int, required=True)
        emu.add_argument("--version", default=default_version)
        emu.set_defaults(run=_emulate, kind=kind)
    return parser


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("arbiter")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _alias_parsers(sub: Any) -> None:
    alias = sub.add_parser("alias", help="model aliases (a second public name)").add_subparsers(metavar="ACTION")
    add = alias.add_parser("add", help="give a model a second public name")
    add.add_argument("alias", help="the new name, e.g. jev-latest")
    add.add_argument("--model", required=True, help="the public name of an installed model")
    add.set_defaults(run=_alias_add)
    alias.add_parser("list", help="every alias, its model and its status").set_defaults(run=_alias_list)
    remove = alias.add_parser("remove", help="remove an alias")
    remove.add_argument("alias")
    remove.set_defaults(run=_alias_remove)


def _model_parsers(sub: Any) -> None:
    model = sub.add_parser("model", help="installed models").add_subparsers(metavar="ACTION")
    change = model.add_parser("set", help="how a model answers decisions (PATCH /admin/models/{id})")
    change.add_argument("model", help="its public name")
    change.add_argument("--service", help="the service's name, when several serve the model")
    change.add_argument("--read-strategy", choices=("labels", "embeddings", "none"),
                        help="labels: a generation model's label probabilities; embeddings: an embedding "
                        "model's similarity; none: the backend's own decision endpoint")
    change.add_argument("--temperature", type=float, help="the embeddings strategy's softmax temperature")
    change.add_argument("--timeout", type=float, help="seconds a request to this model may take")
    change.set_defaults(run=_model_set)


def _model_set(args: argparse.Namespace) -> int:
    from sqlalchemy import select

    from app.db.models import Model, Service
    from app.errors import InvalidRequest, NotFound
    from app.services import service as services
    from app.tenancy.service import CLI

    changes: dict[str, Any] = {}
    if args.read_strategy is not None:
        changes["read_strategy"] = None if args.read_strategy == "none" else args.read_strategy
    if args.temperature is not None:
        changes["embedding_temperature"] = args.temperature
    if args.timeout is not None:
        changes["timeout"] = args.timeout
    if not changes:
        raise SystemExit("arbiter: nothing to set: give --read-strategy, --temperature or --timeout")

    def work(session: Any, _c: Any, _s: Settings) -> str:
        query = select(Model.id, Service.name).join(Service, Model.service_id == Service.id).where(
            Model.public_name == args.model)
        rows = [(i, name) for i, name in session.execute(query) if args.service in (None, name)]
        if not rows:
            where = f" on service '{args.service}'" if args.service else ""
            raise NotFound(f"no model '{args.model}'{where} is installed")
        if len(rows) > 1:
            raise InvalidRequest(f"model '{args.model}' is on several services "
                                 f"({', '.join(n for _, n in rows)}): name one with --service")
        model, service = services.update_model(session, rows[0][0], CLI, changes)
        return f"model '{model.public_name}' on '{service.name}' updated: " + ", ".join(
            f"{k}={v}" for k, v in changes.items()) + " (running servers pick it up at their next registry refresh)"

    print(_with_session(work))
    return 0


def _with_session(work: Callable[[Any, Any, Settings], Any]) -> Any:
    """``work(session, parts, settings)`` in one transaction; ``parts`` has the ``database`` and
    the key ``hasher``. Without the serving stack's imports (app/prepare.py)."""
    settings = Settings()  # a bad setting is reported before any of the imports below
    from types import SimpleNamespace

    from app.db.migrate import NotMigrated
    from app.db.session import Database
    from app.prepare import key_hasher, prepare_database

    parts = SimpleNamespace(database=Database(settings.database_url), hasher=key_hasher(settings))
    try:
        prepare_database(settings, parts.database, parts.hasher)
        with parts.database.session() as session:
            return work(session, parts, settings)
    except NotMigrated as exc:
        raise SystemExit(f"arbiter: {exc}") from exc
    finally:
        parts.database.dispose()


def _serve(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)  # a bad setting is reported before any of the imports below

    from app.db.migrate import NotMigrated
    from app.db.session import Database
    from app.prepare import key_hasher, prepare_database
    from app.telemetry.logs import configure as configure_logs

    configure_logs(settings.log_level)
    database = Database(settings.database_url)
    try:
        prepare_database(settings, database, key_hasher(settings))
    except NotMigrated as exc:
        print(f"arbiter: {exc}", file=sys.stderr)
        return 2
    finally:
        database.dispose()
    from app.server import serve  # the serving stack's imports: once the database is ready

    serve(settings)
    return 0


def _migrate(_args: argparse.Namespace) -> int:
    settings = Settings()  # a bad setting is reported before alembic's imports
    from app.db import migrate

    migrate.upgrade(settings.database_url)
    print("database is at the latest migration")
    return 0


def _admin_create_key(args: argparse.Namespace) -> int:
    from app.tenancy import service as tenancy

    value = _with_session(lambda s, c, _: tenancy.create_key(
        s, c.hasher, tenancy.CLI, kind="admin", name=args.name, role=args.role, projects=args.projects)[1])
    print(f"admin key ({args.role}) created; it is shown once:")
    print(value)
    return 0


def _key_create(args: argparse.Namespace) -> int:
    from app.tenancy import service as tenancy

    value = _with_session(lambda s, c, _: tenancy.create_key(
        s, c.hasher, tenancy.CLI, kind="project", project=args.project, name=args.name)[1])
    print(f"project key for '{args.project}' created; it is shown once:")
    print(value)
    return 0


def _project_create(args: argparse.Namespace) -> int:
    from app.tenancy import service as tenancy

    def work(session: Any, _c: Any, _s: Settings) -> list[str]:
        project = tenancy.create_project(session, args.name, tenancy.CLI, models=args.models,
                                         organization=args.organization)
        return _missing_models(session, project.allowed_models or [])

    for warning in _with_session(work):
        print(f"arbiter: warning: {warning}", file=sys.stderr)
    print(f"project '{args.name}' created (models: {args.models})")
    return 0


def _missing_models(session: Any, allowed: list[str]) -> list[str]:
    """What to say of each allowed name no service here provides: a typo, a model not pulled
    yet, or an alias (an allowlist holds model names, never aliases). Only a warning: a model
    may be installed later, and a mesh peer's models are not known here."""
    from app.services import aliases

    installed = aliases.model_names(session)
    targets = aliases.all_targets(session)
    warnings = []
    for name in allowed:
        if name in installed:
            continue
        if name in targets:
            warnings.append(f"'{name}' is an alias: allow its model '{targets[name]}' instead")
        else:
            warnings.append(f"model '{name}' is not installed here (check the name, or add the service "
                            "that provides it: arbiter service add)")
    return warnings


def _organization_create(args: argparse.Namespace) -> int:
    from app.tenancy import service as tenancy

    _with_session(lambda s, _c, _: tenancy.create_organization(s, args.name, tenancy.CLI))
    print(f"organization '{args.name}' created")
    return 0


def _service_add(args: argparse.Namespace) -> int:
    from app.services import service as services
    from app.tenancy.service import CLI

    def work(session: Any, _c: Any, settings: Settings) -> list[str]:
        service = services.add_service(session, settings, CLI, type=args.type, url=args.url,
                                       name=args.name, credential=args.api_key,
                                       context_length=args.context_length)
        lines = [f"service '{service.name}' added ({service.type}, version {service.version})"]
        views = [services.model_view(m, service) for m in services.service_models(session, service)]
        lines += [f"  model {v['public_name']} ({', '.join(v['capabilities'])})" for v in views]
        lines += [f"  skipped {s['model']}: {s['reason']}" for s in service.skipped_models]
        return lines

    for line in _with_session(work):
        print(line)
    return 0


def _alias_add(args: argparse.Namespace) -> int:
    from app.services import aliases
    from app.tenancy.service import CLI

    _with_session(lambda s, _c, _: aliases.create_alias(s, CLI, args.alias, args.model))
    print(f"alias '{args.alias}' added for model '{args.model}' "
          "(running servers pick it up at their next registry refresh)")
    return 0


def _alias_list(_args: argparse.Namespace) -> int:
    from app.services import aliases

    def work(session: Any, _c: Any, _s: Settings) -> list[dict[str, Any]]:
        installed = aliases.model_names(session)  # this node's models (the mesh's are not known here)
        return [aliases.alias_view(a, installed.__contains__) for a in aliases.list_aliases(session)]

    views = _with_session(work)
    for view in views:
        print(f"{view['alias']} -> {view['model']} ({view['status']})")
    if not views:
        print("no aliases")
    return 0


def _alias_remove(args: argparse.Namespace) -> int:
    from app.services import aliases
    from app.tenancy.service import CLI

    _with_session(lambda s, _c, _: aliases.remove_alias(s, CLI, args.alias))
    print(f"alias '{args.alias}' removed")
    return 0


def _emulate(args: argparse.Namespace) -> int:
    print(f"emulating {args.kind} {args.version} on http://{args.host}:{args.port} "
          "(an emulator, not a real model)", flush=True)
    if args.kind == "ollama":
        from infra_adapters.emulators.ollama import run_ollama_emulator

        run_ollama_emulator(args.host, args.port, args.version)
    else:
        from infra_adapters.emulators.vllm import run_vllm_emulator

        run_vllm_emulator(args.host, args.port, args.version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
