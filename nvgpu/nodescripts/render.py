"""Render the Deckhouse NodeGroupConfiguration scripts from the catalogue and the shared facts."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Literal

from nvgpu import catalogue, labels
from nvgpu.driver import NO_EXPECTATION, DriverExpectation, KernelModules
from nvgpu.nodescripts import facts, plan, templates
from nvgpu.nodescripts.bashplan import (
    render_block,
    render_checks,
    render_chosen,
    render_devices,
    render_input_checks,
    render_plan,
)

#: NodeGroupConfiguration weights, from the one order of node setup's steps (``plan.SETUP_ORDER``, which says
#: why each is where it is).
WEIGHTS = {step.script: step.weight for step in plan.SETUP_ORDER}


@dataclass(frozen=True)
class NodeScript:
    name: str  #: file name, also the NodeGroupConfiguration's ``metadata.name`` suffix
    weight: int  #: ``spec.weight``
    content: str  #: ``spec.content`` (a bash script)


def _fill(template: str, values: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise KeyError(f"template marker @@{key}@@ has no value")
        return values[key]

    return re.sub(r"@@([A-Z0-9_]+)@@", sub, template)


def _model_cases() -> str:
    lines = []
    for model in catalogue.MODELS:
        names = " | ".join(f'"{n}"' for n in model.product_names)
        lines.append(f"    {names}) echo {model.effective_min_driver} ;;")
    return "\n".join(lines)


def _model_pci_cases() -> str:
    """``model_min_driver``'s PCI device ID arms (IDs as nvidia-smi prints them, upper-case hex)."""
    lines = []
    for model in catalogue.MODELS:
        ids = " | ".join(f'"{d:04X}"' for d in model.pci_device_ids)
        lines.append(f"    {ids}) echo {model.effective_min_driver}; return 0 ;;")
    return "\n".join(lines)


def _common(root_prefix: str) -> dict[str, str]:
    return {
        "ROOT": root_prefix.rstrip("/"),
        "STATE_DIR": facts.STATE_DIR,
        "VERDICT_FILE": facts.CHECK_VERDICT_FILE.removeprefix(facts.STATE_DIR),
        "PCI_DIR": facts.PCI_DEVICES_DIR,
        "NVIDIA_VENDOR": f"0x{catalogue.NVIDIA_PCI_VENDOR:04x}",
        "CLASS_TEST": " || ".join(f'"$class" == {c}*' for c in facts.GPU_PCI_CLASSES),
        "CONTAINERD_CONFIG": facts.CONTAINERD_CONFIG,
        "CONF_D": facts.DECKHOUSE_DROPIN_DIRS[2],
        "CONF2_D": facts.DECKHOUSE_DROPIN_DIRS[3],
        "CRI2_RE": re.escape(facts.CRI_PLUGIN[2]),
        "CRI3_RE": re.escape(facts.CRI_PLUGIN[3]),
        "RUNTIME": facts.NVIDIA_RUNTIME_NAME,
        "NCR": facts.NVIDIA_CONTAINER_RUNTIME,
        "CHECK_LABEL": labels.NODE_CHECK,
        "CHECK_REASONS_LABEL": labels.NODE_CHECK_REASONS,
        "SETUP_LABEL": labels.GPU_SETUP_COMPLETE,
        "VFIO_LABEL": labels.GPU_VFIO_READY,
        "GLOBAL_MIN_DRIVER": catalogue.GLOBAL_MIN_DRIVER,
        "MODEL_CASES": _model_cases(),
        "MODEL_PCI_CASES": _model_pci_cases(),
        "DRIVER_FILE": facts.DRIVER_VERSION_FILE,
        "PROC_MODULES": facts.PROC_MODULES,
        "SYS_MODULE_DIR": facts.SYS_MODULE_DIR,
        "OS_RELEASE_FILES": " ".join(facts.OS_RELEASE_FILES),
        "KERNEL_RELEASE_FILE": facts.KERNEL_RELEASE_FILE,
        "OS_ID_LABEL": labels.OS_RELEASE_ID,
        "OS_VERSION_LABEL": labels.OS_RELEASE_VERSION_ID,
        "KERNEL_LABEL": labels.KERNEL_VERSION_FULL,
        "HOST_DRIVER_MARKERS": " ".join(facts.HOST_DRIVER_MARKERS),
        "DEPLOY_DRIVER_LABEL": labels.GPU_DEPLOY_DRIVER,
        "DRIVER_PREINSTALLED": labels.DRIVER_PREINSTALLED,
        "GPUS_PROC_DIR": facts.NVIDIA_GPUS_PROC_DIR,
        "SMI": facts.NVIDIA_SMI,
        "SMI_TIMEOUT": str(facts.NVIDIA_SMI_TIMEOUT_S),
        "SMI_KILL": str(facts.NVIDIA_SMI_KILL_AFTER_S),
        "DECKHOUSE_BASE": facts.DECKHOUSE_CONTAINERD_BASE,
        "CRIO_CONFIG": facts.CRIO_CONFIG,
        "CRIO_DROPIN_DIR": facts.CRIO_DROPIN_DIR,
        "CRIO_BINARIES": " ".join(facts.CRIO_BINARIES),
        "CRIO_SOCKETS": " ".join(facts.CRIO_SOCKETS),
        "CONMON_PATHS": " ".join(facts.CONMON_PATHS),
        "TOOLKIT_CONFIG": facts.TOOLKIT_CONFIG,
        "SYSCTL_PLAN": render_plan(plan.SYSCTL, refuse="plan_refuse"),
        "VFIO_PLAN": render_plan(plan.VFIO),
        "RUNTIME_PLAN": render_chosen(plan.RUNTIME_DROPIN, refuse="runtime_refuse"),
        "HOST_CHECKS": render_checks(plan.HOST_CHECKS),
        "RUNTIME_CHECKS": render_checks(plan.RUNTIME_CHECKS),
        "DRIVER_CHECKS": render_input_checks(plan.DRIVER_CHECKS),
        "REQUIRED_DRIVER_CHECKS": textwrap.indent(render_input_checks(plan.REQUIRED_DRIVER_CHECKS), "  "),
        "VIRTUALIZATION_CHECKS": textwrap.indent(render_input_checks(plan.VIRTUALIZATION_CHECKS), "    "),
        "FABRIC_CHECKS": textwrap.indent(render_input_checks(plan.FABRIC_CHECKS), "    "),
        "DEVICES_PLAN": render_devices(plan.DEVICES, fail="fail_devices"),
        "DEVICES_LOG": plan.DEVICES.log,
        "DEVNODES_JOURNAL": facts.DEVNODES_JOURNAL,
        "DEVNODES_LOCK": facts.DEVNODES_LOCK,
    }


