"""What every object command shares: its parser (with ``--json`` on a read and the remote
options), the client it runs with, and the argument types that refuse bad input in one line."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from app.cli.client import Client
from app.cli.connection import add_options, open_client
from app.text import ascii_digits

Run = Callable[[argparse.Namespace, Client], "int | None"]


class Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors in the one-line form of every other ``arbiter`` error."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("arbiter").strip()
        print(f"arbiter: {where + ': ' if where else ''}{message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def command(actions: Any, name: str, help: str, run: Run, *, read: bool = False,
            gateway_url: bool = True) -> argparse.ArgumentParser:
    """An object command: it runs ``run(args, client)`` with the database or the HTTP client.
    ``gateway_url=False``: the command has a ``--url`` of its own (see add_options)."""
    parser: argparse.ArgumentParser = actions.add_parser(name, help=help, description=help)
    if read:
        parser.add_argument("--json", action="store_true", help="print the admin API's JSON for it, as it is")
    add_options(parser, top=False, url=gateway_url)
    parser.set_defaults(run=lambda args: _with_client(args, run))
    return parser


def _with_client(args: argparse.Namespace, run: Run) -> int:
    with open_client(args) as client:
        return int(run(args, client) or 0)


def objects(sub: Any, name: str, help: str) -> Any:
    """The actions of one kind of object (``arbiter project ...``)."""
    return sub.add_parser(name, help=help, description=help).add_subparsers(metavar="ACTION")


def key_id(text: str) -> int:
    """A key's id, as ``arbiter key list`` shows it."""
    if not ascii_digits(text) or not 0 < int(text) < 2**31:
        raise argparse.ArgumentTypeError(f"a key id is a positive whole number (arbiter key list shows them), "
                                         f"not {text[:40]!r}")
    return int(text)


def limit(text: str) -> int | None:
    """A rate limit: a positive whole number, or ``none`` for no limit."""
    if text.lower() == "none":
        return None
    if not ascii_digits(text) or not 1 <= int(text) <= 10**12:
        raise argparse.ArgumentTypeError(f"a limit is a whole number from 1 to 10^12, or 'none', not {text[:40]!r}")
    return int(text)


def expiry(text: str) -> str:
    """An ISO 8601 time (UTC when it has no zone), sent as it is read, in either mode."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an expiry is an ISO 8601 time such as 2030-01-31T12:00:00Z, "
                                         f"not {text[:40]!r}") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)).isoformat()


def allowlist(text: str) -> str | list[str]:
    """``all``, or a comma-separated list of public model names."""
    return "all" if text == "all" else sorted({m.strip() for m in text.split(",") if m.strip()})
