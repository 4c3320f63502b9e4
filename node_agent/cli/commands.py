"""The command registry: one line per command, naming its module in this package.

A module listed here (``node_agent.cli.<group>``) exposes ``register(subparsers)``, which adds its sub-parsers and sets
``run=<handler>`` on each (``handler(args) -> int``; global options are on ``args`` and
``AgentContext.from_args(args)`` turns them into a context). Only the module of the command being
run is imported, so ``check`` does not pay for gRPC or the Kubernetes client.

To add commands: append ``Command("<name>", "<module>", "<help>")`` (one per sub-command name).
"""

from __future__ import annotations

from dataclasses import dataclass


def summary(doc: str | None) -> str:
    """A module's or class's docstring's first paragraph as one line: a sub-command's ``--help`` description
    (its first line alone can stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n", 1)[0].split())


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("check", "node_agent.cli.check", "check whether this node's GPUs are usable"),
    Command("runtime", "node_agent.cli.runtime", "containerd: enable the nvidia runtime and CDI, or roll back"),
    Command("sysctl", "node_agent.cli.sysctl", "apply or roll back the sysctls the NVIDIA toolkit needs"),
    Command("vfio", "node_agent.cli.vfio", "VFIO status, module/IOMMU preparation, bind/unbind a GPU"),
    Command("labels", "node_agent.cli.labels", "GPU feature-discovery labels: NFD feature file and Node labels"),
    Command("setup", "node_agent.cli.setup", "check, runtime, sysctl (and vfio), then mark the node ready"),
    Command("teardown", "node_agent.cli.setup", "undo setup: remove the label, the runtime drop-in, the sysctl"),
    Command("setup-monitor", "node_agent.cli.setup", "check the node again at an interval; serve the findings"),
    Command("sim", "node_agent.cli.sim", "inspect a simulated machine or inject faults into it"),
    Command("mig-manager", "node_agent.cli.mig", "converge this node's MIG layout to its label"),
    Command("mig", "node_agent.cli.mig", "plan, apply or assert a MIG layout (no Kubernetes)"),
    Command("dra-driver", "node_agent.cli.dra", "run the DRA kubelet plugin (ResourceSlices, claims)"),
    Command("eviction-guard", "node_agent.cli.eviction_guard", "serve the webhook keeping MIG evictions on-node"),
    Command("driver-upgrade", "node_agent.cli.driver_upgrade", "roll driver changes through the nodes one at a time"),
    Command("device-plugin", "node_agent.cli.device_plugin", "run the kubelet device plugin (nvidia.com/gpu)"),
    Command("mps-daemon", "node_agent.cli.mps_daemon", "run the MPS control daemons of MPS-shared GPUs"),
    Command("exporter", "node_agent.cli.exporter", "serve GPU metrics under dcgm-exporter's names, from NVML"),
    Command("diagnose", "node_agent.cli.diagnose", "a read-only report of this node's GPUs, driver and stack"),
)
