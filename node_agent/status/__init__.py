"""The agents' HTTP status endpoint: ``/metrics`` for Prometheus, ``/healthz`` and ``/readyz`` for probes."""
