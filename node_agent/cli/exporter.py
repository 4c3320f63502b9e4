"""``exporter``: GPU metrics under dcgm-exporter's names, from NVML (``node_agent.exporter``).

Runs in the stack's exporter DaemonSet on every GPU node (``cluster.monitoring.exporter: agent``): one
NVML session, an XID event set, kubelet's PodResources API for the pod labels, and ``/metrics``,
``/healthz`` on one port (9400, dcgm-exporter's). Serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import re
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary
from node_agent.cli.context import AgentContext, UsageError
from node_agent.exporter import counters
from node_agent.exporter.service import MetricsService
from node_agent.nvml.xidwatch import XidRecorder
from node_agent.status.server import StatusServer

COMMAND = "exporter"
#: dcgm-exporter's port: scrape configs written for it keep working.
DEFAULT_PORT = 9400


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(COMMAND, help="serve GPU metrics (dcgm-exporter's names) read through NVML",
                              description=summary(__doc__))
    p.add_argument("--listen", default=f"0.0.0.0:{DEFAULT_PORT}", metavar="HOST:PORT",
                   help="HTTP address of /metrics and /healthz (default: %(default)s)")
    p.add_argument("--collectors", "-f", metavar="CSV",
                   help="dcgm-exporter's counters file: the fields to serve (default: dcgm-exporter's defaults "
                        "that NVML gives, plus ECC totals and clock event reasons)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pod-resources-socket", default=None, metavar="PATH",
                   help="kubelet's PodResources socket, for the pod, namespace and container labels "
                        "(default: /var/lib/kubelet/pod-resources/kubelet.sock)")
    g.add_argument("--no-pod-labels", action="store_true", help="do not ask kubelet which pod holds which GPU")
    p.add_argument("--dra-driver", default="gpu.nvidia.com", metavar="NAME",
                   help="the DRA driver whose claimed devices are GPUs of this node (default: %(default)s)")
    p.add_argument("--info", action="append", default=[], metavar="LABEL=VALUE",
                   help="a label of nvidia_gpu_node_info (the stack passes node_group, sharing and "
                        "allocation_mode); repeatable")
    p.set_defaults(run=run)


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--listen {text!r}: expected HOST:PORT with a port from 0 to 65535")
    return host or "0.0.0.0", int(port)


#: A Prometheus label name, ``fullmatch``ed (``re.match`` with ``$`` also took a trailing newline).
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def info_labels(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _LABEL.fullmatch(name) or name.startswith("__") or name == "Hostname":
            raise UsageError(f"--info {pair!r}: expected LABEL=VALUE with a Prometheus label name "
                             "(letters, digits and '_', not starting with a digit or '__', not Hostname)")
        out[name] = value
    return out


def selection(path: str | None) -> counters.Selection:
    if path is None:
        return counters.default()
    try:
        return counters.parse(Path(path).read_text(), source=path)
    except OSError as e:
        raise UsageError(f"--collectors {path}: {e.strerror or e}") from e
    except counters.CountersError as e:
        raise UsageError(f"--collectors: {e}") from e


def run(args: argparse.Namespace) -> int:
    ctx = AgentContext.from_args(args)
    host, port = _listen(args.listen)
    chosen = selection(args.collectors)
    info = info_labels(args.info)
    pod_resources = None
    client = None
    if not args.no_pod_labels:
        # gRPC only where the pods' labels are asked for (--no-pod-labels runs without it).
        from node_agent.kubelet.podresources.client import DEFAULT_SOCKET, PodResourcesClient  # noqa: PLC0415

        client = PodResourcesClient(args.pod_resources_socket or DEFAULT_SOCKET)
        pod_resources = client.list
    recorder = XidRecorder(ctx.nvml, lambda: None)
    service = MetricsService(ctx.nvml, chosen, ctx.node_name or socket.gethostname(), pod_resources=pod_resources,
                             dra_driver=args.dra_driver, xids=recorder, info=info)
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        server = StatusServer(service, live=service.live, ready=service.live, host=host, port=port)
    except OSError as e:  # the address is taken or not ours to bind
        return ctx.fail(e)
    recorder.start()
    server.start()
    ctx.emit({"listening": f"{host}:{server.port}", "fields": list(chosen.fields)},
             f"serving {len(chosen.fields)} field(s) on {host}:{server.port}")
    try:
        stopped.wait()
    finally:
        server.stop()
        recorder.stop()
        service.close()
        if client is not None:
            client.close()
    return exitcodes.OK
