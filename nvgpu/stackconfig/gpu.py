"""``nodeGroups[].gpu``: the GPU model, how its GPUs are shared (exclusive, time-slicing, MPS, MIG) and the
device list strategy, checked against the GPU catalogue (``nvgpu.catalogue``).

A model the catalogue lacks is accepted (a GPU NVML can describe is a GPU); what only the catalogue knows
is then checked on the node. Whether a MIG layout fits is the group's check (:mod:`nvgpu.stackconfig.nodegroup`),
as it needs the group's name.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from nvgpu import catalogue, devicelist
from nvgpu import driver as driverspec
from nvgpu.devicelist import DeviceListStrategy
from nvgpu.errortext import shown
from nvgpu.migparted import (
    CustomGpuLayout,
    CustomSlice,
)
from nvgpu.stackconfig.common import ConfigModel, FieldProblems, Loc, first_indices, raise_all
from nvgpu.stackconfig.driver import Driver

#: MPS control daemons accept at most 48 clients per GPU on Volta and newer.
MPS_MAX_CLIENTS = 48

#: mig-parted's config names: ``all-<profile>`` with ``+`` spelled ``.``, including the RTX PRO 6000's
#: ``all-1g.24gb.me.all``, ``all-1g.24gb.gfx`` and ``all-1g.24gb-me`` (NVIDIA's config-default.yaml).
_PARTED_NAME = re.compile(r"all-(balanced|disabled|enabled|[0-9]g\.[0-9]+gb(\.me|\.me\.all|\.gfx|-me)?)|custom")


#: A GPU model the catalogue lacks, named like the catalogue's keys (``B200-180GB``): it is written into a
#: label value (``nvidia-gpu.io/gpu-model``), so label-value characters, at most 63.
_UNLISTED_MODEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


class Sharing(StrEnum):
    """How a group's GPUs are shared between pods (Deckhouse's semantics)."""

    #: One pod per GPU.
    EXCLUSIVE = "Exclusive"
    #: Replicas of each GPU, time-shared (``gpu.timeSlicing``).
    TIME_SLICING = "TimeSlicing"
    #: Clients of an MPS server per GPU (``gpu.mps``).
    MPS = "MPS"
    #: MIG instances (``gpu.mig``).
    MIG = "MIG"


class MigStrategy(StrEnum):
    """How the device plugin exposes MIG devices: ``mixed`` as ``nvidia.com/mig-<profile>``, ``single`` as
    ``nvidia.com/gpu``."""

    MIXED = "mixed"
    SINGLE = "single"



def _folded(name: str) -> str:
    return re.sub(r"[-_. ]", "", name).lower()


def _catalogue_spelling(name: str) -> str | None:
    """The catalogue key ``name`` spells with other case or separators (``h100_80gb``), or None."""
    return next((k for k in catalogue.MODEL_KEYS if _folded(k) == _folded(name)), None)



class TimeSlicing(ConfigModel):
    """Time-slicing: each GPU advertised as several replicas that share its memory and time."""

    #: Replicas of each GPU offered to pods.
    partition_count: Annotated[int, Field(ge=2, le=100)] = 4


class Mps(ConfigModel):
    """MPS: each GPU shared by several clients of one MPS server, with memory and compute limits per client."""

    #: MPS clients per GPU (each gets its share of the memory and of the SMs).
    partition_count: Annotated[int, Field(ge=2, le=MPS_MAX_CLIENTS)] = 4


class MigSlice(ConfigModel):
    """MIG instances of one profile on one GPU."""

    #: A MIG profile, like ``3g.40gb``.
    profile: str
    #: Instances of that profile on the GPU.
    count: Annotated[int, Field(ge=1, le=7)] = 1


class MigCustomConfig(ConfigModel):
    """One GPU's MIG layout (``partedConfig: custom``)."""

    #: The GPU's index on the node; one layout per index.
    index: Annotated[int, Field(ge=0, le=15)]
    #: The GPU's MIG instances, by profile.
    slices: Annotated[list[MigSlice], Field(min_length=1)]


