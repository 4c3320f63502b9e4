"""The decisions derived from the stack config, kept apart from the schema the user writes.

The models of :mod:`nvgpu.stackconfig` say what a stack file may contain. What the stack then does for a
node group (device plugin or DRA, where the driver is on its nodes, which CDI hook its specs name, what its
``nvidia.com/mig.config`` label says) is decided here, from a :class:`~nvgpu.stackconfig.Cluster` and a
:class:`~nvgpu.stackconfig.NodeGroup`, and nowhere else: the models' own methods of the same names
delegate here, so the stack config's checks and the manifests can never disagree.

:class:`GroupPlan` is those decisions for one group, computed once. A manifest builder that needs only
them takes the plan instead of the whole config: its signature then says what it depends on, and a test
builds one without a valid stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvgpu import devicelist
from nvgpu import driver as driverspec
from nvgpu import toolkit as toolkitspec
from nvgpu.migparted import (
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    build_config,
    custom_config_name,
    custom_specs,
    fit_problems,
)
from nvgpu.stackconfig.gpu import Sharing
from nvgpu.stackconfig.modes import AllocationMode, NodeSetupBackend

if TYPE_CHECKING:
    from nvgpu.stackconfig.cluster import Cluster
    from nvgpu.stackconfig.nodegroup import NodeGroup


def allocation_mode(cluster: Cluster, group: NodeGroup) -> AllocationMode:
    """The group's own ``allocationMode``, else the cluster's."""
    return group.allocation_mode or cluster.allocation_mode


def driver_root(cluster: Cluster, group: NodeGroup) -> str:
    """Where ``group``'s driver is on its nodes: under ``/run/nvidia/driver`` where a driver container
    (the stack's or NVIDIA's operator's) installs it, else ``driverRoot``."""
    if group.gpu.driver.source is not driverspec.DriverSource.PREINSTALLED:
        return driverspec.CONTAINER_DRIVER_ROOT
    return cluster.driver_root


def cdi_hook(cluster: Cluster, group: NodeGroup) -> str:
    """The ``nvidia-cdi-hook`` the CDI specs of ``group``'s nodes name: the one NVIDIA's toolkit container
    installed, or ``cdiHookPath`` where the node has its own toolkit."""
    if group.toolkit.container:
        return toolkitspec.cdi_hook(group.toolkit.install_dir)
    return cluster.cdi_hook_path


def toolkit_accepts_envvar(group: NodeGroup, mode: AllocationMode) -> bool:
    """Whether node setup must let the toolkit honour unprivileged containers' ``NVIDIA_VISIBLE_DEVICES``
    (``mode``: the group's allocation mode): only for a device-plugin group that chose the ``envvar``
    strategy, which hands out GPUs no other way."""
    return mode is AllocationMode.DEVICE_PLUGIN and devicelist.needs_envvar(group.gpu.device_list_strategy)


def mig_config_name(group: NodeGroup) -> str:
    """The ``nvidia.com/mig.config`` value: the parted config, the custom name, or ``all-disabled``.

    A custom layout is named as Deckhouse names it (:func:`nvgpu.migparted.custom_config_name`).
    """
    if group.gpu.sharing is not Sharing.MIG:
        return "all-disabled"
    mig = group.gpu.effective_mig
    if mig.parted_config == "custom":
        return custom_config_name(group.name, mig.custom_layouts)
    return mig.parted_config


def custom_mig_configs(group: NodeGroup) -> dict[str, list[MigConfigSpec]]:
    """The group's custom layout as mig-parted entries (per GPU index), under its Deckhouse-style name.

    Raises :class:`~nvgpu.migparted.MigPartedError` for a slice whose profile is not spelled like one.
    """
    mig = group.gpu.effective_mig
    if group.gpu.sharing is not Sharing.MIG or mig.parted_config != "custom":
        return {}
    return {mig_config_name(group): custom_specs(mig.custom_layouts, group.gpu.declared_model)}


def mig_layout_problems(group: NodeGroup, config: MigPartedConfig | None = None) -> list[str]:
    """Why a MIG group's layout cannot be applied, each problem naming the group; empty when it can.

    ``config`` is the mig-parted config its nodes will read (the MigProfile manifests' ``mig_config``
    passes the one it renders, extra configs included); by default the standard sets plus the group's own custom layout,
    which is what the stack config alone can know. The config the group chooses must fit its declared
    model, or some catalogue GPU when it declares none (:func:`nvgpu.migparted.fit_problems`).
    """
    if group.gpu.sharing is not Sharing.MIG:
        return []
    try:
        cfg = config if config is not None else build_config(None, custom_mig_configs(group))
        if group.gpu.model_unlisted:
            # Deferred to the node: the catalogue cannot say which profiles a model it lacks has. The config
            # must exist and be well formed; the MIG manager fits it to NVML's own profiles and placements.
            cfg.get(mig_config_name(group))
            return []
    except MigPartedError as e:
        problems = e.problems
    else:
        problems = fit_problems(cfg, mig_config_name(group), group.gpu.declared_model)
    return [f"node group {group.name!r}: {p}" for p in problems]


@dataclass(frozen=True, kw_only=True)
class GroupPlan:
    """What the stack decided for one node group: the values its manifests and node scripts are built from.

    Computed once by :meth:`of`; frozen, so a builder cannot change a decision another builder relies on.
    """

    name: str
    allocation_mode: AllocationMode
    node_setup: NodeSetupBackend
    #: Where the group's driver is on its nodes (:func:`driver_root`).
    driver_root: str
    #: The CDI hook the group's CDI specs name (:func:`cdi_hook`).
    cdi_hook: str
    #: The group's ``nvidia.com/mig.config`` value (:func:`mig_config_name`).
    mig_config_name: str
    #: Whether the toolkit honours unprivileged containers' ``NVIDIA_VISIBLE_DEVICES`` (:func:`toolkit_accepts_envvar`).
    accept_envvar: bool
    #: GPUs may be bound to vfio-pci and handed to VMs: ``passthrough`` on a DRA group.
    passthrough: bool
    #: What node setup's driver check compares (``Gpu.node_setup_expectation``).
    node_setup_expectation: driverspec.DriverExpectation
    #: Where NVIDIA's toolkit container installs the toolkit (``toolkit.installDir``).
    toolkit_install_dir: str
    #: The PriorityClass of the group's agent pods (``cluster.priorityClassName``).
    priority_class_name: str

    @classmethod
    def of(cls, cluster: Cluster, group: NodeGroup, mode: AllocationMode | None = None) -> GroupPlan:
        """The plan for ``group`` in ``cluster``; ``mode`` overrides the allocation mode the config gives it."""
        mode = mode or allocation_mode(cluster, group)
        return cls(
            name=group.name,
            allocation_mode=mode,
            node_setup=cluster.node_setup,
            driver_root=driver_root(cluster, group),
            cdi_hook=cdi_hook(cluster, group),
            mig_config_name=mig_config_name(group),
            accept_envvar=toolkit_accepts_envvar(group, mode),
            passthrough=mode is AllocationMode.DRA and group.passthrough,
            node_setup_expectation=group.gpu.node_setup_expectation,
            toolkit_install_dir=group.toolkit.install_dir,
            priority_class_name=cluster.priority_class_name,
        )
