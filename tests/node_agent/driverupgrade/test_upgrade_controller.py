"""The driver upgrade controller over an in-memory API server (``node_agent.driverupgrade.controller``).

Two of its promises, which the pure state machine cannot show:

* its waits are timed on the monotonic clock: a wall-clock step (NTP, ``date -s``) neither fails a node
  early nor holds a failure back, in one process, in a restarted one on the same host, or in one on
  another host, which cannot place a wait it did not time and starts it again rather than fail the node;
* it trusts only the state it wrote: the API server records in ``metadata.managedFields`` which field
  manager last set each label and annotation, and a state key another manager set (a node agent, a person
  with kubectl) is forged: logged, reported in an Event, not acted on, and put back as the controller's own
  record says. A forged ``upgrade-failed`` does not stop the rollout; a forged later state does not skip a
  node's drain nor free its slot.

The fake API answers what the controller asks (DaemonSets, pods, nodes, evictions, events), plays the
DaemonSet controller (a deleted driver pod comes back current and Ready) and keeps ``managedFields`` for the
Nodes' labels and annotations as the API server does for an Update: a key whose value a request changes
is the request's manager's (``?fieldManager=``, else the prefix of its User-Agent; ``python-urllib3`` for
the agent's transport), an unchanged one stays whose it was.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pytest

from node_agent.driverupgrade import controller as ctl
from node_agent.driverupgrade.controller import UpgradeController
from node_agent.driverupgrade.machine import FAILURE_ANNOTATION, STATE_LABEL, WAS_CORDONED_ANNOTATION, UpgradeState
from node_agent.driverupgrade.nodestate import FIELD_MANAGER
from node_agent.kube.errors import Conflict, NotFound, TooManyRequests
from node_agent.kube.transport import Kube
from nvgpu import labels
from nvgpu.driver import DRIVER_SPEC_ANNOTATION, UPGRADE_POLICY_ANNOTATION, UpgradePolicy

NS = "gpu"
GROUP = "g1"
NODES = ("n-a", "n-b", "n-c")
OLD, NEW = "spec-old", "spec-new"
DRAIN_S = 600.0
POLICY = UpgradePolicy(max_unavailable=1, drain=True, drain_timeout_s=DRAIN_S, validation_timeout_s=1800)
#: What the agent's transport sends as its User-Agent, so what the API server records for a request
#: without ``?fieldManager=``: every node agent's, and the controller's before it named itself.
DEFAULT_MANAGER = "python-urllib3"
#: A person's ``kubectl label`` / ``kubectl annotate``.
KUBECTL = "kubectl-label"


def _merge(dst: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


@dataclass
class FakeApi:
    """Nodes, pods and one driver DaemonSet; the Kube calls the controller makes (``request`` and the
    real :class:`Kube` helpers over it)."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: node -> ("labels" | "annotations", key) -> the field manager that last changed it
    owners: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    daemonsets: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: pods a PodDisruptionBudget keeps (eviction answers 429)
    refuse: set[str] = field(default_factory=set)
    patches: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  #: (node, manager, body)
    calls: int = 0
    version: int = 100
    replaced: int = 0

    get = Kube.get
    get_object = Kube.get_object
    items = Kube.items
    create = Kube.create
    merge_patch = Kube.merge_patch
    delete = Kube.delete

    # -- the API -----------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, query: Mapping[str, Any] | None = None,
                content_type: str = "", timeout: Any = None, what: str = "") -> Any:
        self.calls += 1
        q = dict(query or {})
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method == "GET" and path == f"/apis/apps/v1/namespaces/{NS}/daemonsets":
            return {"items": self.daemonsets}
        if method == "GET" and path == f"/api/v1/namespaces/{NS}/pods":
            want = dict(s.split("=", 1) for s in str(q.get("labelSelector", "")).split(",") if s)
            return {"items": [p for p in self.pods.values()
                              if all(p["metadata"].get("labels", {}).get(k) == v for k, v in want.items())]}
        if method == "GET" and path == "/api/v1/pods":
            node = str(q.get("fieldSelector", "")).removeprefix("spec.nodeName=")
            return {"items": [p for p in self.pods.values() if p["spec"].get("nodeName") == node]}
        if method == "GET" and path == "/api/v1/nodes":
            key = str(q.get("labelSelector", ""))
            return {"items": [self._node(n) for n, o in self.nodes.items() if key in o["metadata"]["labels"]]}
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            if parts[3] not in self.nodes:
                raise NotFound(f"{what}: not found")
            if method == "GET":
                return self._node(parts[3])
            if method == "PATCH":
                return self.patch_node(parts[3], body, str(q.get("fieldManager") or DEFAULT_MANAGER))
        if path.startswith("/apis/deckhouse.io/"):
            raise NotFound(f"{what}: not found")
        if method == "POST" and path == "/api/v1/namespaces/default/events":
            self.events.append(body)
            return body
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            ref = (parts[3], parts[5])
            if ref not in self.pods:
                raise NotFound(f"{what}: not found")
            if method == "POST" and parts[6:] == ["eviction"]:
                if f"{ref[0]}/{ref[1]}" in self.refuse:
                    raise TooManyRequests(f"{what}: 429 the budget says not now", 429)
                self._gone(ref)
                return {}
            if method == "DELETE":
                self._gone(ref)
                return {}
        raise AssertionError(f"the fake API has no answer for {method} {path} {q}")

    def _node(self, name: str) -> dict[str, Any]:
        """The Node as the API server answers it, ``managedFields`` included (one Update entry a manager)."""
        obj = self.nodes[name]
        by_manager: dict[str, dict[str, Any]] = {}
        for (section, key), manager in sorted(self.owners.get(name, {}).items()):
            fields = by_manager.setdefault(manager, {"f:metadata": {}})["f:metadata"]
            fields.setdefault(f"f:{section}", {})[f"f:{key}"] = {}
        managed = [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                    "fieldsType": "FieldsV1", "fieldsV1": f} for m, f in sorted(by_manager.items())]
        out: dict[str, Any] = _copy({**obj, "metadata": {**obj["metadata"], "managedFields": managed}})
        return out

    def patch_node(self, name: str, body: Mapping[str, Any], manager: str) -> dict[str, Any]:
        obj = self.nodes[name]
        meta = dict(body.get("metadata") or {})
        want = meta.pop("resourceVersion", None)
        if want is not None and want != obj["metadata"]["resourceVersion"]:
            raise Conflict(f"patch node {name}: 409 the object has been modified", 409)
        self.patches.append((name, manager, _copy(dict(body))))
        owners = self.owners.setdefault(name, {})
        for section in ("labels", "annotations"):
            for key, value in (meta.get(section) or {}).items():
                current = obj["metadata"][section].get(key)
                if value is None:
                    obj["metadata"][section].pop(key, None)
                    owners.pop((section, key), None)
                elif current != value:
                    obj["metadata"][section][key] = value
                    owners[(section, key)] = manager
        _merge(obj["spec"], body.get("spec") or {})
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return self._node(name)

    def _gone(self, ref: tuple[str, str]) -> None:
        pod = self.pods.pop(ref)
        meta = pod["metadata"]
        if meta.get("labels", {}).get("app.kubernetes.io/name") == "nvidia-driver":  # the DaemonSet's work
            self.replaced += 1
            self.add_driver_pod(pod["spec"]["nodeName"], NEW, f"drv-{pod['spec']['nodeName']}-{self.replaced}")

    # -- the world ---------------------------------------------------------------------------------
    def add_node(self, name: str) -> None:
        self.nodes[name] = {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                                         "labels": {labels.NODE_GROUP: GROUP}, "annotations": {}},
                            "spec": {}}

    def add_driver_pod(self, node: str, spec: str, name: str = "") -> None:
        name = name or f"drv-{node}"
        self.pods[(NS, name)] = {
            "metadata": {"namespace": NS, "name": name,
                         "labels": {"app.kubernetes.io/name": "nvidia-driver", "app.kubernetes.io/instance": "drv"},
                         "annotations": {DRIVER_SPEC_ANNOTATION: spec},
                         "ownerReferences": [{"kind": "DaemonSet", "name": "drv", "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "driver"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}

    def add_workload(self, node: str, name: str) -> None:
        self.pods[("ml", name)] = {
            "metadata": {"namespace": "ml", "name": name,
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
            "status": {"phase": "Running"}}

    def write(self, node: str, manager: str, *, label: dict[str, str | None] | None = None,
              annotations: dict[str, str | None] | None = None) -> None:
        """Another client's merge patch of the Node (a node agent, a person)."""
        meta: dict[str, Any] = {}
        if label:
            meta["labels"] = label
        if annotations:
            meta["annotations"] = annotations
        self.patch_node(node, {"metadata": meta}, manager)

    # -- what the tests read -----------------------------------------------------------------------
    def state(self, node: str) -> str | None:
        value = self.nodes[node]["metadata"]["labels"].get(STATE_LABEL)
        return str(value) if value is not None else None

    def states(self) -> dict[str, str | None]:
        return {n: self.state(n) for n in self.nodes}

    def annotation(self, node: str, key: str) -> str | None:
        value = self.nodes[node]["metadata"]["annotations"].get(key)
        return str(value) if value is not None else None

    def cordoned(self) -> list[str]:
        return [n for n, o in self.nodes.items() if o["spec"].get("unschedulable")]

    def driver_specs(self) -> dict[str, str]:
        return {p["spec"]["nodeName"]: p["metadata"]["annotations"][DRIVER_SPEC_ANNOTATION]
                for p in self.pods.values() if p["metadata"]["namespace"] == NS}

    def owner(self, node: str, section: str, key: str) -> str | None:
        return self.owners.get(node, {}).get((section, key))

    def event_reasons(self, node: str) -> list[str]:
        return [str(e["reason"]) for e in self.events if e["involvedObject"]["name"] == node]


def _copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy(v) for v in obj]
    return obj


def world(nodes: tuple[str, ...] = NODES, policy: UpgradePolicy = POLICY) -> FakeApi:
    """Outdated driver pods (the DaemonSet's template moved to NEW) on each node of one group, each node
    with a GPU workload the drain moves."""
    api = FakeApi()
    api.daemonsets.append({"metadata": {"name": "drv", "namespace": NS, "labels": {labels.NODE_GROUP: GROUP},
                                        "annotations": {UPGRADE_POLICY_ANNOTATION: policy.to_annotation()}},
                           "spec": {"template": {"metadata": {"annotations": {DRIVER_SPEC_ANNOTATION: NEW}}}}})
    for n in nodes:
        api.add_node(n)
        api.add_driver_pod(n, OLD)
        api.add_workload(n, f"train-{n}")
    return api


@dataclass
class Clocks:
    """The controller's clocks: ``t`` is time passing (both move); :meth:`step` moves the wall clock alone."""

    t: float = 1_000_000.0
    wall_offset: float = 0.0

    def wall(self) -> float:
        return self.t + self.wall_offset

    def monotonic(self) -> float:
        return self.t - 990_000.0  # seconds since the host booted

    def step(self, seconds: float) -> None:
        self.wall_offset += seconds


def controller(api: FakeApi, clocks: Clocks, *, boot: str = "boot-1", dry_run: bool = False) -> UpgradeController:
    """A controller process on a host of boot ``boot`` (another boot: another host, or this one rebooted)."""
    return UpgradeController(api, NS, clock=clocks.wall, monotonic=clocks.monotonic,  # type: ignore[arg-type]
                             boot_id=lambda: boot, dry_run=dry_run)


def rounds(c: UpgradeController, n: int) -> None:
    for _ in range(n):
        c.run_round()


def run_to_done(api: FakeApi, clocks: Clocks, c: UpgradeController, limit: int = 60) -> None:
    for _ in range(limit):
        c.run_round()
        clocks.t += 5
        if all(s == UpgradeState.DONE.value for s in api.states().values()):
            return
    raise AssertionError(f"the rollout did not finish: {api.states()}")


def draining(api: FakeApi, clocks: Clocks, c: UpgradeController) -> str:
    """Run until the first node is in drain-required with its GPU workload held by a budget."""
    for n in api.nodes:
        api.refuse.add(f"ml/train-{n}")
    for _ in range(5):
        c.run_round()
        if any(s == UpgradeState.DRAIN.value for s in api.states().values()):
            break
    (node,) = [n for n, s in api.states().items() if s == UpgradeState.DRAIN.value]
    return node


@pytest.fixture
def caplog_info(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger=ctl.__name__)
    yield caplog


# --- (A) the waits against wall-clock steps ----------------------------------------------------------------


def test_a_wall_clock_step_forward_mid_drain_does_not_fail_the_node() -> None:
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    node = draining(api, clocks, c)
    clocks.t += 30
    clocks.step(DRAIN_S + 1)  # the wall clock says the drain has waited past its timeout; it has waited 30 s
    rounds(c, 3)
    assert api.state(node) == UpgradeState.DRAIN.value
    assert "DriverUpgradeFailed" not in api.event_reasons(node)
    # The budget lets go: the rollout goes through.
    api.refuse.clear()
    run_to_done(api, clocks, c)
    assert set(api.driver_specs().values()) == {NEW}


def test_a_wall_clock_step_back_does_not_hold_a_real_timeout_back() -> None:
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    node = draining(api, clocks, c)
    clocks.step(-3600)
    clocks.t += DRAIN_S - 10
    rounds(c, 2)
    assert api.state(node) == UpgradeState.DRAIN.value
    clocks.t += 11  # 601 s of real waiting
    rounds(c, 1)
    assert api.state(node) == UpgradeState.FAILED.value
    assert "drain did not finish within 600 s" in str(api.annotation(node, FAILURE_ANNOTATION))


def test_a_controller_restarted_on_the_same_host_times_the_wait_on_the_monotonic_clock() -> None:
    api, clocks = world(), Clocks()
    node = draining(api, clocks, controller(api, clocks))
    clocks.t += 300
    clocks.step(DRAIN_S)
    rounds(controller(api, clocks), 2)  # a new process, the same boot: it reads the record's monotonic reading
    assert api.state(node) == UpgradeState.DRAIN.value
    clocks.t += 301  # 601 s in all, across the restart
    rounds(controller(api, clocks), 1)
    assert api.state(node) == UpgradeState.FAILED.value


def test_a_controller_on_another_host_starts_again_a_wait_it_cannot_place(
        caplog_info: pytest.LogCaptureFixture) -> None:
    """Another host's monotonic clock says nothing of this one's: only the wall clock links the two. A wait
    the wall clock puts past its timeout (or in the future) starts again, logged, rather than fail the node."""
    api, clocks = world(), Clocks()
    node = draining(api, clocks, controller(api, clocks, boot="boot-1"))
    clocks.t += 60
    clocks.step(DRAIN_S + 1)
    elsewhere = controller(api, clocks, boot="boot-2")
    rounds(elsewhere, 2)
    assert api.state(node) == UpgradeState.DRAIN.value
    assert any("event=upgrade-wait-restarted" in r.getMessage() and f"node={node}" in r.getMessage()
               for r in caplog_info.records)
    clocks.t += DRAIN_S + 1
    rounds(elsewhere, 1)
    assert api.state(node) == UpgradeState.FAILED.value


def test_a_controller_on_another_host_keeps_a_plausible_wait() -> None:
    """Without a step, a wait the wall clock places within its timeout goes on from there: the move to
    another host does not give a stuck drain a fresh timeout."""
    api, clocks = world(), Clocks()
    node = draining(api, clocks, controller(api, clocks, boot="boot-1"))
    clocks.t += 400
    elsewhere = controller(api, clocks, boot="boot-2")
    rounds(elsewhere, 1)
    assert api.state(node) == UpgradeState.DRAIN.value
    clocks.t += 201
    rounds(elsewhere, 1)
    assert api.state(node) == UpgradeState.FAILED.value


# --- (B) state another field manager wrote -----------------------------------------------------------------


def forged_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "event=upgrade-state-forged" in r.getMessage()]


def test_the_controller_writes_its_state_as_its_own_field_manager() -> None:
    api, clocks = world(nodes=("n-a",)), Clocks()
    run_to_done(api, clocks, controller(api, clocks))
    assert {m for _, m, _ in api.patches} == {FIELD_MANAGER}
    assert api.owner("n-a", "labels", STATE_LABEL) == FIELD_MANAGER


def test_a_forged_failed_label_does_not_stop_the_rollout(caplog_info: pytest.LogCaptureFixture) -> None:
    """A node agent (the agent's transport: no field manager of its own) marks a node failed before the
    rollout reaches it: the controller ignores it, puts its own view back (no state there), reports it, and
    the rollout goes on through every node."""
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    api.write("n-c", DEFAULT_MANAGER, label={STATE_LABEL: UpgradeState.FAILED.value},
              annotations={FAILURE_ANNOTATION: "forged"})
    run_to_done(api, clocks, c)
    assert set(api.driver_specs().values()) == {NEW}
    assert api.annotation("n-c", FAILURE_ANNOTATION) is None
    lines = forged_lines(caplog_info)
    assert any(f"node=n-c key={STATE_LABEL} manager={DEFAULT_MANAGER}" in line for line in lines), lines
    assert "DriverUpgradeStateForged" in api.event_reasons("n-c")


def test_a_forged_failed_label_mid_rollout_is_put_back_to_the_controllers_record() -> None:
    """The node in flight is marked failed by someone else: its state is what the controller recorded
    (drain-required), written back; the drain goes on and so does the rollout."""
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    node = draining(api, clocks, c)
    api.write(node, KUBECTL, label={STATE_LABEL: UpgradeState.FAILED.value})
    rounds(c, 1)
    assert api.state(node) == UpgradeState.DRAIN.value
    assert api.owner(node, "labels", STATE_LABEL) == FIELD_MANAGER
    assert api.cordoned() == [node], "no other node starts meanwhile"
    api.refuse.clear()
    run_to_done(api, clocks, c)
    assert set(api.driver_specs().values()) == {NEW}


@pytest.mark.parametrize("forged", [UpgradeState.DONE, UpgradeState.UNCORDON, UpgradeState.RESTART])
def test_a_forged_later_state_does_not_skip_the_drain_or_free_the_slot(forged: UpgradeState) -> None:
    """``upgrade-done`` would have the node start over and let another node leave service meanwhile;
    ``uncordon-required`` would give it back with its old driver; ``pod-restart-required`` would replace
    the driver under the GPU workload the drain has not moved yet. None of them is acted on."""
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    node = draining(api, clocks, c)
    api.write(node, DEFAULT_MANAGER, label={STATE_LABEL: forged.value})
    rounds(c, 3)
    assert api.state(node) == UpgradeState.DRAIN.value
    assert api.cordoned() == [node], "one node out of service (maxUnavailable 1)"
    assert api.driver_specs()[node] == OLD, "the driver is not replaced under the workload"
    assert ("ml", f"train-{node}") in api.pods


def test_a_forged_was_cordoned_record_does_not_uncordon_an_operators_node() -> None:
    """An operator cordoned the node before its upgrade: the controller recorded it, and keeps its own
    record when another client rewrites the annotation, so the node stays cordoned after its upgrade."""
    api, clocks = world(nodes=("n-a",)), Clocks()
    api.nodes["n-a"]["spec"]["unschedulable"] = True
    c = controller(api, clocks)
    rounds(c, 2)
    assert api.annotation("n-a", WAS_CORDONED_ANNOTATION) == "true"
    api.write("n-a", DEFAULT_MANAGER, annotations={WAS_CORDONED_ANNOTATION: "false"})
    run_to_done(api, clocks, c)
    assert api.cordoned() == ["n-a"]


def test_an_operator_removing_a_failed_label_still_restarts_the_rollout() -> None:
    """The documented way on after a failure: a person deletes the label (a deletion names no manager)."""
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    node = draining(api, clocks, c)
    clocks.t += DRAIN_S + 1
    rounds(c, 1)
    assert api.state(node) == UpgradeState.FAILED.value
    rounds(c, 2)
    assert [n for n, s in api.states().items() if s == UpgradeState.DRAIN.value] == [], "the rollout stopped"
    api.refuse.clear()
    api.write(node, KUBECTL, label={STATE_LABEL: None})
    run_to_done(api, clocks, c)
    assert set(api.driver_specs().values()) == {NEW}


def test_once_decides_on_the_trusted_state_and_changes_nothing() -> None:
    api, clocks = world(), Clocks()
    rounds(controller(api, clocks), 1)
    assert set(api.states().values()) == {UpgradeState.REQUIRED.value}
    api.write("n-c", DEFAULT_MANAGER, label={STATE_LABEL: UpgradeState.FAILED.value})
    before = len(api.patches)
    done = controller(api, clocks, dry_run=True).run_round()
    assert len(api.patches) == before and api.state("n-c") == UpgradeState.FAILED.value
    assert done.steps["n-a"].state is UpgradeState.DRAIN, "the forged failure does not hold the rollout"


# --- (C) at rest, the loop waits on its watches ------------------------------------------------------------


def test_a_round_is_settled_only_when_every_node_is_at_rest_and_nothing_was_done() -> None:
    api, clocks = world(), Clocks()
    c = controller(api, clocks)
    assert not c.run_round().settled, "outdated drivers: the rollout starts"
    run_to_done(api, clocks, c)
    assert c.run_round().settled, "every node upgrade-done and current"
    # A node that failed waits for a person (who removes its label): nothing is due until then.
    api.write(NODES[0], FIELD_MANAGER, label={STATE_LABEL: UpgradeState.FAILED.value})
    assert c.run_round().settled
    # A forged mid-upgrade state is put back: that round acted.
    api.write(NODES[1], KUBECTL, label={STATE_LABEL: UpgradeState.DRAIN.value})
    assert not c.run_round().settled
    assert c.run_round().settled


@dataclass
class FakeWatch:
    """Stands for one of the controller's watches: the test pokes ``wake`` as an event would."""

    wake: Any
    started: bool = False
    stopped: bool = False

    def start(self) -> None:
        self.started = True

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped = True


class Watched(UpgradeController):
    """The controller with its watches replaced by :class:`FakeWatch` and its rounds counted."""

    def __init__(self, api: FakeApi, clocks: Clocks) -> None:
        super().__init__(api, NS, clock=clocks.wall, monotonic=clocks.monotonic,  # type: ignore[arg-type]
                         boot_id=lambda: "boot-1")
        self.fakes: list[FakeWatch] = []
        self.done = threading.Semaphore(0)
        self.count = 0

    def watches(self, wake: Callable[[], None]) -> list[ctl.Watcher]:
        self.fakes = [FakeWatch(wake) for _ in range(3)]
        return list(self.fakes)

    def run_round(self) -> ctl.Round:
        out = super().run_round()
        self.count += 1
        self.done.release()
        return out


def test_at_rest_the_next_round_waits_for_a_change_not_the_interval() -> None:
    api, clocks = world(), Clocks()
    run_to_done(api, clocks, controller(api, clocks))
    c, stop = Watched(api, clocks), threading.Event()
    loop = threading.Thread(target=c.run, args=(stop,), kwargs={"interval_s": 0.001, "resync_s": 3600})
    loop.start()
    try:
        assert c.done.acquire(timeout=10)
        assert all(w.started for w in c.fakes)
        # Settled: with a 1 ms interval a timer would have run hundreds of rounds by the time this is false.
        assert not c.done.acquire(timeout=0.3) and c.count == 1
        c.fakes[1].wake()  # a driver pod changed
        assert c.done.acquire(timeout=10) and c.count == 2
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive() and all(w.stopped for w in c.fakes)


def test_while_a_rollout_runs_the_rounds_come_every_interval() -> None:
    api, clocks = world(), Clocks()
    c, stop = Watched(api, clocks), threading.Event()
    loop = threading.Thread(target=c.run, args=(stop,), kwargs={"interval_s": 0.001, "resync_s": 3600})
    loop.start()
    try:
        for _ in range(5):  # outdated drivers: no change needed to come round again
            assert c.done.acquire(timeout=10)
    finally:
        stop.set()
        loop.join(10)
    assert not loop.is_alive()
