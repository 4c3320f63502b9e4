"""Container edits that give any container the driver: mounts of the driver's files plus toolkit hooks.

Mounting ``libcuda.so.<version>`` is not enough: the container's linker looks for ``libcuda.so.1`` and
reads its own ``ld.so.cache``. NVIDIA's generated specs fix both with hooks of the NVIDIA Container
Toolkit, run by the runtime on the host: ``create-symlinks`` (``libcuda.so`` → ``libcuda.so.1``, and the
soname link of a library that carries no ``DT_SONAME`` for ``ldconfig`` to read) and ``update-ldcache``
(``ldconfig`` over the mounted folders, which also makes the soname links). The hook
program is the host's ``nvidia-cdi-hook`` (toolkit ≥ 1.16), or ``nvidia-ctk`` with ``hook`` before the
hook's name (older toolkits); only those two hooks are used, which every such toolkit has (newer ones,
such as ``enable-cuda-compat``, would make an older hook binary fail every container).

A hook named in a spec but absent on the host fails every container that uses the spec, so the agent
only writes hooks when it sees the program. Without it, each library is also mounted at its soname path
(``…/libcuda.so.1``) and ``libcuda.so`` is mounted too: CUDA then loads in containers whose linker
searches that directory by default (the same distribution family as the host's driver layout), but the
container's ``ld.so.cache`` does not list the driver's libraries. The agent logs that choice.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from node_agent.cdi.driverfiles import DriverFiles, discover
from node_agent.cdi.spec import ContainerEdits, Hook, Mount
from node_agent.host.driverroot import DriverRoot
from nvgpu.nodescripts import facts

log = logging.getLogger(__name__)

#: The toolkit's hook program on a node with the toolkit package installed (one definition, in nvgpu).
DEFAULT_HOOK_PATH = facts.CDI_HOOK_PATH
#: NVIDIA's toolkit's options for driver files (nvcdi): a recursive, private bind, so nothing mounted under a
#: bound directory later propagates into or out of the container.
_RO = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
_SOCKET = ["ro", "nosuid", "nodev", "rbind", "rprivate", "noexec"]


@dataclass(frozen=True)
class HookTool:
    """The toolkit's hook program: its path on the host (what the runtime runs) and its flavour."""

    host_path: str

    @property
    def is_ctk(self) -> bool:
        return os.path.basename(self.host_path) == "nvidia-ctk"

    def hook(self, name: str, *args: str) -> Hook:
        argv = ["nvidia-ctk", "hook", name, *args] if self.is_ctk else ["nvidia-cdi-hook", name, *args]
        return Hook(hook_name="createContainer", path=self.host_path, args=argv)


def find_hook_tool(host_path: str | None, seen_at: Path | None) -> HookTool | None:
    """The hook program at ``host_path`` if the agent sees it (executable) at ``seen_at``; else None."""
    if not host_path or seen_at is None:
        return None
    return HookTool(host_path) if seen_at.is_file() and os.access(seen_at, os.X_OK) else None


def host_path(driver_root: str, path: str) -> str:
    """``path`` inside the node's driver root as a host path."""
    return path if driver_root in ("", "/") else driver_root.rstrip("/") + path


def driver_edits(files: DriverFiles, driver_root: str, tool: HookTool | None) -> ContainerEdits | None:
    """Mounts (and, with ``tool``, hooks) for ``files``; ``driver_root`` is the node's (host) driver root.

    None when nothing was found (no driver under the root): the spec then carries device nodes only.
    """
    if not files.libraries and not files.binaries:
        return None
    mounts: list[Mount] = []

    def bind(path: str, container: str | None = None, options: list[str] = _RO) -> None:
        mounts.append(Mount(host_path=host_path(driver_root, path), container_path=container or path,
                            options=list(options)))

    links: list[str] = []  #: create-symlinks' ``target::link`` pairs
    for lib in files.libraries:
        bind(lib.path)
        directory, name = lib.path.rsplit("/", 1)
        if lib.soname and not lib.elf_soname and lib.soname != name:
            links.append(f"{name}::{directory}/{lib.soname}")  # ldconfig cannot know this one
        if lib.soname == "libcuda.so.1":
            links.append(f"libcuda.so.1::{directory}/libcuda.so")
        if tool is None and lib.soname and lib.soname != name:
            bind(lib.path, f"{directory}/{lib.soname}")
            if lib.soname == "libcuda.so.1":
                bind(lib.path, f"{directory}/libcuda.so")
    for path in (*files.binaries, *files.firmware):
        bind(path)
    for path in files.sockets:
        bind(path, options=_SOCKET)
    hooks: list[Hook] | None = None
    if tool is not None:
        hooks = []
        if links:
            hooks.append(tool.hook("create-symlinks", *(a for link in links for a in ("--link", link))))
        folders = files.library_dirs
        if folders:
            hooks.append(tool.hook("update-ldcache", *(a for d in folders for a in ("--folder", d))))
    return ContainerEdits(mounts=mounts or None, hooks=hooks or None)


class DriverEditsSource:
    """The driver edits for the running driver, for writers that build specs again and again.

    The file discovery is cached per driver version (a driver upgrade changes the version); whether the
    hook program is there is checked on every call, so a toolkit installed after the agent started is
    used from the next spec on. Each change of choice is logged once.
    """

    def __init__(self, root: DriverRoot, host_driver_root: str, hook_path: str | None,
                 hook_seen_at: Path | None) -> None:
        self.root = root
        self.host_driver_root = host_driver_root
        self.hook_path = hook_path
        self.hook_seen_at = hook_seen_at
        self._files: DriverFiles | None = None
        self._logged: tuple[str, bool, str] | None = None

    def files(self, version: str) -> DriverFiles:
        if self._files is None or self._files.version != version:
            self._files = discover(self.root, version)
        return self._files

    def edits(self, version: str) -> ContainerEdits | None:
        files = self.files(version)
        tool = find_hook_tool(self.hook_path, self.hook_seen_at)
        state = (version, tool is not None, files.problem)
        if state != self._logged:
            self._logged = state
            if files.problem:
                log.warning("event=cdi-no-driver-files driver=%s problem=%s", version, files.problem)
            elif tool is None:
                log.warning("event=cdi-without-hooks hook=%s seen_at=%s action=mount-sonames libraries=%d "
                            "note=the container's ld.so.cache will not list the driver's libraries",
                            self.hook_path, self.hook_seen_at, len(files.libraries))
            else:
                log.info("event=cdi-driver-files driver=%s libraries=%d binaries=%d hook=%s", version,
                         len(files.libraries), len(files.binaries), tool.host_path)
        return driver_edits(files, self.host_driver_root, tool)
