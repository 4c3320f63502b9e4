"""``nodeGroups[]``: one group of GPU nodes: how its nodes are selected, its taints, its GPUs and toolkit.

Selectors and taints that Kubernetes accepts but that would never match or be fought over are refused
here. A MIG group's layout is checked by :func:`nvgpu.stackconfig.resolved.mig_layout_problems`, which the
MigProfile manifests run again on the config they render: both go through
:func:`nvgpu.migparted.fit_problems`, the one MIG layout check. ``gpu.driverVersion``, the older spelling of
``gpu.driver.version``, is read through :mod:`nvgpu.stackconfig.renames`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)

from nvgpu import catalogue, labels
from nvgpu import driver as driverspec
from nvgpu.errortext import shown
from nvgpu.k8snames import check_dns_label, check_key, check_label_value
from nvgpu.mig import balanced_layout
from nvgpu.migparted import (
    MigConfigSpec,
)
from nvgpu.stackconfig import resolved
from nvgpu.stackconfig.common import CONFIG_NAMESPACE, Bool, ConfigModel, Loc, raise_all
from nvgpu.stackconfig.driver import Toolkit
from nvgpu.stackconfig.gpu import Gpu, MigStrategy, Sharing
from nvgpu.stackconfig.modes import AllocationMode
from nvgpu.stackconfig.renames import Rename

#: Most requirements of one node selector: Kubernetes sets no limit, but a node group is selected by a
#: handful, and checking them for contradictions compares every pair.
MAX_SELECTOR_REQUIREMENTS = 100


def _group_name(v: str) -> str:
    check_dns_label(v)
    if len(v) > 32:
        raise ValueError(f"{v!r} is {len(v)} characters; at most 32: the objects named after a group "
                         "(DaemonSets, ConfigMaps, NodeGroupConfigurations) must stay within 63")
    return v



LabelKey = Annotated[str, AfterValidator(check_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]


class LabelSelectorRequirement(ConfigModel):
    """One requirement of a node selector, as Kubernetes' ``matchExpressions`` take it."""

    #: The node label's key.
    key: LabelKey
    #: How the label's value is compared (Kubernetes' operators).
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    #: The values for ``In`` and ``NotIn`` (required there, refused with the other operators).
    values: list[LabelValue] = []

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class NodeSelector(ConfigModel):
    """A label selector for the group's nodes, for clusters without Deckhouse NodeGroups."""

    #: Labels a node must carry, key to value.
    match_labels: dict[LabelKey, LabelValue] = {}
    #: Requirements a node's labels must meet; contradicting ones (no node could match) are refused.
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=MAX_SELECTOR_REQUIREMENTS)] = []

    @model_validator(mode="after")
    def _non_empty(self) -> NodeSelector:
        if not self.match_labels and not self.match_expressions:
            raise ValueError("an empty selector would match every node; set matchLabels or matchExpressions")
        raise_all(self._never_matching())
        return self

    def _never_matching(self) -> list[tuple[Loc, str]]:
        """Selectors Kubernetes accepts that match no node: a key this stack's agents write (they are
        scheduled by this very selector), or requirements that contradict each other."""
        problems: list[tuple[Loc, str]] = []
        agent_key = ("is a label this stack's agents write on nodes they already run on; the agents are "
                     "scheduled by this selector, so it would never match a new node: select on a label the "
                     "node has from the start (its pool, its instance type, or NFD's "
                     "feature.node.kubernetes.io/pci-10de.present)")
        for key in self.match_labels:
            if labels.written_by_agents(key):
                problems.append((("matchLabels", key), f"{key!r} {agent_key}"))
        for i, r in enumerate(self.match_expressions):
            where: Loc = ("matchExpressions", i)
            if labels.written_by_agents(r.key) and r.operator in ("In", "Exists"):
                problems.append(((*where, "key"), f"{r.key!r} {agent_key}"))
            if r.key in self.match_labels:
                value = self.match_labels[r.key]
                contradicts = ((r.operator == "In" and value not in r.values)
                               or (r.operator == "NotIn" and value in r.values) or r.operator == "DoesNotExist")
                if contradicts:
                    shown = f" {r.values}" if r.values else ""
                    problems.append((where, f"{r.key} {r.operator}{shown} contradicts matchLabels {r.key}={value!r}: "
                                            "no node matches both"))
            for j, other in enumerate(self.match_expressions[:i]):
                if other.key != r.key:
                    continue
                ops = {r.operator, other.operator}
                disjoint = (r.operator == other.operator == "In" and not set(r.values) & set(other.values))
                if disjoint or ops in ({"Exists", "DoesNotExist"}, {"In", "DoesNotExist"}):
                    problems.append((where, f"{r.key} {r.operator} contradicts matchExpressions[{j}] "
                                            f"({other.key} {other.operator}): no node matches both"))
        return problems


