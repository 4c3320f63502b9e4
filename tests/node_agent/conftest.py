"""Fixtures for the node-agent tests (the helpers live in ``agent_testkit``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node_agent.agent_testkit import ApiServer, Cli, kmock_api_server, run_cli


@pytest.fixture
def cli() -> Cli:
    """``cli(host_root, nvml, *args)`` runs ``python -m node_agent --json ...`` in-process."""
    return run_cli


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[ApiServer]:
    with kmock_api_server(tmp_path) as server:
        yield server
