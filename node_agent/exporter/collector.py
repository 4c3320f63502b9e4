"""One scrape: every GPU read once through NVML, one series per GPU or MIG device per field.

Labels are dcgm-exporter's, so its dashboards and alerts select the same series: ``gpu`` (NVML index),
``UUID``, ``pci_bus_id``, ``device`` (``nvidia<minor>``), ``modelName``, ``Hostname``, the driver version
as ``DCGM_FI_DRIVER_VERSION``; MIG devices add ``GPU_I_PROFILE`` and ``GPU_I_ID``; a device held by one
container adds ``pod``, ``namespace`` and ``container``. On a GPU in MIG mode the framebuffer fields are
served per MIG device only (the instances' memory is the GPU's, so a per-GPU series would count it twice);
the other fields are the GPU's. A GPU NVML reports lost is left out of the device series and counted in
``nvidia_gpu_exporter_gpus{state="lost"}``; a failed scrape answers what it could and counts the failure.
A GPU whose details NVML refuses (a GPU in MIG mode read without the MIG monitor capability: its memory and
MIG devices) keeps its series, and ``nvidia_gpu_exporter_unreadable{what=...}`` says what is missing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from node_agent.exporter.fields import DRIVER_VERSION_LABEL, FIELDS, XID_FIELD
from node_agent.exporter.holders import Holder, Holders
from node_agent.nvml import Gpu, GpuTelemetry, MigDevice, MigMemory, NvmlError, NvmlSession
from node_agent.nvml.xid import is_application_xid

log = logging.getLogger(__name__)

#: Every GPU's series: dcgm-exporter's labels.
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", DRIVER_VERSION_LABEL)
#: A MIG device's series add its instance.
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
#: A device held by one container adds the container.
POD_LABELS = ("pod", "namespace", "container")
Labels = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric: its type and help, and its samples (labels, value)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Series:
    """A metric the exporter serves besides the DCGM readings (:data:`fields.FIELDS`): declared here, once,
    with the labels its samples carry, so the metrics reference (``make docs-reference``) is read from the
    same definition the scrape uses."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...]

    def family(self, samples: list[tuple[Labels, float]] | None = None) -> Family:
        return Family(self.name, self.kind, self.help, samples or [])


XID_LAST = Series(XID_FIELD, "gauge", "Value of the last XID error encountered.", (*GPU_LABELS, *POD_LABELS))
DEVICE_HOLDER = Series("nvidia_gpu_device_holder", "gauge",
                       "1 for each container holding a GPU, MIG device or a shared replica of one.",
                       (*GPU_LABELS, "device_uuid", *POD_LABELS))
UNREADABLE = Series("nvidia_gpu_exporter_unreadable", "gauge",
                    "1 for each detail NVML refuses to tell about a GPU (its memory or MIG devices when the exporter "
                    "lacks the MIG monitor capability), by what is missing.", (*GPU_LABELS, "what"))
GPUS = Series("nvidia_gpu_exporter_gpus", "gauge", "GPUs this exporter reads, by state.", ("state", "Hostname"))
#: Its other labels are the exporter's ``--info LABEL=VALUE`` (the stack passes node_group, sharing and
#: allocation_mode).
NODE_INFO = Series("nvidia_gpu_node_info", "gauge", "The node's GPU settings as the stack declares them.",
                   ("Hostname",))
XID_ERRORS = Series("nvidia_gpu_xid_errors_total", "counter",
                    "XID errors raised since the exporter started, by GPU, XID and class.",
                    ("gpu", "UUID", "xid", "class", "Hostname"))
FAILURES = Series("nvidia_gpu_exporter_failures_total", "counter", "Scrape steps that failed, by stage.", ("stage",))
SCRAPE_DURATION = Series("nvidia_gpu_exporter_scrape_duration_seconds", "gauge", "How long reading the GPUs took.",
                         ())
#: Every series of :class:`Series`, in the order a scrape serves them (after the DCGM fields).
SERIES: tuple[Series, ...] = (XID_LAST, DEVICE_HOLDER, UNREADABLE, GPUS, XID_ERRORS, FAILURES, SCRAPE_DURATION,
                              NODE_INFO)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: Iterable[Family]) -> bytes:
    """The Prometheus text format (0.0.4), names exactly as given (no ``_total`` added to counters:
    dcgm-exporter's counter names have none, and dashboards query them as they are)."""
    lines: list[str] = []
    for f in families:
        if not f.samples:
            continue
        lines += [f"# HELP {f.name} {_escape(f.help)}", f"# TYPE {f.name} {f.kind}"]
        for labels, value in f.samples:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{f.name}{{{body}}} {_number(value)}" if body else f"{f.name} {_number(value)}")
    return ("\n".join(lines) + "\n").encode()


def _holder_labels(holder: Holder | None) -> Labels:
    return () if holder is None else (("pod", holder.pod), ("namespace", holder.namespace),
                                      ("container", holder.container))


