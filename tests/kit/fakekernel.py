"""A ``HostRoot`` that plays the kernel's part for PCI driver binding in a fake root.

Writing to sysfs on a real host makes the kernel act: ``driver/unbind`` detaches the driver,
``drivers_probe`` attaches the driver named by ``driver_override`` (or the default one). In a
fake root those are plain files, so this subclass applies the same effects to the fake tree (the
``driver`` symlink) after each write. Used by the VFIO tests, which run the real agent code.

As on a real node, unbinding a GPU from ``nvidia`` while something holds it does not fail: the write
blocks in the kernel (the driver's remove waits for its clients) until the last holder lets go, and the
agent's thread is stuck with it, uncancellable; NVIDIA's VFIO code therefore waits, bounded, for the GPU to
be free before it unbinds and runs the unbind with a timeout (NVIDIA/k8s-dra-driver-gpu
``cmd/gpu-kubelet-plugin/vfio-device.go``: ``WaitForGPUFree``, ``tryChangeDriverWithTimeout``). Holders are
processes with ``/dev/nvidia<minor>`` open (``nvml_sim.host.hold_device``) and the driver itself
while the GPU is in persistence mode (the simulated NVML's state). Each blocked unbind is recorded in
:attr:`FakeKernelHostRoot.blocked`; one still held after :data:`UNBIND_HANG_S` raises, as a hung task would
never return.
"""

from __future__ import annotations

import re
import time
from pathlib import PurePosixPath
from typing import Any

from node_agent.host import HostError, HostRoot
from nvgpu.nodescripts.facts import NVIDIA_GPUS_PROC_DIR, PCI_DEVICES_DIR
from nvml_sim import SimulatedMachine
from nvml_sim.host import machine_of, sim_state_file
from tests.kit.fakehost import set_driver

DEFAULT_DRIVER = "nvidia"
#: How long a blocked unbind waits for its holders before the fake kernel calls it hung.
UNBIND_HANG_S = 2.0


class FakeKernelHostRoot(HostRoot):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: ``(address, holders)`` of every unbind that had to wait for holders.
        self.blocked: list[tuple[str, tuple[str, ...]]] = []

    def write_kernel(self, host_path: str, text: str) -> None:
        super().write_kernel(host_path, text)
        parts = PurePosixPath(host_path).parts
        value = text.strip()
        if host_path.endswith("/driver/unbind") or (len(parts) == 6 and parts[-1] == "unbind"):
            if self.readlink_name(f"{PCI_DEVICES_DIR}/{value}/driver") == "nvidia":
                self._wait_for_holders(value)
            self._set_driver(value, None)
        elif host_path == "/sys/bus/pci/drivers_probe":
            override = (self.read_text_or_none(f"{PCI_DEVICES_DIR}/{value}/driver_override") or "").strip()
            if self.readlink_name(f"{PCI_DEVICES_DIR}/{value}/driver") is None:
                self._set_driver(value, override if override and override != "(null)" else DEFAULT_DRIVER)
        elif len(parts) == 6 and parts[-1] == "bind":
            self._set_driver(value, parts[-2])

    def holders(self, address: str) -> tuple[str, ...]:
        """Who holds the GPU at ``address`` now: ``<pid> (<comm>)`` of each process with its device node open,
        and ``persistence mode`` while the driver keeps it initialised."""
        info = self.read_text_or_none(f"{NVIDIA_GPUS_PROC_DIR}/{address}/information") or ""
        m = re.search(r"^Device Minor:\s*(\d+)", info, re.MULTILINE)
        if m is None:
            return ()
        minor = int(m.group(1))
        node = f"/dev/nvidia{minor}"
        out = [f"{pid} ({(self.read_text_or_none(f'/proc/{pid}/comm') or '').strip()})"
               for pid in self.listdir("/proc") if pid.isdigit()
               if any(self.readlink(f"/proc/{pid}/fd/{fd}") == node for fd in self.listdir(f"/proc/{pid}/fd"))]
        machine = machine_of(self.root)
        sim = SimulatedMachine(machine, sim_state_file(self.root, machine)) if machine is not None else None
        if sim is not None and sim.persistence_mode(minor):
            out.append("persistence mode")
        return tuple(out)

    def _wait_for_holders(self, address: str) -> None:
        held = self.holders(address)
        if not held:
            return
        self.blocked.append((address, held))
        deadline = time.monotonic() + UNBIND_HANG_S
        while self.holders(address):
            if time.monotonic() > deadline:
                raise HostError(f"kernel: unbinding {address} from nvidia hung: held by {', '.join(held)}")
            time.sleep(0.02)

    def _set_driver(self, address: str, driver: str | None) -> None:
        set_driver(self.path(f"{PCI_DEVICES_DIR}/{address}"), driver)
