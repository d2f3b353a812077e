"""``arbiter model list|show|set``: installed models, named by their public name (and their
service's, when several serve one)."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.client import Client, View
from app.cli.common import command, objects
from app.cli.render import print_json, print_record, print_table
from app.errors import InvalidRequest, NotFound


def add_parsers(sub: Any) -> None:
    actions = objects(sub, "model", "installed models")
    listing = command(actions, "list", "every installed model", _list, read=True)
    listing.add_argument("--service", help="one service's models")
    show = command(actions, "show", "one model", _show, read=True)
    show.add_argument("model", help="its public name")
    show.add_argument("--service", help="the service's name, when several serve the model")
    change = command(actions, "set", "how a model answers decisions (PATCH /admin/models/{id})", _set)
    change.add_argument("model", help="its public name")
    change.add_argument("--service", help="the service's name, when several serve the model")
    change.add_argument("--read-strategy", choices=("labels", "embeddings", "none"),
                        help="labels: a generation model's label probabilities; embeddings: an embedding "
                        "model's similarity; none: the backend's own decision endpoint")
    change.add_argument("--temperature", type=float, help="the embeddings strategy's softmax temperature")
    change.add_argument("--timeout", dest="model_timeout", type=float,
                        help="seconds a request to this model may take")
    change.add_argument("--confirm", action="store_true",
                        help="go ahead even if a mesh peer is too old for it as a decision model (remote mode)")


def _list(args: argparse.Namespace, client: Client) -> None:
    models = client.list_service_models(args.service) if args.service else client.list_models()
    if args.json:
        print_json({"data": models})
        return
    print_table(models, [("NAME", lambda m: m["public_name"]), ("SERVICE", lambda m: m["service"]),
                         ("KIND", lambda m: m["kind"]), ("CAPABILITIES", lambda m: m["capabilities"]),
                         ("READ STRATEGY", lambda m: m["read_strategy"]), ("ID", lambda m: m["id"])],
                empty="no models")


def _show(args: argparse.Namespace, client: Client) -> None:
    model = client.get_model(find(client, args.model, args.service)["id"])
    print_json(model) if args.json else print_record(model)


def _set(args: argparse.Namespace, client: Client) -> None:
    changes: dict[str, Any] = {}
    if args.read_strategy is not None:
        changes["read_strategy"] = None if args.read_strategy == "none" else args.read_strategy
    if args.temperature is not None:
        changes["embedding_temperature"] = args.temperature
    if args.model_timeout is not None:
        changes["timeout"] = args.model_timeout
    if not changes:
        raise SystemExit("arbiter: nothing to set: give --read-strategy, --temperature or --timeout")
    found = find(client, args.model, args.service)
    model = client.update_model(found["id"], changes, args.confirm)
    print(f"model '{model['public_name']}' on '{model['service']}' updated: " + ", ".join(
        f"{k}={v}" for k, v in changes.items()) + " (running servers pick it up at their next registry refresh)")


def find(client: Client, name: str, service: str | None) -> View:
    """The one installed model of public name ``name`` (on ``service``, when given)."""
    rows = [m for m in client.list_models() if m["public_name"] == name and service in (None, m["service"])]
    if not rows:
        where = f" on service '{service}'" if service else ""
        raise NotFound(f"no model '{name}'{where} is installed")
    if len(rows) > 1:
        raise InvalidRequest(f"model '{name}' is on several services "
                             f"({', '.join(m['service'] for m in rows)}): name one with --service")
    return rows[0]
