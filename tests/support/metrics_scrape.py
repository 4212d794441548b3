"""Test helper: read a process's Prometheus metrics, and the URL it announced for them."""

from __future__ import annotations

import queue
import re

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import STARTUP_TIMEOUT_S, ServeProcess

METRICS_LISTENING = re.compile(r"^metrics listening on (\S+):(\d+)$")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def announced_metrics_url(process: ServeProcess) -> str:
    """The /metrics URL from the process's `metrics listening on HOST:PORT` line."""
    while True:
        try:
            line = process.lines.get(timeout=STARTUP_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError("no `metrics listening on` line in time") from None
        if line is None:
            raise RuntimeError("the process ended before announcing its metrics port")
        match = METRICS_LISTENING.match(line)
        if match:
            host, port = match.groups()
            return f"http://{host}:{port}/metrics"


async def scrape(url: str) -> Samples:
    """Every sample of the exposition at `url`, by (name, labels)."""
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        assert response.content_type == "text/plain"
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when absent (a labelled series exists only once used)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (sample_name, sample_labels), v in samples.items()
               if sample_name == name and wanted <= sample_labels)
