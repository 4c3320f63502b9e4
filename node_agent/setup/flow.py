"""``setup`` and ``teardown``: the node-setup flow, the Python twin of the Deckhouse scripts.

``setup``: device nodes (``nvidia-uvm`` loaded and the ``/dev/nvidia*`` nodes made, as NVIDIA's
``nvidia-ctk system create-device-nodes`` does: ``node_agent.setup.devnodes``) → check (host phase) →
runtime apply (and the toolkit config) → runtime ready? → (``--dra``) VFIO prepare → sysctl apply → label
``node.deckhouse.io/gpu-setup-complete`` (and ``gpu-vfio-ready``), in ``nvgpu.nodescripts.plan.SETUP_ORDER``, the
order of the Deckhouse scripts' weights. The first failing step stops the flow,
removes the label(s) and reports the reason; a node without a GPU gets the labels removed and exits 0.
``teardown`` (GPU turned off for the node) removes the labels, rolls back the runtime drop-in, the sysctl
change and the device nodes setup made, and leaves ``/etc`` as it was before setup.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node_agent.host import HostError, HostRoot, Refused, nvidia_gpus, osinfo
from node_agent.kube import KubeError
from node_agent.kube.nodeowner import NODE_SETUP, labels_to_patch
from node_agent.labeller.labels import withdraw as withdraw_labels
from node_agent.labeller.nodepatch import NodeEnv
from node_agent.setup import devnodes
from node_agent.setup.check import record_verdict, run_check
from node_agent.setup.runtime import (
    apply_runtime,
    installed_toolkit,
    remove_installed_toolkit,
    rollback_runtime,
    runtime_status,
)
from node_agent.setup.sysctl import apply_sysctl, rollback_sysctl
from node_agent.setup.vfio import prepare as vfio_prepare
from nvgpu import labels
from nvgpu.driver import NO_EXPECTATION, DriverExpectation
from nvgpu.nodescripts import plan
from nvgpu.nodescripts.facts import Verdict


class Failure(enum.Enum):
    """Why a flow stopped; the command line maps each to its exit code (``node_agent.cli.exitcodes``)."""

    FAILED = "failed"  #: the node is not OK (unusable GPU, runtime not ready)
    HOST_INPUT = "host-input"  #: bad input on the host; what was not done is left as it was
    KUBE = "kube"  #: the Kubernetes API call failed
    REFUSED = "refused"  #: a file in the way is not ours


@dataclass
class Step:
    name: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class FlowResult:
    action: str
    complete: bool = False
    steps: list[Step] = field(default_factory=list)
    label_changes: dict[str, str | None] = field(default_factory=dict)
    #: None: no step failed.
    failure: Failure | None = None
    #: Setup's check labels (``labels.check_labels``), once the check ran.
    check_labels: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The result without its exit code (the command line adds ``exitCode``)."""
        return {"action": self.action, "complete": self.complete, "steps": [s.to_dict() for s in self.steps],
                "labelChanges": self.label_changes}

    def fail(self, name: str, detail: str, failure: Failure = Failure.FAILED) -> FlowResult:
        self.steps.append(Step(name, False, detail))
        self.failure = failure
        return self


