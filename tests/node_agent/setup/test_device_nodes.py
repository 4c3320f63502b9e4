"""Device nodes on a freshly booted node: ``nvidia-uvm`` loaded and the ``/dev/nvidia*`` nodes made as NVIDIA does.

The simulated host's fresh-boot mode (``lay_out(fresh_boot=True)``) is a node right after boot: the ``nvidia``
module loaded, ``/proc/devices`` and ``mig-minors`` as the driver writes them, no ``nvidia_uvm`` and no device
node. Setup must load the module and make the nodes with the kernel's numbers (``nvidia-ctk system
create-device-nodes``), undo only what it made, and the plugins must see nodes made after they started.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from node_agent.cli.context import AgentContext
from node_agent.deviceplugin import cdi, config
from node_agent.deviceplugin.allocate import Allocator
from node_agent.deviceplugin.cdi import CDI_KIND
from node_agent.deviceplugin.health import HealthPolicy
from node_agent.deviceplugin.metrics import PluginMetrics
from node_agent.deviceplugin.plugin import NodePlugins
from node_agent.deviceplugin.resources import build_resources
from node_agent.host import HostError, HostRoot
from node_agent.host.proc import parse_mig_minors
from node_agent.host.root import CommandResult
from node_agent.mig.nvmlbackend import NvmlMigBackend, SimulatedReset
from node_agent.nvml import open_nvml
from node_agent.setup import devnodes
from nvgpu import catalogue, labels
from nvgpu.migparted import build_config
from nvml_sim.host import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, device_node_stand_in
from tests.kit.fakehost import FakeHost, build_fake_host
from tests.kit.recording_exec import RecordingExec
from tests.node_agent.agent_testkit import ApiServer, Cli
from tests.node_agent.deviceplugin.builders import FakeNode, full_gpu
from tests.node_agent.mig.fakes import FakeBackend
from tests.node_agent.mig.harness import Rig, mig_node

A30 = "simulated:a30x4"


def _node(host: FakeHost, path: str) -> tuple[str, int]:
    """What the simulated host's mknod left at ``path``: ``c <major>:<minor>`` and the mode."""
    local = host.path(path)
    return local.read_text().strip(), local.stat().st_mode & 0o777


def test_proc_devices_reads_the_character_section_only() -> None:
    text = ("Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps\n511 nvidia-uvm\n\n"
            "Block devices:\n  8 sd\n511 nvidia-uvm-block\n")
    assert devnodes.parse_proc_devices(text) == {"mem": 1, "nvidia-frontend": 195, "nvidia-caps": 234,
                                                 "nvidia-uvm": 511}


def test_setup_on_a_fresh_boot_node_loads_uvm_and_makes_the_nodes(tmp_path: Path, cli: Cli,
                                                                   api_server: ApiServer) -> None:
    host = build_fake_host(tmp_path, "a30x4", containerd=2, deckhouse=False, fresh_boot=True)
    assert not host.path("/dev/nvidia-uvm").exists() and not host.path("/dev/nvidiactl").exists()
    host.put("/dev/nvidia-modeset", "an admin's node\n")  # there before setup: never touched
    kube = {"node": "gpu-node-1", "kubeconfig": api_server.kubeconfig}
    code, doc = cli(host.root, A30, "setup", **kube)
    assert (code, doc["complete"]) == (0, True), doc
    assert host.log("modprobe") == ["nvidia-uvm"]
    assert "loaded nvidia-uvm" in doc["steps"][0]["detail"]
    assert _node(host, "/dev/nvidiactl") == (f"c {NVIDIA_MAJOR}:255", 0o666)
    assert _node(host, "/dev/nvidia-uvm") == (f"c {UVM_MAJOR}:0", 0o666)
    assert _node(host, "/dev/nvidia-uvm-tools") == (f"c {UVM_MAJOR}:1", 0o666)
    assert [_node(host, f"/dev/nvidia{i}")[0] for i in range(4)] == [f"c {NVIDIA_MAJOR}:{i}" for i in range(4)]
    assert _node(host, "/dev/nvidia-caps/nvidia-cap1") == (f"c {CAPS_MAJOR}:1", 0o400)  # config: root only
    assert _node(host, "/dev/nvidia-caps/nvidia-cap2") == (f"c {CAPS_MAJOR}:2", 0o444)  # monitor
    assert host.path("/dev/nvidia-modeset").read_text() == "an admin's node\n"

    code, doc = cli(host.root, A30, "setup", **kube)  # idempotent: nothing loaded or made again
    assert code == 0 and host.log("modprobe") == ["nvidia-uvm"] and "made" not in doc["steps"][0]["detail"]

    code, doc = cli(host.root, A30, "teardown", **kube)
    assert (code, doc["complete"]) == (0, True), doc
    assert sorted(p.name for p in host.path("/dev").iterdir()) == ["nvidia-modeset"]  # only what setup made went


