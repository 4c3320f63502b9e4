"""Unit tests: config v1, named configs, resources, allocation, CDI specs, preferred allocation, health."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from node_agent.cdi.driveredits import DriverEditsSource
from node_agent.deviceplugin import cdi, config, mps
from node_agent.deviceplugin.allocate import AllocationError, Allocator
from node_agent.deviceplugin.devices import DeviceError, HealthEvent, HealthEventKind
from node_agent.deviceplugin.health import HealthBoard, HealthMonitor, HealthPolicy
from node_agent.deviceplugin.named import NamedConfigError, available_configs, select
from node_agent.deviceplugin.nodelabel import ConfigSelector, ConfigWatcher
from node_agent.deviceplugin.preferred import Request, best_set, greedy_preference, set_score
from node_agent.deviceplugin.resources import build_resources
from node_agent.host.driverroot import DriverRoot
from node_agent.nvml.xid import EVENT_WAIT_SLICE_S
from nvgpu import catalogue
from nvgpu.devicelist import DeviceListStrategy
from tests.kit.driverinstall import install_driver
from tests.kit.fakehost import FakeHost
from tests.node_agent.cdi.schema import cdi_validator
from tests.node_agent.deviceplugin.builders import dgx_links, full_gpu, hybrid_cube_mesh, machine, mig_gpu
from tests.node_agent.deviceplugin.reference import exhaustive, nvidia_best_effort

DATA = Path(__file__).parent / "data"


def _shipped(name: str) -> str:
    return (DATA / name).read_text()


# -- config -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,strategy", [("nvidia-device-plugin-config-mps.yaml", "mps"),
                                           ("nvidia-device-plugin-config-time-slicing.yaml", "time-slicing")])
def test_nvidia_example_configs_parse(name: str, strategy: str) -> None:
    s = config.load(_shipped(name))
    assert s.sharing.strategy.value == strategy
    assert s.sharing.resources[0].replicas == 10
    assert s.sharing.fail_requests_greater_than_one is (strategy == "mps")


def test_precedence_flags_over_env_over_file() -> None:
    text = "version: v1\nflags:\n  migStrategy: single\n  plugin:\n    deviceListStrategy: volume-mounts\n"
    assert config.load(text).mig_strategy is config.MigStrategy.SINGLE
    env = {"MIG_STRATEGY": "mixed", "DEVICE_LIST_STRATEGY": "cdi-cri,envvar"}
    s = config.load(text, env)
    assert s.mig_strategy is config.MigStrategy.MIXED
    assert s.device_list_strategy == (DeviceListStrategy.CDI_CRI, DeviceListStrategy.ENVVAR)
    s = config.load(text, env, config.Overrides(mig_strategy=config.MigStrategy.NONE))
    assert s.mig_strategy is config.MigStrategy.NONE
    assert config.load("").nvidia_dev_root == "/" and config.load("flags: {nvidiaDriverRoot: /run/nvidia/driver}"
                                                                  ).nvidia_dev_root == "/run/nvidia/driver"


@pytest.mark.parametrize("text,field", [
    ("version: v2", "version"),
    ("flags: {migStrategy: half}", "flags.migStrategy"),
    ("flags: {plugin: {deviceListStrategy: [envvar, tape]}}", "flags.plugin.deviceListStrategy"),
    ("flags: {plugin: {deviceIDStrategy: serial}}", "flags.plugin.deviceIDStrategy"),
    ("flags: {bogus: 1}", "flags.bogus"),
    ("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 1}]}}", "sharing.timeSlicing.resources[0].replicas"),
    ("sharing: {mps: {resources: [{name: other.io/gpu, replicas: 2}]}}", "sharing.mps.resources[0].name"),
    ("imex: {channelIDs: [3]}", "imex.channelIDs"),
])
def test_invalid_configs_name_the_field(text: str, field: str) -> None:
    with pytest.raises(config.ConfigError) as e:
        config.load(text)
    assert any(p.startswith(field) for p in e.value.problems), e.value.problems


def test_invalid_env_names_the_variable() -> None:
    with pytest.raises(config.ConfigError) as e:
        config.load("", {"MIG_STRATEGY": "sometimes"})
    assert e.value.problems[0].startswith("MIG_STRATEGY:")


def test_mps_with_mixed_mig_is_rejected() -> None:
    with pytest.raises(config.ConfigError, match="mixed"):
        config.load("flags: {migStrategy: mixed}\nsharing: {mps: {resources: [{name: gpu, replicas: 2}]}}")


def test_named_config_selection_and_live_switch(tmp_path: Path) -> None:
    d = tmp_path / "configs"
    d.mkdir()
    (d / "default").write_text("")
    (d / "ts").write_text("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}")
    (d / "..data").mkdir()
    avail = available_configs(d)
    assert set(avail) == {"default", "ts"}
    assert select(avail, "ts").reason == "label"
    assert select(avail, None).reason == "fallback-named"
    with pytest.raises(NamedConfigError, match="available: default, ts"):
        select(avail, "missing")

    class Labels:
        value: str | None = None

        def label(self) -> str | None:
            return self.value

    labels = Labels()
    sel = ConfigSelector(config_dir=d, labels=labels)
    changes: list[str] = []
    w = ConfigWatcher(sel, changes.append)
    s, text = sel.read()
    w.remember(s, text)
    assert not w.poll()
    labels.value = "ts"
    assert w.poll() and changes == ["config-changed"]
    assert config.load(sel.read()[1]).sharing.strategy is config.SharingStrategy.TIME_SLICING
    labels.value = "nope"
    assert not w.poll()  # an unknown name keeps the current config

    # Starting with a label that names no config: the default (as if unlabelled), not a crash.
    start = ConfigSelector(config_dir=d, labels=labels, default="ts")
    s, _ = start.read()
    assert (s.name, s.reason) == ("ts", "default")
    with pytest.raises(NamedConfigError, match="'nope', which does not exist"):
        start.select()  # running: the watcher keeps the current config and logs why


# -- resources ----------------------------------------------------------------------------------------------
def test_mig_single_rejects_mixed_profiles(host: FakeHost) -> None:
    node = machine("dgx-a100-40gb", host, mig=["3g.20gb", "1g.5gb"])
    with pytest.raises(DeviceError, match="identical"):
        build_resources(node.gpu_list, config.load("flags: {migStrategy: single}"), host)


def test_mig_none_exposes_whole_gpus_and_mixed_splits(host: FakeHost) -> None:
    node = machine("dgx-h100", host, mig=["1g.10gb+me", "1g.10gb"])
    (r,) = build_resources(node.gpu_list, config.load(""), host)
    assert r.name == "nvidia.com/gpu" and len(r.devices) == 8
    names = [r.name for r in build_resources(node.gpu_list, config.load("flags: {migStrategy: mixed}"), host)]
    assert names == ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.10gb.me"]
    mig = build_resources(node.gpu_list, config.load("flags: {migStrategy: mixed}"), host)[0].devices[0]
    assert mig.index == "0:1" and mig.paths[0] == "/dev/nvidia0"
    assert all(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in mig.paths[1:])


def test_missing_mig_minor_is_an_init_error(host: FakeHost) -> None:
    gpus = [mig_gpu(0, catalogue.A30_24GB, ["1g.6gb"])]
    with pytest.raises(DeviceError, match="mig-minors"):
        build_resources(gpus, config.load("flags: {migStrategy: mixed}"), host)


# -- allocate / CDI -----------------------------------------------------------------------------------------
def test_volume_mounts_device_specs_and_index_ids(host: FakeHost) -> None:
    node = machine("a30x4", host)
    s = config.load("flags:\n  nvidiaDevRoot: /run/nvidia/driver\n  plugin:\n    passDeviceSpecs: true\n"
                    "    deviceListStrategy: volume-mounts\n    deviceIDStrategy: index\n")
    host.put("/run/nvidia/driver/dev/nvidia-uvm", "")
    (r,) = build_resources(node.gpu_list, s, host)
    a = Allocator(r, s, host).allocate([node.gpu_list[2].uuid, node.gpu_list[3].uuid])
    assert a.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert [(m.container_path, m.host_path) for m in a.mounts] == [
        ("/var/run/nvidia-container-devices/2", "/dev/null"), ("/var/run/nvidia-container-devices/3", "/dev/null")]
    assert [(d.container_path, d.host_path, d.permissions) for d in a.devices] == [
        ("/dev/nvidiactl", "/run/nvidia/driver/dev/nvidiactl", "rw"),
        ("/dev/nvidia-uvm", "/run/nvidia/driver/dev/nvidia-uvm", "rw"),
        ("/dev/nvidia2", "/run/nvidia/driver/dev/nvidia2", "rw"),
        ("/dev/nvidia3", "/run/nvidia/driver/dev/nvidia3", "rw")]


def test_replicas_are_deduplicated_in_env(host: FakeHost) -> None:
    node = machine("l4x2", host)
    s = config.load("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 3}]}}")
    (r,) = build_resources(node.gpu_list, s, host)
    u = node.gpu_list[0].uuid
    assert Allocator(r, s, host).allocate([f"{u}::0", f"{u}::2"]).envs["NVIDIA_VISIBLE_DEVICES"] == u
    s1 = config.load("sharing: {timeSlicing: {failRequestsGreaterThanOne: true,\n"
                     "  resources: [{name: gpu, replicas: 3}]}}")
    (r1,) = build_resources(node.gpu_list, s1, host)
    with pytest.raises(AllocationError, match="maximum request size for shared resources is 1"):
        Allocator(r1, s1, host).allocate([f"{u}::0", f"{u}::2"])


@pytest.mark.parametrize("mig", [False, True])
def test_cdi_spec_validates_against_the_schema(host: FakeHost, mig: bool, tmp_path: Path) -> None:
    node = machine("dgx-a100-40gb", host, mig=["3g.20gb", "3g.20gb"] if mig else None)
    s = config.load("flags:\n  migStrategy: mixed\n  plugin: {deviceListStrategy: cdi-cri}\nimex: {channelIDs: [0]}\n")
    resources = build_resources(node.gpu_list, s, host)
    assert cdi.discovery_root(s, tmp_path / "host") == tmp_path / "host"
    mounted = config.load(f"flags: {{plugin: {{containerDriverRoot: {tmp_path / 'driver'}}}}}")
    assert cdi.discovery_root(mounted, tmp_path / "host") == tmp_path / "host"  # nothing mounted there yet
    driver = install_driver(tmp_path / "driver", "550.90.07", layout="rhel", leftover="535.1")
    assert cdi.discovery_root(mounted, tmp_path / "host") == driver.root
    edits = DriverEditsSource(DriverRoot(driver.root), "/", "/usr/bin/nvidia-ctk",
                              driver.root / "usr/bin/nvidia-smi").edits("550.90.07")
    changed = cdi.write_specs(resources, s, host, driver_edits=edits)
    assert cdi.SPEC_FILE in changed
    assert cdi.write_specs(resources, s, host, driver_edits=edits) == []
    validator = cdi_validator()
    for path in (cdi.SPEC_FILE, cdi.IMEX_SPEC_FILE):
        doc = yaml.safe_load(host.read_text_or_none(path) or "")
        errors = list(validator.iter_errors(doc))
        assert not errors, errors[0].message
    spec = yaml.safe_load(host.read_text_or_none(cdi.SPEC_FILE) or "")
    hooks = spec["containerEdits"]["hooks"]
    assert [h["args"][:3] for h in hooks] == [["nvidia-ctk", "hook", "create-symlinks"],
                                              ["nvidia-ctk", "hook", "update-ldcache"]]
    assert hooks[-1]["args"][-2:] == ["--folder", "/usr/lib64"]
    in_container = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}
    assert set(driver.libraries) <= in_container and "/usr/lib64/libcuda.so.535.1" not in in_container
    names = {d["name"] for d in spec["devices"]}
    assert {r.devices[0].uuid for r in resources} <= names and ("0:0" in names) is mig
    bad = dict(spec, devices=[{"name": "x"}])
    assert list(validator.iter_errors(bad))  # the validator does reject a broken spec


# -- preferred allocation -------------------------------------------------------------------------------------
TOPOLOGIES = {"nvswitch": dgx_links(8, 12), "hybrid-cube-mesh": hybrid_cube_mesh()}


@pytest.mark.parametrize("topo", list(TOPOLOGIES))
def test_best_set_is_optimal_and_never_worse_than_nvidia(topo: str) -> None:
    links = TOPOLOGIES[topo]

    def score(a: int, b: int) -> int:
        return links[(min(a, b), max(a, b))].score

    for size in range(1, 9):
        for required in [(), (0,), (3, 6), (1, 2, 5)]:
            if len(required) > size:
                continue
            chosen = best_set(8, score, required, size)
            assert len(chosen) == size and set(required) <= set(chosen)
            got = set_score(chosen, score)
            assert got == exhaustive(8, score, required, size)
            if size in (2, 3, 4):
                assert got >= set_score(nvidia_best_effort(8, score, required, size), score)


def test_best_set_is_fast_on_16_gpus() -> None:
    links = dgx_links(16, 0) | {(a, b): dgx_links(16, 0)[(a, b)] for a, b in itertools.combinations(range(16), 2)}

    def score(a: int, b: int) -> int:
        return links[(a, b) if a < b else (b, a)].score + (100 if a // 4 == b // 4 else 0)

    t = time.perf_counter()
    chosen = best_set(16, score, [5], 4)
    assert time.perf_counter() - t < 2.0
    assert {c // 4 for c in chosen} == {1}


def test_greedy_distributed_and_packed(host: FakeHost) -> None:
    node = machine("a30x4", host)
    s = config.load("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 4}]}}")
    (r,) = build_resources(node.gpu_list, s, host)
    ids = [d.id for d in r.devices]
    taken = {ids[0], ids[1]}  # GPU 0 already has two replicas handed out
    avail = tuple(i for i in ids if i not in taken)
    picks = greedy_preference(r, Request(avail, (), 3), config.AllocationPolicy.DISTRIBUTED)
    assert sorted(i.split("::")[0] for i in picks) == sorted(g.uuid for g in node.gpu_list[1:])
    packed = greedy_preference(r, Request(avail, (), 2), config.AllocationPolicy.PACKED)
    assert {i.split("::")[0] for i in packed} == {node.gpu_list[0].uuid}
    must = greedy_preference(r, Request(avail, (ids[5],), 2), config.AllocationPolicy.DISTRIBUTED)
    assert must[0] == ids[5] and must[1].split("::")[0] not in (node.gpu_list[1].uuid, node.gpu_list[0].uuid)


# -- health ---------------------------------------------------------------------------------------------------
def test_health_env_controls() -> None:
    p = HealthPolicy.from_env({})
    assert not p.is_critical(13) and p.is_critical(48) and p.checks_enabled
    p = HealthPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "48, 79"})
    assert not p.is_critical(48) and not p.is_critical(79) and p.is_critical(94)
    p = HealthPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "all"})
    assert not p.checks_enabled and not p.is_critical(79)
    p = HealthPolicy.from_env({"DP_DISABLE_HEALTHCHECKS": "xids", "DP_ENABLE_HEALTHCHECKS": "79,13"})
    assert p.checks_enabled and p.is_critical(79) and p.is_critical(13) and not p.is_critical(48)


def test_recovery_needs_quiet_period_and_passing_checks(host: FakeHost) -> None:
    node = machine("l4x2", host)
    now = [100.0]
    board = HealthBoard(clock=lambda: now[0])
    mon = HealthMonitor(node, node.gpu_list, board, HealthPolicy(recovery_quiet_s=30), clock=lambda: now[0])
    u = node.gpu_list[0].uuid
    mon.handle(HealthEvent(HealthEventKind.XID, u, 48))
    assert not board.healthy(u)
    now[0] += 20
    mon.handle(HealthEvent(HealthEventKind.XID, u, 48))  # still noisy: the quiet period restarts
    now[0] += 20
    assert mon.recheck() == [] and not board.healthy(u)
    now[0] += 11
    node.failing.add(u)
    assert mon.recheck() == [] and not board.healthy(u)  # re-check fails: stays unhealthy
    node.failing.clear()
    now[0] += 31
    assert mon.recheck() == [u] and board.healthy(u)


def test_lost_gpu_is_found_by_probes_without_an_event(host: FakeHost) -> None:
    node = machine("l4x2", host)
    board = HealthBoard()
    mon = HealthMonitor(node, node.gpu_list, board, HealthPolicy())
    node.failing.add(node.gpu_list[1].uuid)
    mon.recheck()
    assert board.unhealthy() == {node.gpu_list[1].uuid: "gpu-lost"}


def test_mig_xid_with_instance_ids_marks_one_mig_device(host: FakeHost) -> None:
    node = machine("dgx-a100-40gb", host, mig=["3g.20gb", "3g.20gb"])
    board = HealthBoard()
    mon = HealthMonitor(node, node.gpu_list, board, HealthPolicy())
    g = node.gpu_list[4]
    mon.handle(HealthEvent(HealthEventKind.XID, g.uuid, 48, g.migs[1].gi_id, 0xFFFFFFFF))
    assert set(board.unhealthy()) == {g.migs[1].uuid}
    mon.handle(HealthEvent(HealthEventKind.WATCH_FAILED))
    assert len(board.unhealthy()) == 8 + 16


def test_at_rest_the_monitor_waits_on_nvml_in_long_slices_and_a_restart_does_not_wait_for_it(
        host: FakeHost) -> None:
    """NVML's event wait is the monitor's sleep: one wait per ``EVENT_WAIT_SLICE_S`` (or to the next re-check),
    not ten a second; a restart's stop returns while the wait runs, a final stop within the slice."""
    node = machine("l4x2", host)
    waits: list[float] = []
    waiting = threading.Event()
    real = node.wait_event

    def counted(timeout_s: float) -> HealthEvent | None:
        waits.append(timeout_s)
        waiting.set()
        return real(timeout_s)

    node.wait_event = counted  # type: ignore[method-assign]
    mon = HealthMonitor(node, node.gpu_list, HealthBoard(), HealthPolicy(recheck_interval_s=60))
    mon.start()
    assert waiting.wait(5)
    time.sleep(0.5)
    assert len(waits) == 1 and waits[0] == EVENT_WAIT_SLICE_S, waits
    t0 = time.monotonic()
    mon.stop(wait=False)
    assert time.monotonic() - t0 < 0.1, "a restart waited for the NVML wait"
    mon2 = HealthMonitor(node, node.gpu_list, HealthBoard(), HealthPolicy(recheck_interval_s=60))
    mon2.start()
    node.xid(0, 48)  # whichever monitor reads it, it is read at once
    t0 = time.monotonic()
    mon2.stop()
    assert time.monotonic() - t0 <= EVENT_WAIT_SLICE_S + 0.5