@dataclass
class _SetupRun:
    """One ``setup``: its steps as methods named after ``plan.SETUP_ORDER``'s, each answering whether the flow
    goes on (a failed step has recorded its failure in ``result``), so the order is the plan's and the scripts'."""

    ctx: NodeEnv
    dra: bool
    restart: bool
    accept_envvar: bool
    expect: DriverExpectation
    toolkit_root: str
    toolkit_dir: str | None
    result: FlowResult = field(default_factory=lambda: FlowResult("setup"))
    made: devnodes.Result = field(default_factory=devnodes.Result)

    def run(self) -> FlowResult:
        steps: dict[str, Callable[[], bool]] = {"devices": self.devices, "check": self.check,
                                                "runtime": self.runtime, "vfio": self.vfio, "sysctl": self.sysctl}
        for step in plan.SETUP_ORDER:
            if not steps[step.name]():
                return self.result
        self.result.complete = True
        return self.result

    def devices(self) -> bool:
        """A freshly booted node has the driver loaded but not nvidia-uvm, and no /dev/nvidia* node: NVIDIA's
        stack loads the module and makes the nodes itself before it checks (node_agent.setup.devnodes). Its
        outcome is told in the check's step."""
        host = self.ctx.host
        try:
            has_gpu = bool(nvidia_gpus(host))
        except HostError:
            has_gpu = False  # the check reports the unreadable bus (proc-unreadable)
        try:
            self.made = devnodes.ensure(host) if has_gpu else devnodes.Result()
        except Refused as e:
            return self._fail("devices", str(e), Failure.REFUSED)
        except HostError as e:
            return self._fail("devices", str(e), Failure.HOST_INPUT)
        return True

    def check(self) -> bool:
        host, result = self.ctx.host, self.result
        report = run_check(host, self.ctx.nvml, phase="host", expect=self.expect)
        result.check_labels = labels.check_labels(report.verdict.value, report.reasons)
        try:
            record_verdict(host, report)
        except HostError as e:
            return self._fail("check", str(e), Failure.HOST_INPUT)
        if report.verdict is Verdict.NO_GPU:
            result.steps.append(Step("check", True, "no NVIDIA GPU on this node: nothing to set up"))
            return False
        if report.verdict is Verdict.UNUSABLE:
            return self._fail("check", "; ".join(f"{f.reason.value}: {f.message}" for f in report.findings))
        result.steps.append(Step("check", True, f"{len(report.gpus)} GPU(s), driver {report.driver_version}"
                                 + "".join(f"; loaded {m}" for m in self.made.loaded)
                                 + (f"; device nodes made: {', '.join(self.made.created)}"
                                    if self.made.created else "")))
        return True

    def runtime(self) -> bool:
        host = self.ctx.host
        if self.toolkit_dir is not None and not installed_toolkit(host, self.toolkit_dir):
            # The runtime must name a binary that is there (it becomes the default runtime only then): the
            # pod's init container fails and kubelet retries it until the toolkit container has installed it.
            return self._fail("runtime", f"waiting for the toolkit container to install {self.toolkit_dir}")
        try:
            rt = apply_runtime(host, restart=self.restart, accept_envvar=self.accept_envvar,
                               driver_root=self.toolkit_root, toolkit_dir=self.toolkit_dir)
        except Refused as e:
            return self._fail("runtime", str(e), Failure.REFUSED)
        except HostError as e:
            return self._fail("runtime", str(e), Failure.HOST_INPUT)
        status = runtime_status(host)
        if not status.ready:
            return self._fail("runtime", status.detail)
        self.result.steps.append(Step("runtime", True, f"{status.detail}; changed: {', '.join(rt.changed) or 'nothing'}"
                                      + _notes(rt.notes)))
        return True

    def vfio(self) -> bool:
        """DRA's passthrough only (``--dra``): the VFIO modules and an IOMMU."""
        if not self.dra:
            return True
        try:
            vfio = vfio_prepare(self.ctx.host)
        except HostError as e:
            return self._fail("vfio", str(e))
        if not vfio.ready:
            return self._fail("vfio", ", ".join(vfio.problems))
        self.result.steps.append(Step("vfio", True, "modules loaded, IOMMU on"))
        return True

    def sysctl(self) -> bool:
        try:
            sc = apply_sysctl(self.ctx.host)
        except Refused as e:
            return self._fail("sysctl", str(e), Failure.REFUSED)
        except HostError as e:
            return self._fail("sysctl", str(e), Failure.HOST_INPUT)
        self.result.steps.append(Step("sysctl", True, f"changed: {', '.join(sc.changed_files) or 'nothing'}"))
        return True

    def _fail(self, name: str, detail: str, failure: Failure = Failure.FAILED) -> bool:
        self.result.fail(name, detail, failure)
        return False


def setup(ctx: NodeEnv, *, dra: bool, restart: bool, patch_node: bool, accept_envvar: bool = False,
          expect: DriverExpectation = NO_EXPECTATION, toolkit_root: str = "/", toolkit_dir: str | None = None
          ) -> FlowResult:
    """Check (against the group's declared driver, ``expect``), runtime (the toolkit finding the driver under
    ``toolkit_root``; the toolkit NVIDIA's toolkit container installed in ``toolkit_dir``, once it is there),
    (VFIO and) sysctl, then open the gate."""
    result = _SetupRun(ctx, dra, restart, accept_envvar, expect, toolkit_root, toolkit_dir).run()
    wanted: dict[str, str | None] = {labels.GPU_SETUP_COMPLETE: "" if result.complete else None,
                                     **result.check_labels}
    # Published whatever the check found: a driver container is chosen by them and must run first.
    wanted |= _driver_placement_labels(ctx.host)
    if dra or not result.complete:
        wanted[labels.GPU_VFIO_READY] = "true" if (dra and result.complete) else None
    _patch(ctx, result, wanted, patch_node)
    return result


