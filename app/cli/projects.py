"""``arbiter project create|list|show|set|archive|unarchive``. There is no delete: a project's
usage history and audit trail name it, and archiving (reversible, its keys refused at once) is
what the admin API offers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from app.cli.client import Client
from app.cli.common import allowlist, command, limit, objects
from app.cli.render import Column, print_json, print_record, print_table, when

PROJECT_COLUMNS: list[Column] = [
    ("NAME", lambda p: p["name"]), ("MODELS", lambda p: p["models"]), ("ARCHIVED", lambda p: p["archived"]),
    ("RPM", lambda p: p["requests_per_minute"]), ("TPM", lambda p: p["tokens_per_minute"]),
    ("CREATED", lambda p: when(p["created_at"]))]


def add_parsers(sub: Any) -> None:
    actions = objects(sub, "project", "projects (a model allowlist, rate limits, keys)")
    create = command(actions, "create", "create a project", _create)
    create.add_argument("name")
    create.add_argument("--models", default="all", type=allowlist, help="'all' or a comma-separated list")
    create.add_argument("--organization", default=None, help="its organization (default: 'default')")
    command(actions, "list", "every project", _list, read=True)
    command(actions, "show", "one project", _show, read=True).add_argument("name")
    change = command(actions, "set", "change a project's allowlist or rate limits", _set)
    change.add_argument("name")
    change.add_argument("--models", type=allowlist, help="'all' or a comma-separated list")
    change.add_argument("--requests-per-minute", type=limit, default=argparse.SUPPRESS, metavar="N|none",
                        help="the project's request limit ('none': no limit)")
    change.add_argument("--tokens-per-minute", type=limit, default=argparse.SUPPRESS, metavar="N|none",
                        help="the project's token limit ('none': no limit)")
    command(actions, "archive", "archive a project: its keys are refused until it is unarchived",
            _archive).add_argument("name")
    command(actions, "unarchive", "unarchive a project: its keys work again", _unarchive).add_argument("name")


def _create(args: argparse.Namespace, client: Client) -> None:
    project = client.create_project(args.name, args.models, args.organization)
    for warning in missing_models(client, project["models"] if isinstance(project["models"], list) else []):
        print(f"arbiter: warning: {warning}", file=sys.stderr)
    print(f"project '{args.name}' created (models: {_models_text(project['models'])})")


def missing_models(client: Client, allowed: list[str]) -> list[str]:
    """What to say of each allowed name no service here provides: a typo, a model not pulled
    yet, or an alias (an allowlist holds model names, never aliases). Only a warning: a model
    may be installed later, and a mesh peer's models are not known here."""
    if not allowed:
        return []
    installed = {m["public_name"] for m in client.list_models()}
    targets = {a["alias"]: a["model"] for a in client.list_aliases()}
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


def _list(args: argparse.Namespace, client: Client) -> None:
    projects = client.list_projects()
    if args.json:
        print_json({"data": projects})
        return
    print_table(projects, PROJECT_COLUMNS, empty="no projects")


def _show(args: argparse.Namespace, client: Client) -> None:
    project = client.get_project(args.name)
    print_json(project) if args.json else print_record(project)


def _set(args: argparse.Namespace, client: Client) -> None:
    changes: dict[str, Any] = {f: getattr(args, f) for f in ("requests_per_minute", "tokens_per_minute")
                               if hasattr(args, f)}
    if args.models is not None:
        changes["models"] = args.models
    if not changes:
        raise SystemExit("arbiter: nothing to set: give --models, --requests-per-minute or --tokens-per-minute")
    project = client.update_project(args.name, changes)
    if "models" in changes:
        for warning in missing_models(client, project["models"] if isinstance(project["models"], list) else []):
            print(f"arbiter: warning: {warning}", file=sys.stderr)
    print(f"project '{args.name}' updated: " + ", ".join(
        f"{k}={_models_text(project[k]) if k == 'models' else project[k] or 'none'}" for k in changes))


def _archive(args: argparse.Namespace, client: Client) -> None:
    client.update_project(args.name, {"archived": True})
    print(f"project '{args.name}' archived: its keys are refused until 'arbiter project unarchive {args.name}'")


def _unarchive(args: argparse.Namespace, client: Client) -> None:
    client.update_project(args.name, {"archived": False})
    print(f"project '{args.name}' unarchived: its keys work again")


def _models_text(models: Any) -> str:
    return models if isinstance(models, str) else ",".join(models) or "none"
