"""What both kubelet stand-ins do as kubelet does it: kubelet's socket directories, short roots for them,
dialing a plugin's unix socket, finding a plugin's socket, and polling until kubelet's view is reached.

The device plugin protocol and the DRA ``pluginregistration`` protocol run registration in opposite
directions (a device plugin calls kubelet's ``Registration``; kubelet calls a DRA plugin's), but both meet
on unix sockets in kubelet's directories, so the socket handling is said once here.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

#: kubelet's own directories on a node (as kubelet spells them, not as the plugins under test do).
DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
#: The socket kubelet serves the device plugin ``Registration`` service on, in :data:`DEVICE_PLUGINS_DIR`.
KUBELET_SOCKET = "kubelet.sock"


@contextmanager
def short_root(prefix: str) -> Iterator[Path]:
    """A fresh directory directly under ``/tmp``, removed afterwards: a unix socket path has at most 107
    bytes, so the plugins' sockets below a host root (``<root>/var/lib/kubelet/plugins/<driver>/dra.sock``)
    do not fit under pytest's deeper ``tmp_path``."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def dial(socket: Path) -> grpc.Channel:
    """A channel to a unix socket, as kubelet dials plugins (no TLS on a node-local socket)."""
    return grpc.insecure_channel(f"unix://{socket}")


def wait_for_sockets(directory: Path, pattern: str, timeout: float) -> list[Path]:
    """The sockets matching ``pattern`` in ``directory`` once at least one is there (kubelet's plugin
    watcher reacts to the file appearing), sorted; TimeoutError when none appears in time."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = sorted(directory.glob(pattern)) if directory.is_dir() else []
        if found:
            return found
        time.sleep(0.01)
    raise TimeoutError(f"no {pattern} appeared in {directory}")


def remove_sockets(directory: Path) -> None:
    """Remove every socket file in ``directory``: what kubelet does to the plugins' sockets when it restarts,
    so a plugin has to notice and serve (and register) again."""
    for p in directory.glob("*.sock"):
        p.unlink(missing_ok=True)


def wait_until(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``check`` until true: kubelet's view (the stand-in) can run ahead of the plugin's own state."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.01)
