"""The ``arbiter`` command line (docs/cli.md has every command).

    arbiter --version | arbiter completion bash|zsh|fish
    arbiter serve [--host H] [--port P] | arbiter migrate | arbiter secret | arbiter emulate ollama|vllm --port N
    arbiter organization create|list|show|rename
    arbiter project create|list|show|set|archive|unarchive
    arbiter key create|list|show|revoke|rotate            (project keys)
    arbiter admin create-key|list|show|revoke|rotate      (admin keys)
    arbiter service add|list|show|status|refresh|remove
    arbiter model list|show|set
    arbiter alias add|list|show|remove
    arbiter usage rollup [--since DAY]                 (this machine's database only)

The object commands run on the database of ARBITER_DATABASE_URL, or, given a server's address
(``--url`` or ARBITER_URL) and an admin key, on its admin API (app/cli/connection.py): one set of
commands over two clients (app/cli/client.py). Reads take ``--json``. Commands that create a key
print it alone on their last line of output.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import sqlalchemy.exc
from pydantic import ValidationError

from app.cli import aliases, completion, keys, local, models, organizations, projects, services, usage
from app.cli.common import Parser
from app.cli.connection import add_options, given_options
from app.errors import ArbiterError


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    if getattr(args, "local_only", False) and given_options(args):
        print(f"arbiter: {', '.join(given_options(args))}: this command runs here, on this machine's database; "
              "the remote options are for the object commands", file=sys.stderr)
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
    except KeyboardInterrupt:
        print("arbiter: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `arbiter ... | head`: the reader has had enough; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="arbiter", description="A gateway for decision models.",
                    epilog="Object commands work on ARBITER_DATABASE_URL, or on a server's admin API with "
                    "ARBITER_URL and ARBITER_ADMIN_KEY_FILE (or ARBITER_ADMIN_KEY) set: see docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"arbiter {local.version()}")
    add_options(parser, top=True)
    sub = parser.add_subparsers(metavar="COMMAND")
    local.add_parsers(sub)
    keys.add_parsers(sub)
    projects.add_parsers(sub)
    organizations.add_parsers(sub)
    services.add_parsers(sub)
    aliases.add_parsers(sub)
    models.add_parsers(sub)
    usage.add_parsers(sub)
    local.add_emulate_parsers(sub)
    completion.add_parser(sub, parser)
    return parser

