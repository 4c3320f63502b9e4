"""The host layer: the only code that touches host paths, always through a ``HostRoot``.

``root`` (files, atomic writes, commands with timeouts), ``exec`` (the one seam every host command
goes through: the real ``HostExec``, or the test kit's recording one), ``errors`` (the layer's errors,
below ``root`` and ``exec`` both), ``atomic`` (the atomic write and the one lock primitive,
``exclusive_lock``), ``statefile`` (the format of the agent's own state files), ``proc`` (driver version,
modules, GPU minors, character majors, MIG minors), ``pci`` (GPUs on the bus, drivers, IOMMU groups, NUMA
nodes), ``vgpu`` (vGPU guests and their host driver, from the PCI config space), ``driverroot`` (where the
NVIDIA driver's user-space files live, looked up inside that root only: what ``nvml``, ``cdi`` and ``exec`` all
need, so it sits below them).

The services hold narrow protocols of their own (the device plugin's ``HostFiles``, the DRA driver's
``HostPaths``, the MIG manager's ``StateFiles``/``JournalFiles``) and production passes a ``HostRoot``
for each as it is: there is no adapter between them, so every path is resolved, and ``..`` refused,
in :meth:`HostRoot.path`, and every failure is a :class:`HostError` the caller decides about (a missing
file is ``None``/``False``, never an error; a refused or unreadable one is never taken for missing).
"""

from node_agent.host.exec import Exec, HostExec
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
