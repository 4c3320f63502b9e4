"""``check``: is this node's GPU usable? The Python twin of ``gpu-check.sh`` (same reasons, same verdicts).

Checks, in order (the driver declared by the node group, when given: its version or branch, kernel
modules and type, the last against the GPUs' virtualization mode): an NVIDIA GPU on the PCI bus (none
-> verdict ``no-gpu``, a silent success); the driver version in ``/proc/driver/nvidia/version``
(present, parseable, at least the catalogue minimum for every GPU model found); kernel modules
``nvidia`` and ``nvidia_uvm``; ``/dev/nvidiactl`` and ``/dev/nvidia<minor>`` per GPU; NVML initialises
and lists GPUs; each has compute capability >= 6.0 (a model the catalogue lacks is a notice, not a
failure: the global driver minimum applies to it); every NVSwitch GPU's
Fabric Manager registration has completed (``fabric-not-ready`` otherwise); and (phase ``all``)
the container runtime is ready: containerd has the nvidia runtime or CDI, CRI-O has the nvidia runtime
(``runtimeName`` says which was found).
Every failure is a ``Finding`` with a reason code from ``nvgpu.nodescripts.facts.Reason``. The host's
requirements (modules, device nodes, the toolkit's programs) and the judgements of what the check found out
(the loaded driver against the declared one and the required one, the GPUs' virtualization modes against the
declared driver type, their compute capabilities and fabric registrations) are declared once in
``nvgpu.nodescripts.plan`` (``HOST_CHECKS``, ``RUNTIME_CHECKS``, ``DRIVER_CHECKS``, ``FABRIC_CHECKS``,
``VIRTUALIZATION_CHECKS``, ``REQUIRED_DRIVER_CHECKS``), judged here by ``node_agent.setup.executor`` and rendered
into the script.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from node_agent.host import DriverVersionError, HostError, HostRoot, nvidia_gpus, read_driver_version
from node_agent.nvml import FabricState, NvmlError, NvmlSession
from node_agent.setup import executor
from node_agent.setup.runtime import runtime_status
from nvgpu import catalogue
from nvgpu.driver import NO_EXPECTATION, DriverExpectation
from nvgpu.nodescripts import facts, plan
from nvgpu.nodescripts.facts import Reason, Verdict

Phase = Literal["host", "all"]
NvmlOpener = Callable[[], AbstractContextManager[NvmlSession]]


@dataclass(frozen=True)
class Finding:
    reason: Reason
    message: str


@dataclass(frozen=True)
class GpuSummary:
    index: int
    name: str
    uuid: str
    compute_capability: tuple[int, int]
    model: str | None


@dataclass(frozen=True)
class CheckReport:
    verdict: Verdict
    findings: tuple[Finding, ...] = ()
    driver_version: str | None = None
    required_driver: str | None = None
    gpus: tuple[GpuSummary, ...] = ()
    runtime: str | None = None
    runtime_name: str | None = None
    notices: tuple[str, ...] = ()

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(sorted({f.reason.value for f in self.findings}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reasons": list(self.reasons),
            "findings": [{"reason": f.reason.value, "message": f.message} for f in self.findings],
            "driverVersion": self.driver_version,
            "requiredDriver": self.required_driver,
            "gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid, "model": g.model,
                      "computeCapability": f"{g.compute_capability[0]}.{g.compute_capability[1]}"}
                     for g in self.gpus],
            "runtime": self.runtime,
            "runtimeName": self.runtime_name,
            "notices": list(self.notices),
        }

    def verdict_file(self) -> str:
        """The same ``key=value`` record ``gpu-check.sh`` writes."""
        return f"verdict={self.verdict.value}\nreasons={','.join(self.reasons)}\ndriver={self.driver_version or ''}\n"


@dataclass
class _Run:
    host: HostRoot
    findings: list[Finding] = field(default_factory=list)
    #: What the operator should know that does not make the node unusable (a GPU the catalogue lacks).
    notices: list[str] = field(default_factory=list)

    def fail(self, reason: Reason, message: str) -> None:
        self.findings.append(Finding(reason, message))


#: NVML's fabric states as ``nvidia-smi -q`` words them, the words ``plan.FabricReady`` judges.
_FABRIC_WORDS = {FabricState.NOT_SUPPORTED: "N/A", FabricState.NOT_STARTED: "Not Started",
                 FabricState.IN_PROGRESS: "In Progress", FabricState.COMPLETED: "Completed"}


def _fabric(index: int, name: str, nvml: NvmlSession) -> tuple[str, str, str]:
    """An NVSwitch GPU's (HGX/DGX H100, H200 and newer) registration with the NVLink fabric, as
    ``plan.FabricReady`` judges it: (the GPU's name in a message, its state, its status), in ``nvidia-smi -q``'s
    words.

    NOT_SUPPORTED, from the call or as the state, is a GPU without a fabric (PCIe boards, and every pre-Hopper
    GPU, whose NVML reports no fabric): ``N/A``. A failed registration's status is NVML's return code. Any other
    NVML error is raised (NVIDIA's strict path refuses to start on it too): the caller records it as
    ``nvml-failed``.
    """
    info = nvml.fabric_info(index)
    gpu = f"GPU {index} {name!r}"
    if info is None:
        return gpu, _FABRIC_WORDS[FabricState.NOT_SUPPORTED], "N/A"
    if info.state is not FabricState.COMPLETED:
        return gpu, _FABRIC_WORDS[info.state], "N/A"
    return gpu, _FABRIC_WORDS[info.state], "Success" if info.status == 0 else f"NVML status {info.status}"


def run_check(host: HostRoot, open_nvml: NvmlOpener, phase: Phase = "all",
              expect: DriverExpectation = NO_EXPECTATION, toolkit_dir: str | None = None) -> CheckReport:
    """The node's verdict; ``expect``: the driver its node group declares (a mismatch is a finding);
    ``toolkit_dir``: the toolkit a toolkit container installed, if the group has one."""
    try:
        if not nvidia_gpus(host):
            return CheckReport(Verdict.NO_GPU)
    except HostError as e:
        return CheckReport(Verdict.UNUSABLE, (Finding(Reason.PROC_UNREADABLE, str(e)),))
    r = _Run(host)
    driver: str | None = None
    try:
        driver = read_driver_version(host)
    except DriverVersionError as e:
        r.fail(Reason.DRIVER_MISSING if e.missing else Reason.DRIVER_UNPARSEABLE, str(e))
    except HostError as e:
        r.fail(Reason.PROC_UNREADABLE, str(e))
    first = ""
    if driver is not None and not expect.empty:
        # The first line, as gpu-check.sh reads it (read_driver_version just read the file).
        first = (host.read_text_or_none(facts.DRIVER_VERSION_FILE) or "").split("\n", 1)[0]
    inputs = executor.CheckInputs(driver=driver, driver_line=first, expect=expect)
    for reason, message in executor.input_findings(plan.DRIVER_CHECKS, inputs):
        r.fail(reason, message)

    for reason, message in executor.check_findings(host, plan.HOST_CHECKS):
        r.fail(reason, message)

    gpus: list[GpuSummary] = []
    required: str | None = None
    try:
        with open_nvml() as nvml:
            inventory = nvml.inventory()
            fabrics = []
            for g in inventory.gpus:
                try:
                    fabrics.append(_fabric(g.index, g.name, nvml))
                except NvmlError as e:  # this GPU's query only: the other checks still run
                    r.fail(Reason.NVML_FAILED, f"NVML: {e}")
            for reason, message in executor.input_findings(plan.FABRIC_CHECKS, replace(inputs, fabrics=fabrics)):
                r.fail(reason, message)
    except NvmlError as e:
        r.fail(Reason.NVML_FAILED, f"NVML: {e}")
    else:
        for lost in inventory.lost:
            r.fail(Reason.NVML_FAILED, f"GPU {lost.index}: {lost.reason}")
        if not inventory.lost:
            required = catalogue.GLOBAL_MIN_DRIVER
            for g in inventory.gpus:
                # By PCI device ID first: names vary by driver and board (and NVIDIA's mock A100 has its own).
                model = catalogue.identify_model(g.pci_device_id, g.name)
                gpus.append(GpuSummary(g.index, g.name, g.uuid, g.compute_capability, model.key if model else None))
                if model is None:
                    # A GPU NVML can describe is a GPU: NVIDIA's device plugin and GFD serve any board NVML
                    # lists; only the catalogue's extra knowledge (a model's own driver floor) is missing.
                    r.notices.append(f"GPU {g.index} {g.name!r} (PCI device ID 0x{g.pci_device_id:04X}) is not in "
                                     f"the catalogue: the global minimum driver {catalogue.GLOBAL_MIN_DRIVER} "
                                     "applies, and its MIG profiles are NVML's own")
                else:
                    required = max(required, model.effective_min_driver, key=catalogue.parse_driver_version)
            if not inventory.gpus:
                r.fail(Reason.NO_GPUS_LISTED, "NVML lists no GPU")
            modes = [g.virtualization.value if g.virtualization else "N/A" for g in inventory.gpus]
            computes = [(f"GPU {g.index} {g.name!r}", f"{g.compute_capability[0]}.{g.compute_capability[1]}")
                        for g in inventory.gpus]
            inputs = replace(inputs, modes=modes, required=required, computes=computes)
            for reason, message in executor.input_findings((*plan.VIRTUALIZATION_CHECKS,
                                                            *plan.REQUIRED_DRIVER_CHECKS), inputs):
                r.fail(reason, message)

    runtime: str | None = None
    runtime_name: str | None = None
    if phase == "all":
        status = runtime_status(host)
        runtime, runtime_name = status.detail, status.runtime
        if not status.ready:
            r.fail(Reason.RUNTIME_NOT_READY, status.detail)
        for reason, message in executor.check_findings(host, plan.RUNTIME_CHECKS, toolkit_dir=toolkit_dir):
            r.fail(reason, message)

    verdict = Verdict.UNUSABLE if r.findings else Verdict.OK
    return CheckReport(verdict, tuple(r.findings), driver, required, tuple(gpus), runtime, runtime_name,
                       tuple(r.notices))


def record_verdict(host: HostRoot, report: CheckReport) -> None:
    host.write_atomic(facts.CHECK_VERDICT_FILE, report.verdict_file())


def report_text(report: CheckReport) -> str:
    if report.verdict is Verdict.NO_GPU:
        return "GPU check: no NVIDIA GPU on this node (nothing to do)"
    lines = [f"GPU check: {report.verdict.value}"]
    if report.gpus:
        names = sorted({g.name for g in report.gpus})
        lines.append(f"  GPUs: {len(report.gpus)} x {', '.join(names)}; driver {report.driver_version or '?'}"
                     f" (required {report.required_driver})")
    if report.runtime:
        lines.append(f"  runtime: {report.runtime}")
    lines += [f"  NOTE {n}" for n in report.notices]
    lines += [f"  FAIL {f.reason.value}: {f.message}" for f in report.findings]
    return "\n".join(lines)
