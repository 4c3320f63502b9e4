"""The NVML layer: the only code that imports ``pynvml`` (nvidia-ml-py).

Public surface (import from ``node_agent.nvml``):

* ``open_nvml(backend, timeout_s=...)`` → context manager yielding an ``NvmlSession``;
  ``backend`` is ``"real"``, ``"simulated:<machine>"`` or an ``NvmlBackend`` (which can carry a
  state file shared between processes).
* ``NvmlSession``: ``driver()``, ``device_count()``, ``inventory()``, ``gpus()``, ``gpu(i)``,
  ``topology()``, ``processes(i)``, ``fabric_info(i)``, ``watch_events()`` and the MIG operations ``mig_mode``,
  ``set_mig_mode``, ``gpu_instance_profiles``, ``possible_placements``, ``remaining_capacity``,
  ``gpu_instances``, ``create_gpu_instance``, ``destroy_gpu_instance``, ``compute_instances``,
  ``create_compute_instance``, ``destroy_compute_instance``. Protocols ``GpuSource`` and
  ``MigControl`` name the read and MIG halves.
* Frozen values from ``types`` and errors from ``errors`` (``NvmlUnavailable``, ``DeviceLost``,
  ``NvmlTimeout``, ...), each with the ``NVMLError`` chained.
* ``node_agent.nvml.simulator``: the one door to simulated machines (``simulated:<machine>``): a
  ``Simulator`` registered at run time by ``node_agent.cli`` (the machines themselves, with their fault
  injection, are the ``nvml_sim`` package beside the agent, which no module here imports).
* ``node_agent.nvml.loader``: ``real`` loads ``libnvidia-ml.so.1`` from the driver root
  (``NvmlBackend.driver_root``, else the process's ``--driver-root``; see ``node_agent.host.driverroot``)
  into nvidia-ml-py before ``nvmlInit``, never from the process's own library path.
"""

from node_agent.nvml.errors import (
    DeviceLost,
    NvmlError,
    NvmlInsufficientResources,
    NvmlInUse,
    NvmlInvalidArgument,
    NvmlNotFound,
    NvmlNotSupported,
    NvmlPermissionDenied,
    NvmlTimeout,
    NvmlUnavailable,
)
from node_agent.nvml.session import (
    DEFAULT_TIMEOUT_S,
    EventWatcher,
    GpuSource,
    MigControl,
    NvmlBackend,
    NvmlSession,
    open_nvml,
)
from node_agent.nvml.types import (
    ComputeInstance,
    DriverInfo,
    EventKind,
    FabricInfo,
    FabricState,
    Gpu,
    GpuEvent,
    GpuInstance,
    GpuInstanceProfile,
    GpuPair,
    GpuProcess,
    GpuRecovery,
    GpuTelemetry,
    GpuUuid,
    Inventory,
    LostGpu,
    MigDevice,
    MigMemory,
    MigMode,
    MigUuid,
    Placement,
    RecoveryNeed,
    Topology,
    TopologyLevel,
    normalize_bus_id,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ComputeInstance",
    "DeviceLost",
    "DriverInfo",
    "EventKind",
    "EventWatcher",
    "FabricInfo",
    "FabricState",
    "Gpu",
    "GpuEvent",
    "GpuInstance",
    "GpuInstanceProfile",
    "GpuPair",
    "GpuProcess",
    "GpuRecovery",
    "GpuSource",
    "GpuTelemetry",
    "GpuUuid",
    "Inventory",
    "LostGpu",
    "MigControl",
    "MigDevice",
    "MigMemory",
    "MigMode",
    "MigUuid",
    "NvmlBackend",
    "NvmlError",
    "NvmlInUse",
    "NvmlInsufficientResources",
    "NvmlInvalidArgument",
    "NvmlNotFound",
    "NvmlNotSupported",
    "NvmlPermissionDenied",
    "NvmlSession",
    "NvmlTimeout",
    "NvmlUnavailable",
    "Placement",
    "RecoveryNeed",
    "Topology",
    "TopologyLevel",
    "normalize_bus_id",
    "open_nvml",
]
