"""``nodeGroups[].gpu.driver`` and ``nodeGroups[].toolkit``: who installs the NVIDIA driver and Container
Toolkit on a group's nodes, which ones, and how a driver upgrade rolls (``nvgpu.driver``, ``nvgpu.toolkit``).

A section of its own because the combinations are many and each is refused at the field to change
(a precompiled driver chosen by release, a kernel list for a compiled driver, an image for a driver the
stack does not deploy).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    Field,
    field_validator,
    model_validator,
)

from nvgpu import driver as driverspec
from nvgpu import toolkit as toolkitspec
from nvgpu.errortext import shown
from nvgpu.stackconfig.common import (
    Bool,
    ConfigModel,
    Digest,
    DnsLabel,
    FieldProblems,
    Loc,
    PullPolicy,
    Repository,
    Tag,
    absolute_path,
    image_ref,
    raise_all,
)


def _driver_version(v: str) -> str:
    driverspec.parse_version(v)
    return v


def _kernel_release(v: str) -> str:
    if len(v) > 64 or not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9._+-]*", v):
        raise ValueError(f"{shown(v)} is not a kernel release as `uname -r` prints it, like 5.15.0-105-generic")
    return v


class DriverImage(ConfigModel):
    """NVIDIA's driver image: ``<repository>/<name>:<version>-<os>``, pinned by digest per tag where given."""

    #: Where the driver images are (``<repository>/<name>:<version>-<os>``).
    repository: Repository = driverspec.DEFAULT_REPOSITORY
    #: The image name under the repository.
    name: DnsLabel = driverspec.DEFAULT_IMAGE
    #: Image tag (``550.90.07-ubuntu22.04``) to its digest; a tag listed here is pulled by digest.
    digests: dict[Tag, Digest] = {}
    #: The driver image's ``imagePullPolicy``.
    pull_policy: PullPolicy = "IfNotPresent"


class DriverUpgrade(ConfigModel):
    """How a version change rolls through the group's nodes (the driver container and gpuOperator sources)."""

    #: Nodes whose driver is replaced at once.
    max_unavailable: Annotated[int, Field(ge=1, le=100)] = 1
    #: Evict the node's pods first (cordon-and-drain, or Deckhouse's disruption approval); without it only
    #: the pods holding GPUs are evicted.
    drain: Bool = True
    #: How long a drain may take before the node counts as failed and the rollout stops.
    drain_timeout_seconds: Annotated[int, Field(ge=30, le=86400)] = 1800
    #: How long the old driver has to stop and the new one to load and pass ``check`` before the node counts
    #: as failed: at least what NVIDIA's startup probe allows a compiling driver (``nvgpu.driver``).
    validation_timeout_seconds: Annotated[int, Field(ge=driverspec.STARTUP_ALLOWANCE_S, le=7200)] = 1800
    #: Evict pods no controller owns too (``kubectl drain --force``): they are not recreated anywhere.
    force: Bool = False
    #: Evict pods with ``emptyDir`` volumes too (``kubectl drain --delete-emptydir-data``): their data is lost.
    delete_empty_dir: Bool = False