def test_full_gpu_builder_is_plain() -> None:
    g = full_gpu(3, catalogue.T4)
    assert g.minor == 3 and not g.mig_enabled


# -- MPS daemons ------------------------------------------------------------------------------------------------
class _Result:
    def __init__(self, code: int, err: str = ""):
        self.returncode = code
        self.stdout = ""
        self.stderr = err


class _Runner:
    def __init__(self, running: bool = False):
        self.calls: list[tuple[list[str], str | None]] = []
        self.running = running

    def run(self, argv: object, *, timeout_s: float, kill_after_s: float = 5.0, stdin: str | None = None,
            env: object = None) -> _Result:
        args = list(argv)  # type: ignore[call-overload]
        self.calls.append((args, stdin))
        if args[-1] == "-d":
            self.running = True
            return _Result(0)
        if stdin == "quit\n":
            was, self.running = self.running, False
            return _Result(0 if was else 1, "" if was else "Cannot find MPS control daemon process")
        return _Result(0 if self.running else 1, "" if self.running else "Cannot find MPS control daemon process")


class _Modes:
    def __init__(self) -> None:
        self.modes: dict[str, str] = {}

    def compute_mode(self, uuid: str) -> str:
        return self.modes.get(uuid, "DEFAULT")

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self.modes[uuid] = mode


