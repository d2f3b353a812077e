"""``arbiter alias add|list|show|remove``: a second public name for a model (SPEC §1)."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.client import Client
from app.cli.common import command, objects
from app.cli.render import print_json, print_record
from app.errors import NotFound


def add_parsers(sub: Any) -> None:
    actions = objects(sub, "alias", "model aliases (a second public name)")
    add = command(actions, "add", "give a model a second public name", _add)
    add.add_argument("alias", help="the new name, e.g. jev-latest")
    add.add_argument("--model", required=True, help="the public name of an installed model")
    command(actions, "list", "every alias, its model and its status", _list, read=True)
    command(actions, "show", "one alias", _show, read=True).add_argument("alias")
    command(actions, "remove", "remove an alias", _remove).add_argument("alias")


def _add(args: argparse.Namespace, client: Client) -> None:
    client.create_alias(args.alias, args.model)
    print(f"alias '{args.alias}' added for model '{args.model}' "
          "(running servers pick it up at their next registry refresh)")


def _list(args: argparse.Namespace, client: Client) -> None:
    """One line an alias (``ALIAS -> MODEL (STATUS)``, as this command always printed them)."""
    views = client.list_aliases()
    if args.json:
        print_json({"data": views})
        return
    for view in views:
        print(f"{view['alias']} -> {view['model']} ({view['status']})")
    if not views:
        print("no aliases")


def _show(args: argparse.Namespace, client: Client) -> None:
    """An entry of GET /admin/aliases (the API has no route for one alias)."""
    found = [a for a in client.list_aliases() if a["alias"] == args.alias]
    if not found:
        raise NotFound(f"alias '{args.alias}' does not exist")
    print_json(found[0]) if args.json else print_record(found[0])


def _remove(args: argparse.Namespace, client: Client) -> None:
    client.remove_alias(args.alias)
    print(f"alias '{args.alias}' removed")
