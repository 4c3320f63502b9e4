"""Every agent command line the components render is accepted by the agent's own parser.

The DaemonSets run ``python -m node_agent ...``; a flag the agent does not know would crash-loop the
pods on every node, so each container's args (and the setup pod's preStop command) are parsed here
with ``node_agent.cli.build_parser`` for every node group of both shipped stacks and both backends.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from node_agent.cli import build_parser
from node_agent.cli import mig as mig_cli
from node_agent.cli import setup as setup_cli
from node_agent.deviceplugin.allocate import Mount
from node_agent.deviceplugin.config import Settings
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.kubelet.deviceplugin.process import DEFAULT_METRICS_PORT
from node_agent.kubelet.dra import process as dra_process
from node_agent.status.server import StatusServer
from nvgpu import devicelist, labels
from nvgpu.driver import KernelModules
from nvgpu.stackconfig import (
    AllocationMode,
    Cluster,
    GroupPlan,
    NodeGroup,
    NodeSetupBackend,
    load_stack_config,
    load_stack_file,
)
from nvidia_gpu.components.manifests import dra, driver, mig, monitoring, workloads
from nvidia_gpu.components.manifests.sharing import render_named_configs
from nvidia_gpu.components.manifests.workloads import GroupContext
from nvidia_gpu.components.node_group import node_scripts
from tests.nvidia_gpu.components.component_helpers import agent_container

ROOT = Path(__file__).resolve().parents[3]
STACKS = sorted(ROOT.glob("Pulumi.*.yaml"))
_GLOBALS_WITH_VALUE = {"--host-root", "--host-exec", "--nvml", "--nvml-state", "--node-name", "--kubeconfig",
                       "--log-level", "--driver-root"}


def _command_lines(ds: dict[str, Any]) -> list[list[str]]:
    pod = ds["spec"]["template"]["spec"]
    lines = []
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if c["command"] == workloads.AGENT:
            lines.append(list(c["args"]))
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
        if pre_stop:
            assert pre_stop[: len(workloads.AGENT)] == workloads.AGENT
            lines.append(pre_stop[len(workloads.AGENT):])
    return lines


def _parse(argv: list[str]) -> Any:
    i = 0
    while argv[i].startswith("--"):
        i += 2 if argv[i] in _GLOBALS_WITH_VALUE else 1
    return build_parser(argv[i]).parse_args(argv)


def _ctx(cluster: Cluster, group: NodeGroup) -> GroupContext:
    """The group's workloads' context, its plan computed from ``cluster`` as the components compute it."""
    return GroupContext(cluster.namespace, cluster, group, GroupPlan.of(cluster, group))


@pytest.mark.parametrize("stack", STACKS, ids=lambda p: p.name)
def test_rendered_agent_command_lines_parse(stack: Path) -> None:
    cfg = load_stack_file(stack)
    builders = [workloads.device_plugin_daemonset, workloads.labeller_daemonset]
    if cfg.cluster.node_setup is NodeSetupBackend.DAEMONSET:
        builders.append(workloads.setup_daemonset)
    parsed = 0
    for group in cfg.node_groups:
        ctx = _ctx(cfg.cluster, group)
        for build in builders:
            for argv in _command_lines(build(ctx)):
                args = _parse(argv)
                assert args.command == next(a for a in argv if not a.startswith("-")
                                            and a not in (workloads.HOST_ROOT, workloads.CONTAINER_DRIVER_ROOT))
                assert args.driver_root == workloads.CONTAINER_DRIVER_ROOT
                parsed += 1
    assert parsed >= 2 * len(cfg.node_groups)


def test_labeller_arguments_reach_the_labels_command() -> None:
    cfg = load_stack_file(ROOT / "Pulumi.dev.yaml")
    group = next(g for g in cfg.node_groups if g.gpu.sharing.value == "TimeSlicing")
    args = _parse(workloads.labeller_args(_ctx(cfg.cluster, group)))
    assert (args.loop, args.patch_node, args.replicas, args.sharing_strategy) == (True, True, None, None)
    assert (str(args.config_dir), args.config_label, args.default_config) == (
        workloads.DEVICE_PLUGIN_CONFIG_DIR, labels.DEVICE_GPU_CONFIG, "TimeSlicing")


def _plugin_container(ds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    pod = ds["spec"]["template"]["spec"]
    return pod["containers"][0], {v["name"]: v for v in pod["volumes"]}


@pytest.mark.parametrize("stack", STACKS, ids=lambda p: p.name)
def test_device_plugin_pod_gives_the_plugin_what_it_uses(stack: Path) -> None:
    """Env for the NVIDIA runtime, probes on the plugin's own endpoints, the MPS shm the clients share."""

    cfg = load_stack_file(stack)
    for group in cfg.node_groups:
        ds = workloads.device_plugin_daemonset(_ctx(cfg.cluster, group))
        container, _ = _plugin_container(ds)
        env = {e["name"]: e.get("value") for e in container["env"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        security = container["securityContext"]
        assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        assert "/dev" not in mounts  # the GPUs' nodes come from the NVIDIA runtime, not a writable host /dev
        # Unprivileged, no capabilities (SYS_ADMIN for MIG: the runtime then mounts the MIG caps), MPS groups
        # too: their control daemon runs in its own DaemonSet (workloads.mps_control_daemon_daemonset).
        assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
        mig = group.gpu.sharing.value == "MIG"
        assert security["capabilities"] == {"drop": ["ALL"], **({"add": ["SYS_ADMIN"]} if mig else {})}
        assert (env.get("NVIDIA_MIG_MONITOR_DEVICES") == "all") is mig
        # The GPUs asked for as the volume-mounts list does (the toolkit ignores the variable here).
        assert env["NVIDIA_VISIBLE_DEVICES"] == devicelist.VOLUME_MOUNT_ROOT
        assert mounts[f"{devicelist.VOLUME_MOUNT_ROOT}/all"]["readOnly"] is True
        args = _parse(container["args"])
        assert args.metrics_port == DEFAULT_METRICS_PORT == container["ports"][0]["containerPort"]
        probes = {k: container[k]["httpGet"] for k in ("startupProbe", "readinessProbe", "livenessProbe")
                  if k in container}
        # Readiness only: the status port is optional, and liveness is the plugin's own watchdog.
        assert {k: (p["path"], p["port"]) for k, p in probes.items()} == {"readinessProbe": ("/readyz", "metrics")}
        assert "/dev/shm" not in mounts
        if group.gpu.sharing.value == "MPS":
            # Allocate mounts <mpsRoot>/shm at /dev/shm in clients; the daemon must see the same directory.
            mps_root = yaml.safe_load(render_named_configs(group)["MPS"])["flags"]["mpsRoot"]
            daemon, daemon_volumes = _plugin_container(workloads.mps_control_daemon_daemonset(
                _ctx(cfg.cluster, group)))
            daemon_mounts = {m["mountPath"]: m for m in daemon["volumeMounts"]}
            assert Mount("/dev/shm", f"{mps_root}/shm").host_path == daemon_volumes[
                daemon_mounts["/dev/shm"]["name"]]["hostPath"]["path"]
            assert daemon_volumes[daemon_mounts[mps_root]["name"]]["hostPath"]["path"] == mps_root
        # NVML from the driver root (--driver-root), also the plugin's containerDriverRoot for CDI specs.
        assert mounts[Settings().container_driver_root]["readOnly"] is True
        assert args.driver_root == Settings().container_driver_root


def test_device_plugin_status_endpoints_answer_the_probe_paths() -> None:
    """The probe paths are the plugin's real endpoints: 200 when live and registered, 503 when not."""

    cfg = load_stack_file(STACKS[0])
    container, _ = _plugin_container(workloads.device_plugin_daemonset(
        _ctx(cfg.cluster, cfg.node_groups[0])))
    paths = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "readinessProbe", "livenessProbe")
             if k in container}
    state = {"live": True, "ready": False}
    server = StatusServer(PluginMetrics(), lambda: state["live"], lambda: state["ready"], host="127.0.0.1")
    server.start()

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert {k: status(p) for k, p in paths.items()} == {"readinessProbe": 503}
        state["ready"] = True
        assert {status(p) for p in paths.values()} == {200}
    finally:
        server.stop()


