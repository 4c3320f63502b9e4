"""A changed ``partitionCount`` is an in-place update of the fixed-name device-plugin ConfigMap, whatever provider the
user hands the components: here a library user's own provider *without* ``enableConfigMapMutable`` (the
provider's default, under which it replaces a ConfigMap whose ``data`` changes: delete, then create).

One stack, in order, against a control plane of the module's own, with the real CLI and provider:

1. deployed by the code before ``register_config_map`` (commit :data:`BEFORE_SPLIT`, the ConfigMap resource
   owning ``data``), as a user's existing stack is;
2. upgraded to this tree with a new ``partitionCount`` in the same ``up``: the preview replaces and deletes
   nothing (the data patch is a create), and the ConfigMap keeps its uid;
3. another ``partitionCount``: the preview is one in-place update of the data patch, nothing else;
4. destroyed: the ConfigMap goes with its namespace (the retained data patch re-creates nothing);
5. a provider with server-side apply off (which the data patch needs) is refused at preview, in the
   provider's words naming the setting.

During each ``up`` a ``kubectl get --watch`` on the ConfigMap records every event: the agents' view never
has it deleted, or without its content, in between.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import ControlPlane
from localcluster.objects import wait_for
from tests.cluster.pulumi_project import REPO, Project, make_project
from tests.kit.tools import required_bin

#: The last commit whose ConfigMaps own their ``data`` (before ``register_config_map``): the shape a
#: deployed stack's state has. Pinned, never "HEAD~n".
BEFORE_SPLIT = "bb53a8576f19f0aa5329fc6d95fb743cca2dac79"
NS = "cm-team"
CONFIG_MAP = "device-plugin-config-l4"

pytestmark = pytest.mark.timeout(600)  # each `pulumi up` takes about a minute here

PROGRAM = '''\
"""A library user's program with its own provider, which does not set enableConfigMapMutable."""

import pulumi
import pulumi_kubernetes as k8s

import nvidia_gpu

provider = k8s.Provider("team-cluster",
                        enable_server_side_apply=pulumi.Config().get_bool("serverSideApply") is not False)