def _notes(notes: list[str]) -> str:
    """The runtime step's notes, in its detail: what apply or rollback left alone (an operator's edit) or put
    back is said where the setup pod's log shows it, not only in ``runtime``'s own output."""
    return "".join(f"; note: {n}" for n in notes)


def _driver_placement_labels(host: HostRoot) -> dict[str, str | None]:
    """The OS and kernel labels (NFD's names), and ``nvidia.com/gpu.deploy.driver=pre-installed`` where the
    host has its own driver, so no driver container is scheduled there (never removed here: NVIDIA's
    operator may own the label on nodes without one; teardown removes the value setup gave it)."""
    out = dict(osinfo.os_labels(host))
    if osinfo.host_driver_installed(host):
        out[labels.GPU_DEPLOY_DRIVER] = labels.DRIVER_PREINSTALLED
    return out


def teardown(ctx: NodeEnv, *, restart: bool, patch_node: bool, toolkit_dir: str | None = None) -> FlowResult:
    """The node leaves the group: close the gate first (the labeller, gated on it, stops writing), then take
    off the labeller's labels and taints and the feature file, then roll back the runtime and the sysctl,
    and remove the toolkit a toolkit container installed in ``toolkit_dir`` (nothing runs it any more)."""
    result = FlowResult("teardown")
    _patch(ctx, result, {labels.GPU_SETUP_COMPLETE: None, labels.GPU_VFIO_READY: None,
                         labels.NODE_CHECK: None, labels.NODE_CHECK_REASONS: None,
                         **dict.fromkeys(labels.OS_LABELS)}, patch_node,
           remove_if={labels.GPU_DEPLOY_DRIVER: labels.DRIVER_PREINSTALLED})
    if result.failure is not None:
        return result
    if patch_node:
        try:
            withdrawn = withdraw_labels(ctx)
        except (KubeError, HostError) as e:
            return result.fail("node-labels", f"withdrawing the labeller's labels: {e}", Failure.KUBE)
        result.label_changes |= withdrawn
        result.steps.append(Step("labels", True, f"withdrawn: {len(withdrawn)} label(s)"))
    try:
        rt = rollback_runtime(ctx.host, restart=restart)
        result.steps.append(Step("runtime", True, f"restored: {', '.join(rt.changed) or 'nothing'}"
                                 + _notes(rt.notes)))
        sc = rollback_sysctl(ctx.host)
        result.steps.append(Step("sysctl", True, f"restored: {', '.join(sc.changed_files) or 'nothing'}; live: "
                                 + (", ".join(f"{k}={v}" for k, v in sc.live.items()) or "unchanged")))
        removed_nodes = devnodes.rollback(ctx.host)
        if removed_nodes:
            result.steps.append(Step("devices", True,
                                     f"removed the device nodes setup made: {', '.join(removed_nodes)}"))
        if toolkit_dir is not None:
            removed = remove_installed_toolkit(ctx.host, toolkit_dir)
            result.steps.append(Step("toolkit", True, f"removed {toolkit_dir}" if removed
                                     else f"{toolkit_dir}: no installed toolkit to remove"))
    except HostError as e:
        return result.fail("rollback", str(e), Failure.HOST_INPUT)
    result.complete = True
    return result


def _patch(ctx: NodeEnv, result: FlowResult, wanted: dict[str, str | None], patch_node: bool,
           remove_if: dict[str, str] | None = None) -> None:
    """Set (or, with None, remove) the ``wanted`` labels; ``remove_if``: labels removed only while they have
    the value setup gave them (another owner's value stays)."""
    if not patch_node:
        return

    try:
        node = ctx.require_node_name()
        api = ctx.node_api()
        changes = labels_to_patch(api.labels(node), wanted, remove_if=remove_if)
        if changes:
            api.patch_labels(node, changes, writer=NODE_SETUP)
        result.label_changes = changes
    except KubeError as e:
        result.fail("node-labels", str(e), Failure.KUBE)
        result.complete = False
