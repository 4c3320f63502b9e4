"""vGPU guests from the PCI config space: is this node a VM with NVIDIA vGPUs, and which host driver serves them.

NVIDIA's GFD (``internal/vgpu`` of k8s-device-plugin) reads it so, and so do we, byte for byte: every
NVIDIA PCI function (vendor ``0x10de``, whatever its class) has its ``config`` read whole; a config
space shorter than 256 bytes is an error (Linux gives only the first 64 bytes to a reader without
CAP_SYS_ADMIN, which is why NVIDIA runs GFD privileged). The capability list (status bit 0x10, list
from offset 0x34) is walked to the first vendor-specific capability (ID 0x09); a vGPU's carries the
signature ``VF`` at bytes 3-4 and records from byte 5 on, each ``id, length, data``, of which record 0
holds the host driver version and branch (10 NUL-padded bytes each).

Two kinds of failure, as NVIDIA tells them apart: :class:`VgpuScanError` when the devices cannot be
read at all (the caller then publishes no vGPU label: it cannot tell), :class:`VgpuInfoError` when a
vGPU capability has no host-driver record (NVIDIA's GFD fails the labelling run on it).
"""

from __future__ import annotations

from dataclasses import dataclass

from node_agent.host.root import HostError, HostRoot
from nvgpu.catalogue import NVIDIA_PCI_VENDOR
from nvgpu.nodescripts.facts import PCI_DEVICES_DIR

#: Offsets and IDs of the PCI config space (PCI Local Bus spec), as NVIDIA's ``pciutil.go`` names them.
CONFIG_SIZE = 256
STATUS = 0x06
STATUS_CAPABILITY_LIST = 0x10
CAPABILITY_LIST = 0x34
CAPABILITY_VENDOR_SPECIFIC = 0x09
#: The vGPU vendor capability: signature at bytes 3-4, records from byte 5, host driver record 0.
VGPU_SIGNATURE = b"VF"
RECORD_START = 5
HOST_DRIVER_RECORD = 0
HOST_DRIVER_VERSION_LENGTH = 10
HOST_DRIVER_BRANCH_LENGTH = 10


class VgpuScanError(HostError):
    """The NVIDIA PCI devices cannot be read (a file missing, a short config space): vGPU presence unknown."""


class VgpuInfoError(HostError):
    """A vGPU capability without the host driver record NVIDIA's GFD reads the version and branch from."""


@dataclass(frozen=True)
class VgpuDevice:
    address: str  #: sysfs PCI address, ``0000:07:00.0``
    host_driver_version: str  #: ``550.90.05``: the vGPU manager on the hypervisor
    host_driver_branch: str  #: ``r550_00``


def vendor_capability(config: bytes) -> bytes | None:
    """The first vendor-specific capability of a config space (None: no capability list or none in it).

    Walked as ``GetVendorSpecificCapability`` does: offsets are single bytes (they wrap at 256), a
    visited offset ends the walk (a looped chain), so does ID 0xff (a broken one).
    """
    if len(config) < CONFIG_SIZE:
        raise ValueError(f"the config space has {len(config)} bytes, fewer than {CONFIG_SIZE}")
    if not config[STATUS] & STATUS_CAPABILITY_LIST:
        return None
    visited: set[int] = set()
    pos = config[CAPABILITY_LIST]
    while pos != 0 and pos not in visited:
        cap_id, nxt, length = config[pos], config[(pos + 1) & 0xFF], config[(pos + 2) & 0xFF]
        if cap_id == 0xFF:
            break
        if cap_id == CAPABILITY_VENDOR_SPECIFIC:
            return config[pos:pos + length]
        visited.add(pos)
        pos = nxt
    return None


def is_vgpu(capability: bytes) -> bool:
    return len(capability) >= RECORD_START and capability[3:5] == VGPU_SIGNATURE


def host_driver(capability: bytes) -> tuple[str, str] | None:
    """(version, branch) from the host driver record of a vGPU capability; None when it has none.

    Records are skipped by their length byte until record 0; the record must hold both 10-byte fields.
    Bytes map to characters one to one and NULs are trimmed from both ends, as in ``GetInfo``.
    """
    pos = RECORD_START
    record = capability[pos] if pos < len(capability) else HOST_DRIVER_RECORD
    while record != HOST_DRIVER_RECORD and pos < len(capability):
        if pos + 1 >= len(capability) or capability[pos + 1] == 0:
            return None  # a record running off the end, or of length 0 (NVIDIA's loop would never end)
        pos += capability[pos + 1]
        if pos >= len(capability):
            return None
        record = capability[pos]
    data = pos + 2
    end = data + HOST_DRIVER_VERSION_LENGTH + HOST_DRIVER_BRANCH_LENGTH
    if record != HOST_DRIVER_RECORD or end > len(capability):
        return None

    def text(raw: bytes) -> str:
        return "".join(map(chr, raw)).strip("\x00")

    return (text(capability[data:data + HOST_DRIVER_VERSION_LENGTH]),
            text(capability[data + HOST_DRIVER_VERSION_LENGTH:end]))


def _nvidia_configs(host: HostRoot) -> list[tuple[str, bytes]]:
    """(address, config space) of every NVIDIA PCI function; any unreadable file is a :class:`VgpuScanError`."""
    nvidia = f"0x{NVIDIA_PCI_VENDOR:04x}"
    out = []
    try:
        for address in host.listdir(PCI_DEVICES_DIR):
            base = f"{PCI_DEVICES_DIR}/{address}"
            if host.read_text(f"{base}/vendor").strip().lower() != nvidia:
                continue
            host.read_text(f"{base}/class")  # NVIDIA reads it too: a device without one is unreadable
            out.append((address, host.read_bytes(f"{base}/config")))
    except HostError as e:
        raise VgpuScanError(f"cannot read the NVIDIA PCI devices: {e}", e.path) from e
    return out


def vgpu_devices(host: HostRoot) -> tuple[VgpuDevice, ...]:
    """Every NVIDIA PCI function that is a vGPU, in address order.

    Raises :class:`VgpuScanError` when a device cannot be read (NVIDIA's ``Devices()`` error: the
    caller cannot tell whether this is a vGPU guest) and :class:`VgpuInfoError` for a vGPU without
    its host driver record.
    """
    found: list[VgpuDevice] = []
    for address, config in _nvidia_configs(host):
        where = f"{PCI_DEVICES_DIR}/{address}/config"
        try:
            capability = vendor_capability(config)
        except ValueError as e:
            raise VgpuScanError(f"PCI device {address}: {e} (reading it whole needs CAP_SYS_ADMIN)", where) from e
        if capability is None or not is_vgpu(capability):
            continue
        driver = host_driver(capability)
        if driver is None:
            raise VgpuInfoError(f"PCI device {address} is a vGPU, but its vendor capability has no host driver "
                                "version record", where)
        found.append(VgpuDevice(address, *driver))
    return tuple(found)
