"""The Node-ownership module (node_agent.kube.nodeowner): whose keys, the merge patch, the refusals, the
field manager, the 409 handling. The services' own tests check their requests end to end; these pin the
rules they share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from node_agent.kube import KubeError, nodes
from node_agent.kube.errors import Conflict
from node_agent.kube.nodeowner import (
    DRIVER_UPGRADE,
    LABELLER,
    MIG_MANAGER,
    NODE_SETUP,
    NodeChange,
    NotOwned,
    changed_taint_keys,
    decide_and_patch,
    labels_to_patch,
    patch,
    retaint,
)
from node_agent.kube.transport import Kube
from nvgpu import labels
from nvgpu.driver import UPGRADE_TAINT_KEY

FOREIGN = {"key": "example.com/maintenance", "value": "soon", "effect": "PreferNoSchedule",
           "timeAdded": "2026-01-01T00:00:00Z"}
MIG_TAINT = {"key": labels.MIG_RECONFIGURE_TAINT_KEY, "value": "true", "effect": "NoSchedule"}


@dataclass
class FakeKube:
    """Records the PATCH requests; answers a Node, or 409 while ``conflicts`` lasts."""

    sent: list[tuple[str, str, dict[str, Any], Mapping[str, Any] | None]] = field(default_factory=list)
    conflicts: int = 0

    def request(self, method: str, path: str, body: Any = None, *, query: Mapping[str, Any] | None = None,
                what: str = "", **_: Any) -> Any:
        self.sent.append((method, path, body, query))
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict(f"{what}: 409", 409)
        return {"metadata": {"name": path.rsplit("/", 1)[-1], "resourceVersion": str(len(self.sent))}}

    def merge_patch(self, path: str, body: Mapping[str, Any], *, what: str = "") -> Any:
        return self.request("PATCH", path, dict(body), what=what)


@dataclass
class Cache:
    offered: list[Mapping[str, Any]] = field(default_factory=list)
    invalidated: int = 0

    def offer(self, obj: Mapping[str, Any]) -> None:
        self.offered.append(obj)

    def invalidate(self) -> None:
        self.invalidated += 1


def _kube(fake: FakeKube) -> Kube:
    return cast(Kube, fake)


def test_the_body_is_the_merge_patch_of_the_kube_layer() -> None:
    change = NodeChange(MIG_MANAGER, labels={labels.MIG_CONFIG_STATE: "pending"},
                        annotations={labels.DRAINED: None}, taints=(MIG_TAINT,), unschedulable=True,
                        resource_version="7")
    assert change.body() == nodes.patch_body(labels={labels.MIG_CONFIG_STATE: "pending"},
                                             annotations={labels.DRAINED: None}, taints=[MIG_TAINT],
                                             unschedulable=True, resource_version="7")
    assert change.body()["metadata"]["annotations"] == {labels.DRAINED: None}  # null deletes
    assert NodeChange(LABELLER).empty and NodeChange(LABELLER).body() == {"metadata": {}}


@pytest.mark.parametrize(("change", "refused"), [
    (NodeChange(LABELLER, labels={"team": "ml", "nvidia.com/gpu.product": "x", labels.GPU_NODE: None}), []),
    (NodeChange(LABELLER, labels={labels.NODE_CHECK: "ok"}), [f"label {labels.NODE_CHECK}"]),
    (NodeChange(LABELLER, labels={labels.MIG_CONFIG_STATE: None}), [f"label {labels.MIG_CONFIG_STATE}"]),
    (NodeChange(LABELLER, annotations={"team": "ml"}), ["annotation team"]),
    (NodeChange(LABELLER, unschedulable=True), ["spec.unschedulable"]),
    (NodeChange(NODE_SETUP, labels={labels.GPU_SETUP_COMPLETE: "", labels.GPU_DEPLOY_DRIVER: None}), []),
    (NodeChange(NODE_SETUP, labels={"nvidia.com/gpu.product": "x"}), ["label nvidia.com/gpu.product"]),
    (NodeChange(MIG_MANAGER, labels={labels.MIG_CONFIG: None},
                annotations={labels.DISRUPTION_APPROVED: None, labels.DRAINING: "mig"}), []),
    (NodeChange(MIG_MANAGER, labels={labels.MIG_CONFIG: "all-1g.10gb"}), [f"label {labels.MIG_CONFIG}"]),
    (NodeChange(MIG_MANAGER, annotations={labels.DISRUPTION_APPROVED: ""}),
     [f"annotation {labels.DISRUPTION_APPROVED}"]),
    (NodeChange(DRIVER_UPGRADE, labels={labels.DRIVER_UPGRADE_STATE: "upgrade-done"},
                annotations={"gpu.nvidia-gpu.io/driver-upgrade-since": "1", labels.DISRUPTION_APPROVED: None},
                unschedulable=False), []),
    (NodeChange(DRIVER_UPGRADE, labels={labels.MIG_CONFIG_STATE: "failed"}), [f"label {labels.MIG_CONFIG_STATE}"]),
])
def test_each_writer_changes_only_its_own_keys(change: NodeChange, refused: list[str]) -> None:
    assert change.not_owned() == refused


def test_the_taints_changed_are_told_from_the_list_they_were_computed_from() -> None:
    read = (FOREIGN, MIG_TAINT)
    # The labeller adds a group taint and gives the others back as read.
    group = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert NodeChange(LABELLER, taints=(*read, group), taints_read=read).not_owned() == []
    # Dropping another owner's taint, or adding it, is not the labeller's to do.
    assert NodeChange(LABELLER, taints=(FOREIGN,), taints_read=read).not_owned() == [
        f"taint {labels.MIG_RECONFIGURE_TAINT_KEY}"]
    assert NodeChange(LABELLER, taints=(FOREIGN, MIG_TAINT), taints_read=(FOREIGN,)).not_owned() == [
        f"taint {labels.MIG_RECONFIGURE_TAINT_KEY}"]
    # The MIG manager removes its own; a foreign taint whose timeAdded differs is still the same taint.
    assert NodeChange(MIG_MANAGER, taints=({**FOREIGN, "timeAdded": ""},), taints_read=read).not_owned() == []
    # A list without the list it came from: every taint in it counts as added.
    assert NodeChange(MIG_MANAGER, taints=read).not_owned() == ["taint example.com/maintenance"]
    assert changed_taint_keys(read, ({**MIG_TAINT, "value": "false"}, FOREIGN)) == {labels.MIG_RECONFIGURE_TAINT_KEY}


def test_retaint_keeps_the_others_as_read() -> None:
    upgrade = {"key": UPGRADE_TAINT_KEY, "value": "true", "effect": "NoSchedule"}
    assert retaint((FOREIGN,), UPGRADE_TAINT_KEY, upgrade) == (FOREIGN, upgrade)
    assert retaint((upgrade, FOREIGN), UPGRADE_TAINT_KEY) == (FOREIGN,)


def test_a_change_not_owned_is_refused_before_any_request() -> None:
    fake = FakeKube()
    with pytest.raises(NotOwned) as refused:
        patch(_kube(fake), "n1", NodeChange(LABELLER, labels={labels.NODE_CHECK: "ok"}))
    assert str(refused.value) == f"patch node n1: not the labeller's to change: label {labels.NODE_CHECK}"
    assert isinstance(refused.value, KubeError)  # reported as the admission policy's refusal would be
    assert fake.sent == []


def test_the_driver_upgrade_signs_its_writes_and_the_agents_do_not() -> None:
    fake = FakeKube()
    patch(_kube(fake), "n1", NodeChange(DRIVER_UPGRADE, labels={labels.DRIVER_UPGRADE_STATE: "upgrade-done"}),
          what="driver upgrade: upgrade-done")
    patch(_kube(fake), "n/1", NodeChange(NODE_SETUP, labels={labels.GPU_SETUP_COMPLETE: ""}))
    assert fake.sent == [
        ("PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {labels.DRIVER_UPGRADE_STATE: "upgrade-done"}}},
         {"fieldManager": "nvidia-gpu-driver-upgrade"}),
        ("PATCH", "/api/v1/nodes/n%2F1", {"metadata": {"labels": {labels.GPU_SETUP_COMPLETE: ""}}}, None)]


def test_a_watched_copy_takes_the_answer_and_a_conflict_drops_it() -> None:
    fake, cache = FakeKube(conflicts=1), Cache()
    change = NodeChange(MIG_MANAGER, unschedulable=True)
    with pytest.raises(Conflict):
        patch(_kube(fake), "n1", change, cache=cache)
    assert (cache.invalidated, cache.offered) == (1, [])
    answer = patch(_kube(fake), "n1", change, cache=cache)
    assert cache.offered == [answer]


def test_decide_and_patch_reads_and_decides_again_after_a_conflict() -> None:
    reads, writes = iter(["7", "8", "9"]), []

    def write(rv: str) -> None:
        writes.append(rv)
        if rv != "9":
            raise Conflict("409", 409)

    assert decide_and_patch(lambda: next(reads), lambda rv: rv, write, attempts=3, node="n1") == "9"
    assert writes == ["7", "8", "9"]
    with pytest.raises(Conflict):
        decide_and_patch(lambda: "7", lambda rv: rv, write, attempts=2, node="n1")
    assert decide_and_patch(lambda: "7", lambda rv: None, write, attempts=3, node="n1") is None


def test_labels_to_patch_removes_only_what_has_our_value() -> None:
    current = {labels.GPU_SETUP_COMPLETE: "", labels.GPU_DEPLOY_DRIVER: "operator-managed", "kept": "x"}
    wanted: dict[str, str | None] = {labels.GPU_SETUP_COMPLETE: None, labels.GPU_VFIO_READY: None,
                                     labels.NODE_CHECK: "ok"}
    assert labels_to_patch(current, wanted, remove_if={labels.GPU_DEPLOY_DRIVER: labels.DRIVER_PREINSTALLED}) == {
        labels.GPU_SETUP_COMPLETE: None, labels.NODE_CHECK: "ok"}
    ours = {**current, labels.GPU_DEPLOY_DRIVER: labels.DRIVER_PREINSTALLED}
    assert labels_to_patch(ours, {}, remove_if={labels.GPU_DEPLOY_DRIVER: labels.DRIVER_PREINSTALLED}) == {
        labels.GPU_DEPLOY_DRIVER: None}

