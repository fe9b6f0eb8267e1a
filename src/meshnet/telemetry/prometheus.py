"""Prometheus exposition of a component's metrics, without the library's global registry.

A component hands over a function returning its current figures as a flat mapping; names
ending in ``_total`` are exposed as counters, the rest as gauges; it may also hand over
``telemetry.histogram.Histogram`` objects, exposed as histograms. Each component builds its own
registry, so two components in one process (tests) never share or double-count metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from meshnet.telemetry.histogram import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Source = Callable[[], Mapping[str, float]]


class _SourceCollector(Collector):
    def __init__(self, prefix: str, source: Source, labels: Mapping[str, str]) -> None:
        self._prefix = prefix
        self._source = source
        self._labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        names, values = list(self._labels), list(self._labels.values())
        for name, value in sorted(self._source().items()):
            if name.endswith("_total"):
                family: Metric = CounterMetricFamily(
                    f"{self._prefix}_{name[:-6]}", name.replace("_", " "), labels=names
                )
            else:
                family = GaugeMetricFamily(f"{self._prefix}_{name}", name.replace("_", " "), labels=names)
            family.add_metric(values, float(value))  # type: ignore[attr-defined]
            yield family


class _HistogramCollector(Collector):
    def __init__(self, prefix: str, histograms: Sequence[Histogram]) -> None:
        self._prefix = prefix
        self._histograms = tuple(histograms)

    def collect(self) -> Iterator[Metric]:
        for histogram in self._histograms:
            names = [histogram.label] if histogram.label else []
            family = HistogramMetricFamily(f"{self._prefix}_{histogram.name}", histogram.help_text, labels=names)
            for series in histogram.series():
                values = [series.label] if histogram.label else []
                family.add_metric(values, list(series.cumulative), series.total)
            yield family


def build_registry(
    prefix: str, source: Source, labels: Mapping[str, str] | None = None, histograms: Sequence[Histogram] = ()
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SourceCollector(prefix, source, labels or {}))
    if histograms:
        registry.register(_HistogramCollector(prefix, histograms))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


class MetricsEndpoint:
    """A ``/metrics`` HTTP server a component started (``serve_metrics``)."""

    def __init__(self, server: WSGIServer, address: str) -> None:
        self._server = server
        self.address = address
        """host:port the endpoint listens on (a ready line may name it)."""

    def close(self) -> None:
        self._server.shutdown()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serve ``/metrics`` over HTTP on a daemon thread, on ``host:port`` (0 picks a port)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return MetricsEndpoint(server, f"{host}:{int(server.server_port)}")
