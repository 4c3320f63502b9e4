"""Project errors for the NVML layer, so callers never catch ``pynvml.NVMLError`` themselves.

The type says what the caller can do: ``NvmlUnavailable`` (no driver/library: treat the node as
having no usable GPU), ``DeviceLost`` (one GPU fell off the bus: mark it unhealthy, keep the
others), ``NvmlTimeout`` (a call hung: same as lost for that device), ``NvmlNotSupported`` (the
feature does not exist on this GPU), ``NvmlInUse``/``NvmlInsufficientResources`` (a MIG operation
cannot proceed now). Any error other than ``NvmlUnavailable`` raised for one GPU's call is that
GPU's alone: ``NvmlSession.inventory()`` lists the GPU as unusable with the message and keeps the
others. The original ``NVMLError`` is always chained as ``__cause__``.
"""

from __future__ import annotations


class NvmlError(Exception):
    """Base of every NVML-layer error; ``code`` is NVML's return code when one exists."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlUnavailable(NvmlError):
    """NVML cannot be loaded or initialised (no library, driver not loaded, version mismatch)."""


class DeviceLost(NvmlError):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST) or needs a reset."""


class NvmlTimeout(NvmlError):
    """An NVML call did not return within its time budget (the call is abandoned, not cancelled)."""


class NvmlNotSupported(NvmlError):
    """The GPU or driver does not support the requested query or operation."""


class NvmlNotFound(NvmlError):
    """The device, instance or placement asked for does not exist."""


class NvmlInUse(NvmlError):
    """The GPU or instance is in use (processes, existing instances) so the change was refused."""


class NvmlInsufficientResources(NvmlError):
    """No room left on the GPU for the requested MIG instance."""


class NvmlInvalidArgument(NvmlError):
    """NVML rejected an argument (for example a placement that is not legal for the profile)."""


class NvmlPermissionDenied(NvmlError):
    """The operation needs privileges the agent does not have."""
