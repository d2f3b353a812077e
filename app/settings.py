"""The one settings object. Read once, passed into ``create_app(settings)``.

Every field is documented in docs/configuration.md; a test fails when one is not.
"""

from __future__ import annotations

import math
import re
import string
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from zxcvbn import zxcvbn

MiB = 1024 * 1024
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PLACEHOLDER = re.compile(r"change[-_ ]?me", re.IGNORECASE)
# Secrets that guard something on their own (SPEC §3, §5, §6): at least 32 characters, at least 8
# of them different, not a shorter piece repeated, and at least SECRET_MIN_BITS of estimated
# randomness (``secret_bits``). A hex or base64 token of 16+ random bytes passes (a hex one of 16
# bytes has fewer than 8 different digits about once in 10^8 draws; its estimate falls under the
# bits only with three or more repeats of 5+ characters in 32 random digits, far rarer still).
STRONG_SECRETS = ("secret_key", "key_pepper", "metrics_token", "mesh_key")
SECRET_MIN_CHARS = 32
SECRET_MIN_DISTINCT = 8
SECRET_MIN_BITS = 96
# zxcvbn's estimate of the guesses, in bits: under it a secret is words, names or dates. Lower than
# SECRET_MIN_BITS: zxcvbn prices a random token of 16 bytes as hex at 95-110 bits, not 128.
SECRET_MIN_GUESS_BITS = 80
ZXCVBN_MAX_CHARS = 64  # its time grows with the length; 64 characters of any token are plenty
SECRET_GENERATOR = "arbiter secret"  # prints a fresh one (app/cli/local.py)
_REPEAT_MIN = 5  # a piece seen before counts as a repeat from this length on
_RUN_MIN = 3  # characters continuing a run (abc, 987, aaa, qwe) count as one from this many on
_KEYBOARD = {c: (row, col) for row, keys in enumerate(("`1234567890-=", "qwertyuiop[]\\", "asdfghjkl;'", "zxcvbnm,./"))
             for col, c in enumerate(keys)}


