"""dcgm-exporter's counters file (``-f default-counters.csv``): which fields to serve.

The format is dcgm-exporter's, so one ConfigMap serves either exporter: one field per line,
``DCGM_FIELD, type, help``, ``#`` starting a comment. A line this exporter cannot read is an error
naming the line; a field it cannot serve is a warning with the reason (:data:`fields.NOT_FROM_NVML`),
never a silent gap; a field known to neither is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.exporter.fields import (
    DEFAULT_FIELDS,
    DRIVER_VERSION_LABEL,
    FIELDS,
    NOT_FROM_NVML,
    NOT_SERVED_LABELS,
    XID_FIELD,
)
from nvgpu.dcgmcounters import CountersError, read

__all__ = ["CountersError", "Selection", "default", "parse"]


@dataclass(frozen=True)
class Selection:
    """The fields to serve, in file order, and what was asked for but cannot be."""

    fields: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def default() -> Selection:
    return Selection(DEFAULT_FIELDS)


def parse(text: str, source: str = "counters file") -> Selection:
    """The fields of a counters file this exporter serves; what it cannot serve becomes a warning."""
    chosen: list[str] = []
    warnings: list[str] = []
    for counter in read(text, source):
        name, kind, where = counter.name, counter.kind, f"{source} line {counter.line}"
        if name in {DRIVER_VERSION_LABEL, XID_FIELD, *FIELDS}:
            if name in FIELDS and kind != "label" and kind != FIELDS[name].kind:
                warnings.append(f"{where}: {name} is a {FIELDS[name].kind} (as DCGM defines it), not a {kind}")
            if name != DRIVER_VERSION_LABEL:  # the driver label is always set
                chosen.append(name)
        elif name in NOT_FROM_NVML:
            warnings.append(f"{where}: {name} is not served by the agent exporter ({NOT_FROM_NVML[name]}); "
                            "cluster.monitoring.exporter: dcgm serves it")
        elif name in NOT_SERVED_LABELS or name.startswith("DCGM_EXP_"):
            warnings.append(f"{where}: {name} is not served by the agent exporter")
        else:
            raise CountersError(f"{where}: {name!r} is not a DCGM field this exporter knows "
                                f"(known: {', '.join(sorted({*FIELDS, XID_FIELD, *NOT_FROM_NVML}))})")
    if not chosen:
        raise CountersError(f"{source}: no field to serve")
    return Selection(tuple(chosen), tuple(warnings))