def test_device_plugin_mounts_the_driver_root_read_only_whatever_the_device_list_strategy() -> None:
    """CDI specs (cdi-cri, cdi-annotations) and NVML both need the driver root: it is always mounted."""
    cfg = load_stack_file(STACKS[0])
    container, volumes = _plugin_container(workloads.device_plugin_daemonset(
        _ctx(cfg.cluster, cfg.node_groups[0])))
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == Settings().container_driver_root)
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"]["path"] == Settings().nvidia_driver_root
    assert "--nvidia-driver-root" not in container["args"]  # the plugin's own default, /
    assert workloads.uses_cdi([{"flags": {"plugin": {"deviceListStrategy": "cdi-annotations"}}}])
    assert not workloads.uses_cdi([{"flags": {"plugin": {"deviceListStrategy": ["envvar", "volume-mounts"]}}}])


def test_a_driver_container_root_reaches_the_mount_and_the_plugins_cdi_root() -> None:
    cfg = load_stack_file(STACKS[0])
    cluster = cfg.cluster.model_copy(update={"driver_root": "/run/nvidia/driver"})
    container, volumes = _plugin_container(workloads.device_plugin_daemonset(
        _ctx(cluster, cfg.node_groups[0])))
    assert volumes["driver-root"]["hostPath"] == {"path": "/run/nvidia/driver", "type": "DirectoryOrCreate"}
    args = _parse(container["args"])
    assert (args.driver_root, args.nvidia_driver_root) == ("/driver-root", "/run/nvidia/driver")


