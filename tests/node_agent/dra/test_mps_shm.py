"""MPS claims share ``/dev/shm`` with their control daemon, as NVIDIA's DRA driver gives them.

NVIDIA/k8s-dra-driver-gpu ``cmd/gpu-kubelet-plugin/sharing.go`` (``GetCDIContainerEdits``): an MPS claim's
containers get the pipe directory *and* a ``/dev/shm`` bind mount (``rw,nosuid,nodev,bind``) of the shm
directory the daemon sees as its own ``/dev/shm`` (``templates/mps-control-daemon.tmpl.yaml``). Without it a
client's CUDA context cannot reach the MPS server's shared-memory segments, and every client fails to
connect. Here the daemons run in the DRA plugin's container, whose ``/dev/shm`` is the node's MPS shm
directory (``nvidia_gpu.components.manifests.dra``): the claim's mount must be that very directory.
"""

from __future__ import annotations

import json

from node_agent.dra import sharing
from node_agent.dra.config import GpuSharing, Strategy
from node_agent.kubelet.dra.server import PluginServer
from nvgpu import hostpaths
from nvgpu.stackconfig import GroupPlan
from nvidia_gpu.components.manifests import dra as dra_manifests
from tests.kit.dra_builders import DRIVER, claim, gpu_config
from tests.kit.kubelet.dra import DraKubelet
from tests.node_agent.dra.conftest import Env
from tests.node_agent.dra.test_plugin import put_claim, spec_file
from tests.nvidia_gpu.components.component_helpers import stack_config


def _daemon_shm_host_dir() -> str:
    """The host directory the DRA plugin's container (where the MPS daemons run) has at ``/dev/shm``."""
    cfg = stack_config([{"name": "d", "nodeGroup": "ng-d", "allocationMode": "dra"}])
    (g,) = cfg.node_groups
    ds = dra_manifests.plugin_daemonset(cfg.cluster.namespace, cfg.cluster, g, GroupPlan.of(cfg.cluster, g))
    pod = ds["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert len(mounts) == 1, "the DRA plugin's container has no shared /dev/shm for its MPS daemons"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    path: str = volumes[mounts[0]["name"]]["hostPath"]["path"]
    # Mounted after /dev (the host's, for the GPUs' device nodes), so it is what the daemons see.
    order = [m["mountPath"] for m in container["volumeMounts"]]
    assert order.index("/dev/shm") > order.index("/dev")
    return path


def test_an_mps_claim_gets_the_daemons_dev_shm(env: Env, plugin: tuple[PluginServer, DraKubelet]) -> None:
    _, kubelet = plugin
    ref = put_claim(env, claim("mps", "uid-mps", [("gpu", "gpu-0")], configs=[gpu_config(
        "FromClaim", ["gpu"], {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})]))
    assert kubelet.prepare(DRIVER, [ref]).claims["uid-mps"].error == ""
    edits = json.loads(spec_file(env, "uid-mps").read_text())["devices"][0]["containerEdits"]
    shm = [m for m in edits["mounts"] if m["containerPath"] == "/dev/shm"]
    assert shm == [{"hostPath": _daemon_shm_host_dir(), "containerPath": "/dev/shm",
                    "options": ["rw", "nosuid", "nodev", "bind"]}]
    assert (env.root / shm[0]["hostPath"].lstrip("/")).is_dir()  # made before the daemon starts
    assert kubelet.unprepare(DRIVER, [ref]).claims["uid-mps"].error == ""
    # Shared by every MPS claim of the node (as NVIDIA's device plugin shares one per node): it stays.
    assert (env.root / shm[0]["hostPath"].lstrip("/")).is_dir()


def test_time_slicing_claims_keep_their_own_dev_shm() -> None:
    planned = sharing.plan("uid-ts", [], GpuSharing(strategy=Strategy.TIME_SLICING))
    assert planned.edits.mounts == ()
    assert hostpaths.DRA_MPS_SHM.startswith(hostpaths.DRA_MPS_ROOT + "/")
