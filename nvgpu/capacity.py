"""The capacity plan: what each node group offers per GPU, from the stack config and the GPU catalogue.

A reviewer reading a pull request's preview sees that ``all-1g.10gb`` on the H100 group means seven
``nvidia.com/mig-1g.10gb`` of 9.75 GiB and one seventh of the SMs each, per GPU, or that time-slicing
four ways offers four ``nvidia.com/gpu`` sharing one GPU's memory with no isolation, before any node
has it. The figures follow what the agents do: the device plugin's resource names and replicas, the
MPS limits its allocations set (memory / replicas, 100 % / replicas of the SMs, as NVIDIA's daemon
sets them), mig-parted's standard layouts, the DRA driver's DeviceClasses.

GPUs per node are not part of the stack config (a node group's machines decide), so the plan is per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from nvgpu import catalogue
from nvgpu.mig import MigLayoutError, all_profile_layout, balanced_layout
from nvgpu.migparted import ALL_DISABLED, ALL_ENABLED
from nvgpu.stackconfig import (
    DRA_DEVICE_CLASSES,
    AllocationMode,
    GroupPlan,
    MigStrategy,
    NodeGroup,
    Sharing,
    StackConfig,
)

MemoryKind = Literal["isolated", "limit", "shared"]
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
#: The DRA DeviceClasses, in the stack config's one list.
GPU_CLASS, MIG_CLASS, VFIO_CLASS = DRA_DEVICE_CLASSES


@dataclass(frozen=True)
class Offer:
    """``count`` units of ``resource`` (an extended resource, or a DRA DeviceClass) per GPU of ``gpus``."""

    resource: str
    count: int
    #: Memory each unit may use, in MiB; None when the model is not declared.
    memory_mib: int | None
    #: How much of the GPU's compute a unit gets, in words ("whole GPU", "1/7 of the SMs", "time-shared").
    compute: str
    #: ``isolated`` (a whole GPU or a MIG instance: no other unit touches it), ``limit`` (MPS: a limit per
    #: client inside one shared address space) or ``shared`` (time-slicing: all of it, shared, no limit).
    memory: MemoryKind
    gpus: str = "every GPU"

    def as_json(self) -> dict[str, Any]:
        return {"resource": self.resource, "perGpu": self.count, "memoryMiB": self.memory_mib,
                "memory": self.memory, "compute": self.compute, "gpus": self.gpus}


@dataclass(frozen=True)
class GroupCapacity:
    node_group: str
    model: str | None
    allocation_mode: AllocationMode
    sharing: Sharing
    #: The ``nvidia.com/mig.config`` the group's nodes carry (``all-disabled`` without MIG).
    mig_config: str
    mig_strategy: MigStrategy
    offers: tuple[Offer, ...]
    notes: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {"nodeGroup": self.node_group, "model": self.model, "allocationMode": self.allocation_mode.value,
                "sharing": self.sharing.value, "migConfig": self.mig_config, "migStrategy": self.mig_strategy.value,
                "offers": [o.as_json() for o in self.offers], "notes": list(self.notes)}


def plan(config: StackConfig) -> tuple[GroupCapacity, ...]:
    """Every node group's capacity, in the config's order."""
    return tuple(group_capacity(g, GroupPlan.of(config.cluster, g)) for g in config.node_groups)


def group_capacity(group: NodeGroup, plan: GroupPlan) -> GroupCapacity:
    """What ``group`` offers per GPU (``plan``: what the stack decided for it, its allocation mode and
    ``nvidia.com/mig.config``)."""
    gpu = group.gpu
    mode = plan.allocation_mode
    model = gpu.declared_model
    memory = model.memory_mib if model else None
    notes: list[str] = []
    if gpu.model_unlisted:
        notes.append(f"gpu.model {gpu.model} is not in the catalogue: its memory and MIG profiles are not known "
                     "before the nodes report them (the MIG layout is checked on the node against NVML's own "
                     "profiles; the global driver minimum applies)")
    elif model is None:
        notes.append("gpu.model is not declared: memory and MIG layouts depend on each node's GPU")
    dra = mode is AllocationMode.DRA
    whole_resource = GPU_CLASS if dra else GPU_RESOURCE
    offers: list[Offer]
    if gpu.sharing is Sharing.MIG:
        offers = _mig_offers(group, model, dra, notes)
    elif gpu.sharing is Sharing.EXCLUSIVE or dra:
        offers = [Offer(whole_resource, 1, memory, "whole GPU", "isolated")]
        if dra and gpu.sharing is not Sharing.EXCLUSIVE:
            notes.append(f"DRA: {gpu.sharing.value} is chosen per claim (the claim's opaque config), not per node; "
                         "each GPU is one device")
    elif gpu.sharing is Sharing.TIME_SLICING:
        offers = [Offer(GPU_RESOURCE, gpu.replicas, memory, f"time-shared by {gpu.replicas}", "shared")]
        notes.append("time-slicing: replicas share the GPU's memory and faults; no limit is enforced")
    else:  # MPS
        share = memory // gpu.replicas if memory is not None else None
        offers = [Offer(GPU_RESOURCE, gpu.replicas, share, f"{max(1, 100 // gpu.replicas)}% of the SMs (MPS)", "limit")]
        notes.append("MPS: memory and SM limits per client, one address space fault domain per GPU")
    if plan.passthrough:
        offers.append(Offer(VFIO_CLASS, 1, memory, "whole GPU, bound to vfio-pci for a VM", "isolated"))
        notes.append("passthrough: a GPU given to a VM is taken out of the other offers while it is bound")
    return GroupCapacity(group.name, gpu.model, mode, gpu.sharing, plan.mig_config_name,
                         gpu.effective_mig.strategy, tuple(offers), tuple(notes))


def _mig_offers(group: NodeGroup, model: catalogue.GpuModel | None, dra: bool, notes: list[str]) -> list[Offer]:
    mig = group.gpu.effective_mig
    name = mig.parted_config
    if name == ALL_DISABLED:
        return [Offer(GPU_CLASS if dra else GPU_RESOURCE, 1, model.memory_mib if model else None, "whole GPU",
                      "isolated")]
    if name == ALL_ENABLED:
        notes.append("all-enabled: MIG mode on with no instances; nothing to allocate until instances are made")
        return []
    if model is None or model.mig is None:
        return []
    layouts: list[tuple[str, dict[str, int]]]
    try:
        if name == "custom":
            layouts = [(f"GPU {c.index}", {s.profile: s.count for s in c.slices}) for c in mig.custom_configs]
            notes.append("custom: GPUs without a layout of their own keep the one they have")
        elif name == "all-balanced":
            layouts = [("every GPU", balanced_layout(model))]
        else:
            layouts = [("every GPU", all_profile_layout(model, name.removeprefix("all-")))]
    except MigLayoutError as e:  # the config's own checks refuse these first; a caller past them gets a note
        notes.append(f"MIG layout: {e}")
        return []
    single = mig.strategy is MigStrategy.SINGLE and not dra
    offers = []
    for gpus, layout in layouts:
        merged: dict[str, int] = {}
        for spelled, count in layout.items():
            key = spelled.replace(".me", "+me") if spelled.endswith(".me") else spelled
            merged[key] = merged.get(key, 0) + count
        for profile_name, count in sorted(merged.items()):
            profile = model.mig.profile(profile_name)
            if profile is None:
                continue
            resource = MIG_CLASS if dra else GPU_RESOURCE if single else MIG_RESOURCE_PREFIX + profile.resource_suffix
            share = f"{profile.compute_slices}/{model.mig.compute_slices} of the SMs"
            offers.append(Offer(resource, count, profile.memory_mib, share, "isolated", gpus))
    if single:
        notes.append("strategy single: every MIG device is an nvidia.com/gpu")
    return offers


def _gib(mib: int | None) -> str:
    if mib is None:
        return "?"
    gib = mib / 1024
    return f"{gib:.0f} GiB" if gib >= 10 and abs(gib - round(gib)) < 0.05 else f"{gib:.2f} GiB".replace(".00 ", " ")


def lines(groups: tuple[GroupCapacity, ...]) -> list[str]:
    """The preview's text: a line per offer under a line per group, then its notes."""
    out = ["Capacity plan (per GPU, from the GPU catalogue):"]
    for g in groups:
        how = g.sharing.value + (f" {g.mig_config}" if g.sharing is Sharing.MIG else "")
        if g.sharing is Sharing.MIG and g.allocation_mode is AllocationMode.DEVICE_PLUGIN:
            how += f" (strategy {g.mig_strategy.value})"
        out.append(f"  {g.node_group}: {g.model or 'model not declared'}, {g.allocation_mode.value}, {how}")
        for o in g.offers:
            where = "" if o.gpus == "every GPU" else f"  [{o.gpus}]"
            memory = {"isolated": "each", "limit": "limit each", "shared": "shared by all"}[o.memory]
            out.append(f"      {o.count:>3} x {o.resource:<26} {_gib(o.memory_mib):>10} {memory}, {o.compute}{where}")
        if not g.offers:
            out.append("        (nothing to allocate)")
        out += [f"      note: {n}" for n in g.notes]
    return out
