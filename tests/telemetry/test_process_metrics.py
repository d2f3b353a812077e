"""The process's own metrics (prometheus_client's collectors) on each app's registry: CPU,
memory, open files, the interpreter and its garbage collector, for every app in the process."""

from __future__ import annotations

import resource
import time
from typing import Any

from tests.support import Stack
from tests.telemetry.test_metrics import samples

PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
           "process_open_fds", "process_max_fds", "process_start_time_seconds")


def scraped(gateway: Any, key: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with gateway.client(key) as admin:
        response = admin.get("/metrics")
    assert response.status_code == 200
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for (name, labels), value in samples(response.text).items():
        found.setdefault(name, []).append((dict(labels), value))
    return found


def test_every_app_in_the_process_shows_the_process_metrics(stack: Stack, gateway_factory: Any) -> None:
    """Two apps in one process (as here), each with its registry: both show them, and neither
    registration clashes with the other's (nor with prometheus_client's global registry)."""
    other = gateway_factory()
    for gateway in (stack.gateway, other):
        found = scraped(gateway, stack.admin_key)
        for name in PROCESS:
            assert len(found[name]) == 1, name
        assert found["process_resident_memory_bytes"][0][1] > 1_000_000
        assert 0 < found["process_open_fds"][0][1] <= found["process_max_fds"][0][1]
        assert found["process_cpu_seconds_total"][0][1] > 0
        ((info, one),) = found["python_info"]
        assert one == 1.0 and info["implementation"] == "CPython" and info["major"] == "3"
        generations = {labels["generation"] for labels, _ in found["python_gc_collections_total"]}
        assert generations == {"0", "1", "2"}
        assert {"python_gc_objects_collected_total", "python_gc_objects_uncollectable_total"} <= set(found)


def test_the_figures_are_this_processs(stack: Stack) -> None:
    """Read from /proc/self: the open-file limit is the one this process runs under (the one
    `arbiter serve` raises at start, app/openfiles.py), and it started before the scrape."""
    found = scraped(stack.gateway, stack.admin_key)
    assert found["process_max_fds"][0][1] == float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    assert found["process_start_time_seconds"][0][1] <= time.time()
