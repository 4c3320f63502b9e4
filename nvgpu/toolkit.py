"""The NVIDIA Container Toolkit a node group's GPU containers run with: the node's own, or NVIDIA's toolkit
container installing it (``nodeGroups[].toolkit``), and the paths both sides agree on.

A node without NVIDIA's toolkit (``nvidia-container-runtime``, ``nvidia-ctk``, ``nvidia-cdi-hook``) cannot
start GPU containers. ``preinstalled`` (the default) is Deckhouse's assumption: the node image has the
toolkit under ``/usr/bin``, and node setup's check verifies it. ``container`` runs NVIDIA's toolkit image
(``nvcr.io/nvidia/k8s/container-toolkit``, its ``nvidia-ctk-installer``) on the group's nodes as the GPU
Operator does, installing into ``<installDir>/toolkit`` on the host, with ``--no-runtime-config``: node
setup keeps configuring containerd or CRI-O (one owner of the runtime's config, undone by teardown) and
points the nvidia runtime at the installed ``nvidia-container-runtime``. The installer writes the
toolkit's own config under ``<installDir>/toolkit/.config`` from its flags, so the stack passes the
settings node setup would otherwise edit in: the driver root, and which device lists unprivileged
containers may use.

The layout (``toolkit/``, the binaries' names, the config's path) is the installer's, as
``cmd/nvidia-ctk-installer`` of NVIDIA's nvidia-container-toolkit module writes it.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ToolkitSource(StrEnum):
    """Who installs the NVIDIA Container Toolkit on the group's nodes."""

    #: The node image (or a configuration manager) installed it; node setup verifies it.
    PREINSTALLED = "preinstalled"
    #: NVIDIA's toolkit container installs it on each of the group's nodes.
    CONTAINER = "container"


#: NVIDIA's default install directory (``--toolkit-install-dir``); the toolkit lands in its ``toolkit/``.
DEFAULT_INSTALL_DIR = "/usr/local/nvidia"
SUBDIR = "toolkit"
DEFAULT_REPOSITORY = "nvcr.io/nvidia/k8s"
DEFAULT_IMAGE = "container-toolkit"
#: The release whose installer the stack's flags and paths are written against (tools/container-toolkit
#: builds the same release's installer for the tests).
DEFAULT_TAG = "v1.20.2"
#: The first release whose ``jit-cdi`` mode (the default) gives a container asking for the MIG monitor capability
#: (``NVIDIA_MIG_MONITOR_DEVICES=all`` with CAP_SYS_ADMIN) ``/dev/nvidia-caps/nvidia-cap2``: 1.18 and 1.19 give
#: it every MIG instance's nodes but not that one (NVIDIA/nvidia-container-toolkit#1740, fixed in 1.20.1 as
#: "MIG Management Devices"), so on a MIG GPU NVML refuses our device plugin, labeller and exporter.
MIG_MONITOR_SINCE = (1, 20, 1)
_RELEASE = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?")


def release(tag: str) -> tuple[int, int, int] | None:
    """The release an image tag names (``v1.20.2``, ``1.17.8-ubi8``), or None for a tag that names none
    (``latest``, a build's own name): such a tag cannot be judged by its name."""
    m = _RELEASE.fullmatch(tag)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


#: The image's entrypoint.
INSTALLER = "/work/nvidia-ctk-installer"
#: The installer's pid file (it holds a lock on it while it runs; its directory is created on the host).
PID_FILE = "/run/nvidia/toolkit/toolkit.pid"
#: The toolkit container's role (the policy pack allows it privileged and its host paths).
COMPONENT = "nvidia-container-toolkit"


#: In the installed toolkit directory: the ``nvidia-container-runtime`` wrapper the runtime's nvidia handler
#: runs, the CDI hook specs name, and the toolkit config the wrapper points the runtime at.
RUNTIME_WRAPPER = "nvidia-container-runtime"
CDI_HOOK = "nvidia-cdi-hook"
CONFIG = ".config/nvidia-container-runtime/config.toml"


def toolkit_dir(install_dir: str) -> str:
    return f"{install_dir.rstrip('/')}/{SUBDIR}"


def installed_runtime(toolkit: str) -> str:
    """The wrapper in an installed toolkit directory (``<installDir>/toolkit``, node setup's ``--toolkit-dir``)."""
    return f"{toolkit.rstrip('/')}/{RUNTIME_WRAPPER}"


def runtime_binary(install_dir: str) -> str:
    return installed_runtime(toolkit_dir(install_dir))


def cdi_hook(install_dir: str) -> str:
    return f"{toolkit_dir(install_dir)}/{CDI_HOOK}"