class Mig(ConfigModel):
    """The MIG layout of the group's GPUs and how the device plugin exposes it."""

    #: The mig-parted config every GPU of the group gets: ``all-disabled``, ``all-enabled``, ``all-balanced``,
    #: ``all-<profile>`` in NVIDIA's spelling (``all-1g.10gb``, ``all-1g.24gb.gfx``, ``all-1g.24gb.me.all``,
    #: ``all-1g.24gb-me``), or ``custom`` for ``customConfigs``; checked against the model's MIG profiles.
    parted_config: str = "all-1g.10gb"
    #: How the device plugin offers MIG devices: ``mixed``, one resource per profile (``nvidia.com/mig-<profile>``), or
    #: ``single``, every MIG device as ``nvidia.com/gpu`` (the group's layout must then use one profile).
    strategy: MigStrategy = MigStrategy.MIXED
    #: With ``partedConfig: custom``: a layout per GPU index (refused otherwise).
    custom_configs: list[MigCustomConfig] = []

    @field_validator("parted_config")
    @classmethod
    def _parted(cls, v: str) -> str:
        if not _PARTED_NAME.fullmatch(v):
            raise ValueError(
                "must be all-disabled, all-enabled, all-balanced, all-<profile> (like all-1g.10gb) or custom"
            )
        return v

    @model_validator(mode="after")
    def _custom(self) -> Mig:
        if self.parted_config == "custom" and not self.custom_configs:
            raise FieldProblems([(("customConfigs",), "partedConfig 'custom' needs customConfigs "
                                                      "(a layout per GPU index)")])
        if self.parted_config != "custom" and self.custom_configs:
            raise FieldProblems([(("customConfigs",), f"only allowed with partedConfig 'custom' (partedConfig is "
                                                      f"{self.parted_config!r})")])
        first = first_indices([c.index for c in self.custom_configs])
        raise_all([(("customConfigs", i, "index"), f"GPU {c.index} has a layout already "
                                                    f"(customConfigs[{first[c.index]}])")
                    for i, c in enumerate(self.custom_configs) if first[c.index] != i])
        return self

    @property
    def custom_layouts(self) -> tuple[CustomGpuLayout, ...]:
        """``customConfigs`` in mig-parted's terms: what the custom config's name and entries are made of."""
        return tuple(
            CustomGpuLayout(c.index, tuple(CustomSlice(s.profile, s.count) for s in c.slices))
            for c in self.custom_configs
        )



