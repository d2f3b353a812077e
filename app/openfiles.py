"""The process's open-file limit, and the cap on client connections that fits under it.

Every client connection is a file descriptor, and so is every backend connection, pooled
database connection, log file and listening socket. A process that runs out of descriptors
fails every request (a new connection, a backend call, a log line) until some close, so the
client connections are capped well below the limit (``ARBITER_MAX_CONNECTIONS``).
"""

from __future__ import annotations

import logging

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX: no limit to read or raise
    resource = None  # type: ignore[assignment]

FIXED_DESCRIPTORS = 256  # database pool, Redis, logs, listening sockets, the metrics port, spool files
HEALTH_RESERVE = 16  # connections past the cap kept for /healthz and /readyz (app/server.py)
DEFAULT_CAP_CEILING = 16_384  # past this many connections one process is the wrong fix: add replicas
MINIMUM_CAP = 16
UNKNOWN_LIMIT = 1024  # what the limit is taken to be where it cannot be read

log = logging.getLogger("arbiter.server")


def open_file_limit() -> int:
    """The soft limit on open files (RLIMIT_NOFILE), as it is now."""
    if resource is None:  # pragma: no cover
        return UNKNOWN_LIMIT
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNKNOWN_LIMIT if soft == resource.RLIM_INFINITY else soft


def raise_open_file_limit() -> int:
    """Raise the soft limit on open files to the hard limit where the system lets it (distributions
    often start services at a soft 1024 under a hard limit hundreds of times that); the soft limit
    that holds afterwards."""
    if resource is None:  # pragma: no cover
        return UNKNOWN_LIMIT
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # macOS refuses RLIM_INFINITY; a sandbox may refuse any
            log.warning("could not raise the open-file limit from %d to %s: %s", soft, hard, exc)
    return open_file_limit()


def connection_cap(configured: int | None, limit: int) -> int:
    """``configured`` when it is set; else what fits under ``limit`` open files: half of what the
    fixed descriptors leave, since each client connection in flight may hold a backend one too."""
    if configured is not None:
        return configured
    return max(MINIMUM_CAP, min(DEFAULT_CAP_CEILING, (limit - FIXED_DESCRIPTORS - HEALTH_RESERVE) // 2))


def check_fits(cap: int, limit: int) -> None:
    """A configured cap the open-file limit cannot hold is the operator's choice, but worth a line."""
    if 2 * cap + HEALTH_RESERVE + FIXED_DESCRIPTORS > limit:
        log.warning("ARBITER_MAX_CONNECTIONS=%d may not fit under the open-file limit of %d (each connection "
                    "may need a backend connection too); raise the limit (ulimit -n) or lower the cap",
                    cap, limit)
