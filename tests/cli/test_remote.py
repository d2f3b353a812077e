"""The remote mode's failures, each one line with a non-zero exit and never a key: a wrong key,
a role that may not, a server that is down, silent or not Arbiter, TLS, and where the key comes
from. And the database mode's changes reaching a running server through Redis."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from redis import Redis

from app.db.session import Database
from tests.cli.conftest import Run
from tests.support import Gateway, Stack, body, closed_port, decision, redis_url, synced, wait_for

ARBITER = str(Path(sys.executable).with_name("arbiter"))


def test_a_wrong_admin_key_is_explained(cli: Run, stack: Stack) -> None:
    for key in ("arb_admin_" + "x" * 40, stack.project_key):
        result = cli("remote", "project", "list", env={"ARBITER_ADMIN_KEY_FILE": "", "ARBITER_ADMIN_KEY": key})
        line = result.error_line("the server refused the admin key", "ARBITER_ADMIN_KEY")
        assert key not in line and result.code == 1


def test_a_role_that_may_not_is_explained(cli: Run, stack: Stack, tmp_path: Path) -> None:
    with stack.client("admin") as owner:
        viewer = body(owner.post("/admin/admin-keys", json={"role": "viewer"}), 201)["key"]
    (tmp_path / "viewer").write_text(viewer)
    (tmp_path / "viewer").chmod(0o600)
    env = {"ARBITER_ADMIN_KEY_FILE": str(tmp_path / "viewer")}
    assert cli("remote", "project", "list", env=env).code == 0  # a viewer reads
    cli("remote", "project", "create", "nope", env=env).error_line("not allowed", "'viewer'", "ask an owner")
    cli("remote", "key", "revoke", "1", env=env).error_line("not allowed")


def test_a_server_that_is_down_is_one_line(cli: Run) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    cli("remote", "project", "list", env={"ARBITER_URL": url}).error_line(f"cannot reach {url}", "ARBITER_URL")


def test_a_server_that_does_not_answer_times_out(cli: Run) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = cli("remote", "service", "status", "--request-timeout", "0.3", env={"ARBITER_URL": url})
    result.error_line(f"{url} did not answer within 0.3 s", "--request-timeout")


def test_a_server_that_is_not_arbiter_is_named(cli: Run, stack: Stack) -> None:
    result = cli("remote", "project", "list", env={"ARBITER_URL": stack.ollama.url})
    result.error_line("404", "without Arbiter's error JSON", "ARBITER_URL")


@pytest.mark.parametrize(("env", "args", "words"), [
    ({"ARBITER_ADMIN_KEY_FILE": "/nonexistent/key"}, (), ("cannot read the admin key file", "No such file")),
    ({"ARBITER_ADMIN_KEY_FILE": ""}, (), ("no admin key", "ARBITER_ADMIN_KEY_FILE")),
    ({"ARBITER_ADMIN_KEY_FILE": "", "ARBITER_ADMIN_KEY": "two words"}, (), ("ARBITER_ADMIN_KEY", "spaces")),
    ({}, ("--admin-key-file", "/nonexistent/key"), ("--admin-key-file",)),
    ({"ARBITER_URL": "ftp://127.0.0.1"}, (), ("http(s)://host",)),
    ({"ARBITER_URL": "http://user:sekrit@127.0.0.1"}, (), ("no user, password",)),
    ({}, ("--request-timeout", "0"), ("--request-timeout", "between 0 and 3600")),
])
def test_a_bad_remote_setting_is_one_line(cli: Run, env: dict[str, str], args: tuple[str, ...],
                                          words: tuple[str, ...]) -> None:
    line = cli("remote", "project", "list", *args, env=env).error_line(*words)
    assert "sekrit" not in line


def test_an_empty_key_file_is_refused(cli: Run, tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    cli("remote", "project", "list", env={"ARBITER_ADMIN_KEY_FILE": str(tmp_path / "empty")}).error_line("empty")


def test_the_key_and_url_from_flags(cli: Run, stack: Stack, key_file: Path) -> None:
    flags = ("--url", stack.gateway.url, "--admin-key-file", str(key_file))
    assert "acme" in cli("local", "project", "list", *flags).out  # flags alone make it remote
    assert "acme" in cli("local", *flags, "project", "list").out  # before the command too
    by_value = cli("local", "project", "list", "--url", stack.gateway.url, "--admin-key", stack.admin_key)
    assert by_value.code == 0 and "acme" in by_value.out
    with stack.client("admin") as admin:  # the remote calls were the admin key's, not the database's
        assert body(admin.get("/admin/audit"), 200)["data"][0]["action"] != "project.create"
    cli("local", "project", "list", "--admin-key-file", str(key_file)).error_line("give --url")
    cli("local", "project", "list", "--insecure").error_line("--insecure", "give --url")


def test_local_only_commands_refuse_the_remote_options(cli: Run) -> None:
    result = cli("local", "--url", "http://127.0.0.1:1", "migrate")
    assert result.code == 2 and "runs here" in result.err


def test_bad_input_is_a_clear_error_in_both_modes(cli: Run, mode: str) -> None:
    cli(mode, "project", "show", "nosuch").error_line("'nosuch'", "does not exist")
    cli(mode, "organization", "rename", "default", "").error_line("name")
    cli(mode, "organization", "rename", "nosuch", "x").error_line("'nosuch'")
    assert cli(mode, "organization", "create", "taken").code == 0
    cli(mode, "organization", "rename", "default", "taken").error_line("'taken' already exists")
    cli(mode, "key", "create", "--project", "nosuch").error_line("'nosuch'")
    cli(mode, "model", "show", "ghost").error_line("no model 'ghost'")
    cli(mode, "alias", "show", "ghost").error_line("alias 'ghost' does not exist")
    cli(mode, "service", "remove", "ghost").error_line("service 'ghost' does not exist")
    cli(mode, "key", "rotate", "999999").error_line("999999")
    cli(mode, "project", "set", "acme").error_line("nothing to set")
    for args in (("key", "show", "abc"), ("project", "set", "acme", "--requests-per-minute", "0"),
                 ("key", "create", "--project", "acme", "--expires-at", "soon"), ("completion", "tcsh"),
                 ("admin", "create-key", "--role", "root")):
        result = cli(mode, *args)
        assert result.code == 2 and result.error_line("see arbiter")  # argparse's refusal, in one line


def test_the_real_command_against_a_server_that_is_down(tmp_path: Path) -> None:
    """As a user runs it: the installed ``arbiter``, a one-line error, exit 1, no traceback."""
    (tmp_path / "key").write_text("arb_admin_" + "k" * 40)
    (tmp_path / "key").chmod(0o600)
    env = {"PATH": "/usr/bin:/bin", "ARBITER_URL": f"http://127.0.0.1:{closed_port()}",
           "ARBITER_ADMIN_KEY_FILE": str(tmp_path / "key")}
    result = subprocess.run([ARBITER, "service", "status"], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("arbiter: cannot reach") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr and "kkkk" not in result.stderr


def test_a_key_file_others_can_read_is_warned_of_once(cli: Run, key_file: Path) -> None:
    key_file.chmod(0o644)
    result = cli("remote", "project", "list")
    assert result.code == 0 and "acme" in result.out
    [warning] = result.err.strip().splitlines()
    assert warning.startswith("arbiter: warning: ") and "other users" in warning and "chmod 600" in warning
    assert "0644" in warning and "arb_" not in result.err
    key_file.chmod(0o600)
    assert cli("remote", "project", "list").err == ""  # loopback http, a private key file: nothing to say


@pytest.mark.parametrize("url", ["http://192.0.2.1:9", "http://arbiter.example.invalid:9"])
def test_plain_http_to_another_host_is_warned_of(cli: Run, url: str) -> None:
    result = cli("remote", "project", "list", "--request-timeout", "0.5", env={"ARBITER_URL": url})
    lines = result.err.strip().splitlines()
    assert lines[0].startswith("arbiter: warning: ") and "plain http" in lines[0] and "https://" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("arbiter: ") and "warning" not in lines[1]  # then the failure


def test_which_addresses_are_warned_of() -> None:
    from app.cli.connection import remote_warnings

    for quiet in ("http://127.0.0.1:8080", "http://127.3.4.5", "http://[::1]:8080", "http://localhost:8080",
                  "http://LOCALHOST", "https://arbiter.example.com", "https://10.0.0.5:8443"):
        assert remote_warnings(quiet, None) == [], quiet
    for loud in ("http://10.0.0.5:8080", "http://arbiter.example.com", "http://[2001:db8::1]",
                 "http://localhost.example.com", "http://0.0.0.0:8080"):
        assert len(remote_warnings(loud, None)) == 1, loud


# -- TLS ----------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server with a self-signed certificate for 127.0.0.1, answering an empty project
    list as the admin API would; its URL and the certificate (a CA bundle of one)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "arbiter-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name for it
            payload = json.dumps({"data": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert_path
    finally:
        server.shutdown()
        server.server_close()


def test_tls_is_verified_unless_told_otherwise(cli: Run, tls_server: tuple[str, Path]) -> None:
    url, cert = tls_server
    env = {"ARBITER_URL": url}
    cli("remote", "project", "list", env=env).error_line("cannot verify the TLS certificate", "--ca-file",
                                                         "--insecure")
    assert cli("remote", "project", "list", "--ca-file", str(cert), env=env).out == "no projects\n"
    assert cli("remote", "project", "list", "--insecure", env=env).out == "no projects\n"
    cli("remote", "project", "list", "--ca-file", "/nonexistent.pem", env=env).error_line("cannot load the CA bundle")


# -- the database mode and running servers --------------------------------------------------------


def test_local_changes_reach_a_running_server_through_redis(
        cli: Run, db: Database, stack: Stack, gateway_factory: Callable[..., Gateway]) -> None:
    """With ARBITER_REDIS_URL, a revocation on the database is applied by a running server at once,
    not at its key cache's expiry (an hour here)."""
    redis = redis_url(0)
    gateway = synced(gateway_factory(redis_url=redis, key_cache_ttl=3600))
    with gateway.client(stack.project_key) as tenant:
        assert tenant.post("/v1/systemone", json=decision()).status_code == 200  # cached now
        channel = gateway.app.components.bus.channel
        with Redis.from_url(redis) as server:  # the gateway listens: a message now is not lost
            wait_for(lambda: dict(server.pubsub_numsub(channel)).get(channel.encode(), 0) >= 1)
        key_id = body(gateway.client(stack.admin_key).get("/admin/projects/acme/keys"), 200)["data"][0]["id"]
        revoked = cli("local", "key", "revoke", str(key_id), env={"ARBITER_REDIS_URL": redis})
        assert revoked.code == 0 and revoked.err == "", revoked
        wait_for(lambda: tenant.post("/v1/systemone", json=decision()).status_code == 401)