class Gpu(ConfigModel):
    """A node group's GPUs (``nodeGroups[].gpu``): the model, how they are shared, the driver and the device list
    strategy."""

    #: The group's GPU model, for the MIG layout and driver checks and the capacity plan: a catalogue model
    #: (``nvgpu.catalogue``, like ``H100-80GB``), or another name of letters, digits, ``.``, ``_`` and ``-`` for a
    #: board the catalogue lacks (its MIG layout is then checked on the node, and the global driver minimum
    #: applies). Unset: checks fall back to every model.
    model: str | None = None
    #: How the group's GPUs are shared (Deckhouse's modes): a GPU per pod, time-slicing, MPS or MIG.
    sharing: Sharing = Sharing.EXCLUSIVE
    #: With ``sharing: TimeSlicing`` only.
    time_slicing: TimeSlicing | None = None
    #: With ``sharing: MPS`` only.
    mps: Mps | None = None
    #: With ``sharing: MIG`` only (default: ``partedConfig all-1g.10gb``, strategy ``mixed``).
    mig: Mig | None = None
    #: The group's NVIDIA driver: who installs it, which one, how it is upgraded.
    driver: Driver = Driver()
    #: How the device plugin names allocated GPUs to the container (``nvgpu.devicelist``), a list or a comma
    #: list; node setup makes the NVIDIA toolkit accept exactly that. ``envvar`` lets any pod take any GPU of
    #: its node.
    device_list_strategy: Annotated[
        list[DeviceListStrategy],
        BeforeValidator(devicelist.split, json_schema_input_type=list[DeviceListStrategy] | str),
        AfterValidator(devicelist.check)] = list(devicelist.DEFAULT)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        # A model the catalogue lacks is allowed (a GPU NVML can describe is a GPU): what only the catalogue
        # knows, its MIG profiles and driver floor, is then checked on the node (``model_unlisted``).
        if v is not None and v not in catalogue.MODEL_KEYS and not _UNLISTED_MODEL.fullmatch(v):
            # The rule first: the catalogue's list is long and a problem line is clipped.
            raise ValueError(f"{shown(v)} is neither a model name of letters, digits, '.', '_' and '-' (at most 63, "
                             f"like B200-180GB) nor a catalogue model ({', '.join(catalogue.MODEL_KEYS)})")
        if v is not None and v not in catalogue.MODEL_KEYS and (same := _catalogue_spelling(v)) is not None:
            # An unlisted name is accepted as a board the catalogue lacks, so a catalogue model spelled another
            # way ("h100-80gb") would silently lose its MIG and driver checks: refuse it instead.
            raise ValueError(f"{shown(v)} is the catalogue model {same!r} spelled differently; write {same!r}")
        return v

    @model_validator(mode="after")
    def _sharing_blocks(self) -> Gpu:
        blocks = {
            Sharing.TIME_SLICING: ("timeSlicing", self.time_slicing),
            Sharing.MPS: ("mps", self.mps),
            Sharing.MIG: ("mig", self.mig),
        }
        problems: list[tuple[Loc, str]] = []
        for mode, (key, block) in blocks.items():
            if block is not None and self.sharing is not mode:
                problems.append(((key,), f"only allowed with sharing {mode.value} (sharing is {self.sharing.value})"))
        model = self.declared_model
        if self.sharing is Sharing.MIG and model is not None and model.mig is None:
            # Whether the layout fits the model is the group's check (it needs the group's name).
            mig_models = ", ".join(m.key for m in catalogue.MODELS if m.mig)
            problems.append((("sharing",), f"MIG needs a MIG-capable GPU and {model.key} is not one "
                                           f"({mig_models} are)"))
        version = self.declared_driver_version
        if model is not None and version is not None:
            minimum = model.effective_min_driver
            what = f"the {model.key} minimum"
            mig_floor = model.mig.min_driver if self.sharing is Sharing.MIG and model.mig else None
            if mig_floor and catalogue.parse_driver_version(mig_floor) > catalogue.parse_driver_version(minimum):
                minimum, what = mig_floor, f"the minimum for MIG on {model.key}"
            if not version.at_least(minimum):
                problems.append((("driver", "version"), f"{version.text} is below {what}, {minimum}"))
        if (self.driver.kernel_modules is driverspec.KernelModules.OPEN and model is not None
                and not driverspec.open_modules_supported(model.compute_capability)):
            problems.append((("driver", "kernelModules"),
                             f"the open kernel modules need a Turing or later GPU; {model.key} is compute "
                             f"{model.compute_capability[0]}.{model.compute_capability[1]}"))
        if self.driver.driver_type is driverspec.DriverType.VGPU_HOST_MANAGER and self.sharing is not Sharing.EXCLUSIVE:
            problems.append((("sharing",), f"{self.sharing.value} is decided by the vGPU profiles of the VMs on a "
                                           "vGPU host (driver.type vgpu-host-manager): use Exclusive"))
        if self.driver.driver_type is driverspec.DriverType.VGPU and self.sharing is Sharing.MIG:
            problems.append((("sharing",), "a vGPU guest cannot partition its GPU: MIG-backed vGPUs are made on the "
                                           "host (driver.type is vgpu)"))
        raise_all(problems)
        return self

    @property
    def driver_expectation(self) -> driverspec.DriverExpectation:
        """What ``check`` verifies on the group's nodes, whoever installed the driver."""
        declared_type = self.driver.driver_type if "driver_type" in self.driver.model_fields_set else None
        return driverspec.DriverExpectation(self.declared_driver_version, self.driver.kernel_modules, declared_type)

    @property
    def node_setup_expectation(self) -> driverspec.DriverExpectation:
        """What node setup's check compares (setup, its monitor, bashible's ``gpu-check.sh``). Not for a
        driver the stack's containers install: node setup's pods are ``OnDelete`` and would keep comparing
        with the version they started with after an upgrade; the driver pod's own check, whose template is
        always current, verifies that declaration (``manifests.driver.check_container``)."""
        if self.driver.source is driverspec.DriverSource.CONTAINER:
            return driverspec.NO_EXPECTATION
        return self.driver_expectation

    @property
    def declared_driver_version(self) -> driverspec.DriverVersion | None:
        """``driver.version`` (the older ``gpu.driverVersion`` is read as it: :class:`NodeGroup`)."""
        return self.driver.parsed_version

    @property
    def declared_model(self) -> catalogue.GpuModel | None:
        """The catalogue entry for ``model``; ``None`` when undeclared (checks then fall back to every model)
        or not in the catalogue (``model_unlisted``: checks that need the catalogue defer to the node)."""
        return catalogue.get_model(self.model) if self.model in catalogue.MODEL_KEYS else None

    @property
    def model_unlisted(self) -> bool:
        """A declared model the catalogue lacks: its MIG layout is checked on the node, where the MIG manager
        reads the GPU's own profiles and placements from NVML, not at preview; its driver floor is the global one."""
        return self.model is not None and self.model not in catalogue.MODEL_KEYS

    @property
    def effective_mig(self) -> Mig:
        return self.mig or Mig()

    @property
    def replicas(self) -> int:
        if self.sharing is Sharing.TIME_SLICING:
            return (self.time_slicing or TimeSlicing()).partition_count
        if self.sharing is Sharing.MPS:
            return (self.mps or Mps()).partition_count
        return 1

