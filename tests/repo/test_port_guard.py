"""The suite's guard against fixed TCP ports (``tests.kit.ports``) refuses what two parallel runs would
fight over and lets through what they would not."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.kit.ports import EPHEMERAL, FixedPortError, fixed_agent_port, private_ports

AGENT = [sys.executable, "-m", "node_agent", "--host-root", "/h"]
FREE = str(EPHEMERAL.start + 7)


@pytest.mark.parametrize(("argv", "why"), [
    ([*AGENT, "device-plugin", "--socket-dir", "/k"], "`device-plugin` without --metrics-port"),
    ([*AGENT, "dra-driver", "--metrics-port", "9402"], "`dra-driver` with --metrics-port 9402"),
    ([*AGENT, "setup-monitor", "--metrics-port", "0", "--metrics-port", "9404"], "--metrics-port 9404"),
    ([*AGENT, "exporter", "--listen", "127.0.0.1:9400"], "`exporter` with --listen 127.0.0.1:9400"),
    (["unshare", "--mount", "--", "sh", "-c", "exec \"$@\"", "sh", *AGENT, "eviction-guard"],
     "`eviction-guard` without --listen"),
])
def test_an_agent_on_a_fixed_port_is_refused(argv: list[str], why: str) -> None:
    assert why in (fixed_agent_port(argv) or "")


@pytest.mark.parametrize("argv", [
    [*AGENT, "device-plugin", "--metrics-port", "0"],
    [*AGENT, "dra-driver", "--metrics-port", FREE],
    [*AGENT, "exporter", "--listen", f"127.0.0.1:{FREE}"],
    [*AGENT, "mig-manager", "--once"],
    [*AGENT, "check"],
    ["nvidia-device-plugin", "--metrics-port", "9401"],
])
def test_what_cannot_collide_passes(argv: list[str]) -> None:
    assert fixed_agent_port(argv) is None


def test_the_guard_is_installed_for_binds_and_process_starts() -> None:
    with socket.socket() as s, pytest.raises(FixedPortError, match="fixed TCP port 9401"):
        s.bind(("127.0.0.1", 9401))
    with pytest.raises(FixedPortError, match="`exporter` without --listen"):
        subprocess.run([*AGENT, "exporter"], check=False)


def test_a_rendered_command_line_gets_free_ports_in_place_of_its_pods_fixed_ones() -> None:
    rendered = [*AGENT, "dra-driver", "--driver-name", "gpu.nvidia.com", "--metrics-port", "9402",
                "--metrics-port-required"]
    private = private_ports(rendered)
    assert private[:-2] == rendered[:-2] and private[-1] == "--metrics-port-required"
    assert int(private[-2]) in EPHEMERAL and fixed_agent_port(private) is None
    listen = private_ports([*AGENT, "exporter", "--listen", "0.0.0.0:9400"])
    assert listen[-1].startswith("0.0.0.0:") and int(listen[-1].rpartition(":")[2]) in EPHEMERAL
    kept = [*AGENT, "device-plugin", "--metrics-port", "0"]
    assert private_ports(kept) == kept
