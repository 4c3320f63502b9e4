"""The NVIDIA driver's MIG capability minors, numbered as the driver numbers them.

With MIG, access to a GPU instance or compute instance goes through an ``nvidia-caps`` character device.
The driver reserves a minor for every GPU-instance slot (GI 0-14) and every compute-instance slot of it
(CI 0-7) of every GPU, in GPU minor order, after ``config`` (1) and ``monitor`` (2), and publishes the table
as ``/proc/driver/nvidia-caps/mig-minors``. Both plugins build a MIG device's device nodes from it, so every
test host (device plugin, DRA, MIG manager interplay, the side-by-side machines) gets the one table here.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: GPU-instance and compute-instance IDs the driver reserves minors for, per GPU.
GI_SLOTS, CI_SLOTS = 15, 8
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
CAPS_DEV_DIR = "/dev/nvidia-caps"
#: A MIG slot: (GPU minor, GPU instance ID, compute instance ID or None for the GPU instance itself).
Slot = tuple[int, int, int | None]


def minor_table(gpu_minors: Iterable[int]) -> dict[Slot, int]:
    """Every GI and CI slot of the GPUs with these minors and its capability minor, as the driver assigns
    them (``config`` and ``monitor`` take 1 and 2)."""
    table: dict[Slot, int] = {}
    n = 3
    for minor in sorted(set(gpu_minors)):
        for gi in range(GI_SLOTS):
            table[(minor, gi, None)] = n
            n += 1
            for ci in range(CI_SLOTS):
                table[(minor, gi, ci)] = n
                n += 1
    return table


def mig_minors_text(table: dict[Slot, int]) -> str:
    """The table as the driver writes ``mig-minors``: ``gpu<minor>/gi<id>[/ci<id>]/access <cap minor>``."""
    lines = ["config 1", "monitor 2"]
    for (minor, gi, ci), cap in table.items():
        lines.append(f"gpu{minor}/gi{gi}" + (f"/ci{ci}" if ci is not None else "") + f"/access {cap}")
    return "\n".join(lines) + "\n"


def write_mig_minors(root: Path, gpu_minors: Iterable[int]) -> dict[Slot, int]:
    """``mig-minors`` for these GPUs under the host root ``root``; the table it holds."""
    table = minor_table(gpu_minors)
    path = root / MIG_MINORS.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mig_minors_text(table))
    return table


def cap_device(cap: int) -> str:
    """The host path of capability minor ``cap``'s device node."""
    return f"{CAPS_DEV_DIR}/nvidia-cap{cap}"
