"""The commands that only ever run where the database and the process are: ``serve``,
``migrate``, ``secret`` and ``emulate``. They take no remote options."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from app.settings import Settings


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", help="address to bind (default: ARBITER_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default: ARBITER_PORT or 8080)")
    serve.set_defaults(run=_serve, local_only=True)
    sub.add_parser("migrate", help="apply database migrations").set_defaults(run=_migrate, local_only=True)
    sub.add_parser("secret", help="print a fresh random secret (ARBITER_SECRET_KEY, ARBITER_MESH_KEY, ...)"
                   ).set_defaults(run=_secret, local_only=True)


def _secret(args: argparse.Namespace) -> int:
    """32 random bytes, URL-safe base64 (43 characters): what every strong secret setting takes."""
    import secrets

    print(secrets.token_urlsafe(32))
    return 0


def add_emulate_parsers(sub: Any) -> None:
    emulate = sub.add_parser("emulate", help="run a backend emulator (tests, local trials)")
    kinds = emulate.add_subparsers(metavar="BACKEND")
    for kind, default_version in (("ollama", "0.35.0"), ("vllm", "0.11.0")):
        emu = kinds.add_parser(kind, help=f"emulate {kind}")
        emu.add_argument("--host", default="127.0.0.1")
        emu.add_argument("--port", type=int, required=True)
        emu.add_argument("--version", default=default_version)
        emu.set_defaults(run=_emulate, kind=kind, local_only=True)


def version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("arbiter")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _serve(args: argparse.Namespace) -> int:
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = Settings(**overrides)  # a bad setting is reported before any of the imports below

    from app.db.migrate import NotMigrated
    from app.db.session import Database
    from app.prepare import key_hasher, prepare_database, unreachable_reason
    from app.telemetry.logs import configure as configure_logs

    configure_logs(settings.log_level)
    database = Database(settings.database_url)
    try:
        prepare_database(settings, database, key_hasher(settings))
    except NotMigrated as exc:
        print(f"arbiter: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        why = unreachable_reason(exc, database.url)
        if why is None:
            raise
        # A replica started while the database is away serves /healthz and waits for it (app/components.py).
        logging.getLogger("arbiter").error("the database cannot be reached (%s); starting anyway: not ready "
                                           "until it answers", why)
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