def test_a_node_that_cannot_load_uvm_fails_setup_with_the_reason(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4", fresh_boot=True)
    executor = RecordingExec({"modprobe": lambda call: CommandResult(
        call.argv, 1, "", "modprobe: FATAL: Module nvidia-uvm not found in directory /lib/modules/5.15.0")})
    root = HostRoot(host.root, executor=executor, mknod=device_node_stand_in)
    with pytest.raises(HostError, match="modprobe nvidia-uvm failed \\(exit 1\\): modprobe: FATAL: Module nvidia-uvm"):
        devnodes.ensure(root)
    assert executor.argvs == [["modprobe", "nvidia-uvm"]]
    assert not host.path("/dev/nvidiactl").exists()


def test_device_plugin_passes_uvm_made_after_it_started(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4", fresh_boot=True)
    root = HostRoot(host.root, mknod=device_node_stand_in)
    devnodes.ensure(root, load_modules=False)  # nvidiactl and the GPU nodes: uvm's major is not there yet
    assert not host.path("/dev/nvidia-uvm").exists()
    settings = config.load("flags:\n  plugin:\n    passDeviceSpecs: true\n")
    gpus = [full_gpu(i, catalogue.A30_24GB, "a30x4") for i in range(4)]
    (resource,) = build_resources(gpus, settings, root)
    allocator = Allocator(resource, settings, root)  # the plugin is up before setup finished
    assert [d.container_path for d in allocator.allocate([gpus[0].uuid]).devices] == [
        "/dev/nvidiactl", "/dev/nvidia-modeset", "/dev/nvidia0"]
    assert devnodes.ensure(root).created == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert [d.container_path for d in allocator.allocate([gpus[0].uuid]).devices] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia0"]


def test_mig_apply_makes_the_new_instances_caps_nodes(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path / "host", "a30x4", fresh_boot=True)
    config_file = tmp_path / "mig.yaml"
    config_file.write_text(build_config().to_yaml())
    code, doc = cli(host.root, A30, "mig", "apply", "--config", str(config_file), "--name", "all-2g.12gb")
    assert code == 0, doc
    args = argparse.Namespace(host_root=str(host.root), host_exec="direct", nvml=A30, nvml_state=None)
    with open_nvml(AgentContext.from_args(args).nvml_backend) as session:
        caps = NvmlMigBackend(session, SimulatedReset("a30x4")).mig_caps()
        assert len(caps) == 4 * 2 * 2  # 4 GPUs x 2 instances x (GI + CI)
    table = parse_mig_minors(host.path("/proc/driver/nvidia-caps/mig-minors").read_text())
    for cap in caps:  # each instance's caps node, with the driver's minor, readable by all as the driver makes it
        assert _node(host, f"/dev/nvidia-caps/nvidia-cap{table[cap]}") == (f"c {CAPS_MAJOR}:{table[cap]}", 0o444)
    assert not host.path(f"/dev/nvidia-caps/nvidia-cap{table['gpu0/gi14/access']}").exists()  # no node for a free slot


def test_mig_manager_makes_device_nodes_once_the_layout_is_applied() -> None:
    rig = mig_node(Rig(FakeBackend.of("A30-24GB", count=2, reset_needs=False)), "all-2g.12gb")
    seen: list[list[dict[str, int]]] = []
    manager = rig.manager()
    manager.device_nodes = lambda: seen.append([rig.backend.layout(i) for i in range(2)])
    rig.converge(manager=manager)
    assert seen == [[{"2g.12gb": 2}] * 2]  # after the new instances exist, once
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "success"


def test_mig_manager_carries_on_when_device_nodes_cannot_be_made() -> None:
    rig = mig_node(Rig(FakeBackend.of("A30-24GB", count=2, reset_needs=False)), "all-2g.12gb")
    manager = rig.manager()

    def refuse() -> None:
        raise HostError("cannot create device node /dev/nvidia-caps/nvidia-cap12 (c 234:12): Operation not permitted")

    manager.device_nodes = refuse
    rig.converge(manager=manager)  # the layout is right; the plugin names the missing node when it builds devices
    assert rig.node.labels[labels.MIG_CONFIG_STATE] == "success"


def test_sim_host_fresh_boot_reboots_a_laid_out_node(tmp_path: Path, cli: Cli) -> None:
    host = build_fake_host(tmp_path, "a30x4")
    assert host.path("/dev/nvidia-uvm").exists()
    code, _ = cli(host.root, A30, "sim", "host", "--fresh-boot")
    assert code == 0
    assert not list(host.path("/dev").glob("nvidia*"))
    assert [line.split()[0] for line in host.path("/proc/modules").read_text().splitlines()] == ["e1000e", "nvidia"]
    assert " nvidia-uvm" not in host.path("/proc/devices").read_text()
    assert host.path("/proc/driver/nvidia-caps/mig-minors").read_text().startswith("config 1\nmonitor 2\n")
    code, _ = cli(host.root, A30, "sim", "persistence", "1", "off")
    assert code == 0 and host.machine is not None and not host.machine.persistence_mode(1)


def test_device_plugin_cdi_spec_gains_uvm_made_after_it_started(tmp_path: Path) -> None:
    host = build_fake_host(tmp_path, "a30x4", fresh_boot=True)
    root = HostRoot(host.root, mknod=device_node_stand_in)
    devnodes.ensure(root, load_modules=False)
    node = FakeNode([full_gpu(i, catalogue.A30_24GB, "a30x4") for i in range(4)], {})
    plugins = NodePlugins(node, config.load("flags: {plugin: {deviceListStrategy: [cdi-cri]}}"), root,
                          metrics=PluginMetrics(), policy=HealthPolicy())

    def control_nodes() -> list[str]:
        spec = yaml.safe_load(host.path(cdi.SPEC_FILE).read_text())
        return [n["path"] for n in spec["containerEdits"]["deviceNodes"]]

    assert control_nodes() == ["/dev/nvidiactl", "/dev/nvidia-modeset"]
    devnodes.ensure(root)  # setup finishes after the plugin started: nvidia-uvm loaded, its nodes made
    [plugin] = plugins.plugins
    [alloc] = plugin.allocate([[plugin.resource.devices[0].id]])
    assert alloc.cdi_devices == (f"{CDI_KIND}={plugin.resource.devices[0].uuid}",)
    assert control_nodes() == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
