"""Proof 5: restart and failure. The node agents against a real API server that restarts, hangs and
crashes under them, and agents killed in the middle of their own work.

Four long-running agents run as processes, each with the identity of its own DaemonSet pod on a kwok
Node of the dev stack (a token bound to that pod, as the kubelet would mount it) and the arguments of
the rendered DaemonSet:

* the DRA kubelet plugin of ``h200-dra`` on a simulated HGX H200 (``rst-h200``), registered with the
  repository's kubelet stand-in;
* the labeller of ``a100-train`` in its DaemonSet form (``labels --loop --patch-node``) on a simulated
  DGX A100, with the group's ``--node-label``/``--node-taint`` flags as the renderer gives them on the
  daemonset backend (the dev stack is Deckhouse, where the node template carries them instead) and a
  1 s interval instead of 60 s (``rst-a100``);
* the device plugin of ``a30-mps`` with its Node-label watch, against the device-plugin kubelet stand-in
  (``rst-a30``; config file polling slowed to a minute, so only the watch can deliver a label change);
* the MIG manager on a simulated DGX H100 of ``gpu-h100`` (``rst-h100``); the test plays Deckhouse's
  node-manager (approval, drain) inside its polls, as nothing else in this control plane does.

The API server is then restarted (SIGTERM, 2 s down, started again on the same port), and later hung
(SIGSTOP) for longer than the agents' request timeouts before it crashes (SIGKILL) and comes back.
Work is handed to every agent while the server is gone (GPU faults on the hosts) or once it is back
(an administrator's edits of labels, taints and config labels), and each outcome is read back from the
API server: the agents reconnect by themselves (same process, no restart), do the work, and leave
nothing half-applied. Then the MIG manager is SIGKILLed in the middle of a layout change and the DRA
plugin between a claim's prepare and its unprepare; their journals bring each back where it was. Last,
a defect the restarts exposed (fixed): a device-plugin Node watch refused once (403, as kube-scheduler's
watches are right after a restart here) never watched again.

Every Node here is named ``rst-*`` and deleted at the end; the API server is left running (restarted),
and the one shared object the DRA plugin touches, the uninstall marker, is given back as it was.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localcluster import ApiError, ControlPlane, Kube
from localcluster.objects import kwok_node, wait_for
from node_agent.deviceplugin.nodewatch import NodeLabelWatch, WatchTiming
from node_agent.dra.cleanup import FINALIZER
from node_agent.host import statefile
from node_agent.mig.executor import DEPLOY_LABELS, DRAIN_ANNOTATIONS
from node_agent.mig.journal import JOURNAL_PATH, JOURNAL_VERSION
from nvgpu import labels as names
from nvgpu.stackconfig import GroupPlan, NodeSetupBackend
from nvidia_gpu.components.manifests.workloads import DRIVER_ROOT_ARGS, GroupContext, labeller_args
from nvml_sim import SimulatedMachine
from tests.cluster.agents import (
    NS,
    REPO,
    AgentIdentity,
    agent_command,
    config_map_files,
    container_env,
    identity,
    node_annotations,
    node_labels,
    node_taints,
    read_node,
    with_config_dir,
)
from tests.cluster.stack import AppliedStack, rendered
from tests.kit.fakehost import build_fake_host
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet
from tests.kit.kubelet.dra import DraKubelet

RESOURCE = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
MARKER = "dra-uninstall-marker"
TAINT_KEY = names.MIG_RECONFIGURE_TAINT_KEY
CLAIMS_NS = "rst-claims"
GPU_TAINT_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


@dataclass(frozen=True)
class Role:
    """One agent: its Node, the NodeGroup it belongs to, its DaemonSet and the simulated machine."""

    node: str
    node_group: str
    daemonset: str
    machine: str


DRA = Role("rst-h200", "gpu-h200", "dra-kubelet-plugin-h200-dra", "hgx-h200")
LABELLER = Role("rst-a100", "gpu-a100", "gpu-labeller-a100-train", "dgx-a100-80gb")
PLUGIN = Role("rst-a30", "gpu-a30", "device-plugin-a30-mps", "a30x4")
MIG = Role("rst-h100", "gpu-h100", "nvidia-gpu-mig-manager", "dgx-h100")
ROLES = (DRA, LABELLER, PLUGIN, MIG)
LABELLER_GROUP = "a100-train"
#: The labeller loop's interval here (the DaemonSet's is 60 s): short, so recovery shows within seconds.
LABEL_INTERVAL = "1"


# --- agent processes ---------------------------------------------------------------------------------


@dataclass
class Agent:
    """A long-running agent process; calling ``start`` again runs the same command (same host root, same
    pod identity), as the kubelet restarts a container."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> Agent:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.pids.append(self.proc.pid)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return f"--- {self.name} log ({self.log}) ---\n{self.text()[-5000:]}"

    def stacks(self) -> str:
        """Every thread's stack, as the agent writes it on SIGUSR1, then the log's tail: what it waits on."""
        if self.alive():
            assert self.proc is not None
            size = self.log.stat().st_size
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: self.log.stat().st_size > size, timeout=5, interval=0.05, what="stacks")
            time.sleep(0.2)
        return self.tail()

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is cleaned up (an OOM kill, a node's hard stop)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@contextlib.contextmanager
def _explained(*agents: Agent) -> Iterator[None]:
    """On any failure in the block (a timeout from pytest-timeout included), print what each agent is
    doing: its threads' stacks and its log's tail land in the test's captured output, so a failure in
    CI says where an agent waits instead of only that it did not converge."""
    try:
        yield
    except BaseException:
        for a in agents:
            print(a.stacks())
        raise


def _stop_all(agents: list[Agent], grace: float = 2.0) -> None:
    """SIGTERM to every agent at once, as the kubelet would on a node drain; SIGKILL after ``grace``
    (the MIG manager notices SIGTERM only once its Node watch returns)."""
    running = [a.proc for a in agents if a.proc is not None and a.proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in running:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _container(stack: AppliedStack, daemonset: str) -> dict[str, Any]:
    container: dict[str, Any] = stack.object("DaemonSet", daemonset)["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "node_agent"]
    return container


def _pod_env(container: dict[str, Any], node: str) -> dict[str, str]:
    """The process environment with the container's env, ``fieldRef: spec.nodeName`` resolved for ``node``;
    the test runner's in-cluster variables dropped, so only ``--kubeconfig`` names the server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(container_env(container, node))
    return env


def _sim(root: Path, machine: str) -> SimulatedMachine:
    """The simulated machine the agents on ``root`` see (its state file under the host root)."""
    return SimulatedMachine(machine, root / "run/nvidia-gpu-agent/nvml-sim" / f"{machine}.json")


# --- Nodes and what the test reads back ---------------------------------------------------------------


def _template(stack: AppliedStack, node_group: str) -> dict[str, Any]:
    return dict(stack.object("NodeGroup", node_group)["spec"]["nodeTemplate"])


_node = read_node
_labels = node_labels
_annotations = node_annotations
_taints = node_taints


def _slot(taint: dict[str, Any]) -> str:
    return f"{taint['key']}:{taint['effect']}"


def _assert_no_duplicate_taints(node: dict[str, Any]) -> None:
    slots = [_slot(t) for t in _taints(node)]
    assert len(slots) == len(set(slots)), f"duplicated taints on {node['metadata']['name']}: {slots}"


def _patch_node(kube: Kube, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """An administrator's read-modify-write of a Node (guarded by its resourceVersion, retried on 409)."""
    for _ in range(10):
        node = _node(kube, name)
        body = change(node)
        body.setdefault("metadata", {})["resourceVersion"] = node["metadata"]["resourceVersion"]
        try:
            kube.patch("v1", "Node", name, body)
            return
        except ApiError as e:
            if e.status != 409:
                raise
    raise AssertionError(f"Node {name} kept changing under the administrator's patch")


def _set_label(kube: Kube, name: str, key: str, value: str | None) -> None:
    kube.patch("v1", "Node", name, {"metadata": {"labels": {key: value}}})


def _slices(kube: Kube, node: str) -> list[dict[str, Any]]:
    return [s for s in kube.list(RESOURCE, "ResourceSlice", fieldSelector=f"spec.nodeName={node}")
            if s["spec"]["driver"] == DRIVER]


def _devices(slices: list[dict[str, Any]]) -> set[str]:
    names_ = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert len(names_) == len(set(names_)), f"a device published twice: {sorted(names_)}"
    return set(names_)


def _generation(slices: list[dict[str, Any]]) -> int:
    gens = {int(s["spec"]["pool"]["generation"]) for s in slices}
    assert len(gens) == 1, f"one generation across the pool's slices: {gens}"
    return gens.pop()


def _pool(kube: Kube, devices: set[str]) -> list[dict[str, Any]] | None:
    slices = _slices(kube, DRA.node)
    one_generation = len({s["spec"]["pool"]["generation"] for s in slices}) == 1
    return slices if slices and one_generation and _devices(slices) == devices else None


def _assert_pool_holds(kube: Kube, generation: int) -> None:
    """Across several inventory polls (0.5 s), the pool is not republished."""
    try:
        wait_for(lambda: _generation(_slices(kube, DRA.node)) != generation, timeout=2.0, interval=0.25,
                 what="a republication")
    except TimeoutError:
        return
    pytest.fail(f"{DRA.node}'s pool was republished without an inventory change: "
                f"{json.dumps(_slices(kube, DRA.node))[:1500]}")


# --- the agents ------------------------------------------------------------------------------------------


@dataclass
class Labeller:
    agent: Agent
    host: SimulatedMachine
    want_labels: dict[str, str]  #: the group's --node-label flags
    want_taints: list[dict[str, str]]  #: the group's --node-taint flags, as the Node carries them


@dataclass
class DevicePlugin:
    agent: Agent
    kubelet: DevicePluginKubelet
    config_label: str
    gpus: int
    identity: AgentIdentity


@dataclass
class MigManager:
    agent: Agent
    root: Path
    template_taints: list[dict[str, Any]]

    @property
    def journal(self) -> Path:
        return self.root / JOURNAL_PATH.lstrip("/")


@dataclass
class DraPlugin:
    agent: Agent
    root: Path
    kubelet: DraKubelet
    identity: AgentIdentity

    @property
    def registration_socket(self) -> Path:
        return self.root / f"var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"

    def register(self, previous_inode: int | None = None) -> None:
        """The kubelet's registration once the plugin serves; after a SIGKILL the dead process's socket
        file is still there, so wait for the new process to replace it first."""
        if previous_inode is not None:
            wait_for(lambda: self.registration_socket.exists()
                     and self.registration_socket.stat().st_ino != previous_inode,
                     timeout=60, interval=0.1, what="the restarted plugin's registration socket")
        self.kubelet.register(timeout=60)


@dataclass
class Agents:
    dra: DraPlugin
    labeller: Labeller
    plugin: DevicePlugin
    mig: MigManager

    def all(self) -> tuple[Agent, ...]:
        return (self.dra.agent, self.labeller.agent, self.plugin.agent, self.mig.agent)

    def assert_alive(self) -> None:
        for a in self.all():
            assert a.alive(), f"{a.name} exited with {a.proc.returncode if a.proc else None}\n{a.tail()}"
            assert len(a.pids) == 1 or a.name in ("dra", "mig"), f"{a.name} was restarted: {a.pids}"


def _node_flags(stack: AppliedStack) -> tuple[list[str], dict[str, str], list[dict[str, str]]]:
    """The labeller's ``--node-label``/``--node-taint`` flags for the group on the daemonset backend, by the
    renderer's own function (the same flags the prod stack's labellers carry), and what they ask for."""
    config = rendered(stack.name).config
    assert config is not None
    group = next(g for g in config.node_groups if g.name == LABELLER_GROUP)
    cluster = config.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET})
    deckhouse_args = list(_container(stack, LABELLER.daemonset)["args"])
    full = labeller_args(GroupContext(config.cluster.namespace, cluster, group, GroupPlan.of(cluster, group)))
    assert full[:len(deckhouse_args)] == deckhouse_args, "the daemonset backend only appends the node flags"
    flags = full[len(deckhouse_args):]
    want_labels = dict(flags[i + 1].split("=", 1) for i in range(0, len(flags), 2) if flags[i] == "--node-label")
    want_taints = []
    for text in (flags[i + 1] for i in range(0, len(flags), 2) if flags[i] == "--node-taint"):
        head, _, effect = text.rpartition(":")
        key, _, value = head.partition("=")
        want_taints.append({"key": key, "effect": effect, **({"value": value} if value else {})})
    assert want_labels and len(want_taints) == 2, flags
    return flags, want_labels, want_taints


def _with_interval(args: list[str], interval: str) -> list[str]:
    i = args.index("--interval")
    assert args[:i] == [*DRIVER_ROOT_ARGS, "labels", "--loop"], args
    return [*args[:i + 1], interval, *args[i + 2:]]


def _map_mounts(args: list[str], mounts: dict[str, Path]) -> list[str]:
    out = []
    for arg in args:
        mount = next((m for m in mounts if arg == m or arg.startswith(m + "/")), None)
        out.append(arg if mount is None else str(mounts[mount]) + arg[len(mount):])
    return out


def _create_nodes(kube: Kube, stack: AppliedStack) -> None:
    """One kwok Node per agent, in its NodeGroup and past setup; the labeller's is bare (no node template:
    the labeller must put the group's labels and taints there), the others as Deckhouse makes them."""
    for role in ROLES:
        template = {} if role is LABELLER else _template(stack, role.node_group)
        node_labels = {names.DECKHOUSE_NODE_GROUP: role.node_group, **template.get("labels", {}),
                       names.GPU_SETUP_COMPLETE: ""}
        if role is PLUGIN:
            node_labels[names.DEVICE_GPU_CONFIG] = "Exclusive"  # MPS needs MPS daemons this host lacks
        kube.create(kwok_node(role.node, node_labels, template.get("taints", [])))
    for role in ROLES:
        def ready(name: str = role.node) -> bool:
            conds = {c["type"]: c["status"] for c in _node(kube, name).get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"

        wait_for(ready, timeout=30, what=f"kwok Node {role.node} Ready")


def _mig_apply(root: Path, config: Path, name: str) -> subprocess.Popen[str]:
    """The one-shot ``mig apply``: the GPUs carry the group's layout before the manager starts, as on a
    node that joined the group earlier."""
    return subprocess.Popen(agent_command("--host-root", str(root), "--nvml", f"simulated:{MIG.machine}", "mig",
                                          "apply", "--config", str(config), "--name", name),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _release_marker(kube: Kube) -> None:
    marker = kube.get_or_none("v1", "ConfigMap", MARKER, NS)
    finalizers = (marker or {}).get("metadata", {}).get("finalizers") or []
    if FINALIZER in finalizers:
        kube.patch("v1", "ConfigMap", MARKER, {"metadata": {"finalizers": [f for f in finalizers if f != FINALIZER]}},
                   NS)


@pytest.fixture(scope="module")
def agents(kube: Kube, dev_stack: AppliedStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    work = tmp_path_factory.mktemp("restart")
    # Unix socket paths are limited to 107 bytes: the DRA and device-plugin roots must be short.
    roots = {role: Path(tempfile.mkdtemp(prefix=f"{role.node}-", dir="/tmp")) for role in ROLES}
    started: list[Agent] = []
    kubelets: list[Any] = []
    try:
        _create_nodes(kube, dev_stack)
        # MIG: the GPUs already carry the node template's layout (run while the identities are fetched).
        mig_template = _template(dev_stack, MIG.node_group)
        build_fake_host(roots[MIG], MIG.machine)
        mig_config = work / "mig-config"
        mig_config.mkdir()
        cm = kube.get("v1", "ConfigMap", "nvidia-gpu-mig-parted-config", NS)  # as the kubelet projects it
        (mig_config / "config.yaml").write_text(cm["data"]["config.yaml"])
        preapply = _mig_apply(roots[MIG], mig_config / "config.yaml", mig_template["labels"][names.MIG_CONFIG])
        ids = {role: identity(kube, role.daemonset, role.node, work / "identities") for role in ROLES}

        # DRA plugin: the rendered args, the host's kubelet and CDI directories under its host root.
        build_fake_host(roots[DRA], DRA.machine, containerd=None)
        boot = roots[DRA] / "proc/sys/kernel/random/boot_id"
        boot.parent.mkdir(parents=True, exist_ok=True)
        boot.write_text("3c0a6f0e-5b1d-4a8e-9f4f-2b7c1d0e9a11\n")
        c = _container(dev_stack, DRA.daemonset)
        dra = Agent("dra", agent_command("--host-root", str(roots[DRA]), "--nvml", f"simulated:{DRA.machine}",
                                         "--kubeconfig", str(ids[DRA].kubeconfig), "--log-level", "info",
                                         *c["args"]), _pod_env(c, DRA.node), work / "dra.log")

        # Labeller: the DaemonSet's loop, a 1 s interval, the group's node flags (daemonset backend).
        lab_host = build_fake_host(roots[LABELLER], LABELLER.machine)
        assert lab_host.machine is not None
        flags, want_labels, want_taints = _node_flags(dev_stack)
        c = _container(dev_stack, LABELLER.daemonset)
        lab_configs = config_map_files(kube.get("v1", "ConfigMap", "device-plugin-config-a100-train", NS)["data"],
                                       work / "lab-configs")  # the device plugin's, mounted into the labeller
        labeller = Agent("labeller", agent_command(
            "--host-root", str(roots[LABELLER]), "--host-exec", "direct", "--nvml", f"simulated:{LABELLER.machine}",
            "--kubeconfig", str(ids[LABELLER].kubeconfig), "--log-level", "info",
            *with_config_dir(_with_interval(list(c["args"]), LABEL_INTERVAL), lab_configs), *flags),
            _pod_env(c, LABELLER.node), work / "labeller.log")

        # Device plugin: the group's named configs as mounted, sockets where the kubelet stand-in listens.
        c = _container(dev_stack, PLUGIN.daemonset)
        configs = work / "dp-configs"
        configs.mkdir()
        for name, text in kube.get("v1", "ConfigMap", "device-plugin-config-a30-mps", NS)["data"].items():
            (configs / name).write_text(text)
        sockets = roots[PLUGIN] / "k"
        dp_host = build_fake_host(roots[PLUGIN] / "host", PLUGIN.machine)
        args = list(c["args"])
        moved = {"--config-dir": str(configs), "--metrics-port": "0"}
        args = [moved.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
        dp_kubelet = DevicePluginKubelet(sockets)
        dp_kubelet.start()
        kubelets.append(dp_kubelet)
        plugin = Agent("device-plugin", agent_command(
            "--host-root", str(dp_host.root), "--host-exec", "direct", "--nvml", f"simulated:{PLUGIN.machine}",
            "--kubeconfig", str(ids[PLUGIN].kubeconfig), "--log-level", "info", *args,
            "--socket-dir", str(sockets), "--config-poll-interval", "60"), _pod_env(c, PLUGIN.node),
            work / "device-plugin.log")

        # MIG manager: the DaemonSet's args with its mounts (the host at /host, the ConfigMap) mapped.
        c = _container(dev_stack, MIG.daemonset)
        mig = Agent("mig", agent_command("--nvml", f"simulated:{MIG.machine}", "--kubeconfig",
                                         str(ids[MIG].kubeconfig), "--log-level", "info",
                                         *_map_mounts(list(c["args"]), {"/host": roots[MIG],
                                                                        "/etc/nvidia-gpu/mig": mig_config})),
                    _pod_env(c, MIG.node), work / "mig.log")
        out, _ = preapply.communicate(timeout=60)
        assert preapply.returncode == 0, out

        for a in (dra, labeller, plugin, mig):
            started.append(a.start())
        dra_kubelet = DraKubelet(roots[DRA])
        kubelets.append(dra_kubelet)
        result = Agents(
            DraPlugin(dra, roots[DRA], dra_kubelet, ids[DRA]),
            Labeller(labeller, lab_host.machine, want_labels, want_taints),
            DevicePlugin(plugin, dp_kubelet, args[args.index("--config-label") + 1],
                         _sim(dp_host.root, PLUGIN.machine).spec.gpu_count, ids[PLUGIN]),
            MigManager(mig, roots[MIG], mig_template.get("taints", [])),
        )
        # Everyone converged before any failure: pool published, Node labelled, plugin registered with the
        # whole GPUs, MIG layout recorded as applied.
        result.dra.register()
        wait_for(functools.partial(_pool, kube, GPUS_H200), timeout=30, what="the H200 pool published")
        _allocate_claim(kube)
        wait_for(lambda: _labeller_converged(kube, result.labeller, gpus=8), timeout=30, interval=0.2,
                 what="the labeller's first patch")
        dp_kubelet.wait_registered({"nvidia.com/gpu"}, timeout=30)
        dp_kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == result.plugin.gpus, timeout=10)
        wait_for(lambda: _mig_given_back(kube, result.mig, mig_template["labels"][names.MIG_CONFIG],
                                         [["1g.10gb"] * 7] * 8),
                 timeout=30, interval=0.2, what="the MIG manager recording the template's layout")
        result.assert_alive()
        yield result
    finally:
        _stop_all(started)
        for a in started:
            print(a.tail())  # shown when a test failed
        for k in kubelets:
            if isinstance(k, DevicePluginKubelet):
                k.stop()
            else:
                k.close()
        # What the kubelet does 30 s after a plugin is gone (kwok does not): wipe its node's slices.
        for s in _slices(kube, DRA.node):
            kube.delete(RESOURCE, "ResourceSlice", s["metadata"]["name"])
        _release_marker(kube)
        kube.delete("v1", "Namespace", CLAIMS_NS)
        for role in ROLES:
            kube.delete("v1", "Node", role.node)
        for root in roots.values():
            shutil.rmtree(root, ignore_errors=True)


GPUS_H200 = {f"gpu-{i}" for i in range(8)}


# --- what "done" looks like for each agent ---------------------------------------------------------------


def _labeller_converged(kube: Kube, lab: Labeller, *, gpus: int) -> dict[str, Any] | None:
    node = _node(kube, LABELLER.node)
    if _labels(node).get("nvidia.com/gpu.count") != str(gpus):
        return None
    try:
        _assert_labeller_consistent(node, lab)
    except AssertionError:
        return None
    return node


def _assert_labeller_consistent(node: dict[str, Any], lab: Labeller) -> None:
    """Everything the labeller applies, applied and recorded together: each requested label and taint
    on the Node once, and its ownership annotations naming exactly those (nothing claimed that is not
    there, nothing there that is not claimed)."""
    labels, taints, notes = _labels(node), _taints(node), _annotations(node)
    _assert_no_duplicate_taints(node)
    assert {k: labels.get(k) for k in lab.want_labels} == lab.want_labels
    present = {_slot(t): t for t in taints}
    for want in lab.want_taints:
        got = present.get(_slot(want))
        assert got is not None and (got.get("value") or "") == want.get("value", ""), (want, taints)
    assert notes.get(names.OWNED_NODE_LABELS) == ",".join(sorted(lab.want_labels))
    assert notes.get(names.OWNED_NODE_TAINTS) == ",".join(sorted(_slot(t) for t in lab.want_taints))


def _play_node_manager(kube: Kube, node: dict[str, Any]) -> None:
    """Deckhouse's node-manager, one step: approve a requested disruption, report a requested drain done
    (the node runs no GPU workload, so there is nothing to evict)."""
    notes = _annotations(node)
    patch: dict[str, str] = {}
    if names.DISRUPTION_REQUIRED in notes and names.DISRUPTION_APPROVED not in notes:
        patch[names.DISRUPTION_APPROVED] = ""
    if names.DRAINING in notes and names.DRAINED not in notes:
        patch[names.DRAINED] = notes[names.DRAINING]
    if patch:
        kube.patch("v1", "Node", node["metadata"]["name"], {"metadata": {"annotations": patch}})


def _mig_given_back(kube: Kube, mig: MigManager, config: str, layout: list[list[str]]) -> dict[str, Any] | None:
    """The Node once the manager has applied ``config`` (the GPUs carry ``layout``) and given the node back,
    playing node-manager meanwhile. The GPUs change only once the node is paused (taint on), so GPUs in
    the new layout with the taint gone and ``state=success`` mean the manager's restore has landed, not
    that the state label still says ``success`` from the config before."""
    node = _node(kube, MIG.node)
    _play_node_manager(kube, node)
    labels, taints = _labels(node), _taints(node)
    done = (labels.get(names.MIG_CONFIG) == config and labels.get(names.MIG_CONFIG_STATE) == "success"
            and not any(t["key"] == TAINT_KEY for t in taints)
            and not any(k in _annotations(node) for k in DRAIN_ANNOTATIONS)
            and _mig_layout(mig) == layout)
    return node if done else None


def _assert_mig_node_clean(node: dict[str, Any], mig: MigManager) -> None:
    """Nothing of a reconfiguration left: no paused deploy labels, no mig-reconfigure taint, the template's
    taints once each, no drain annotations, no failure reason, not cordoned."""
    labels, notes = _labels(node), _annotations(node)
    assert labels[names.MIG_CONFIG_STATE] == "success"
    assert not [k for k in labels if k in DEPLOY_LABELS], labels
    _assert_no_duplicate_taints(node)
    assert [t for t in _taints(node) if not t["key"].startswith("node.kubernetes.io/")] == mig.template_taints
    assert not [k for k in notes if k in DRAIN_ANNOTATIONS or k == names.MIG_FAILURE_REASON], notes
    assert not node["spec"].get("unschedulable")


def _mig_layout(mig: MigManager) -> list[list[str]]:
    """Per GPU, the sorted MIG profiles of its GPU instances, from the simulated machine's state."""
    sim = _sim(mig.root, MIG.machine)
    model = sim.spec.model
    assert model.mig is not None
    out = []
    for g in sim.state.gpus:
        out.append(sorted(_profile_name(model, gi.profile) for gi in g.instances) if g.mig_current else [])
    return out


def _profile_name(model: Any, gi_profile: int) -> str:
    return str(next(p.name for p in model.mig.profiles if p.gi_profile == gi_profile))


def _mig_events(kube: Kube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1", "Event", "default",
                                 fieldSelector=f"involvedObject.kind=Node,involvedObject.name={MIG.node}")
            if e["reason"] == reason]


# --- the outage ------------------------------------------------------------------------------------------


def _unreachable(kube: Kube) -> bool:
    """True while nothing answers on the API server's port (refused or reset), not merely not ready."""
    try:
        kube.request("GET", "/readyz", timeout=1)
    except ApiError:
        return False  # it answers, if only to say it is shutting down
    except OSError:
        return True
    return False


def _log_marks(agents: Agents) -> dict[str, int]:
    return {a.name: len(a.text()) for a in agents.all()}


def _since(agent: Agent, marks: dict[str, int]) -> str:
    return agent.text()[marks[agent.name]:]


#: What each agent logs when a call to the API server fails: proof that it met the outage, then got over it.
FAILURE_LOGS = {
    "dra": ("event=publish-failed",),
    "labeller": ("labelling failed",),
    "device-plugin": ("event=node-watch-failed",),
    "mig": ("event=watch-failed", "event=mig-step-failed"),
}


def _assert_met_the_outage(agents: Agents, marks: dict[str, int]) -> None:
    for a in agents.all():
        seen = _since(a, marks)
        assert any(m in seen for m in FAILURE_LOGS[a.name]), f"{a.name} logged no failed call\n{a.tail()}"
        assert "Traceback" not in seen, a.tail()


def _during_outage(agents: Agents, lost: int, labeller_gpu: Callable[[SimulatedMachine], None]) -> None:
    """Work that arrives while the API server is gone: a GPU of the H200 falls off the bus (the DRA plugin
    must withdraw it) and a change on the labeller's host (its GPU count label must follow)."""
    _sim(agents.dra.root, DRA.machine).lose_gpu(lost)
    labeller_gpu(agents.labeller.host)


@dataclass
class Before:
    generation: int
    registrations: int


def _before(kube: Kube, agents: Agents, devices: set[str]) -> Before:
    slices = wait_for(functools.partial(_pool, kube, devices), timeout=30, what="the pool before the outage")
    agents.assert_alive()
    return Before(_generation(slices), len(agents.plugin.kubelet.registrations))


def _wait_journal_cleared(mig: MigManager) -> None:
    """The journal goes once the node is given back: the manager patches the Node first and clears the journal
    after (a crash in between finds the journal and gives back again), so it may outlive the patch briefly."""
    wait_for(lambda: (not mig.journal.exists()) or None, timeout=10, interval=0.05,
             what="the MIG journal cleared after the node was given back")


def _after_outage(kube: Kube, agents: Agents, before: Before, *, devices: set[str], gpus: int,
                  removed_label: str, removed_taint: dict[str, str], plugin_config: str, plugin_devices: int,
                  mig_config: str, mig_layout: list[list[str]]) -> None:
    """Once the server is back: an administrator's edits (a label and a taint the labeller owns removed in
    one patch; the device plugin's config label; the MIG config label), then every outcome read back."""
    lab, plugin, mig = agents.labeller, agents.plugin, agents.mig
    # The device plugin kept its config through the outage: no re-registration, no flap to its default.
    assert len(plugin.kubelet.registrations) == before.registrations, plugin.kubelet.registrations

    _patch_node(kube, LABELLER.node, lambda n: {
        "metadata": {"labels": {removed_label: None}},
        "spec": {"taints": [t for t in _taints(n) if _slot(t) != _slot(removed_taint)]}})
    t_label = time.monotonic()
    _set_label(kube, PLUGIN.node, plugin.config_label, plugin_config)
    _set_label(kube, MIG.node, names.MIG_CONFIG, mig_config)

    # DRA: the GPU lost while the server was away is withdrawn, in exactly one new pool generation.
    slices = wait_for(functools.partial(_pool, kube, devices), timeout=30, interval=0.2,
                      what=f"the pool without the lost GPU ({sorted(devices)})")
    assert _generation(slices) == before.generation + 1, [s["spec"]["pool"] for s in slices]

    # Labeller: both removals come back in one patch (never one without the other), with the GPU count
    # of the host as it is now; the ownership annotations never lose a key meanwhile.
    def restored() -> dict[str, Any] | None:
        node = _node(kube, LABELLER.node)
        labels, notes = _labels(node), _annotations(node)
        has_label = labels.get(removed_label) == lab.want_labels[removed_label]
        has_taint = any(_slot(t) == _slot(removed_taint) for t in _taints(node))
        assert has_label == has_taint, f"half a patch on the Node: label {has_label}, taint {has_taint}: {node}"
        assert notes.get(names.OWNED_NODE_LABELS) == ",".join(sorted(lab.want_labels)), notes
        _assert_no_duplicate_taints(node)
        return node if has_label and labels.get("nvidia.com/gpu.count") == str(gpus) else None

    node = wait_for(restored, timeout=30, interval=0.05, what="the labeller restoring the label and the taint")
    _assert_labeller_consistent(node, lab)

    # Device plugin: the label change after the restart reaches it over its watch (file polling is 60 s).
    plugin.kubelet.wait_registered({"nvidia.com/gpu"}, timeout=30, after=t_label)
    plugin.kubelet.wait_devices("nvidia.com/gpu", lambda d: len(d) == plugin_devices, timeout=10)

    # MIG manager: the config label set after the restart is applied and the node given back. Allowed
    # 150 s: in about one full run in two the manager's first Node watch after the restart stays silent
    # until its read times out (~70 s seen), a known gap written up in the issue note.
    with _explained(mig.agent):
        node = wait_for(lambda: _mig_given_back(kube, mig, mig_config, mig_layout), timeout=150, interval=0.2,
                        what=f"the MIG manager applying {mig_config}")
    _assert_mig_node_clean(node, mig)
    _wait_journal_cleared(mig)

    _assert_pool_holds(kube, before.generation + 1)
    _assert_labeller_consistent(_node(kube, LABELLER.node), lab)
    agents.assert_alive()


@pytest.mark.timeout(360)  # its own waits bound it (the MIG step alone may take 150 s), not the default
def test_agents_reconnect_after_an_api_server_restart(kube: Kube, control_plane: ControlPlane,
                                                      agents: Agents) -> None:
    """The API server stops (SIGTERM), stays down 2 s and starts again on the same port. While it is
    unreachable a GPU of the H200 falls off the bus and one of the A100 labeller's GPUs is lost; once it
    is back an administrator removes a label and a taint the labeller owns, switches the device plugin's
    config label and the MIG config label. Read back from the server: every agent is the same process
    and met the outage (a failed call logged); the DRA pool drops the lost GPU in exactly one new
    generation; the labeller restores label and taint in one patch (never half), with the new GPU count
    and consistent ownership annotations; the device plugin kept its config through the outage and
    re-registers with time-slicing after the change; the MIG manager applies all-3g.40gb and gives the
    node back clean."""
    before = _before(kube, agents, GPUS_H200)
    marks = _log_marks(agents)
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            control_plane.restart_apiserver(down_s=2)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    thread = threading.Thread(target=restart, name="apiserver-restart")
    thread.start()
    try:
        wait_for(lambda: _unreachable(kube), timeout=60, interval=0.05, what="the API server gone")
        _during_outage(agents, 7, lambda host: host.lose_gpu(7))
        assert _unreachable(kube), "the faults were injected while the server was down"
    finally:
        thread.join(120)
    assert not errors and not thread.is_alive(), errors
    _after_outage(kube, agents, before, devices=GPUS_H200 - {"gpu-7"}, gpus=7,
                  removed_label="gpu.nvidia-gpu.io/node-group", removed_taint=agents.labeller.want_taints[-1],
                  plugin_config="TimeSlicing", plugin_devices=4 * agents.plugin.gpus,
                  mig_config="all-3g.40gb", mig_layout=[["3g.40gb", "3g.40gb"]] * 8)
    _assert_met_the_outage(agents, marks)


#: Seconds the API server hangs: past the labeller's connect timeout (5 s) and the DRA plugin's and the
#: device plugin watch's request timeouts (10 s), so calls in flight time out or are cut by the crash.
HANG_S = 10.5


@pytest.mark.timeout(360)  # its own waits bound it (the MIG step alone may take 150 s), not the default
def test_agents_recover_from_a_hung_then_crashed_api_server(kube: Kube, control_plane: ControlPlane,
                                                            agents: Agents) -> None:
    """The API server stops answering (SIGSTOP: connections are accepted by the kernel, nothing replies)
    for longer than the agents' request timeouts, then crashes (SIGKILL), stays down 2 s and starts
    again. While it hangs another H200 GPU falls off the bus and the A100 labeller's lost GPU is back.
    Afterwards the same outcomes as after a clean restart, with other edits: every agent is the same
    process and resumes by itself (the labeller's calls timed out meanwhile), the pool drops the second
    GPU in one more generation, the labeller's restored label and taint land together with the GPU count
    back at 8, the device plugin switches back to whole GPUs and the MIG manager applies all-2g.20gb.
    The DRA plugin reported each lost GPU once, not on every inventory poll."""
    before = _before(kube, agents, GPUS_H200 - {"gpu-7"})
    marks = _log_marks(agents)
    pid = control_plane.pids["kube-apiserver"]
    os.kill(pid, signal.SIGSTOP)
    try:
        hung_at = time.monotonic()
        _during_outage(agents, 6, lambda host: host.restore_gpu(7))
        with pytest.raises(OSError):  # it accepts the connection and answers nothing
            kube.request("GET", "/readyz", timeout=1)
        time.sleep(max(0.0, HANG_S - (time.monotonic() - hung_at)))  # the outage itself
    finally:
        os.kill(pid, signal.SIGKILL)  # the crash (also releases a hung server if the test failed above)
        control_plane.restart_apiserver(down_s=2)
    _after_outage(kube, agents, before, devices=GPUS_H200 - {"gpu-6", "gpu-7"}, gpus=8,
                  removed_label=names.MIG_CONFIG, removed_taint=agents.labeller.want_taints[0],
                  plugin_config="Exclusive", plugin_devices=agents.plugin.gpus,
                  mig_config="all-2g.20gb", mig_layout=[["2g.20gb"] * 3] * 8)
    _assert_met_the_outage(agents, marks)
    # The hang outlasted the labeller's handshake timeout (5 s on each of urllib3's attempts), so a call
    # begun during the hang timed out. One whose handshake was done when the server stopped waits for its
    # answer (30 s) instead and is cut by the crash: on a loaded machine the stop can land there.
    since = _since(agents.labeller.agent, marks)
    assert "Read timed out" in since or "Remote end closed connection without response" in since, \
        agents.labeller.agent.tail()
    # A GPU that stays lost is reported when it is lost, not on every inventory poll (twice a second).
    dra_log = agents.dra.agent.text()
    assert (dra_log.count("event=gpu-lost index=7"), dra_log.count("event=gpu-lost index=6")) == (1, 1)


# --- killed mid-operation ----------------------------------------------------------------------------------


def _journal(mig: MigManager) -> dict[str, Any] | None:
    """The journal's data as the manager wrote it (the agent's state-file format, checksum checked)."""
    try:
        _, data = statefile.decode(mig.journal.read_bytes(), JOURNAL_VERSION)
    except (FileNotFoundError, statefile.StateFileProblem):
        return None  # absent, or caught between the temp file's write and its rename
    return data


def test_mig_manager_killed_mid_layout_resumes_and_gives_the_node_back(kube: Kube, agents: Agents) -> None:
    """The MIG manager is SIGKILLed in the middle of a layout change: its journal says phase ``layout``
    (attempt 1), the Node is paused (state pending, deploy labels paused, the mig-reconfigure taint),
    seven GPUs carry the new layout and the last still the old one (its NVML calls hung when the kill
    came). Restarted with the same arguments and identity, it resumes from the journal (no new
    reconfiguration begins, only the last GPU is changed), finishes with ``state=success`` and gives
    the node back as it was: deploy labels gone, the mig-reconfigure taint removed, the template's
    taint once, the journal cleared, one MigReconfigured Event for the layout."""
    mig = agents.mig
    target, old = "all-1g.10gb", [["2g.20gb"] * 3] * 8
    assert _mig_layout(mig) == old
    sim = _sim(mig.root, MIG.machine)
    events_before = {e["metadata"]["name"] for e in _mig_events(kube, "MigReconfigured")}
    hung = threading.Event()
    stop = threading.Event()

    def hang_the_last_gpu() -> None:
        """Once the manager has journaled the layout step and rebuilt GPU 0, GPU 7's NVML calls hang, so
        the kill finds the layout half-applied (the manager works through the GPUs in order)."""
        while not stop.is_set():
            j = _journal(mig)
            if j and j.get("phase") == "layout" and j.get("attempts", 0) >= 1 and \
                    len(sim.state.gpus[0].instances) == 7:
                sim.hang_gpu(7)
                hung.set()
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=hang_the_last_gpu, name="hang-gpu-7", daemon=True)
    watcher.start()
    try:
        _set_label(kube, MIG.node, names.MIG_CONFIG, target)

        def layout_under_way() -> bool:
            _play_node_manager(kube, _node(kube, MIG.node))
            return hung.is_set()

        wait_for(layout_under_way, timeout=60, interval=0.05, what="the manager in the layout phase")
        want = ["1g.10gb"] * 7
        wait_for(lambda: _mig_layout(mig)[:7] == [want] * 7, timeout=30, interval=0.05,
                 what="GPUs 0-6 rebuilt, the manager stuck on GPU 7")
        assert _mig_layout(mig)[7] == old[7], "GPU 7 still has the old layout"
        journal = _journal(mig)
        assert journal is not None and (journal["phase"], journal["attempts"], journal["config"]) == \
            ("layout", 1, target), journal
        node = _node(kube, MIG.node)
        labels = _labels(node)
        assert labels[names.MIG_CONFIG_STATE] == "pending"
        assert all(labels.get(k) == names.PAUSED_FOR_MIG_CHANGE for k in DEPLOY_LABELS), labels
        assert [t["key"] for t in _taints(node)].count(TAINT_KEY) == 1
        mig.agent.kill()
    finally:
        stop.set()
        watcher.join(5)
        sim.restore_gpu(7)  # the GPU answers again (a hang past the limit would have ended by itself)

    assert _journal(mig) == journal, "SIGKILL: nothing ran after the kill"
    marks = _log_marks(agents)
    mig.agent.start()
    node = wait_for(lambda: _mig_given_back(kube, mig, target, [want] * 8), timeout=60, interval=0.2,
                    what="the restarted manager finishing the layout")
    _assert_mig_node_clean(node, mig)
    _wait_journal_cleared(mig)
    log = _since(mig.agent, marks)
    assert "event=mig-reconfigure-begin" not in log, "resumed from the journal, not begun again"
    assert f"event=mig-reconfigure-end config={target} outcome=success" in log, mig.agent.tail()
    assert "event=mig-layout gpu=7" in log and "event=mig-layout gpu=0" not in log, "only GPU 7 was left"
    [event] = [e for e in _mig_events(kube, "MigReconfigured") if e["metadata"]["name"] not in events_before]
    assert event["message"] == f"MIG config {target!r} applied", event
    assert mig.agent.alive(), mig.agent.tail()


def _allocate_claim(kube: Kube) -> None:
    """A ResourceClaim for GPU 0 of the H200 (by its UUID: GPUs 6 and 7 fall off the bus later) and a pod
    on that node using it; kube-scheduler allocates it from the plugin's pool. Made before any outage:
    after an API server restart the scheduler's informers take their own back-off (up to half a minute
    here), which is the scheduler's business, not the agents'."""
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CLAIMS_NS}})
    wait_for(lambda: kube.get_or_none("v1", "ServiceAccount", "default", CLAIMS_NS), timeout=30,
             what=f"the default ServiceAccount of {CLAIMS_NS}")
    gpu0 = next(d for s in _slices(kube, DRA.node) for d in s["spec"]["devices"] if d["name"] == "gpu-0")
    uuid = gpu0["attributes"]["uuid"]["string"]
    exactly = {"deviceClassName": DRIVER,
               "selectors": [{"cel": {"expression": f"device.attributes['{DRIVER}'].uuid == '{uuid}'"}}]}
    kube.create({"apiVersion": RESOURCE, "kind": "ResourceClaim",
                 "metadata": {"name": "one-gpu", "namespace": CLAIMS_NS},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
    kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer", "namespace": CLAIMS_NS},
                 "spec": {"nodeSelector": {"kubernetes.io/hostname": DRA.node}, "tolerations": GPU_TAINT_TOLERATION,
                          "containers": [{"name": "c", "image": "ubuntu:22.04", "command": ["sleep", "infinity"],
                                          "resources": {"claims": [{"name": "gpu"}]}}],
                          "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}]}})

    wait_for(functools.partial(_allocated, kube), timeout=30, interval=0.2, what="the claim allocated by the scheduler")


def _allocated(kube: Kube) -> dict[str, Any] | None:
    claim: dict[str, Any] = kube.get(RESOURCE, "ResourceClaim", "one-gpu", CLAIMS_NS)
    return claim if claim.get("status", {}).get("allocation") else None


def test_dra_plugin_killed_between_prepare_and_unprepare_keeps_its_claim(kube: Kube, agents: Agents) -> None:
    """A claim the scheduler allocated on the H200 node is prepared through the kubelet stand-in, then the
    plugin is SIGKILLed before the claim's unprepare. Restarted on the same host root, its checkpoint
    still holds the claim: the kubelet's repeated prepare returns the same devices and CDI device IDs
    (the CDI spec untouched), unprepare then removes the spec and the checkpoint entry, and the pool is
    neither withdrawn nor republished (same slice, same generation, no duplicate device)."""
    dra = agents.dra
    claim = _allocated(kube)
    assert claim is not None, "allocated when the module started"
    ref = (CLAIMS_NS, "one-gpu", claim["metadata"]["uid"])
    uid = ref[2]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (DRIVER, DRA.node, "gpu-0")
    slices = _slices(kube, DRA.node)
    prepared = dra.kubelet.prepare(DRIVER, [ref]).claims[uid]
    assert prepared.error == "", f"{prepared.error}\n{dra.agent.tail()}"
    first = [(d.device_name, list(d.cdi_device_ids)) for d in prepared.devices]
    assert first == [(result["device"], [f"k8s.{DRIVER}/claim={uid}-{result['device']}"])]
    spec = dra.root / f"var/run/cdi/k8s.{DRIVER}-claim_{uid}.json"
    spec_bytes = spec.read_bytes()
    checkpoint = dra.root / "var/lib/nvidia-gpu-agent/dra/checkpoint.json"
    assert json.loads(checkpoint.read_bytes())["data"]["preparedClaims"][uid]["state"] == "PrepareCompleted"

    inode = dra.registration_socket.stat().st_ino
    dra.agent.kill()
    dra.kubelet.close()
    assert spec.read_bytes() == spec_bytes
    dra.agent.start()
    dra.register(previous_inode=inode)

    again = dra.kubelet.prepare(DRIVER, [ref]).claims[uid]
    assert again.error == "", f"{again.error}\n{dra.agent.tail()}"
    assert [(d.device_name, list(d.cdi_device_ids)) for d in again.devices] == first
    assert spec.read_bytes() == spec_bytes, "the recorded claim is returned, not prepared again"
    _assert_pool_holds(kube, _generation(slices))
    after = _slices(kube, DRA.node)
    assert [(s["metadata"]["uid"], s["spec"]) for s in after] == [(s["metadata"]["uid"], s["spec"]) for s in slices]
    _devices(after)  # no device twice

    done = dra.kubelet.unprepare(DRIVER, [ref]).claims[uid]
    assert done.error == "", done.error
    assert not spec.exists()
    assert uid not in json.loads(checkpoint.read_bytes())["data"]["preparedClaims"]
    assert "event=rollback-on-start" not in dra.agent.text(), "a completed claim is kept, not rolled back"
    assert dra.agent.alive(), dra.agent.tail()


# --- a refusal that does not last ------------------------------------------------------------------------

PLUGIN_ROLE = "nvidia-gpu-device-plugin"


def _must(probe: Callable[[], object], *, timeout: float, what: str) -> None:
    """A precondition: its timeout is an AssertionError, so a failure says which step did not happen."""
    try:
        wait_for(probe, timeout=timeout, interval=0.02, what=what)
    except TimeoutError as e:
        raise AssertionError(str(e)) from None


def test_device_plugin_watch_watches_again_after_a_passing_refusal(kube: Kube, agents: Agents) -> None:
    """Right after the API server restarts in this suite, kube-scheduler's first watches are refused (403:
    the authorizer's caches are not filled yet). Modelled here by withdrawing ``watch`` from the device
    plugin's ClusterRole for a moment, then giving it back: the plugin's Node watch (the class the
    ``device-plugin`` process runs, with that process's pod identity; the server ends each watch after a
    second, so the next request meets the refusal) must return to watching, so a label change reaches it
    within seconds and not at its next re-list (30 s here)."""
    role = kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", PLUGIN_ROLE)
    rules = role["rules"]
    node_rule = next(i for i, r in enumerate(rules) if "nodes" in r["resources"])
    assert "watch" in rules[node_rule]["verbs"]
    refused = [dict(r, verbs=[v for v in r["verbs"] if v != "watch"]) if i == node_rule else r
               for i, r in enumerate(rules)]
    me, key = agents.plugin.identity.kube, agents.plugin.config_label
    w = NodeLabelWatch(PLUGIN.node, key, kubeconfig=agents.plugin.identity.kubeconfig, timing=WatchTiming(
        request_timeout_s=5, watch_timeout_s=1, read_slack_s=5, backoff_initial_s=0.05, backoff_max_s=0.5,
        relist_interval_s=30))
    initial = w.label()
    w.start()
    try:
        _must(lambda: w.watches >= 1, timeout=10, what="the watch opened")
        try:
            kube.patch("rbac.authorization.k8s.io/v1", "ClusterRole", PLUGIN_ROLE, {"rules": refused})
            _must(lambda: w.poll_only, timeout=15, what="a watch request refused (403)")
        finally:
            kube.patch("rbac.authorization.k8s.io/v1", "ClusterRole", PLUGIN_ROLE, {"rules": rules})
        _must(lambda: me.can_i("watch", "nodes"), timeout=10, what="watch allowed again")
        value = "TimeSlicing" if initial != "TimeSlicing" else "Exclusive"
        _set_label(kube, PLUGIN.node, key, value)
        wait_for(lambda: w.label() == value, timeout=5, interval=0.05, what="the change delivered by a watch")
    finally:
        w.stop()
        assert kube.get("rbac.authorization.k8s.io/v1", "ClusterRole", PLUGIN_ROLE)["rules"] == rules