class Driver(ConfigModel):
    """The group's NVIDIA driver: who installs it, which one, and how it is upgraded (see ``nvgpu.driver``)."""

    #: Who installs the driver: ``preinstalled`` (the node has it; ``check`` verifies it against this block),
    #: ``container`` (the stack runs NVIDIA's driver container) or ``gpuOperator`` (the stack emits ``NVIDIADriver``
    #: objects for NVIDIA's GPU Operator).
    source: driverspec.DriverSource = driverspec.DriverSource.PREINSTALLED
    #: ``gpu``, ``vgpu`` (a vGPU guest driver) or ``vgpu-host-manager`` (the node's GPUs become vGPUs for VMs: sharing
    #: must be ``Exclusive``).
    driver_type: driverspec.DriverType = Field(driverspec.DriverType.GPU, alias="type")
    #: A release (``550.90.07``) or a branch (``550``; precompiled drivers are chosen by branch).
    version: Annotated[str, AfterValidator(_driver_version)] | None = None
    #: NVIDIA's precompiled driver images (per branch and kernel; type ``gpu`` only), for nodes that may not compile.
    precompiled: Bool = False
    #: ``auto``, ``open`` (NVIDIA's open GPU kernel modules: branch 515 or later, Turing or later GPUs) or
    #: ``proprietary``.
    kernel_modules: driverspec.KernelModules = driverspec.KernelModules.AUTO
    #: ``container``: the OS releases of the group's nodes, one driver DaemonSet each (``ubuntu22.04``).
    os_releases: list[Annotated[str, AfterValidator(driverspec.check_os_release)]] = []
    #: ``container`` and precompiled: the kernels of the group's nodes (``uname -r``), one DaemonSet each.
    kernels: list[Annotated[str, AfterValidator(_kernel_release)]] = []
    #: The driver image (``container``).
    image: DriverImage = DriverImage()
    #: How a driver change rolls through the group's nodes (``container`` and ``gpuOperator``).
    upgrade: DriverUpgrade = DriverUpgrade()

    @model_validator(mode="after")
    def _combinations(self) -> Driver:
        problems: list[tuple[Loc, str]] = []
        deployed = self.source is not driverspec.DriverSource.PREINSTALLED
        version = driverspec.parse_version(self.version) if self.version else None
        if deployed and version is None:
            problems.append((("version",), f"source {self.source.value} deploys a driver: name its release "
                                           "(like 550.90.07), or its branch (like 550) when precompiled"))
        if self.precompiled:
            if not deployed:
                problems.append((("precompiled",), "only with source container or gpuOperator: a pre-installed "
                                                   "driver is whatever the node has"))
            if version is not None and not version.is_branch:
                problems.append((("version",), f"{self.version} is a release; precompiled drivers are chosen by "
                                               f"branch and kernel: write the branch ({version.branch})"))
            if self.driver_type is not driverspec.DriverType.GPU:
                problems.append((("precompiled",), f"NVIDIA builds precompiled drivers for type gpu only, not "
                                                   f"{self.driver_type.value}"))
        elif deployed and version is not None and version.is_branch:
            problems.append((("version",), f"{self.version} is a branch; a driver compiled on the node is chosen "
                                           "by its full release (like 550.90.07), or set precompiled: true"))
        if self.kernel_modules is driverspec.KernelModules.OPEN and version is not None \
                and version.branch < driverspec.OPEN_MODULES_MIN_BRANCH:
            problems.append((("kernelModules",), f"the open kernel modules exist from the "
                                                 f"{driverspec.OPEN_MODULES_MIN_BRANCH} branch on (version is "
                                                 f"{self.version})"))
        if self.source is driverspec.DriverSource.CONTAINER:
            if self.driver_type is not driverspec.DriverType.GPU:
                problems.append((("type",), f"source container runs NVIDIA's data-center driver image (type gpu), "
                                            f"not {self.driver_type.value}: the vGPU guest and host drivers are "
                                            "licensed images of their own; use source gpuOperator or preinstalled"))
            if not self.os_releases:
                problems.append((("osReleases",), "source container runs one driver DaemonSet per OS release: "
                                                  "list the group's (like ubuntu22.04)"))
            if self.precompiled and not self.kernels:
                problems.append((("kernels",), "a precompiled driver image is per kernel: list the group's "
                                               "kernels (uname -r, like 5.15.0-105-generic)"))
        else:
            for key, value in (("osReleases", self.os_releases), ("kernels", self.kernels)):
                if value:
                    problems.append(((key,), f"only used with source container (source is {self.source.value})"))
        if self.kernels and not self.precompiled:
            problems.append((("kernels",), "only used by a precompiled driver: a compiled one builds for the "
                                           "node's kernel"))
        if not deployed:
            for key in ("image", "upgrade"):
                if key in self.model_fields_set:
                    problems.append(((key,), "only used when the stack deploys the driver (source container or "
                                             "gpuOperator)"))
        raise_all(problems)
        return self

    @property
    def parsed_version(self) -> driverspec.DriverVersion | None:
        return driverspec.parse_version(self.version) if self.version else None


class ToolkitImage(ConfigModel):
    """NVIDIA's toolkit image (``<repository>/<name>:<tag>``), pinned by digest where given."""

    #: Where NVIDIA's toolkit image is.
    repository: Repository = toolkitspec.DEFAULT_REPOSITORY
    #: The image name under the repository.
    name: DnsLabel = toolkitspec.DEFAULT_IMAGE
    #: The toolkit release (the tests run this release's installer).
    tag: Tag = toolkitspec.DEFAULT_TAG
    #: Its ``sha256:`` digest: pulled by digest when set.
    digest: Digest | None = None
    #: The toolkit image's ``imagePullPolicy``.
    pull_policy: PullPolicy = "IfNotPresent"

    @property
    def ref(self) -> str:
        return image_ref(f"{self.repository}/{self.name}", self.tag, self.digest)


class Toolkit(ConfigModel):
    """The NVIDIA Container Toolkit of the group's nodes: the node's own, or NVIDIA's toolkit container
    installing it under ``installDir`` (``nvgpu.toolkit``)."""

    #: Who installs the NVIDIA Container Toolkit on the group's nodes: the node image (``preinstalled``, verified by
    #: ``check``) or NVIDIA's toolkit container (``container``; needs ``cluster.nodeSetup: daemonset``).
    source: toolkitspec.ToolkitSource = toolkitspec.ToolkitSource.PREINSTALLED
    #: NVIDIA's toolkit image (``container``).
    image: ToolkitImage = ToolkitImage()
    #: ``container``: where the toolkit is installed on the host (in its ``toolkit/`` subdirectory, which the installer
    #: empties on every start).
    install_dir: str = toolkitspec.DEFAULT_INSTALL_DIR

    @field_validator("install_dir")
    @classmethod
    def _install_dir(cls, v: str) -> str:
        path = absolute_path(v, "e.g. /usr/local/nvidia")
        if path.rstrip("/") in ("", "/usr", "/usr/bin", "/etc", "/run", "/var"):
            raise ValueError(f"{v!r} is a system directory; the installer empties its toolkit/ subdirectory "
                             "on every start: use a directory of its own, such as /usr/local/nvidia")
        return path.rstrip("/")

    @model_validator(mode="after")
    def _used(self) -> Toolkit:
        if self.source is toolkitspec.ToolkitSource.PREINSTALLED:
            unused = [key for k, key in (("image", "image"), ("install_dir", "installDir"))
                      if k in self.model_fields_set]
            if unused:
                raise FieldProblems([((key,), "only used with source container (the node's own toolkit is "
                                              "under /usr/bin)") for key in unused])
        return self

    @property
    def container(self) -> bool:
        return self.source is toolkitspec.ToolkitSource.CONTAINER

