"""The host layer: the only code that touches host paths, always through a ``HostRoot``.

``root`` (files, atomic writes, commands with timeouts), ``exec`` (the one seam every host command
goes through: the real ``HostExec`` or a test's ``RecordingExec``), ``proc`` (driver version, modules, GPU
minors), ``pci`` (GPUs on the bus, drivers, IOMMU groups, NUMA nodes), ``vgpu`` (vGPU guests and their
host driver, from the PCI config space), ``driverroot`` (where the NVIDIA driver's user-space files live,
looked up inside that root only: what ``nvml``, ``cdi`` and ``exec`` all need, so it sits below them).
"""

from node_agent.host.exec import Call, Exec, HostExec, RecordingExec
from node_agent.host.pci import PciDevice, normalize_address, nvidia_gpus, read_device
from node_agent.host.proc import DriverVersionError, gpu_minors, loaded_modules, read_driver_version
from node_agent.host.root import (
    CommandNotFound,
    CommandResult,
    CommandTimeout,
    HostError,
    HostRoot,
    NotOurs,
    Refused,
)
from node_agent.host.vgpu import VgpuDevice, VgpuInfoError, VgpuScanError, vgpu_devices

__all__ = [
    "Call",
    "CommandNotFound",
    "CommandResult",
    "CommandTimeout",
    "DriverVersionError",
    "Exec",
    "HostError",
    "HostExec",
    "HostRoot",
    "NotOurs",
    "PciDevice",
    "RecordingExec",
    "Refused",
    "VgpuDevice",
    "VgpuInfoError",
    "VgpuScanError",
    "gpu_minors",
    "loaded_modules",
    "normalize_address",
    "nvidia_gpus",
    "read_device",
    "read_driver_version",
    "vgpu_devices",
]