opts = pulumi.ResourceOptions(provider=provider)
platform = nvidia_gpu.GpuPlatform("gpu", nvidia_gpu.GpuPlatformArgs(
    cluster={"kubernetesVersion": "1.34", "nodeSetup": "daemonset", "runtimeClass": {"create": False}},
    namespace="cm-team",
    agent_image="registry.example.com/team/nvidia-gpu-agent:1.2.3",
), opts=opts)
nvidia_gpu.GpuNodeGroup("l4", nvidia_gpu.GpuNodeGroupArgs(
    platform=platform,
    group={"name": "l4", "nodeSelector": {"matchLabels": {"example.com/gpu-pool": "l4"}},
           "gpu": {"model": "L4", "sharing": "TimeSlicing",
                   "timeSlicing": {"partitionCount": pulumi.Config().require_int("partitionCount")}}},
), opts=opts)
'''


def _export(commit: str, dest: Path) -> Path:
    """``git archive`` of ``commit`` into ``dest``; fails (never skips) without the history."""
    if not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout: this test exports commit {commit} with `git archive`")
    done = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                          capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.fail(f"cannot export commit {commit} (the program before the ConfigMap split): "
                    f"{done.stderr.decode(errors='replace').strip()}; "
                    "a shallow clone lacks it (`git fetch --unshallow`)")
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        tar.extractall(dest, filter="data")
    assert "def register_config_map" not in (dest / "nvidia_gpu" / "components" / "register.py").read_text()
    return dest


@dataclass
class Watch:
    """``kubectl get --watch`` of the ConfigMap, its events parsed as they arrive."""

    process: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    thread: threading.Thread | None = None

    def read(self) -> None:
        assert self.process.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self.process.stdout:
            buffer += line
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except json.JSONDecodeError:
                    break  # an event split across lines: wait for the rest
                self.events.append(event)
                buffer = buffer.lstrip()[end:]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        if self.thread is not None:
            self.thread.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def _watch(cluster: ControlPlane) -> Watch:
    kubectl = required_bin("kubectl") / "kubectl"
    process = subprocess.Popen([str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "get", "configmap", CONFIG_MAP,
                                "-n", NS, "--watch", "--output-watch-events", "-o", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    watch = Watch(process)
    watch.thread = threading.Thread(target=watch.read, daemon=True)
    watch.thread.start()
    wait_for(lambda: bool(watch.events), timeout=30, what="the watch's first event (the ConfigMap as it is)")
    return watch


def _up_watched(cluster: ControlPlane, project: Project, replicas: int) -> list[dict[str, Any]]:
    """``pulumi up`` with the ConfigMap watched; every event the watch saw, up to the new content."""
    watch = _watch(cluster)
    try:
        project.pulumi("up", "--yes", "--skip-preview")
        wait_for(lambda: any(f"replicas: {replicas}" in ((e["object"].get("data") or {}).get("TimeSlicing") or "")
                             for e in watch.events), timeout=30, what="the watch seeing the new content")
    finally:
        watch.stop()
    return watch.events


def _assert_never_absent(events: list[dict[str, Any]], uid: str) -> None:
    for e in events:
        obj = e["object"]
        assert e["type"] in ("ADDED", "MODIFIED"), (e["type"], obj.get("metadata", {}).get("name"))
        assert obj["metadata"]["uid"] == uid, "the ConfigMap was re-created"
        assert set(obj.get("data") or {}) == {"Exclusive", "TimeSlicing", "MPS", "MIG"}, obj.get("data")


def _changes(project: Project) -> tuple[dict[str, int], dict[str, str]]:
    """``pulumi preview``'s change summary and each changed step's op, by resource name."""
    preview = json.loads(project.pulumi("preview", "--json").stdout)
    ops = {s["urn"].rsplit("::", 1)[-1]: s["op"] for s in preview.get("steps", []) if s["op"] not in ("same", "read")}
    return preview["changeSummary"], ops


def _set_replicas(project: Project, replicas: int) -> None:
    project.pulumi("config", "set", "--type", "int", "partitionCount", str(replicas))


def _use_tree(project: Project, tree: Path) -> None:
    project.env["PYTHONPATH"] = str(tree)  # the tree's nvidia_gpu and nvgpu first on the path


@pytest.fixture(scope="module")
def project(cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    work = tmp_path_factory.mktemp("configmap-in-place")
    project = make_project(cluster, work / "engine")
    for name in ("__main__.py", f"Pulumi.{project.stack}.yaml"):
        (project.directory / name).unlink()
    meta = yaml.safe_load((project.directory / "Pulumi.yaml").read_text())
    (project.directory / "Pulumi.yaml").write_text(yaml.safe_dump({"name": "team-gpus", "runtime": meta["runtime"]},
                                                                   sort_keys=False))
    (project.directory / "__main__.py").write_text(PROGRAM)
    _use_tree(project, _export(BEFORE_SPLIT, work / "before-split"))
    project.pulumi("stack", "init", project.stack)
    _set_replicas(project, 2)
    try:
        yield project
    finally:
        project.pulumi("destroy", "--yes", check=False)


def test_1_the_code_before_the_split_deploys_the_configmap_owning_its_data(cluster: ControlPlane,
                                                                           project: Project) -> None:
    project.pulumi("up", "--yes", "--skip-preview")
    cm = cluster.admin().get("v1", "ConfigMap", CONFIG_MAP, NS)
    assert "replicas: 2" in cm["data"]["TimeSlicing"]
    state = json.loads(project.pulumi("stack", "export").stdout)["deployment"]["resources"]
    assert not [r for r in state if r["type"] == "kubernetes:core/v1:ConfigMapPatch"], "not the shape before the split"


def test_2_the_upgrade_with_a_new_partition_count_keeps_the_configmap(cluster: ControlPlane,
                                                                      project: Project) -> None:
    uid = cluster.admin().get("v1", "ConfigMap", CONFIG_MAP, NS)["metadata"]["uid"]
    _use_tree(project, REPO)
    _set_replicas(project, 3)
    summary, ops = _changes(project)
    assert set(summary) <= {"same", "create", "update"}, (summary, ops)  # no replace, no delete
    assert ops.get("l4-sharing-config-data") == "create", ops  # takes the content over
    assert "l4-sharing-config" not in ops, ops  # the ConfigMap resource itself is unchanged
    events = _up_watched(cluster, project, 3)
    _assert_never_absent(events, uid)
    cm = cluster.admin().get("v1", "ConfigMap", CONFIG_MAP, NS)
    assert cm["metadata"]["uid"] == uid and "replicas: 3" in cm["data"]["TimeSlicing"]
    project.pulumi("up", "--yes", "--expect-no-changes")


def test_3_a_partition_count_change_is_an_in_place_update(cluster: ControlPlane, project: Project) -> None:
    uid = cluster.admin().get("v1", "ConfigMap", CONFIG_MAP, NS)["metadata"]["uid"]
    _set_replicas(project, 4)
    summary, ops = _changes(project)
    assert set(summary) <= {"same", "update"}, (summary, ops)
    assert ops.get("l4-sharing-config-data") == "update", ops
    assert "l4-sharing-config" not in ops, ops
    events = _up_watched(cluster, project, 4)
    _assert_never_absent(events, uid)
    cm = cluster.admin().get("v1", "ConfigMap", CONFIG_MAP, NS)
    assert cm["metadata"]["uid"] == uid and "replicas: 4" in cm["data"]["TimeSlicing"]


def test_4_destroy_removes_the_configmap_and_re_creates_nothing(cluster: ControlPlane, project: Project) -> None:
    project.pulumi("destroy", "--yes")
    kube = cluster.admin()
    wait_for(lambda: kube.get_or_none("v1", "Namespace", NS) is None, timeout=60, what="the namespace gone")
    assert kube.get_or_none("v1", "ConfigMap", CONFIG_MAP, NS) is None


def test_5_a_provider_without_server_side_apply_is_refused_at_preview(project: Project) -> None:
    project.pulumi("config", "set", "--type", "bool", "serverSideApply", "false")
    try:
        done = project.pulumi("preview", check=False)
    finally:
        project.pulumi("config", "rm", "serverSideApply")
    assert done.returncode != 0
    out = done.stdout + done.stderr
    # The provider's own refusal, against the content patch, before anything is applied. (When the engine
    # stops on it while the program is still registering, the Pulumi SDK may add its own shutdown traceback,
    # "Resource monitor has terminated": a race of the SDK's, seen under load, not a failure of the program.)
    assert "patch resources require Server-Side Apply mode, which is enabled using the `enableServerSideApply` " \
           "Provider config" in out, out[-4000:]
    assert "ConfigMapPatch" in out, out[-4000:]
