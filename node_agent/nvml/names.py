"""NVML's enumerations by name, and the reads ``diagnose`` makes that need nvidia-ml-py's constants.

Kept in the NVML layer (the only one that imports nvidia-ml-py), so a report can say ``EXCLUSIVE_PROCESS``
and ``RESET`` rather than 3 and 2.
"""

from __future__ import annotations

from typing import Any, Protocol

import pynvml


def _names(prefix: str) -> dict[int, str]:
    """nvidia-ml-py's constants with ``prefix`` as value -> name (``NVML_BRAND_NVIDIA`` -> ``NVIDIA``)."""
    out: dict[int, str] = {}
    for name in sorted(dir(pynvml)):
        value = getattr(pynvml, name)
        if name.startswith(prefix) and isinstance(value, int) and value not in out:
            out[value] = name.removeprefix(prefix)
    return out


#: ``nvmlBrandType_t``.
BRANDS = _names("NVML_BRAND_")
#: ``nvmlBrandType_t`` as NVIDIA's go-nvlib spells it (``GetBrandAsString``, ``pkg/nvlib/device/device.go``),
#: which NVIDIA's DRA driver publishes as the ``brand`` attribute (``cmd/gpu-kubelet-plugin/nvlib.go``).
GO_NVLIB_BRANDS: dict[int, str] = {
    pynvml.NVML_BRAND_UNKNOWN: "Unknown", pynvml.NVML_BRAND_QUADRO: "Quadro", pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS", pynvml.NVML_BRAND_GRID: "Grid", pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan", pynvml.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    pynvml.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC", pynvml.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    pynvml.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS", pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    pynvml.NVML_BRAND_QUADRO_RTX: "QuadroRTX", pynvml.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia", pynvml.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    pynvml.NVML_BRAND_TITAN_RTX: "TitanRTX",
}
#: ``nvmlComputeMode_t`` (nvml.h; nvidia-ml-py spells the constants ``NVML_COMPUTEMODE_*``).
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
#: ``nvmlDeviceGpuRecoveryAction_t``: what the GPU needs after an error (none, a reset, a reboot, a drain and reset).
RECOVERY_ACTIONS = _names("NVML_GPU_RECOVERY_ACTION_")
RECOVERY_FIELD: int | None = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)


class Queries(Protocol):
    def query(self, index: int, name: str, *args: Any) -> Any: ...


def recovery_action(nvml: Queries, index: int) -> str:
    """``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` of GPU ``index`` by name; raises the field's own NVML error."""
    if RECOVERY_FIELD is None:
        raise RuntimeError("this nvidia-ml-py has no NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    field: Any
    (field,) = nvml.query(index, "nvmlDeviceGetFieldValues", [RECOVERY_FIELD])
    if int(field.nvmlReturn) != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(int(field.nvmlReturn))
    action = int(field.value.uiVal)
    return RECOVERY_ACTIONS.get(action, str(action))
