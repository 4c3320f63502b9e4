"""What every agent command gets: host and driver roots, the NVML backend, the node name, Kubernetes access.

Built once from the global CLI options (``AgentContext.from_args``) so every command module of this
package reads the same settings the same way. Kubernetes and NVML are opened lazily: ``check`` on a
node without a GPU never loads either. The labeller and the setup flow take it as their
``node_agent.labeller.nodepatch.NodeEnv`` (the part of it they use), so they never see the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node_agent.cli import exitcodes
from node_agent.host import HostError, HostRoot, Refused
from node_agent.host.driverroot import DriverRoot, current_driver_root, default_driver_root
from node_agent.host.root import ExecMode
from node_agent.nvml import NvmlBackend, NvmlSession, open_nvml, simulator

if TYPE_CHECKING:
    from node_agent.labeller.nodepatch import NodeApi

HostFactory = Callable[[str, ExecMode], HostRoot]
log = logging.getLogger(__name__)


class UsageError(ValueError):
    """A bad option value; the CLI prints it and exits 2."""


def simulated_host(root: Path, machine: str | None) -> bool:
    """Whether ``root`` is (now) a simulated host for ``--nvml simulated:<machine>``.

    An empty or missing directory is laid out for the machine on first use, so ``--host-root $(mktemp -d)
    --nvml simulated:dgx-h100 check`` finds the machine's GPUs (``sim host`` does it explicitly). A
    directory laid out for another machine is refused rather than mixed with this one; any other
    non-empty directory is taken as it is (a host mounted somewhere, a test's tree)."""
    sim = simulator.get()
    if sim.is_simulated_host(root):
        laid_out = sim.machine_of(root)
        if machine is not None and laid_out is not None and laid_out != machine:
            raise UsageError(f"--host-root {root} is a simulated {laid_out} host; --nvml simulated:{machine} does "
                             f"not match it (use --nvml simulated:{laid_out}, or an empty directory)")
        return True
    if machine is None or (root.exists() and (not root.is_dir() or any(root.iterdir()))):
        return False
    sim.lay_out(root, machine)
    log.info("event=simulated-host-laid-out root=%s machine=%s", root, machine)
    return True


@dataclass(frozen=True)
class AgentContext:
    host: HostRoot
    nvml_backend: NvmlBackend
    node_name: str | None
    kubeconfig: Path | None
    json: bool
    nvml_timeout_s: float = 10.0

    @classmethod
    def from_args(cls, args: argparse.Namespace, host_factory: HostFactory | None = None) -> AgentContext:
        root = str(getattr(args, "host_root", "/") or "/")
        state = getattr(args, "nvml_state", None)
        spec = getattr(args, "nvml", None) or "real"
        driver_root = DriverRoot(Path(str(getattr(args, "driver_root", None) or default_driver_root())))
        try:
            backend = NvmlBackend.parse(spec, Path(state) if state else None, driver_root.path)
        except ValueError as e:
            raise UsageError(str(e)) from e
        simulated = backend.kind == "simulated" and root != "/" and simulated_host(Path(root), backend.machine)
        # A simulated host has no OS to chroot into: its tools are resolved inside it and run directly.
        exec_mode: ExecMode = getattr(args, "host_exec", None) or ("direct" if root == "/" or simulated else "chroot")
        if host_factory is None and simulated:
            stand_in = simulator.get().device_node_stand_in
            # A simulated host's device nodes are regular files: its users run as non-root, where mknod fails.
            host_factory = lambda r, m: HostRoot(r, exec_mode=m, mknod=stand_in)  # noqa: E731
        host = (host_factory or (lambda r, m: HostRoot(r, exec_mode=m)))(root, exec_mode)
        if backend.kind == "simulated" and backend.state_file is None and not host.is_real_root:
            backend = NvmlBackend("simulated", backend.machine,
                                  host.path(f"{simulator.get().state_dir}/{backend.machine}.json"), driver_root.path)
        kubeconfig = getattr(args, "kubeconfig", None)
        return cls(
            host=host,
            nvml_backend=backend,
            node_name=getattr(args, "node_name", None) or os.environ.get("NODE_NAME") or None,
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            json=bool(getattr(args, "json", False)),
        )

    @contextmanager
    def nvml(self) -> Iterator[NvmlSession]:
        with open_nvml(self.nvml_backend, timeout_s=self.nvml_timeout_s) as session:
            yield session

    @property
    def driver_root(self) -> DriverRoot:
        """The NVIDIA driver root as this process sees it (``--driver-root``; not under the host root)."""
        root = self.nvml_backend.driver_root
        return DriverRoot(root) if root is not None else current_driver_root()

    def require_node_name(self) -> str:
        if not self.node_name:
            raise UsageError("this command needs the node name: pass --node-name or set NODE_NAME")
        return self.node_name

    def node_api(self) -> NodeApi:
        from node_agent.labeller.nodepatch import KubeNodeApi  # noqa: PLC0415 - the Kubernetes client, when used

        return KubeNodeApi.connect(self.kubeconfig)

    def fail(self, error: Exception, **extra: Any) -> int:
        """Report an error the way every command does and return its exit code."""
        refused = isinstance(error, Refused)
        self.emit({"error": str(error), **({"refused": True} if refused else {}), **extra},
                  f"{'refused' if refused else 'error'}: {error}")
        if refused:
            return exitcodes.REFUSED
        return exitcodes.HOST_INPUT if isinstance(error, HostError) else exitcodes.FAILED

    def emit(self, doc: dict[str, Any], text: str) -> None:
        """Print the command's result: JSON with ``--json``, the human text otherwise."""
        if self.json:
            json.dump(doc, sys.stdout, indent=2, sort_keys=True)
            sys.stdout.write("\n")
        elif text:
            sys.stdout.write(text.rstrip("\n") + "\n")