#: Taints Kubernetes' own controllers set and clear (the node lifecycle controller's conditions, the
#: cloud node controller's, and ``out-of-service``, which force-deletes every pod): one the stack sets
#: is removed again, or evicts everything, or is fought over on every reconcile.
CONTROLLER_TAINTS = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/memory-pressure", "node.kubernetes.io/disk-pressure", "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable", "node.kubernetes.io/out-of-service",
    "node.cloudprovider.kubernetes.io/uninitialized", "node.cloudprovider.kubernetes.io/shutdown",
})


class Taint(ConfigModel):
    """A node taint, as Kubernetes' ``spec.taints`` take it."""

    #: The taint's key; not the GPU taint's while ``gpuTaint`` is on, nor a key the MIG manager, the driver upgrade
    #: or Kubernetes' node controllers set.
    key: LabelKey
    #: The taint's value (none by default).
    value: LabelValue = ""
    #: What the taint does to pods that do not tolerate it.
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]



class NodeGroup(ConfigModel):
    """One group of GPU nodes (an entry of ``nvidia-gpu:nodeGroups``): how its nodes are selected, its taints, its GPUs
    and toolkit."""

    #: The group's name, a DNS label of at most 32 characters: it names the group's objects (DaemonSets,
    #: ConfigMaps, NodeGroupConfigurations).
    name: Annotated[str, AfterValidator(_group_name)]
    #: The Deckhouse NodeGroup whose nodes form this group (selects ``node.deckhouse.io/group=<name>``).
    node_group: Annotated[str, AfterValidator(check_dns_label)] | None = None
    #: An explicit label selector, for clusters without Deckhouse NodeGroups.
    node_selector: NodeSelector | None = None
    #: The group's GPUs: model, sharing, driver and device list strategy.
    gpu: Gpu = Gpu()
    #: Taint GPU nodes ``nvidia.com/gpu=present:NoSchedule`` so only GPU workloads land there.
    gpu_taint: Bool = True
    #: More taints on the group's nodes; on Deckhouse they replace the node template's taint list, so list them all
    #: here.
    extra_taints: list[Taint] = []
    #: The group's own allocation mode (default: ``cluster.allocationMode``).
    allocation_mode: AllocationMode | None = None
    #: DRA only: GPUs of this group may be bound to vfio-pci and handed to VMs (IOMMU on, gpu-vfio.sh).
    passthrough: Bool = False
    #: The NVIDIA Container Toolkit of the group's nodes.
    toolkit: Toolkit = Toolkit()

    renamed_keys = (
        #: ``gpu.driverVersion`` said which driver a pre-installed node has; ``gpu.driver`` says all of it.
        Rename(("gpu", "driverVersion"), ("gpu", "driver", "version")),
    )

    @classmethod
    def config_where(cls, data: Mapping[str, Any]) -> str:
        """``nvidia-gpu:nodeGroups[<name>].``: a group is known by its name (as the policies name it)."""
        name = data.get("name")
        return f"{CONFIG_NAMESPACE}:nodeGroups[{shown(name) if not isinstance(name, str) else name}]."

    def toolkit_accepts_envvar(self, mode: AllocationMode) -> bool:
        """Whether node setup lets the toolkit honour ``NVIDIA_VISIBLE_DEVICES`` in ``mode``
        (:func:`nvgpu.stackconfig.resolved.toolkit_accepts_envvar`)."""
        return resolved.toolkit_accepts_envvar(self, mode)

    @model_validator(mode="after")
    def _selection(self) -> NodeGroup:
        if (self.node_group is None) == (self.node_selector is None):
            raise ValueError("set exactly one of nodeGroup (a Deckhouse NodeGroup name) or nodeSelector")
        return self

    @model_validator(mode="after")
    def _taints(self) -> NodeGroup:
        """Taints the API server refuses (two with one key and effect) or that would be lost or fought over:
        the GPU taint's key while ``gpuTaint`` sets it, a key the node lifecycle controller or the cloud
        provider owns, the MIG manager's or the driver upgrade's own taint (``node_agent.kube.nodeowner``
        refuses the labeller another writer's key)."""
        problems: list[tuple[Loc, str]] = []
        seen: dict[tuple[str, str], int] = {}
        for i, t in enumerate(self.extra_taints):
            where: Loc = ("extraTaints", i, "key")
            if (t.key, t.effect) in seen:
                problems.append((where, f"{t.key}:{t.effect} is also extraTaints[{seen[t.key, t.effect]}]; the API "
                                        "server refuses two taints with one key and effect"))
            seen.setdefault((t.key, t.effect), i)
            if t.key == labels.GPU_TAINT_KEY and self.gpu_taint:
                problems.append((where, f"{t.key} is the GPU taint's key and gpuTaint is on, so this taint would "
                                        "be replaced by the GPU taint; drop it, or set gpuTaint: false"))
            elif t.key == labels.MIG_RECONFIGURE_TAINT_KEY:
                problems.append((where, f"{t.key} is the MIG manager's own taint (set while it reconfigures); "
                                        "choose another key"))
            elif t.key == driverspec.UPGRADE_TAINT_KEY:
                problems.append((where, f"{t.key} is the driver upgrade's own taint (set while it replaces a "
                                        "node's driver; the labeller may not write it); choose another key"))
            elif t.key in CONTROLLER_TAINTS:
                problems.append((where, f"{t.key} is a taint Kubernetes' node controllers set and remove by "
                                        "themselves; choose another key"))
        raise_all(problems)
        return self

    @model_validator(mode="after")
    def _mig_layout(self) -> NodeGroup:
        if self.gpu.sharing is not Sharing.MIG:
            return self
        mig = self.gpu.effective_mig
        field = "customConfigs" if mig.parted_config == "custom" else "partedConfig"
        problems: list[tuple[Loc, str]] = [(("gpu", "mig", field), p.removeprefix(f"node group {self.name!r}: "))
                                           for p in resolved.mig_layout_problems(self)]
        if not problems and mig.strategy is MigStrategy.SINGLE:
            mixed = self._mixed_profiles()
            if len(mixed) > 1:
                problems.append((("gpu", "mig", "strategy"), (
                    f"'single' exposes every MIG device as nvidia.com/gpu, so the GPUs must all carry one profile; "
                    f"partedConfig {self.mig_config_name!r} mixes {', '.join(mixed)}: use strategy 'mixed' "
                    "(nvidia.com/mig-<profile> resources) or an all-<profile> config")))
        raise_all(problems)
        return self

    def _mixed_profiles(self) -> list[str]:
        """The MIG profiles the group's layout creates across its GPUs (a guess over the catalogue's MIG
        models for ``all-balanced`` when no model is declared: it mixes profiles on every one of them)."""
        mig = self.gpu.effective_mig
        if mig.parted_config == "custom":
            return sorted({s.profile for c in mig.custom_configs for s in c.slices})
        if mig.parted_config != "all-balanced" or self.gpu.model_unlisted:
            return []  # an unlisted model's balanced layout is NVML's to say, on the node
        model = self.gpu.declared_model
        models = [model] if model is not None else [m for m in catalogue.MODELS if m.mig]
        return sorted({p for m in models for p in balanced_layout(m)})

    @property
    def mig_config_name(self) -> str:
        """The ``nvidia.com/mig.config`` value (:func:`nvgpu.stackconfig.resolved.mig_config_name`)."""
        return resolved.mig_config_name(self)

    def custom_mig_configs(self) -> dict[str, list[MigConfigSpec]]:
        """The group's custom MIG layout as mig-parted entries
        (:func:`nvgpu.stackconfig.resolved.custom_mig_configs`)."""
        return resolved.custom_mig_configs(self)

    @property
    def match_labels(self) -> dict[str, str]:
        if self.node_group is not None:
            return {"node.deckhouse.io/group": self.node_group}
        assert self.node_selector is not None
        return dict(self.node_selector.match_labels)

    @property
    def match_expressions(self) -> list[LabelSelectorRequirement]:
        return [] if self.node_selector is None else list(self.node_selector.match_expressions)

