"""The suite's guard against fixed TCP ports, installed for every test by ``tests/conftest.py``.

Two clones of the repository run ``make test`` on one machine at once, so a port fixed in a test (or an
agent started with the default port its pod has to itself) collides with the other run. An audit hook
(PEP 578) refuses, in the test process, a TCP ``bind`` to a fixed port and the start of an agent that
would serve on one. A free port is one the kernel picked (port 0), which lies in its ephemeral range;
ports picked by :func:`free_port` come from there too.
"""


from __future__ import annotations

import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The agent commands that serve TCP, and the flag that names their port (``HOST:PORT`` for ``--listen``).
#: ``mig-manager`` serves nothing with ``--once`` or ``--pre-stop``.
SERVING = {"device-plugin": "--metrics-port", "dra-driver": "--metrics-port", "mig-manager": "--metrics-port",
           "setup-monitor": "--metrics-port", "exporter": "--listen", "eviction-guard": "--listen"}
NOT_SERVING_WITH = {"mig-manager": ("--once", "--pre-stop", "--help"), "exporter": ("--help",),
                    "eviction-guard": ("--help",), "device-plugin": ("--help",), "dra-driver": ("--help",),
                    "setup-monitor": ("--help",)}


def _ephemeral() -> range:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


EPHEMERAL = _ephemeral()


class FixedPortError(AssertionError):
    """A test asked for a fixed TCP port."""


def _free(port: int) -> bool:
    return port == 0 or port in EPHEMERAL


def fixed_agent_port(argv: Sequence[str]) -> str | None:
    """Why ``argv`` (a process about to start) would serve an agent on a fixed port, or None."""
    args = [str(a) for a in argv]
    try:
        at = next(i for i in range(len(args) - 1) if args[i] == "-m" and args[i + 1] == "node_agent")
    except StopIteration:
        return None
    rest = args[at + 2:]
    command = next((a for a in rest if a in SERVING), None)
    if command is None or any(a in rest for a in NOT_SERVING_WITH[command]):
        return None
    flag = SERVING[command]
    values = [rest[i + 1] for i in range(len(rest) - 1) if rest[i] == flag]
    if not values:
        return f"`{command}` without {flag} serves on its default port"
    port = values[-1].rpartition(":")[2]
    if port.isdigit() and _free(int(port)):
        return None
    return f"`{command}` with {flag} {values[-1]} serves on a fixed port"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.bind":
        sock, address = args
        if (getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple)
                and len(address) >= 2 and isinstance(address[1], int) and not _free(address[1])):
            raise FixedPortError(f"a test bound the fixed TCP port {address[1]}: bind port 0 (or a free_port()) "
                                 "so that two runs can share the machine")
    elif event == "subprocess.Popen":
        argv = args[1]
        if isinstance(argv, (list, tuple)):
            why = fixed_agent_port(argv)
            if why:
                raise FixedPortError(f"{why}: pass a free port (tests.kit.ports.free_port()) or 0 so that two "
                                     f"runs can share the machine: {' '.join(map(str, argv))[:300]}")


def free_port() -> int:
    """A loopback port free now (the kernel's pick, so in its ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def private_ports(argv: Sequence[str]) -> list[str]:
    """``argv`` (an agent's command line, often its DaemonSet's rendered one) with every fixed status or
    listen port replaced by a free one: each pod has its port to itself, the agents a test starts share
    this machine. Free ports and 0 stay as they are."""
    out = [str(a) for a in argv]
    for i in range(len(out) - 1):
        if out[i] == "--metrics-port" and out[i + 1].isdigit() and not _free(int(out[i + 1])):
            out[i + 1] = str(free_port())
        elif out[i] == "--listen":
            host, sep, port = out[i + 1].rpartition(":")
            if sep and port.isdigit() and not _free(int(port)):
                out[i + 1] = f"{host}:{free_port()}"
    return out


_installed = False


def install() -> None:
    """Install the audit hook once per process (hooks cannot be removed)."""
    global _installed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True