class Settings(BaseSettings):
    # hide_input_in_errors: a refused secret (or a database URL with its password) is never echoed.
    model_config = SettingsConfigDict(env_prefix="ARBITER_", extra="ignore", populate_by_name=True,
                                      hide_input_in_errors=True)

    # Where state lives.
    database_url: str = Field(
        "sqlite:///./arbiter.db",
        description="sqlite:///path or postgresql://user@host/db; Arbiter picks the driver.",
    )
    auto_migrate: bool = Field(False, description="Apply migrations at start-up.")

    # Serving.
    host: str = Field("127.0.0.1", description="Address `arbiter serve` binds to.")
    port: int = Field(8080, ge=1, le=65535, description="Port `arbiter serve` binds to.")
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        # uvicorn's own variable is read too, as it would be without this setting.
        validation_alias=AliasChoices("ARBITER_FORWARDED_ALLOW_IPS", "FORWARDED_ALLOW_IPS"),
        description="Proxies whose X-Forwarded-Proto/-For are believed (comma-separated addresses "
                    "or networks, * for any).",
    )

    # Load.
    max_concurrency: int = Field(
        0, ge=0, description="Most model requests served at once; past it 503 with Retry-After (0: no cap)."
    )

    # Limits (SPEC §1).
    max_body_bytes: int = Field(32 * MiB, description="Largest request body, after decoding.")
    max_response_bytes: int = Field(16 * MiB, description="Largest backend answer accepted.")
    decode_budget_bytes: int = Field(
        128 * MiB, description="Most memory that request bodies may grow to at once while decoded "
                               "(decompressed, images made base64); past it 503 with Retry-After.")
    default_text_limit: int = Field(
        64 * 1024, description="Text limit of a new service (its own setting overrides)."
    )
    allow_remote_media_urls: bool = Field(
        False, description="Let http(s):// media URLs through to backends (SSRF risk)."
    )

    # Keys.
    key_pepper: SecretStr | None = Field(
        None, description="Server pepper: key digests become HMAC-SHA-256 with it."
    )
    bootstrap_admin_key: SecretStr | None = Field(
        None, description="An admin key to register at start-up when no admin key exists."
    )
    secret_key: SecretStr | None = Field(
        None, description="Encrypts service credentials at rest; needed to store a service's API key."
    )
    redis_url: SecretStr | None = Field(
        None, description="Redis for rate limits shared by every replica, change notifications and mesh nonces."
    )
    rate_limit_fail_open: bool = Field(
        False, description="Let requests through when Redis is unreachable (ARBITER_RATE_LIMIT_FALLBACK=open)."
    )
    rate_limit_fallback: Literal["share", "open", "closed"] = Field(
        "share", description="Rate limits while Redis is unreachable: each replica counts limit / replicas "
        "(share), lets requests through (open) or refuses them with 503 (closed)."
    )
    key_cache_ttl: float = Field(10.0, ge=0, description="Seconds a resolved key stays cached.")
    key_stale_seconds: float = Field(
        900.0, ge=0, description="While the database cannot be reached, a key it found valid within this many "
        "seconds keeps working (0: none does)."
    )

    client_timeout: float = Field(
        60.0, gt=0, description="Seconds a client may take to send one request, from its first byte to its "
        "last (head and body); past it the answer is 408 and the connection closes."
    )
    keep_alive_timeout: float = Field(
        5.0, gt=0, description="Seconds an idle keep-alive connection is kept open after an answer."
    )
    max_connections: int | None = Field(
        None, ge=1, description="Most client connections open at once; past it 503 with Retry-After "
        "(default: what fits under the open-file limit)."
    )

    # Backends.
    backend_connect_timeout: float = Field(5.0, gt=0, description="Seconds to connect to a backend.")
    backend_timeout: float = Field(
        120.0, gt=0, description="Seconds a backend may take to answer (a model's own timeout wins)."
    )
    backend_admin_timeout: float = Field(
        10.0, gt=0, description="Seconds for each admin call to a backend (version, model lists), in all."
    )
    backend_pool_size: int = Field(256, ge=1, description="Connections per backend pool.")
    replica_backoff: float = Field(
        10.0, ge=0, description="Seconds a replica is left out after a connection error, timeout or 5xx."
    )
    sync_interval: float = Field(
        60.0, gt=0, description="Seconds between scheduled syncs of every service (version and models)."
    )
    registry_refresh_interval: float = Field(
        5.0, gt=0, description="Seconds between reloads of services and models from the database."
    )
    install_lease: float = Field(
        30.0, gt=0, description="Seconds a running install may go unrefreshed before it counts as dead."
    )
    # Label reading (docs/labels.md): under it, a question's diagnostics warn low_label_mass.
    label_mass_warning: float = Field(
        0.25, ge=0, le=1, description="The label_mass under which a label-read answer carries a "
        "low_label_mass warning (0: never)."
    )

    label_calibration: Literal["local", "all", "off"] = Field(
        "local", description="Which label-read models divide a content-free baseline out of their "
        "answers (docs/labels.md): the in-process models (local), every one (all) or none (off)."
    )

    # The mesh (SPEC §5): off unless a mesh key is set.
    mesh_key: SecretStr | None = Field(
        None, description="The shared secret of the mesh; every node of a mesh holds the same one."
    )
    mesh_peers: str = Field("", description="Comma-separated base URLs of peers this node connects to.")
    mesh_node_name: str | None = Field(None, description="This node's name in the mesh (default: host:port).")
    mesh_url: str | None = Field(
        None, description="The base URL peers reach this node at (default: from host and port)."
    )
    mesh_interval: float = Field(1.0, gt=0, description="Seconds between model-list exchanges with each peer.")
    mesh_max_backoff: float = Field(8.0, gt=0, description="Longest wait between reconnects to a peer that is down.")
    mesh_max_hops: int = Field(4, ge=1, le=32, description="Most mesh hops a request may take.")

    # The admin web UI (/ui).
    ui_session_minutes: int = Field(
        480, ge=1, le=7 * 24 * 60, description="Minutes a web UI sign-in lasts before it must be repeated."
    )
    ui_session_idle_minutes: int = Field(
        30, ge=1, le=7 * 24 * 60, description="Minutes a web UI session may go unused before it ends."
    )

    # Failed credentials: after this many from one client address within the window, that address
    # gets 429 for the rest of the window (web UI sign-ins and admin keys; 0 turns it off).
    auth_failure_limit: int = Field(
        10, ge=0, description="Failed sign-ins or admin keys one client address may make per window."
    )
    auth_failure_window: float = Field(
        300.0, gt=0, description="Seconds of the failed-credential window (ARBITER_AUTH_FAILURE_LIMIT)."
    )

    # Background writes.
    flush_interval: float = Field(1.0, gt=0, description="Seconds between batched writes.")
    usage_spool_dir: str | None = Field(
        None, description="The usage spool: set, every usage record is journaled there as it comes (fsynced "
        "every ARBITER_USAGE_FSYNC_INTERVAL); unset, only what a shutdown could not write goes there, in the "
        "SQLite database's directory or the working directory.")
    usage_fsync_interval: float = Field(
        0.1, gt=0, le=10, description="Seconds between two writes and fsyncs of the usage journal: what a "
        "killed process may lose (with ARBITER_USAGE_SPOOL_DIR).")
    usage_durable: Literal["interval", "always"] = Field(
        "interval", description="'always': a decision's usage record is fsynced to the journal before its "
        "answer is sent (needs ARBITER_USAGE_SPOOL_DIR); 'interval': every ARBITER_USAGE_FSYNC_INTERVAL.")

    # Usage maintenance (app/telemetry/retention.py): on one replica at a time.
    usage_maintenance_interval: float = Field(
        3600.0, gt=0, description="Seconds between two runs of the usage maintenance (day partitions, the "
        "previous release's rows, retention); the first run comes soon after start.")
    usage_retention_days: int = Field(
        90, ge=0, description="Days usage records are kept (whole UTC days on PostgreSQL: a day's partition "
        "goes once all of it is older); 0 keeps them forever.")
    rollup_retention_days: int = Field(
        730, ge=0, description="Days the usage rollups (every report's totals: by the hour, then by the day) "
        "are kept; 0 keeps them forever.")

    # Usage reports (every usage page, API and CSV): a pool of their own, never the hot path's.
    report_pool_size: int = Field(
        2, ge=1, le=64, description="Database connections (and threads) usage reports run on, apart from "
        "the ones key lookups and the usage writer use.")
    report_timeout_seconds: float = Field(
        10.0, gt=0, le=3600, description="Seconds a usage report's query may run before it is stopped (504).")
    usage_reads_per_minute: int = Field(
        30, ge=0, description="Usage reads (pages, API calls, CSV downloads) one key may make a minute, per "
        "replica (429 with Retry-After past it; 0: no limit).")

    # Observability.
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
    log_payloads: bool = Field(False, description="Put request states in the logs (personal data!).")
    metrics_token: SecretStr | None = Field(None, description="Bearer token that opens /metrics.")
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Serve /metrics on this port instead, unauthenticated."
    )
    metrics_host: str = Field("127.0.0.1", description="Address of the separate metrics port.")
    metrics_project_label: bool = Field(True, description="Label token and duration metrics with the project's name.")
    trace_state: bool = Field(True, description="Put the request's state on spans as body.state.")
    trace_state_max_bytes: int = Field(4096, ge=0, description="Longest body.state span attribute.")
    public_api_docs: bool = Field(
        False, description="Open /docs, /redoc and /openapi.json without an admin key."
    )

    @field_validator("max_body_bytes", "max_response_bytes", "default_text_limit", "decode_budget_bytes")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be a positive number of bytes")
        return value

    @field_validator("rate_limit_fallback")
    @classmethod
    def _one_fallback(cls, value: str, info: ValidationInfo) -> str:
        if value == "closed" and info.data.get("rate_limit_fail_open"):
            raise ValueError("closed contradicts ARBITER_RATE_LIMIT_FAIL_OPEN=true; set only one of them")
        return value

    @property
    def rate_limit_mode(self) -> str:
        """What rate limits do while Redis is unreachable: share, open or closed (the older
        ARBITER_RATE_LIMIT_FAIL_OPEN=true is open)."""
        return "open" if self.rate_limit_fail_open else self.rate_limit_fallback

    @field_validator("usage_durable")
    @classmethod
    def _durable_needs_a_spool(cls, value: str, info: ValidationInfo) -> str:
        if value == "always" and not info.data.get("usage_spool_dir"):
            raise ValueError("ARBITER_USAGE_DURABLE=always needs ARBITER_USAGE_SPOOL_DIR (where the journal is)")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return level

    @field_validator("secret_key", "key_pepper", "metrics_token", "mesh_key", "bootstrap_admin_key")
    @classmethod
    def _not_a_placeholder(cls, value: SecretStr | None) -> SecretStr | None:
        # The deploy files ship CHANGE-ME: a secret everyone knows signs web UI sessions
        # (anyone could forge an admin's) and decrypts service credentials.
        if value is not None and PLACEHOLDER.search(value.get_secret_value()):
            raise ValueError("is still the deploy files' placeholder; set a random value, e.g. "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        return value

    @field_validator(*STRONG_SECRETS)
    @classmethod
    def _strong_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        # ARBITER_MESH_KEY=x would start a working node: anyone could guess the mesh's key.
        problem = None if value is None else weak_secret_problem(value.get_secret_value())
        if problem is not None:
            name = f"ARBITER_{(info.field_name or '').upper()}"
            raise ValueError(f"{name} {problem}; use a random value, made with `{SECRET_GENERATOR}` or "
                             "python -c \"import secrets; print(secrets.token_urlsafe(32))\"")
        return value

    def sqlalchemy_url(self) -> str:
        """The database URL with the driver Arbiter uses filled in."""
        return sqlalchemy_url(self.database_url)


def weak_secret_problem(value: str) -> str | None:
    """Why ``value`` is too weak for a secret (the rule of docs/configuration.md), or None.
    Counts and patterns only: the message never holds the value."""
    if len(value) < SECRET_MIN_CHARS:
        return f"is too short: it must be at least {SECRET_MIN_CHARS} characters"
    if len(set(value)) < SECRET_MIN_DISTINCT:
        return f"has too few different characters: it needs at least {SECRET_MIN_DISTINCT}"
    for period in range(1, len(value) // 2 + 1):
        if value == (value[:period] * (len(value) // period + 1))[: len(value)]:
            return f"is a piece of {period} characters repeated"
    bits = secret_bits(value)
    if bits < SECRET_MIN_BITS:
        return (f"is too predictable: about {int(bits)} bits of randomness once its runs (abc, 321, qwerty) "
                f"and repeated pieces are discounted, under the {SECRET_MIN_BITS} needed")
    # A second opinion that knows words, names, dates and keyboard patterns (zxcvbn): a phrase of
    # dictionary words passes the count above, letter by letter, yet is guessed far sooner.
    guessed = zxcvbn(value[:ZXCVBN_MAX_CHARS])["guesses_log10"] * math.log2(10)
    if guessed < SECRET_MIN_GUESS_BITS:
        return (f"is too guessable: about {int(guessed)} bits once its words, names and dates are counted "
                f"as such, under the {SECRET_MIN_GUESS_BITS} needed")
    return None


def secret_bits(value: str, enough: float = SECRET_MIN_BITS) -> float:
    """An estimate of the randomness in ``value``, in bits, counted until ``enough``: each character
    is worth log2 of its alphabet (the classes it draws from: 16 for hex digits alone), except that
    a piece repeating an earlier one (5+ characters) costs only where it starts and its length, and
    a run continuing the character before it (the next or the previous letter or digit, the same
    again, a neighbour on the keyboard's row: 3+ characters) costs its length and its kind of step.
    A random token loses next to nothing; a word repeated or a counted run loses most."""
    per_char = math.log2(_alphabet(value))
    bits = 0.0
    i = 0
    while i < len(value) and bits < enough:
        repeat = _repeat_at(value, i)
        if repeat >= _REPEAT_MIN:
            bits += math.log2(i) + math.log2(repeat)
            i += repeat
            continue
        run = _run_at(value, i)
        if run >= _RUN_MIN:
            bits += math.log2(run) + 2  # its length, and which of the four kinds of step
            i += run
            continue
        bits += per_char
        i += 1
    return bits


def _alphabet(value: str) -> int:
    chars = set(value)
    if chars <= set(string.digits + "abcdef") or chars <= set(string.digits + "ABCDEF"):
        return 16
    classes = (string.ascii_lowercase, string.ascii_uppercase, string.digits)
    size = sum(len(letters) for letters in classes if chars & set(letters))
    return size + (33 if any(not (c.isascii() and c.isalnum()) for c in chars) else 0)


def _repeat_at(value: str, i: int) -> int:
    """The length of the longest piece from ``i`` on that also starts at an earlier position."""
    best = 0
    for j in range(i):
        length = 0
        while i + length < len(value) and value[j + length] == value[i + length]:
            length += 1
        best = max(best, length)
    return best


def _run_at(value: str, i: int) -> int:
    """How many characters from ``i`` on each take one same step from the one before (code point
    +1, -1 or 0; keyboard row +1 or -1)."""
    if i == 0:
        return 0
    longest = 0
    for position, steps in ((_code_point, (-1, 0, 1)), (_key, (-1, 1))):
        before, here = position(value[i - 1]), position(value[i])
        if before is None or here is None or here - before not in steps:
            continue
        step, length = here - before, 0
        while i + length < len(value):
            before, here = position(value[i + length - 1]), position(value[i + length])
            if before is None or here is None or here - before != step:
                break
            length += 1
        longest = max(longest, length)
    return longest


def _code_point(c: str) -> int | None:
    return ord(c)


def _key(c: str) -> int | None:
    where = _KEYBOARD.get(c.lower())
    return None if where is None else where[0] * 100 + where[1]


def sqlalchemy_url(url: str) -> str:
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url