def test_every_agents_metrics_port_is_the_one_its_pod_names_and_its_monitor_scrapes() -> None:
    """DRA plugin, MIG manager and node setup's monitor: the port each agent serves by default, the port its
    rendered command line passes, the container port named ``metrics`` and the scrape target are one."""
    cfg = load_stack_file(next(p for p in STACKS if p.name == "Pulumi.dev.yaml"))
    cluster = cfg.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET})
    dra_group = next(g for g in cfg.node_groups if cfg.allocation_mode(g).value == "dra")
    pods = {
        dra.COMPONENT: (dra.plugin_daemonset(cluster.namespace, cluster, dra_group, GroupPlan.of(cluster, dra_group)),
                        dra_process.DEFAULT_METRICS_PORT),
        mig.COMPONENT: (mig.daemonset(cluster.namespace, cluster, cfg.node_groups), mig_cli.DEFAULT_METRICS_PORT),
        "gpu-setup": (workloads.setup_daemonset(_ctx(cluster, cfg.node_groups[0])),
                      setup_cli.DEFAULT_METRICS_PORT),
    }
    plans = {g.name: GroupPlan.of(cluster, g) for g in cfg.node_groups}
    scraped = {t.component: t.port for t in monitoring.targets(cluster, cfg.node_groups, plans)}
    for component, (ds, default) in pods.items():
        container = agent_container(ds)
        args = _parse(container["args"])
        assert args.metrics_port == default == container["ports"][0]["containerPort"] == scraped[component], component
        assert container["ports"][0]["name"] == "metrics"


@pytest.mark.parametrize("required", [False, True])
def test_the_stack_decides_whether_a_taken_status_port_stops_an_agent(required: bool) -> None:
    """cluster.monitoring.requireStatusPort reaches every agent that serves a status port beside its job
    (device plugin, DRA plugin, MIG manager, node setup's monitor, the driver pod's check), parsed by the
    agent's own parser; the exporter always needs its port and takes no such flag."""
    cfg = load_stack_file(next(p for p in STACKS if p.name == "Pulumi.dev.yaml"))
    monitoring = cfg.cluster.monitoring.model_copy(update={"require_status_port": required})
    cluster = cfg.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET, "monitoring": monitoring})
    dra_group = next(g for g in cfg.node_groups if cfg.allocation_mode(g).value == "dra")
    ctx = _ctx(cluster, cfg.node_groups[0])
    command_lines = {
        "device-plugin": workloads.device_plugin_daemonset(ctx)["spec"]["template"]["spec"]["containers"][0]["args"],
        "dra-driver": dra.plugin_args(cluster, cluster.namespace, GroupPlan.of(cluster, dra_group)),
        "mig-manager": mig.manager_args(cluster),
        "setup-monitor": agent_container(workloads.setup_daemonset(ctx))["args"],
        "driver-check": driver.check_container(cluster, cfg.node_groups[0])["args"],
    }
    for name, argv in command_lines.items():
        assert _parse(list(argv)).metrics_port_required is required, name


