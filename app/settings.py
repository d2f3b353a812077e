"""The one settings object. Read once, passed into ``create_app(settings)``.

Every field is documented in docs/configuration.md; a test fails when one is not.
"""

from __future__ import annotations

import re

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
PLACEHOLDER = re.compile(r"change[-_ ]?me", re.IGNORECASE)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ARBITER_", extra="ignore", populate_by_name=True)

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
        False, description="Let requests through when Redis is unreachable (default: refuse with 503)."
    )
    key_cache_ttl: float = Field(30.0, ge=0, description="Seconds a resolved key stays cached.")

    client_timeout: float = Field(
        60.0, gt=0, description="Seconds a client may take to send one request, from its first byte to its "
        "last (head and body); past it the answer is 408 and the connection closes."
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

    # The mesh (SPEC §5): off unless a mesh key is set.
    mesh_key: SecretStr | None = Field(
        None, description="The shared secret of the mesh; every node of a mesh holds the same one."
    )
    mesh_peers: str = Field("", description="Comma-separated base URLs of peers this node connects to.")
    mesh_node_name: str | None = Field(None, description="This node's name in the mesh (default: host:port).")
    mesh_url: str | None = Field(None, description="The base URL peers reach this node at (default: from host and port).")
    mesh_interval: float = Field(1.0, gt=0, description="Seconds between model-list exchanges with each peer.")
    mesh_max_backoff: float = Field(8.0, gt=0, description="Longest wait between reconnects to a peer that is down.")
    mesh_max_hops: int = Field(4, ge=1, le=32, description="Most mesh hops a request may take.")

    # The admin web UI (/ui).
    ui_session_minutes: int = Field(
        480, ge=1, le=7 * 24 * 60, description="Minutes a web UI sign-in lasts before it must be repeated."
    )

    # Background writes.
    flush_interval: float = Field(1.0, gt=0, description="Seconds between batched writes.")
    usage_spool_dir: str | None = Field(
        None, description="Where usage records the database never took at a shutdown are kept for the next "
        "start (default: the SQLite database's directory, or the working directory).")

    # Observability.
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
    log_payloads: bool = Field(False, description="Put request states in the logs (personal data!).")
    metrics_token: SecretStr | None = Field(None, description="Bearer token that opens /metrics.")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="Serve /metrics on this port instead, unauthenticated.")
    metrics_host: str = Field("127.0.0.1", description="Address of the separate metrics port.")
    metrics_project_label: bool = Field(True, description="Label token metrics with the project's name.")
    trace_state: bool = Field(True, description="Put the request's state on spans as body.state.")
    trace_state_max_bytes: int = Field(4096, ge=0, description="Longest body.state span attribute.")

    @field_validator("max_body_bytes", "max_response_bytes", "default_text_limit")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be a positive number of bytes")
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

    @field_validator("secret_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (it signs web UI sessions and encrypts "
                             "service credentials)")
        return value

    def sqlalchemy_url(self) -> str:
        """The database URL with the driver Arbiter uses filled in."""
        return sqlalchemy_url(self.database_url)


def sqlalchemy_url(url: str) -> str:
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url
