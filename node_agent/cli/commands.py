"""The command registry: one line per command module.

A module listed here exposes ``register(subparsers)``, which adds its sub-parsers and sets
``run=<handler>`` on each (``handler(args) -> int``; global options are on ``args`` and
``AgentContext.from_args(args)`` turns them into a context). Only the module of the command being
run is imported, so ``check`` does not pay for gRPC or the Kubernetes client.

To add commands: append ``Command("<name>", "<module>", "<help>")`` (one per sub-command name).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("check", "node_agent.setup.check", "check whether this node's GPUs are usable"),
    Command("runtime", "node_agent.setup.runtime", "containerd: enable the nvidia runtime and CDI, or roll back"),
    Command("sysctl", "node_agent.setup.sysctl", "apply or roll back the sysctls the NVIDIA toolkit needs"),
    Command("vfio", "node_agent.setup.vfio", "VFIO status, module/IOMMU preparation, bind/unbind a GPU"),
    Command("labels", "node_agent.labeller.labels", "GPU feature-discovery labels: NFD feature file and Node labels"),
    Command("setup", "node_agent.setup.flow", "check, runtime, sysctl (and vfio), then mark the node ready"),
    Command("teardown", "node_agent.setup.flow", "undo setup: remove the label, the runtime drop-in, the sysctl"),
    Command("sim", "node_agent.cli.sim", "inspect a simulated machine or inject faults into it"),
    Command("mig-manager", "node_agent.cli.mig", "converge this node's MIG layout to its label"),
    Command("mig", "node_agent.cli.mig", "plan, apply or assert a MIG layout (no Kubernetes)"),
    Command("dra-driver", "node_agent.kubelet.dra.process", "run the DRA kubelet plugin (ResourceSlices, claims)"),
    Command("device-plugin", "node_agent.kubelet.deviceplugin.process",
            "run the kubelet device plugin (nvidia.com/gpu)"),
)
