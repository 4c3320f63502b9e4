"""An MPS group's control daemon runs as NVIDIA runs it: its own DaemonSet, not the device plugin's container.

NVIDIA/k8s-device-plugin's chart (``templates/daemonset-mps-control-daemon.yml``): ``mps-control-daemon`` from
the plugin's image, privileged, the MPS root and ``<mpsRoot>/shm`` as its ``/dev/shm``; NVIDIA/k8s-dra-driver-gpu
(``templates/mps-control-daemon.tmpl.yaml``): ``hostPID``, ready once its startup file exists. The paths the
DaemonSet mounts must be the ones the agent's ``mps-daemon`` writes and the plugin's Allocate hands to clients.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent.deviceplugin import config, mps
from node_agent.deviceplugin.allocate import MPS_CONTAINER_ROOT
from nvgpu.stackconfig import GroupPlan
from nvidia_gpu.components.manifests import workloads
from nvidia_gpu.components.manifests.workloads import GroupContext
from tests.nvidia_gpu.components.component_helpers import Engine, by_name, engine, group, of_kind, stack_config
from tests.nvidia_gpu.components.test_component_engine import _group_component
from tests.nvidia_gpu.policies.policy_fixtures import DS_TYPE, check

__all__ = ["engine"]


def _ctx(sharing: str = "MPS") -> GroupContext:
    cfg = stack_config([group("a30", sharing=sharing)])
    (g,) = cfg.node_groups
    return GroupContext(cfg.cluster.namespace, cfg.cluster, g, GroupPlan.of(cfg.cluster, g))


def _pod(ds: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = ds["spec"]["template"]["spec"]
    return pod


def test_the_mps_control_daemon_daemonset() -> None:
    ds = workloads.mps_control_daemon_daemonset(_ctx())
    assert ds["metadata"]["name"] == "mps-control-daemon-a30"
    assert ds["metadata"]["labels"]["app.kubernetes.io/component"] == "mps-control-daemon"
    pod = _pod(ds)
    assert pod["hostPID"] is True
    assert pod["serviceAccountName"] == "device-plugin"  # NVIDIA's chart: the plugin's account (reads its Node)
    (c,) = pod["containers"]
    assert c["command"] == workloads.AGENT
    # The plugin's own config source (ConfigMap, node label, the group's mode by default): one plan for both.
    source = workloads.config_source_args(_ctx().group)
    assert c["args"] == ["--driver-root", "/driver-root", "mps-daemon", *source]
    (plugin,) = _pod(workloads.device_plugin_daemonset(_ctx()))["containers"]
    assert plugin["args"][plugin["args"].index("--config-dir"):][:len(source)] == source
    assert c["securityContext"]["privileged"] is True  # nvmlDeviceSetComputeMode needs root and every GPU
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    root = config.DEFAULT_MPS_ROOT
    assert volumes[mounts[root]]["hostPath"]["path"] == root
    # The daemon's /dev/shm is the very directory Allocate mounts at /dev/shm in every client.
    assert volumes[mounts["/dev/shm"]]["hostPath"] == {"path": f"{root}/shm", "type": "DirectoryOrCreate"}
    assert volumes[mounts["/etc/nvidia-gpu/device-plugin"]]["configMap"]["name"] == "device-plugin-config-a30"
    # Ready when mps-daemon has every daemon up: the file it writes (node_agent.deviceplugin.mps).
    assert c["readinessProbe"]["exec"]["command"] == ["cat", f"{root}/{mps.READY_FILE}"]


def test_the_device_plugin_of_an_mps_group_no_longer_runs_the_daemon() -> None:
    pod = _pod(workloads.device_plugin_daemonset(_ctx()))
    (c,) = pod["containers"]
    assert not pod.get("hostPID")
    assert c["securityContext"]["privileged"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "/dev/shm" not in {m["mountPath"] for m in c["volumeMounts"]}
    # It still sees the MPS root (read what mps-daemon wrote; Allocate names the host dirs under it).
    assert config.DEFAULT_MPS_ROOT in {m["mountPath"] for m in c["volumeMounts"]}
    assert MPS_CONTAINER_ROOT == "/mps"


@pytest.mark.parametrize(("sharing", "expected"), [("MPS", True), ("TimeSlicing", False), ("Exclusive", False)])
def test_only_mps_groups_get_the_daemonset(engine: Engine, sharing: str, expected: bool) -> None:
    cfg = stack_config([group("a30", sharing=sharing)])
    resources = engine.run(lambda: _group_component(cfg))
    names = {r.inputs["metadata"]["name"] for r in of_kind(resources, "DaemonSet")}
    assert ("mps-control-daemon-a30" in names) is expected
    if expected:
        named = by_name(resources)
        daemon = named["a30-mps-control-daemon"]
        assert daemon.parent_urn == named["a30"].urn
        # Created after the ConfigMap it reads, as the plugin is.
        assert named["a30-sharing-config-data"].urn in daemon.dependencies  # the ConfigMap with its content


def test_the_security_policies_allow_it_by_role_and_only_it() -> None:
    """``host-access-allow-listed`` lets the ``mps-control-daemon`` role be privileged with ``hostPID`` (the
    shipped ``policies/config.json`` too); the same pod under another role is refused."""
    ds = workloads.mps_control_daemon_daemonset(_ctx())
    shipped = json.loads((Path(__file__).resolve().parents[3] / "policies" / "config.json").read_text())
    assert check("host-access-allow-listed", DS_TYPE, ds) == []
    assert check("host-access-allow-listed", DS_TYPE, ds, shipped["host-access-allow-listed"]) == []
    other = json.loads(json.dumps(ds).replace('"mps-control-daemon"', '"someone-else"'))
    problems = check("host-access-allow-listed", DS_TYPE, other)
    assert any("hostPID" in p for p in problems) and any("privileged" in p for p in problems)
