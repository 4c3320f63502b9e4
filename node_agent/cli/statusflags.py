"""The status endpoint's flags, one definition for every agent that serves ``/metrics`` and its probes
beside another job (device plugin, DRA plugin, MIG manager, node setup's monitor)."""

from __future__ import annotations

import argparse

MAX_PORT = 65535


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to {MAX_PORT} (0 disables the endpoint), "
                                         f"got {text[:40]!r}")
    return int(text)


def add_status_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, default_port: int) -> None:
    """``--metrics-address``, ``--metrics-port`` and ``--metrics-port-required`` (see
    ``node_agent.status.server`` for what a taken port does with and without the last)."""
    p.add_argument("--metrics-address", default="0.0.0.0", help="status endpoint address (default: %(default)s)")
    p.add_argument("--metrics-port", type=_port, default=default_port,
                   help="/metrics, /healthz and /readyz (default: %(default)s; 0 disables the endpoint)")
    p.add_argument("--metrics-port-required", action="store_true",
                   help="exit when the port cannot be bound (default: log it, keep doing the agent's job "
                        "without the endpoint, and bind it once it is free)")
