"""Which client a command gets: with a server's address (``--url`` or ARBITER_URL) and an admin
key (``--admin-key-file``, ARBITER_ADMIN_KEY_FILE, ``--admin-key`` or ARBITER_ADMIN_KEY) it talks
to that server's admin API; without an address, to the database of ARBITER_DATABASE_URL."""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import shlex
import ssl
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.cli.client import Client

DEFAULT_TIMEOUT = 30.0
OPTIONS = ("gateway_url", "admin_key_file", "admin_key", "ca_file", "insecure", "request_timeout")
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")  # what an Authorization header can carry as it is


def add_options(parser: argparse.ArgumentParser, *, top: bool, url: bool = True) -> None:
    """The remote options, on the top parser (``arbiter --url U project list``) and on each object
    command (``arbiter project list --url U``). There they default to SUPPRESS, so an option given
    before the command is not reset by the command's parser. ``url=False``: a command whose own
    ``--url`` is something else (``service add``'s backend); the gateway's goes before it."""
    default: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    group = parser.add_argument_group("remote mode (the admin API instead of the database)")
    if url:
        group.add_argument("--url", dest="gateway_url", metavar="URL",
                           help="the gateway's address, e.g. https://arbiter.example.com "
                           "(default: ARBITER_URL; none: work on the database)", **default)
    group.add_argument("--admin-key-file", metavar="FILE", help="a file holding the admin key (default: "
                       "ARBITER_ADMIN_KEY_FILE); keeps the key out of shell history", **default)
    group.add_argument("--admin-key", metavar="KEY", help="the admin key itself (default: ARBITER_ADMIN_KEY; "
                       "prefer --admin-key-file: other users can see a process's arguments)", **default)
    group.add_argument("--ca-file", metavar="FILE", help="trust the server's certificate from this CA bundle "
                       "(default: the system's, or SSL_CERT_FILE)", **default)
    group.add_argument("--insecure", action="store_true", help="do not verify the server's TLS certificate "
                       "(a test cluster's self-signed one; never across a network you do not trust)",
                       **({"default": False} if top else default))
    group.add_argument("--request-timeout", type=float, metavar="SECONDS",
                       help="how long a call to the server may take "
                       f"(default: {DEFAULT_TIMEOUT:g})", **default)


@contextlib.contextmanager
def open_client(args: argparse.Namespace) -> Iterator[Client]:
    """The HTTP client when a URL is given, else the database client; closed at the end."""
    url = _given(args, "gateway_url", "ARBITER_URL")
    if url is None:
        stray = given_options(args)
        if stray:
            raise SystemExit(f"arbiter: {', '.join(stray)} is for talking to a server: give --url (or set "
                             "ARBITER_URL) too, or leave it out to work on the database")
        from app.cli.db_client import DatabaseClient

        local = DatabaseClient()
        try:
            yield local
        finally:
            local.close()
        return
    from app.cli.http_client import HttpClient
    from app.version import VERSION

    checked, key = _checked_url(url), _admin_key(args)
    for warning in remote_warnings(checked, _key_file(args)):
        print(f"arbiter: warning: {warning}", file=sys.stderr)
    remote = HttpClient(checked, key, verify=_verify(args), timeout=_timeout(args),
                        user_agent=f"arbiter-cli/{VERSION}")
    try:
        yield remote
    finally:
        remote.close()


def remote_warnings(url: str, key_file: str | None) -> list[str]:
    """What is risky about this remote call, said once per command on stderr (and never the key):
    an admin key file others on the machine can read, and a plain-HTTP address off this machine,
    where the key would cross the network in the clear."""
    warnings = []
    if key_file is not None:
        try:
            mode = Path(key_file).expanduser().stat().st_mode
        except OSError:
            mode = 0
        if mode & 0o044:
            warnings.append(f"the admin key file {key_file!r} can be read by other users (mode "
                            f"{stat.S_IMODE(mode):04o}); make it yours alone: chmod 600 {shlex.quote(key_file)}")
    parts = urlsplit(url)
    if parts.scheme == "http" and not _loopback(parts.hostname or ""):
        warnings.append(f"{parts.hostname} is reached over plain http: the admin key and every answer cross "
                        "the network unencrypted; use https:// (a TLS-terminating proxy in front of Arbiter)")
    return warnings


def _loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _key_file(args: argparse.Namespace) -> str | None:
    """The admin key file the key is read from, when it comes from one (``_admin_key``'s order)."""
    if getattr(args, "admin_key_file", None) is not None:
        return str(args.admin_key_file)
    if getattr(args, "admin_key", None) is not None:
        return None
    return os.environ.get("ARBITER_ADMIN_KEY_FILE") or None


def given_options(args: argparse.Namespace) -> list[str]:
    """The remote options given on the command line, as typed."""
    return [f"--{name.replace('_', '-')}".replace("gateway-", "") for name in OPTIONS
            if getattr(args, name, None) not in (None, False)]


def _given(args: argparse.Namespace, name: str, variable: str) -> str | None:
    value = getattr(args, name, None)
    if value is None:
        value = os.environ.get(variable) or None
    return value


def _checked_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SystemExit(f"arbiter: the server's URL must be http(s)://host[:port], not {url[:100]!r} "
                         "(--url or ARBITER_URL)")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise SystemExit("arbiter: the server's URL takes no user, password, query or fragment: the admin key "
                         "goes in --admin-key-file or ARBITER_ADMIN_KEY (--url or ARBITER_URL)")
    return url.strip().rstrip("/")


def _admin_key(args: argparse.Namespace) -> str:
    """The key from the first place that has one: a flag (file, then value), then the environment."""
    sources = (("admin_key_file", "--admin-key-file", True), ("admin_key", "--admin-key", False),
               ("ARBITER_ADMIN_KEY_FILE", "ARBITER_ADMIN_KEY_FILE", True),
               ("ARBITER_ADMIN_KEY", "ARBITER_ADMIN_KEY", False))
    for name, where, from_file in sources:
        value = getattr(args, name, None) if name.islower() else (os.environ.get(name) or None)
        if value is None:
            continue
        key = _read_key_file(value, where) if from_file else value.strip()
        if not _HEADER_SAFE.fullmatch(key):
            raise SystemExit(f"arbiter: the admin key from {where} is empty or holds spaces or characters an HTTP "
                             "header cannot carry: give the key alone")
        return key
    raise SystemExit("arbiter: a server's URL is given but no admin key: set ARBITER_ADMIN_KEY_FILE (or "
                     "ARBITER_ADMIN_KEY), or give --admin-key-file FILE")


def _read_key_file(path: str, where: str) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise SystemExit(f"arbiter: cannot read the admin key file {path!r} ({where}): {reason}") from exc


def _verify(args: argparse.Namespace) -> ssl.SSLContext | bool:
    if getattr(args, "insecure", False):
        return False
    ca_file = getattr(args, "ca_file", None)
    if ca_file is None:
        from infra_adapters.admin import admin_tls

        return admin_tls()  # the system's (certifi's) bundle, or SSL_CERT_FILE / SSL_CERT_DIR
    try:
        return ssl.create_default_context(cafile=os.path.expanduser(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"arbiter: cannot load the CA bundle {ca_file!r} (--ca-file): "
                         f"{getattr(exc, 'strerror', None) or exc}") from exc


def _timeout(args: argparse.Namespace) -> float:
    timeout = getattr(args, "request_timeout", None)
    if timeout is None:
        return DEFAULT_TIMEOUT
    if not 0 < timeout <= 3600:
        raise SystemExit("arbiter: --request-timeout must be between 0 and 3600 seconds")
    return float(timeout)