@dataclass
class Exporter:
    """Reads a node's GPUs into families; ``holders`` maps the GPUs to their pods (None: no attribution)."""

    nvml: NvmlSession
    fields: Sequence[str]
    hostname: str
    xid_last: Callable[[], Mapping[int, int]] = dict
    xid_counts: Callable[[], Mapping[tuple[int, int], int]] = dict
    holders: Callable[[Sequence[Gpu]], Holders] | None = None
    clock: Callable[[], float] = time.perf_counter
    #: Failed steps by stage, kept by the caller across scrapes (``nvidia_gpu_exporter_failures_total``).
    failures: dict[str, int] = field(default_factory=dict)
    #: After :meth:`collect`: GPUs read, and GPUs NVML lists but cannot read.
    read: int = 0
    lost: int = 0

    def collect(self) -> list[Family]:
        start = self.clock()
        inv = self.nvml.inventory()
        driver = self.nvml.driver().driver_version
        holders = self._holders(inv.gpus)
        families = {n: Family(n, FIELDS[n].kind, FIELDS[n].help) for n in self.fields if n in FIELDS}
        xid = XID_LAST.family() if XID_FIELD in self.fields else None
        held = DEVICE_HOLDER.family()
        unreadable = UNREADABLE.family()
        last = self.xid_last()
        for gpu in inv.gpus:
            base: Labels = (("gpu", str(gpu.index)), ("UUID", str(gpu.uuid)), ("pci_bus_id", gpu.pci_bus_id),
                            ("device", f"nvidia{gpu.minor}"), ("modelName", gpu.name), ("Hostname", self.hostname),
                            (DRIVER_VERSION_LABEL, driver))
            for what in gpu.unreadable:
                unreadable.samples.append(((*base, ("what", what.split(":", 1)[0])), 1.0))
            try:
                reading = self.nvml.telemetry(gpu.index)
                migs = self.nvml.mig_memory(gpu.index) if gpu.mig_enabled else ()
            except NvmlError as e:  # lost between the listing and the reading: next scrape says so
                self._fail("read")
                log.warning("event=gpu-read-failed gpu=%d error=%s", gpu.index, e)
                continue
            whole = base + _holder_labels(holders.sole(str(gpu.uuid)))
            self._gpu_series(families, gpu, reading=reading, migs=migs, base=base, whole=whole, holders=holders)
            if xid is not None and gpu.index in last:
                xid.samples.append((whole, float(last[gpu.index])))
            for uuid in (str(gpu.uuid), *(str(m.uuid) for m in gpu.mig_devices)):
                for h in holders.by_uuid.get(uuid, ()):
                    held.samples.append(((*base, ("device_uuid", uuid), *_holder_labels(h)), 1.0))
        self.read, self.lost = len(inv.gpus), len(inv.lost)
        out = list(families.values()) + ([xid] if xid else []) + [held, unreadable]
        out += self._own(inv.gpus, len(inv.lost), self.clock() - start)
        return out

    def _gpu_series(self, families: dict[str, Family], gpu: Gpu, *, reading: GpuTelemetry,
                    migs: Sequence[MigMemory], base: Labels, whole: Labels, holders: Holders) -> None:
        by_id = {(m.gi_id, m.ci_id): m for m in gpu.mig_devices}
        for name, fam in families.items():
            f = FIELDS[name]
            if f.per_mig and gpu.mig_enabled:
                for mem in migs:
                    dev = by_id.get((mem.gi_id, mem.ci_id))
                    if dev is not None:
                        fam.samples.append((self._mig_labels(base, dev, holders), float(
                            mem.used_mib if name == "DCGM_FI_DEV_FB_USED" else mem.free_mib)))
                continue
            value = f.read(reading)
            if value is not None:
                fam.samples.append((whole, float(value)))

    @staticmethod
    def _mig_labels(base: Labels, dev: MigDevice, holders: Holders) -> Labels:
        return (*base, ("GPU_I_PROFILE", dev.profile), ("GPU_I_ID", str(dev.gi_id)),
                *_holder_labels(holders.sole(str(dev.uuid))))

    def _holders(self, gpus: Sequence[Gpu]) -> Holders:
        if self.holders is None:
            return Holders()
        try:
            return self.holders(gpus)
        except Exception as e:  # kubelet down or restarting: serve the GPU series without pod labels
            self._fail("pod-resources")
            log.warning("event=pod-resources-failed error=%s", e)
            return Holders()

    def _fail(self, stage: str) -> None:
        self.failures[stage] = self.failures.get(stage, 0) + 1

    def _own(self, gpus: Sequence[Gpu], lost: int, seconds: float) -> list[Family]:
        state = GPUS.family([((("state", "ok"), ("Hostname", self.hostname)), float(len(gpus))),
                             ((("state", "lost"), ("Hostname", self.hostname)), float(lost))])
        return [state, *own_families(self.hostname, {g.index: str(g.uuid) for g in gpus}, self.xid_counts(),
                                     self.failures, seconds)]


def info_family(hostname: str, info: Mapping[str, str]) -> Family:
    """``nvidia_gpu_node_info``: what the stack declared for this node (its node group, sharing and
    allocation mode, given as ``--info``), for dashboards to group GPUs by; 1 always."""
    labels = (("Hostname", hostname), *sorted(info.items()))
    return NODE_INFO.family([(labels, 1.0)])


def own_families(hostname: str, index_uuid: Mapping[int, str], counts: Mapping[tuple[int, int], int],
                 failures: Mapping[str, int], seconds: float | None) -> list[Family]:
    """The exporter's own series: XIDs counted, failed steps, the scrape's duration (left out when no GPU
    could be read, so a dashboard never shows a broken scrape as a fast one)."""
    xids = XID_ERRORS.family()
    for (index, code), n in sorted(counts.items()):
        klass = "application" if is_application_xid(code) else "device"
        xids.samples.append(((("gpu", str(index)), ("UUID", index_uuid.get(index, "")), ("xid", str(code)),
                              ("class", klass), ("Hostname", hostname)), float(n)))
    failed = FAILURES.family([((("stage", s),), float(n)) for s, n in sorted(failures.items())])
    took = SCRAPE_DURATION.family([] if seconds is None else [((), seconds)])
    return [xids, failed, took]
