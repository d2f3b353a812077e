"""``arbiter_service_up{service}``: whether each registered service answered when it was last read.

The state is the one the admin API and the UI show as a service's ``reachable``: written by every
read of the service (the scheduled sync, a Refresh, a change of its URL or key), and read back by
the registry's reload with the models (app/routing/registry.py). The gauge is made from it when
/metrics is scraped: no call to any backend per scrape, and a service removed is gone from the
series at the next reload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

NAME = "arbiter_service_up"
HELP = "1 when the service (backend) answered its last read (sync, Refresh), 0 when it did not."


def _no_services() -> Mapping[str, bool]:
    return {}


class ServiceUp(Collector):
    """The gauge's family, read from ``source`` (service name -> reachable) at each scrape."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.source: Callable[[], Mapping[str, bool]] = _no_services
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(NAME, HELP, labels=["service"])
        for name, up in sorted(self.source().items()):
            family.add_metric([name], 1.0 if up else 0.0)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(NAME, HELP, labels=["service"])
