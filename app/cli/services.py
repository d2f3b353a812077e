"""``arbiter service add|list|show|status|refresh|remove``: backends and what the gateway last
saw of them (its sync, every ARBITER_SYNC_INTERVAL, or a refresh)."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.client import Client, View
from app.cli.common import command, objects
from app.cli.render import print_json, print_record, print_table, when

SERVICE_TYPES = ["ollama", "ollama-external", "ollama-cloud", "vllm", "openai", "local"]


def add_parsers(sub: Any) -> None:
    actions = objects(sub, "service", "services (backends)")
    add = command(actions, "add", "register a backend and its models (remote mode: the gateway's address "
                  "before the command, arbiter --url URL service add ..., or in ARBITER_URL)", _add,
                  gateway_url=False)
    add.add_argument("--type", required=True, choices=SERVICE_TYPES)
    add.add_argument("--url", dest="service_url", default=None,
                     help="the backend's URL (ollama-cloud: https://ollama.com)")
    add.add_argument("--name", default=None)
    add.add_argument("--api-key", default=None, help="the backend's bearer key, if it needs one")
    add.add_argument("--context-length", type=int, default=None,
                     help="type ollama: the context length of every model on it")
    add.add_argument("--confirm", action="store_true",
                     help="add it even if a mesh peer is too old for its decision models (remote mode)")
    command(actions, "list", "every service", _list, read=True)
    command(actions, "show", "one service", _show, read=True).add_argument("name")
    command(actions, "status", "each service's reachability, version, last sync and models", _status, read=True)
    command(actions, "refresh", "read a service's version and models again now", _refresh).add_argument("name")
    command(actions, "remove", "remove a service and its models", _remove).add_argument("name")


def _add(args: argparse.Namespace, client: Client) -> None:
    service = client.add_service({"type": args.type, "url": args.service_url, "name": args.name,
                                  "api_key": args.api_key, "context_length": args.context_length}, args.confirm)
    print(f"service '{service['name']}' added ({service['type']}, version {service['version']})")
    for model in service["models"]:
        print(f"  model {model['public_name']} ({', '.join(model['capabilities'])})")
    for skipped in service["skipped_models"]:
        print(f"  skipped {skipped['model']}: {skipped['reason']}")


def _list(args: argparse.Namespace, client: Client) -> None:
    services = client.list_services()
    if args.json:
        print_json({"data": services})
        return
    print_table(services, [("NAME", lambda s: s["name"]), ("TYPE", lambda s: s["type"]), ("URL", lambda s: s["url"]),
                           ("REACHABLE", lambda s: s["reachable"]), ("VERSION", lambda s: s["version"]),
                           ("DECISIONS", lambda s: s["decisions_supported"]),
                           ("LAST SYNC", lambda s: when(s["last_sync_at"]))], empty="no services")


def _show(args: argparse.Namespace, client: Client) -> None:
    service = client.get_service(args.name)
    print_json(service) if args.json else print_record(service)


def _status(args: argparse.Namespace, client: Client) -> None:
    """GET /admin/services, each with its models as GET /admin/services/{name}/models has them."""
    services = client.list_services()
    models: dict[str, list[View]] = {}
    for model in client.list_models():
        models.setdefault(model["service"], []).append(model)
    status = [{**s, "models": models.get(s["name"], [])} for s in services]
    if args.json:
        print_json({"data": status})
        return
    print_table(status, [("SERVICE", lambda s: s["name"]), ("REACHABLE", lambda s: s["reachable"]),
                         ("VERSION", lambda s: s["version"]), ("DECISIONS", _decisions),
                         ("MODELS", lambda s: [m["public_name"] for m in s["models"]]),
                         ("LAST SYNC", lambda s: when(s["last_sync_at"])),
                         ("LAST ERROR", lambda s: s["last_error"])], empty="no services")


def _decisions(service: View) -> str:
    if service["decisions_supported"]:
        return "yes"
    return f"no: {service['decisions_message']}" if service.get("decisions_message") else "no"


def _refresh(args: argparse.Namespace, client: Client) -> None:
    service = client.refresh_service(args.name)
    state = "reachable" if service["reachable"] else f"unreachable: {service['last_error'] or 'no reason given'}"
    print(f"service '{service['name']}' refreshed (version {service['version']}, {state})")


def _remove(args: argparse.Namespace, client: Client) -> None:
    client.remove_service(args.name)
    print(f"service '{args.name}' removed, and its models")
