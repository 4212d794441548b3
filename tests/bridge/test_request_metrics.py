"""The bridge's request metrics, counted in plain numbers, are exposed exactly as
prometheus_client's own Counter and Histogram expose the same observations."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from http_bridge._metrics import (
    REQUEST_SECONDS_HELP, REQUEST_SECONDS_NAME, REQUESTS_HELP, REQUESTS_NAME, RequestMetrics,
)
from ors_grpc.observability.metrics import DURATION_BUCKETS

#: (route, method, status, seconds): on and between bucket bounds, below the first and over the last.
OBSERVATIONS = [
    ("/{env}/call", "POST", 200, 0.0005), ("/{env}/call", "POST", 200, 0.001), ("/{env}/call", "POST", 200, 0.0011),
    ("/ping", "POST", 404, 2.5), ("/{env}/call", "POST", 500, 1000.0), ("unmatched", "other", 405, 0.0),
    ("/{env}/call", "POST", 200, 30.0),
]


def _without_creation_times(text: str) -> str:
    return re.sub(r"^(\S*_created\{.*\}) \S+$", r"\1 T", text, flags=re.MULTILINE)


@pytest.mark.parametrize("exposition", [generate_latest, generate_openmetrics], ids=["text", "openmetrics"])
def test_the_exposition_is_prometheus_clients_own(exposition) -> None:
    reference, ours = CollectorRegistry(), CollectorRegistry()
    requests = Counter(REQUESTS_NAME, REQUESTS_HELP, ["route", "method", "status"], registry=reference)
    seconds = Histogram(REQUEST_SECONDS_NAME, REQUEST_SECONDS_HELP, ["route", "method"], buckets=DURATION_BUCKETS,
                        registry=reference)
    metrics = RequestMetrics()
    ours.register(metrics)
    for route, method, status, elapsed in OBSERVATIONS:
        requests.labels(route, method, str(status)).inc()
        seconds.labels(route, method).observe(elapsed)
        metrics.record(route, method, status, elapsed)
    expected = _without_creation_times(exposition(reference).decode())
    assert "ors_bridge_request_duration_seconds_bucket" in expected
    assert _without_creation_times(exposition(ours).decode()) == expected
