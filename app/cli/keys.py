"""``arbiter key ...`` (project keys) and ``arbiter admin ...`` (admin keys): create, list, show,
revoke, rotate. A command that makes a key prints it alone on its last line; no other output
ever holds one (a key is shown by its prefix and last four characters)."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.client import Client, View
from app.cli.common import command, expiry, key_id, objects
from app.cli.render import Column, key_state, masked, print_json, print_record, print_table, when
from app.tenancy.roles import ROLES

PROJECT_KEY_COLUMNS: list[Column] = [
    ("ID", lambda k: k["id"]), ("PROJECT", lambda k: k["project"]), ("NAME", lambda k: k["name"]),
    ("KEY", masked), ("STATE", key_state), ("CREATED", lambda k: when(k["created_at"])),
    ("EXPIRES", lambda k: when(k["expires_at"])), ("LAST USED", lambda k: when(k["last_used_at"]))]
ADMIN_KEY_COLUMNS: list[Column] = [
    ("ID", lambda k: k["id"]), ("NAME", lambda k: k["name"]), ("ROLE", lambda k: k["role"]),
    ("PROJECTS", lambda k: k["projects"]), ("KEY", masked), ("STATE", key_state),
    ("CREATED", lambda k: when(k["created_at"])), ("EXPIRES", lambda k: when(k["expires_at"])),
    ("LAST USED", lambda k: when(k["last_used_at"]))]
GRACE_HELP = "seconds the old key keeps working (0 to 2592000; default: 3600)"


def add_parsers(sub: Any) -> None:
    _project_key_parsers(objects(sub, "key", "project keys (they call models)"))
    _admin_key_parsers(objects(sub, "admin", "admin keys (they call the admin API)"))


def _project_key_parsers(actions: Any) -> None:
    create = command(actions, "create", "create a project key (printed once)", _create_project_key)
    create.add_argument("--project", required=True, help="the project's name")
    create.add_argument("--name", default="", help="a label for the key")
    create.add_argument("--expires-at", type=expiry, metavar="TIME", help="when it stops working (ISO 8601)")
    listing = command(actions, "list", "project keys (never their values)", _list_project_keys, read=True)
    listing.add_argument("--project", help="one project's keys (default: every project's)")
    command(actions, "show", "one project key", _show, read=True).add_argument("id", type=key_id)
    command(actions, "revoke", "revoke a project key now", _revoke).add_argument("id", type=key_id)
    rotate = command(actions, "rotate", "a new key for the same project; the old one works for a grace period",
                     _rotate)
    rotate.add_argument("id", type=key_id)
    rotate.add_argument("--grace-seconds", type=int, default=3600, metavar="N", help=GRACE_HELP)
    for parser in (actions.choices["show"], actions.choices["revoke"], actions.choices["rotate"]):
        parser.set_defaults(kind="project")


def _admin_key_parsers(actions: Any) -> None:
    create = command(actions, "create-key", "create an admin key (printed once)", _create_admin_key)
    create.add_argument("--name", default="", help="a label for the key")
    create.add_argument("--role", default="owner", choices=list(ROLES),
                        help="what the key may do (default: owner, everything)")
    create.add_argument("--project", action="append", default=[], dest="projects", metavar="NAME",
                        help="a project a project-admin key manages (repeat for several; project-admin only)")
    create.add_argument("--expires-at", type=expiry, metavar="TIME", help="when it stops working (ISO 8601)")
    command(actions, "list", "admin keys, their roles and projects (never their values)", _list_admin_keys,
            read=True)
    command(actions, "show", "one admin key", _show, read=True).add_argument("id", type=key_id)
    command(actions, "revoke", "revoke an admin key now", _revoke).add_argument("id", type=key_id)
    rotate = command(actions, "rotate", "a new admin key with the same role and projects; the old one works "
                     "for a grace period", _rotate)
    rotate.add_argument("id", type=key_id)
    rotate.add_argument("--grace-seconds", type=int, default=3600, metavar="N", help=GRACE_HELP)
    for parser in (actions.choices["show"], actions.choices["revoke"], actions.choices["rotate"]):
        parser.set_defaults(kind="admin")


def _create_project_key(args: argparse.Namespace, client: Client) -> None:
    made = client.create_project_key(args.project, args.name, args.expires_at)
    print(f"project key {made['id']} for '{args.project}' created; it is shown once:")
    print(made["key"])


def _create_admin_key(args: argparse.Namespace, client: Client) -> None:
    made = client.create_admin_key(args.name, args.role, args.projects, args.expires_at)
    print(f"admin key {made['id']} ({made['role']}) created; it is shown once:")
    print(made["key"])


def _list_project_keys(args: argparse.Namespace, client: Client) -> None:
    projects = [args.project] if args.project else [p["name"] for p in client.list_projects()]
    keys = [k for project in projects for k in client.list_project_keys(project)]
    if args.json:
        print_json({"data": keys})
        return
    print_table(keys, PROJECT_KEY_COLUMNS, empty="no project keys")


def _list_admin_keys(args: argparse.Namespace, client: Client) -> None:
    keys = client.list_admin_keys()
    if args.json:
        print_json({"data": keys})
        return
    print_table(keys, ADMIN_KEY_COLUMNS, empty="no admin keys")


def _show(args: argparse.Namespace, client: Client) -> None:
    key = _of_kind(client, args.id, args.kind)
    print_json(key) if args.json else print_record(key, {"state": key_state(key)})


def _revoke(args: argparse.Namespace, client: Client) -> None:
    key = _of_kind(client, args.id, args.kind)
    client.revoke_key(args.id)
    print(f"{_title(key)} revoked")


def _rotate(args: argparse.Namespace, client: Client) -> None:
    key = _of_kind(client, args.id, args.kind)
    made = client.rotate_key(args.id, args.grace_seconds)
    print(f"{_title(key)} rotated: it works for {args.grace_seconds} more seconds; its successor, "
          f"key {made['id']}, is shown once:")
    print(made["key"])


def _of_kind(client: Client, id_: int, kind: str) -> View:
    """Key ``id_``, refused when it is of the other kind: ``key revoke`` never revokes an admin
    key by a slip of the id, nor ``admin revoke`` a project key."""
    key = client.get_key(id_)
    if key["kind"] != kind:
        other = "admin" if key["kind"] == "admin" else "key"
        raise SystemExit(f"arbiter: key {id_} is {'an admin' if key['kind'] == 'admin' else 'a project'} key: "
                         f"use 'arbiter {other} ...' for it")
    return key


def _title(key: View) -> str:
    return f"project key {key['id']} ('{key['project']}')" if key["kind"] == "project" else f"admin key {key['id']}"
