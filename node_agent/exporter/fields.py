"""The DCGM fields the agent exporter serves, each with the NVML reading behind it.

Users' dashboards and alerts are written against dcgm-exporter's metric names, types and units, so the
names here are DCGM's and the values are converted to DCGM's units (W, MHz, MiB, mJ, %). DCGM reads most
device fields through NVML itself; those are exact. What NVML does not give is listed in
:data:`NOT_FROM_NVML` with the reason and what, if anything, is served instead: the DCGM profiling
fields (``DCGM_FI_PROF_*``) come from DCGM's own counters; the two PCIe profiling fields are served from
NVML's PCIe throughput (its 20 ms window, the same unit).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from node_agent.nvml import GpuTelemetry

Kind = Literal["gauge", "counter"]
Reading = Callable[[GpuTelemetry], float | int | bool | None]


@dataclass(frozen=True)
class Field:
    """One DCGM field as a Prometheus metric."""

    name: str
    kind: Kind
    help: str
    read: Reading
    #: Also served per MIG device (the framebuffer is the instance's own); other fields are the GPU's.
    per_mig: bool = False


def _f(name: str, kind: Kind, help_: str, read: Reading, *, per_mig: bool = False) -> Field:
    return Field(name, kind, help_, read, per_mig)


#: Every field this exporter can serve, by DCGM name.
FIELDS: dict[str, Field] = {f.name: f for f in (
    _f("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda t: t.sm_clock_mhz),
    _f("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda t: t.mem_clock_mhz),
    _f("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda t: t.gpu_temp_c),
    _f("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda t: t.power_w),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
       lambda t: t.energy_mj),
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", lambda t: t.pcie_replays),
    _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda t: t.gpu_util),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda t: t.memory_util),
    _f("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda t: t.encoder_util),
    _f("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda t: t.decoder_util),
    _f("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda t: t.fb_free_mib, per_mig=True),
    _f("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda t: t.fb_used_mib, per_mig=True),
    _f("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", lambda t: t.fb_reserved_mib),
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
       lambda t: t.ecc_sbe_volatile),
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
       lambda t: t.ecc_dbe_volatile),
    _f("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.",
       lambda t: t.ecc_sbe_aggregate),
    _f("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.",
       lambda t: t.ecc_dbe_aggregate),
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors",
       lambda t: t.remapped_uncorrectable),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors",
       lambda t: t.remapped_correctable),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", lambda t: t.remap_failure),
    _f("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending a GPU reset",
       lambda t: t.remap_pending),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event (throttle) reasons, NVML's bitmask.",
       lambda t: t.clock_events),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus (bytes per second; "
       "NVML's 20 ms throughput window).", lambda t: t.pcie_tx_bytes_per_s),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus (bytes per second; "
       "NVML's 20 ms throughput window).", lambda t: t.pcie_rx_bytes_per_s),
)}

#: The last XID (a gauge, as dcgm-exporter serves it) comes from the exporter's NVML event set, not a reading.
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
#: The driver version is a label on every series (dcgm-exporter's ``label`` type), not a series.
DRIVER_VERSION_LABEL = "DCGM_FI_DRIVER_VERSION"

#: DCGM fields dcgm-exporter can serve and NVML cannot give, with the reason (``cluster.monitoring.exporter:
#: dcgm`` serves them; the agent exporter warns once when a counters file asks for one).
NOT_FROM_NVML: dict[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "a DCGM profiling counter; DCGM_FI_DEV_GPU_UTIL is NVML's nearest",
    "DCGM_FI_PROF_SM_ACTIVE": "a DCGM profiling counter",
    "DCGM_FI_PROF_SM_OCCUPANCY": "a DCGM profiling counter",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "a DCGM profiling counter",
    "DCGM_FI_PROF_DRAM_ACTIVE": "a DCGM profiling counter; DCGM_FI_DEV_MEM_COPY_UTIL is NVML's nearest",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "a DCGM profiling counter",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "a DCGM profiling counter",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "a DCGM profiling counter",
    "DCGM_FI_DEV_MEMORY_TEMP": "NVML reports it only as a field value on HBM boards; not read yet",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "NVML field values (NVLink throughput counters); not read yet",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU guests only (the vGPU licensing API); not read",
    "DCGM_FI_DEV_POWER_VIOLATION": "DCGM's violation timers; DCGM_FI_DEV_CLOCKS_EVENT_REASONS has the cause",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "DCGM's violation timers; DCGM_FI_DEV_CLOCKS_EVENT_REASONS has the cause",
}

#: dcgm-exporter's own fields (``DCGM_EXP_*``) and the static-information labels this exporter has no
#: equivalent for; a counters file naming them is told so.
NOT_SERVED_LABELS = frozenset({
    "DCGM_FI_NVML_VERSION", "DCGM_FI_DEV_BRAND", "DCGM_FI_DEV_SERIAL", "DCGM_FI_DEV_OEM_INFOROM_VER",
    "DCGM_FI_DEV_ECC_INFOROM_VER", "DCGM_FI_DEV_POWER_INFOROM_VER", "DCGM_FI_DEV_INFOROM_IMAGE_VER",
    "DCGM_FI_DEV_VBIOS_VERSION",
})

#: What the agent exporter serves without a counters file: dcgm-exporter's defaults that NVML provides,
#: plus the ECC totals and the clock event reasons the stack's alerts use.
DEFAULT_FIELDS: tuple[str, ...] = (
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", XID_FIELD,
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
)
