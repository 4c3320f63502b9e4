"""The MIG manager as its DaemonSet runs it, as a process on a simulated host: shared by the MIG manager's
own cluster tests (``test_agent_mig.py``) and the engine's MIG-to-time-slicing switch (``test_pulumi_engine.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node_agent.nvml import NvmlBackend, open_nvml
from tests.cluster.agents import REPO, AgentIdentity, agent_command
from tests.kit.fakehost import sim_state_file

MACHINE = "dgx-h100"


@dataclass(frozen=True)
class Rendered:
    """What the stack hands the manager: the DaemonSet's container and the mig-parted config."""

    container: dict[str, Any]
    volumes: dict[str, dict[str, Any]]
    config_text: str
    node_template: dict[str, Any]


@dataclass
class ManagerProcess:
    proc: subprocess.Popen[str]
    log: Path

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the process so far (``/proc/PID/stat``)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM as the kubelet sends it; the manager may sit in a Node watch, so do not wait long."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _map_paths(arg: str, mounts: dict[str, Path]) -> str:
    for mount, local in mounts.items():
        if arg == mount or arg.startswith(mount + "/"):
            return str(local) + arg[len(mount):]
    return arg


def manager_argv(rendered_stack: Rendered, host: Path, config_dir: Path, drain: str | None = None) -> list[str]:
    """The DaemonSet's command line, with its volume mounts mapped onto local directories.

    ``drain`` replaces ``--drain`` the way the stack renders it for another node setup.
    """
    c = rendered_stack.container
    mounts: dict[str, Path] = {}
    for m in c["volumeMounts"]:
        vol = rendered_stack.volumes[m["name"]]
        if "hostPath" in vol:
            assert vol["hostPath"]["path"] == "/", vol
            mounts[m["mountPath"]] = host
        elif "configMap" in vol:
            mounts[m["mountPath"]] = config_dir
    args = [_map_paths(a, mounts) for a in c["args"]]
    if drain is not None:
        i = args.index("--drain")
        args[i + 1] = drain
    assert c["command"][:3] == ["python", "-m", "node_agent"]
    return args


def start_manager(rendered_stack: Rendered, ident: AgentIdentity, tmp: Path, *, drain: str | None = None,
                  machine: str = MACHINE) -> ManagerProcess:
    """``python -m node_agent`` as in the pod: its args, ``NODE_NAME`` from ``spec.nodeName``, the pod's token."""
    host = tmp / "host"
    config_dir = tmp / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "config.yaml").write_text(rendered_stack.config_text)
    args = manager_argv(rendered_stack, host, config_dir, drain)
    env = dict(os.environ)
    for e in rendered_stack.container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = ident.pod["spec"]["nodeName"]
    assert env.get("NODE_NAME") == ident.pod["spec"]["nodeName"]
    cmd = agent_command("--nvml", f"simulated:{machine}", "--kubeconfig", str(ident.kubeconfig),
                        "--log-level", "info", *args)
    log = tmp / "manager.log"
    out = log.open("w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    out.close()
    return ManagerProcess(proc, log)


# --- objects ------------------------------------------------------------------------------------------


def layout(host: Path, machine: str = MACHINE) -> list[list[str]]:
    """Per GPU, the sorted MIG device profiles the simulated NVML reports (``[]`` with MIG off)."""
    state = sim_state_file(host, machine)
    with open_nvml(NvmlBackend("simulated", machine, state)) as nvml:
        return [sorted(d.profile for d in g.mig_devices) if g.mig_enabled else [] for g in nvml.gpus()]