def test_mps_daemon_plan_start_adopt_and_stop(host: FakeHost) -> None:
    node = machine("a30x4", host)
    s = config.load(_shipped("nvidia-device-plugin-config-mps.yaml"))
    resources = build_resources(node.gpu_list, s, host)
    (d,) = mps.plan(resources, s)
    assert d.pipe_dir == "/run/nvidia/mps/nvidia.com/gpu/pipe" and d.log_dir == "/run/nvidia/mps/nvidia.com/gpu/log"
    assert d.visible == tuple(g.uuid for g in node.gpu_list) and d.active_thread_percentage == 10
    assert d.defaults().splitlines() == ["set_default_active_thread_percentage 10"] + [
        f"set_default_device_pinned_mem_limit {i} {catalogue.A30_24GB.memory_mib // 10}M" for i in range(4)]
    assert d.env()["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps/nvidia.com/gpu/pipe"

    runner, modes = _Runner(), _Modes()
    daemons = mps.MpsDaemons(runner, host, modes, "/run/nvidia/mps")
    assert mps.daemon_problem(host, d, "/run/nvidia/mps") is not None
    daemons.ensure([d])
    assert [c[0][-1] for c in runner.calls] == ["nvidia-cuda-mps-control", "-d", "nvidia-cuda-mps-control"]
    assert runner.calls[-1][1] == d.defaults()
    assert host.exists("/run/nvidia/mps/nvidia.com/gpu/log/plugin-settings.json")
    assert mps.daemon_problem(host, d, "/run/nvidia/mps") is None  # what the plugin waits for
    assert set(modes.modes.values()) == {"EXCLUSIVE_PROCESS"}
    runner.calls.clear()
    daemons.ensure([d])  # unchanged plan: nothing to do
    assert runner.calls == []
    adopted = mps.MpsDaemons(runner, host, modes, "/run/nvidia/mps")  # a restarted container finds it serving
    adopted.ensure([d])
    assert [c[1] for c in runner.calls] == ["get_default_active_thread_percentage\n", d.defaults()]
    runner.calls.clear()
    daemons.ensure([])  # MPS switched off: the daemon quits, the GPUs get their modes back
    assert runner.calls == [(d.control_argv(), "quit\n")] and not runner.running
    assert set(modes.modes.values()) == {"DEFAULT"}
    assert mps.daemon_problem(host, d, "/run/nvidia/mps") is not None

    class Broken:
        def run(self, argv: object, **kwargs: object) -> _Result:
            return _Result(1, "no driver")

    with pytest.raises(mps.MpsError, match="no driver"):
        mps.MpsDaemons(Broken(), host, _Modes(), "/run/nvidia/mps").ensure([d])


def test_ties_keep_well_connected_groups_together() -> None:
    strong = {(0, 1), (1, 2), (2, 3)}

    def score(a: int, b: int) -> int:
        return 100 if (min(a, b), max(a, b)) in strong else 10

    # {0,1}, {1,2} and {2,3} all score 100; taking {1,2} would strand 0 and 3 apart.
    assert best_set(4, score, [], 2) in ((0, 1), (2, 3))
    assert best_set(4, score, [3], 2) == (2, 3)


def test_best_set_prunes_symmetric_topologies() -> None:
    t = time.perf_counter()
    assert len(best_set(16, lambda a, b: 1200, [], 8)) == 8
    assert time.perf_counter() - t < 0.5


def test_gpus_below_the_minimum_compute_capability_are_not_advertised(host: FakeHost) -> None:
    node = machine("l4x2", host)
    old = replace(node.gpu_list[1], compute_capability=(5, 2))
    (r,) = build_resources([node.gpu_list[0], old], config.load(""), host)
    assert [d.id for d in r.devices] == [node.gpu_list[0].uuid]
