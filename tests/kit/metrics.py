"""Reading an agent's ``/metrics`` in tests: Prometheus's own client parser, samples by the name Prometheus
stores them under (``..._total`` for counters), and a value lookup that fails with what was there."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.kit.ports import free_port  # the tests that scrape an agent pick its port here

__all__ = ["Samples", "free_port", "get", "parse", "value", "with_port"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for have, v in samples.get(name, []) if labels.items() <= have.items()]
    assert len(found) == 1, f"{name}{labels}: {samples.get(name)}"
    return found[0]


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET ``url``: the status and the body (an HTTP error status is an answer, not an exception)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()




def with_port(args: list[str], port: int) -> list[str]:
    """A rendered agent command line with ``--metrics-port`` set to ``port`` (agents that share a test
    machine cannot all serve on the port each has in its own pod; 0 turns the endpoint off)."""
    assert "--metrics-port" in args, args
    i = args.index("--metrics-port")
    return [*args[: i + 1], str(port), *args[i + 2:]]