def test_the_declared_driver_reaches_both_node_setup_backends() -> None:
    """A group's gpu.driver (version, kernelModules) is what setup's check and the monitor compare with on the
    daemonset backend (parsed by the agent's own parser) and what gpu-check.sh compares with on Deckhouse."""
    values = {"cluster": {"kubernetesVersion": "1.34", "nodeSetup": "daemonset",
                          "agentImage": {"repository": "registry.example.com/agent", "tag": "1.0.0"}},
              "nodeGroups": [{"name": "h100", "nodeSelector": {"matchLabels": {"pool": "h100"}},
                              "gpu": {"model": "H100-80GB", "driver": {"version": "550", "kernelModules": "open"}}}]}
    cfg = load_stack_config(values)
    ds = workloads.setup_daemonset(_ctx(cfg.cluster, cfg.node_groups[0]))
    pod = ds["spec"]["template"]["spec"]
    for container in (pod["initContainers"][0], agent_container(ds)):
        args = _parse(container["args"])
        assert (args.expect_driver.text, args.expect_kernel_modules) == ("550", "open"), container["name"]
    deckhouse = cfg.cluster.model_copy(update={"node_setup": NodeSetupBackend.DECKHOUSE})
    (check,) = [s for s in node_scripts(GroupPlan.of(deckhouse, cfg.node_groups[0], AllocationMode.DEVICE_PLUGIN))
                if s.name == "gpu-check.sh"]
    assert 'EXPECT_DRIVER="${NVIDIA_GPU_EXPECT_DRIVER-550}"' in check.content
    assert f'EXPECT_MODULES="${{NVIDIA_GPU_EXPECT_MODULES-{KernelModules.OPEN.value}}}"' in check.content


def test_a_driver_containers_root_is_the_toolkits_on_both_backends() -> None:
    """Pulumi.drivers.yaml: setup tells the agent's runtime step, and gpu-check.sh's sibling gpu-runtime.sh
    on Deckhouse, to point the host toolkit's nvidia-container-cli at /run/nvidia/driver."""
    cfg = load_stack_file(next(p for p in STACKS if p.name == "Pulumi.drivers.yaml"))
    group = cfg.node_groups[0]
    ds = workloads.setup_daemonset(_ctx(cfg.cluster, group))
    args = _parse(ds["spec"]["template"]["spec"]["initContainers"][0]["args"])
    assert args.toolkit_driver_root == "/run/nvidia/driver"
    deckhouse = cfg.cluster.model_copy(update={"node_setup": NodeSetupBackend.DECKHOUSE})
    group = group.model_copy(update={"node_group": "gpu-h100", "node_selector": None})
    plan = GroupPlan.of(deckhouse, group, AllocationMode.DEVICE_PLUGIN)
    (runtime,) = [s for s in node_scripts(plan) if s.name == "gpu-runtime.sh"]
    assert 'TOOLKIT_ROOT="${NVIDIA_GPU_TOOLKIT_ROOT-/run/nvidia/driver}"' in runtime.content
    dev = load_stack_file(next(p for p in STACKS if p.name == "Pulumi.dev.yaml"))
    ds = workloads.setup_daemonset(_ctx(dev.cluster.model_copy(update={"node_setup": NodeSetupBackend.DAEMONSET}),
                                        dev.node_groups[0]))
    assert _parse(ds["spec"]["template"]["spec"]["initContainers"][0]["args"]).toolkit_driver_root == "/"
