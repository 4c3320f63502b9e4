""":class:`~node_agent.deviceplugin.devices.HostFiles` over the agent's ``HostRoot``.

The plugin reads sysfs NUMA nodes, ``/proc/driver/nvidia-caps/mig-minors`` and device nodes, and
writes CDI specs, always by host-absolute path; ``node_agent.host.HostRoot`` resolves them (``/`` on
the host, ``/host`` in the agent container, a temp dir in tests) and writes atomically.
"""

from __future__ import annotations

from node_agent.host import HostError, HostRoot


class HostRootFiles:
    def __init__(self, root: HostRoot):
        self.root = root

    def read_text(self, path: str) -> str | None:
        try:
            return self.root.read_text_or_none(path)
        except HostError:
            return None

    def exists(self, path: str) -> bool:
        try:
            return self.root.exists(path)
        except HostError:
            return False

    def listdir(self, path: str) -> list[str]:
        try:
            return self.root.listdir(path)
        except HostError:
            return []

    def write_text(self, path: str, text: str) -> bool:
        return self.root.write_atomic(path, text)

    def remove(self, path: str) -> None:
        self.root.remove(path)