_PURPOSES = {
    "gpu-devices.sh": "load nvidia-uvm and make the missing /dev/nvidia* device nodes, as nvidia-ctk does",
    "gpu-check.sh": "decide whether this node's NVIDIA GPUs are usable (driver, modules, devices, NVML)",
    "gpu-runtime.sh": "enable the nvidia runtime and CDI in containerd (or CRI-O) through a drop-in",
    "gpu-vfio.sh": "load the VFIO modules, check the IOMMU and label the node gpu-vfio-ready",
    "gpu-sysctl.sh": "apply the sysctls the NVIDIA toolkit needs, then gate gpu-setup-complete",
}


def render_node_scripts(
    *,
    vfio: bool = False,
    root_prefix: str = "",
    check_phase: Literal["host", "all"] = "host",
    strict_check: bool = False,
    accept_envvar: bool = False,
    expect: DriverExpectation = NO_EXPECTATION,
    driver_root: str = "/",
) -> list[NodeScript]:
    """Render the node-setup scripts, in weight order. ``accept_envvar``: the group's device plugin uses the
    ``envvar`` strategy, so the toolkit must honour unprivileged containers' NVIDIA_VISIBLE_DEVICES.
    ``expect``: the driver the group declares, which the check compares with the loaded one.
    ``driver_root``: where the group's driver is on the node (a driver container's ``/run/nvidia/driver``),
    set as the toolkit's nvidia-container-cli root."""
    t = templates
    body = {
        "gpu-devices.sh": t.HEAD + t.HAS_GPU + t.DEVICES,
        "gpu-check.sh": t.HEAD + t.STATE + t.WRITE_FILE + t.NODE_LABEL + t.HAS_GPU + t.CONTAINERD_VERSION
        + t.RUNTIME_DETECT + t.RUNTIME_READY + t.CHECK,
        "gpu-runtime.sh": t.HEAD + t.STATE + t.WRITE_FILE + t.HAS_GPU + t.CONTAINERD_VERSION + t.RUNTIME_DETECT
        + t.TOOLKIT + t.RUNTIME,
        "gpu-sysctl.sh": t.HEAD + t.STATE + t.WRITE_FILE + t.NODE_LABEL + t.HAS_GPU + t.CONTAINERD_VERSION
        + t.RUNTIME_DETECT + t.RUNTIME_READY + t.SYSCTL,
    }
    if vfio:
        body["gpu-vfio.sh"] = t.HEAD + t.NODE_LABEL + t.HAS_GPU + t.VFIO
    values = _common(root_prefix)
    values["PHASE"] = check_phase
    values["STRICT"] = "true" if strict_check else "false"
    values["TOOLKIT_ROOT"] = "" if driver_root == "/" else driver_root
    values["EXPECT_DRIVER"] = expect.version.text if expect.version else ""
    values["EXPECT_MODULES"] = "" if expect.modules is KernelModules.AUTO else expect.modules.value
    values["EXPECT_DRIVER_TYPE"] = expect.driver_type.value if expect.driver_type else ""
    values["TOOLKIT_PLAN"] = render_block(plan.toolkit_config(accept_envvar))
    scripts = []
    for name, tmpl in body.items():
        vals = dict(values, NAME=name, PURPOSE=_PURPOSES[name])
        scripts.append(NodeScript(name=name, weight=WEIGHTS[name], content=_fill(tmpl, vals)))
    return sorted(scripts, key=lambda s: s.weight)
