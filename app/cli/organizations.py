"""``arbiter organization create|list|show|rename``."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.client import Client
from app.cli.common import command, objects
from app.cli.projects import PROJECT_COLUMNS
from app.cli.render import print_json, print_record, print_table, when


def add_parsers(sub: Any) -> None:
    actions = objects(sub, "organization", "organizations (each holds projects)")
    command(actions, "create", "create an organization", _create).add_argument("name")
    command(actions, "list", "every organization and its projects", _list, read=True)
    command(actions, "show", "one organization and its projects", _show, read=True).add_argument("name")
    rename = command(actions, "rename", "give an organization a new name (its projects follow it)", _rename)
    rename.add_argument("name", help="its name now")
    rename.add_argument("new_name", metavar="NEW_NAME", help="the name it gets")


def _create(args: argparse.Namespace, client: Client) -> None:
    client.create_organization(args.name)
    print(f"organization '{args.name}' created")


def _list(args: argparse.Namespace, client: Client) -> None:
    organizations = client.list_organizations()
    if args.json:
        print_json({"data": organizations})
        return
    print_table(organizations, [("NAME", lambda o: o["name"]), ("PROJECTS", lambda o: o["projects"]),
                                ("CREATED", lambda o: when(o["created_at"]))], empty="no organizations")


def _show(args: argparse.Namespace, client: Client) -> None:
    organization = client.get_organization(args.name)
    if args.json:
        print_json(organization)
        return
    print_record({k: v for k, v in organization.items() if k != "projects"})
    print()
    print_table(organization["projects"], PROJECT_COLUMNS, empty="no projects")


def _rename(args: argparse.Namespace, client: Client) -> None:
    client.rename_organization(args.name, args.new_name)
    print(f"organization '{args.name}' renamed to '{args.new_name}'")
