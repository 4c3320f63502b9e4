"""A ``HostRoot`` that plays the kernel's part for PCI driver binding in a fake root.

Writing to sysfs on a real host makes the kernel act: ``driver/unbind`` detaches the driver,
``drivers_probe`` attaches the driver named by ``driver_override`` (or the default one). In a
fake root those are plain files, so this subclass applies the same effects to the fake tree (the
``driver`` symlink) after each write. Used by the VFIO tests, which run the real agent code.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from node_agent.host import HostRoot
from nvgpu.nodescripts.facts import PCI_DEVICES_DIR
from tests.kit.fakehost import set_driver

DEFAULT_DRIVER = "nvidia"


class FakeKernelHostRoot(HostRoot):
    def write_kernel(self, host_path: str, text: str) -> None:
        super().write_kernel(host_path, text)
        parts = PurePosixPath(host_path).parts
        value = text.strip()
        if host_path.endswith("/driver/unbind") or (len(parts) == 6 and parts[-1] == "unbind"):
            self._set_driver(value, None)
        elif host_path == "/sys/bus/pci/drivers_probe":
            override = (self.read_text_or_none(f"{PCI_DEVICES_DIR}/{value}/driver_override") or "").strip()
            if self.readlink_name(f"{PCI_DEVICES_DIR}/{value}/driver") is None:
                self._set_driver(value, override if override and override != "(null)" else DEFAULT_DRIVER)
        elif len(parts) == 6 and parts[-1] == "bind":
            self._set_driver(value, parts[-2])

    def _set_driver(self, address: str, driver: str | None) -> None:
        set_driver(self.path(f"{PCI_DEVICES_DIR}/{address}"), driver)
