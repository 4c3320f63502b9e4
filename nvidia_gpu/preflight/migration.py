"""What another GPU installation already runs on the stack's nodes: NVIDIA's GPU Operator, NVIDIA's
device-plugin / GFD Helm chart, NVIDIA's DRA driver, Deckhouse's own GPU support.

Some of their agents must never share a node with the stack's (two device plugins registering one
resource with the kubelet, two MIG managers reconfiguring one GPU, two DRA kubelet plugins for one driver
name, two writers of the ``nvidia.com/gpu.*`` labels): those are errors, each with the per-node-group
handover that moves the node to this stack. Others coexist (the operator's driver and toolkit when the
group's ``driver.source`` is ``gpuOperator``, a second metrics exporter): those are warnings. The
handover order, rollback and the commands are in ``docs/migration.md``; every command a message offers is
built here, and the guide's tests check that it names the same keys.

The facts, read from the projects' own sources:

* GPU Operator (NVIDIA/gpu-operator): every operand DaemonSet selects its nodes by
  ``nodeSelector: nvidia.com/gpu.deploy.<operand>: "true"`` (``assets/state-device-plugin/0500_daemonset.yaml``,
  ``assets/gpu-feature-discovery/0600_daemonset.yaml``, ...). ``controllers/state_manager.go`` adds those labels
  to every GPU node (``gpuStateLabels``; ``nvidia.com/gpu.deploy.mig-manager`` only where
  ``nvidia.com/mig.capable=true`` or the product is an A100/A30/H100) but *honours a value already set*
  (``addGPUStateLabels``: "If a required state label already exists on the node, honor the current value"),
  so ``nvidia.com/gpu.deploy.<operand>=false`` on a node keeps that operand off it for good, and
  ``nvidia.com/gpu.deploy.operands=false`` removes them all (``hasOperandsDisabled``). It labels GPU nodes
  (NFD's ``pci-10de`` labels, ``gpuNodeLabels``), which every node of a GPU node group is.
* Device-plugin chart (NVIDIA/k8s-device-plugin ``deployments/helm/nvidia-device-plugin``): the plugin, GFD and
  the MPS control daemon run the ``k8s-device-plugin`` image with the commands ``nvidia-device-plugin``,
  ``gpu-feature-discovery`` and ``mps-control-daemon``; their placement is the chart's ``nodeSelector`` /
  ``affinity`` values (no per-node switch); Helm records the release in ``meta.helm.sh/release-name``.
* DRA driver (NVIDIA/k8s-dra-driver-gpu ``deployments/helm/nvidia-dra-driver-gpu/templates/kubeletplugin.yaml``):
  DaemonSet ``<name>-kubelet-plugin``, the GPU plugin is container ``gpus`` running ``gpu-kubelet-plugin``
  (driver ``gpu.nvidia.com``), switched by the chart value ``resources.gpus.enabled``; its DeviceClasses
  ``gpu.nvidia.com``, ``mig.nvidia.com`` and ``vfio.gpu.nvidia.com`` are the names this stack's DRA mode keeps.
* Deckhouse (``/work/shared/reference/deckhouse-nvidia-gpu.md``): the in-core support (node-manager) and the
  ``gpu`` module (ModuleConfig ``gpu``) run a device plugin, GFD, MIG manager and DCGM exporter in namespace
  ``d8-nvidia-gpu`` for every NodeGroup with ``spec.gpu``, and label its nodes with the same keys this stack's
  node template sets (``node.deckhouse.io/device-gpu.config``, ``nvidia.com/mig.config``).

Reads: Nodes once, DaemonSets once, ClusterPolicies, the ModuleConfig, each Deckhouse group's NodeGroup, the
DRA DeviceClasses (when the stack creates them), and the Pods of a colliding DaemonSet only (by its selector).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nvgpu import driver as driverspec
from nvgpu import labels
from nvgpu.nodelabels import desired_node_labels, desired_node_taints
from nvgpu.stackconfig import AllocationMode, GroupPlan, MetricsExporter, Monitoring, NodeGroup, StackConfig
from nvidia_gpu.components.manifests.dra import DEVICE_CLASSES, RESOURCE_API
from nvidia_gpu.components.manifests.driver import nvidia_driver
from nvidia_gpu.components.manifests.meta import MANAGED_BY, PART_OF
from nvidia_gpu.components.manifests.mig import may_use_mig
from nvidia_gpu.components.manifests.scheduling import node_selector_terms
from nvidia_gpu.preflight.model import ClusterReader, Finding, Severity

# --- the facts --------------------------------------------------------------------------------------------

#: The GPU Operator's ClusterPolicy (``clusterpolicies.nvidia.com``); its singleton is ``cluster-policy``.
CLUSTER_POLICY_API = "nvidia.com/v1"
CLUSTER_POLICY = "ClusterPolicy"
#: The per-node switch of one operand (``nvidia.com/gpu.deploy.<operand>``) and of all of them.
DEPLOY_PREFIX = labels.GPU_DEPLOY_PREFIX
DEPLOY_OPERANDS = f"{DEPLOY_PREFIX}operands"
#: ``hasMIGCapableGPU``: the products whose nodes get the MIG manager when ``mig.capable`` is not set yet.
OPERATOR_MIG_PRODUCTS = ("h100", "a100", "a30")
GPU_PRODUCT = "nvidia.com/gpu.product"
HELM_RELEASE = "meta.helm.sh/release-name"
HELM_NAMESPACE = "meta.helm.sh/release-namespace"
#: Deckhouse's GPU namespace (in-core support and the ``gpu`` module) and the module's ModuleConfig.
DECKHOUSE_NAMESPACE = "d8-nvidia-gpu"
MODULE_CONFIG_API = "deckhouse.io/v1alpha1"
GPU_MODULE = "gpu"
NODE_GROUP_API = "deckhouse.io/v1"
#: Images (the repository's last path element) of NVIDIA's standalone deployments.
DEVICE_PLUGIN_IMAGE = "k8s-device-plugin"
GFD_IMAGE = "gpu-feature-discovery"
MIG_MANAGER_IMAGE = "k8s-mig-manager"
DCGM_EXPORTER_IMAGE = "dcgm-exporter"
DRA_IMAGES = ("k8s-dra-driver-gpu", "k8s-dra-driver")
DRA_GPU_PLUGIN = "gpu-kubelet-plugin"
#: The GPU Operator's toolkit container reads the toolkit's two device-selection settings from these
#: variables (Helm ``toolkit.env``, ClusterPolicy ``spec.toolkit.env``; NVIDIA/nvidia-container-toolkit's
#: installer flags ``--accept-nvidia-visible-devices-envvar-when-unprivileged`` / ``-as-volume-mounts``).
TOOLKIT_ENVVAR_ENV = "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"
TOOLKIT_VOLUME_MOUNTS_ENV = "ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"
#: Taints the DaemonSet controller tolerates by itself or that come and go with node conditions.
_CONDITION_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/")
#: The migration guide, which the messages cite by section.
GUIDE = "docs/migration.md"
#: Nodes named in one message before "and N more".
SHOWN_NODES = 3


class Owner(enum.Enum):
    OPERATOR = "GPU Operator"
    CHART = "NVIDIA device-plugin chart"
    DRA_CHART = "NVIDIA DRA driver"
    DECKHOUSE = "Deckhouse GPU support"
    STANDALONE = "standalone NVIDIA deployment"


class Role(enum.Enum):
    """What a foreign agent does on a node; the value is the GPU Operator's operand name."""

    DEVICE_PLUGIN = "device-plugin"
    GFD = "gpu-feature-discovery"
    MIG_MANAGER = "mig-manager"
    DCGM_EXPORTER = "dcgm-exporter"
    TOOLKIT = "container-toolkit"
    DRIVER = "driver"
    DRA_PLUGIN = "dra-driver"
    #: The operator's VM operands: they bind the GPUs to vfio-pci or hand them to VMs.
    VFIO_MANAGER = "vfio-manager"
    SANDBOX_DEVICE_PLUGIN = "sandbox-device-plugin"
    VGPU_MANAGER = "vgpu-manager"


#: The ClusterPolicy ``spec`` key that enables each operand (for the cluster-wide alternative).
POLICY_KEYS: dict[Role, str] = {
    Role.DEVICE_PLUGIN: "devicePlugin",
    Role.GFD: "gfd",
    Role.MIG_MANAGER: "migManager",
    Role.DCGM_EXPORTER: "dcgmExporter",
    Role.TOOLKIT: "toolkit",
    Role.DRIVER: "driver",
    Role.VFIO_MANAGER: "vfioManager",
    Role.SANDBOX_DEVICE_PLUGIN: "sandboxDevicePlugin",
    Role.VGPU_MANAGER: "vgpuManager",
}
_OPERANDS = {r.value: r for r in Role}
#: The operands the operator labels every GPU node for (``gpuStateLabels["container"]`` and the MIG manager);
#: the VM operands only where ``nvidia.com/gpu.workload.config`` asks for them.
_CONTAINER_OPERANDS = (Role.DEVICE_PLUGIN, Role.GFD, Role.MIG_MANAGER, Role.DCGM_EXPORTER, Role.TOOLKIT, Role.DRIVER)


@dataclass(frozen=True)
class Foreign:
    """A DaemonSet of another installation and the agent it runs."""

    owner: Owner
    role: Role
    namespace: str
    name: str

    @property
    def subject(self) -> str:
        return f"DaemonSet/{self.namespace}/{self.name}"


def deploy_label(role: Role) -> str:
    """The GPU Operator's per-node switch for an operand: ``nvidia.com/gpu.deploy.<operand>``."""
    return f"{DEPLOY_PREFIX}{role.value}"


# --- classification ---------------------------------------------------------------------------------------

def _map(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _map(obj.get("metadata"))


def _pod_spec(ds: Mapping[str, Any]) -> dict[str, Any]:
    return _map(_map(_map(ds.get("spec")).get("template")).get("spec"))


def _image_name(image: Any) -> str:
    """``nvcr.io/nvidia/k8s-device-plugin:v0.17.0`` -> ``k8s-device-plugin``."""
    text = str(image or "").split("@", 1)[0]
    last = text.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def _containers(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [c for c in _list(spec.get("containers")) if isinstance(c, dict)]


def _command_text(container: Mapping[str, Any]) -> str:
    return " ".join(str(x) for x in [*_list(container.get("command")), *_list(container.get("args"))])


def is_ours(ds: Mapping[str, Any]) -> bool:
    """A DaemonSet of an nvidia-gpu stack (this one or another: the stacks' own checks cover those). The
    GPU Operator's GFD carries ``app.kubernetes.io/part-of: nvidia-gpu`` too, so the manager decides."""
    found = _map(_meta(ds).get("labels"))
    return found.get("app.kubernetes.io/part-of") == PART_OF and found.get("app.kubernetes.io/managed-by") == MANAGED_BY


def classify(ds: Mapping[str, Any]) -> Foreign | None:
    """The installation and role of a DaemonSet, or None when it runs no GPU agent we know of."""
    if is_ours(ds):
        return None
    meta = _meta(ds)
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    spec = _pod_spec(ds)
    # The GPU Operator: its operands select their nodes by their own deploy label.
    for key in _map(spec.get("nodeSelector")):
        operand = str(key).removeprefix(DEPLOY_PREFIX) if str(key).startswith(DEPLOY_PREFIX) else None
        if operand in _OPERANDS:
            return Foreign(Owner.OPERATOR, _OPERANDS[operand], namespace, name)
    if namespace == DECKHOUSE_NAMESPACE:
        for prefix, role in (("nvidia-device-plugin", Role.DEVICE_PLUGIN), ("mps-control-daemon", Role.DEVICE_PLUGIN),
                             ("gpu-feature-discovery", Role.GFD), ("nvidia-mig-manager", Role.MIG_MANAGER),
                             ("nvidia-dcgm-exporter", Role.DCGM_EXPORTER)):
            if name.startswith(prefix):
                return Foreign(Owner.DECKHOUSE, role, namespace, name)
        return None
    for c in _containers(spec):
        image, command = _image_name(c.get("image")), _command_text(c)
        if image in DRA_IMAGES or DRA_GPU_PLUGIN in command:
            if c.get("name") == "gpus" or DRA_GPU_PLUGIN in command:
                return Foreign(Owner.DRA_CHART, Role.DRA_PLUGIN, namespace, name)
            continue  # the ComputeDomain plugin: another driver, other devices
        if image == DEVICE_PLUGIN_IMAGE:
            if "gpu-feature-discovery" in command:
                return Foreign(Owner.CHART, Role.GFD, namespace, name)
            if "config-manager" in command and "nvidia-device-plugin" not in command:
                continue  # the chart's config sidecar: the main container decides
            return Foreign(Owner.CHART, Role.DEVICE_PLUGIN, namespace, name)  # the plugin or its MPS daemon
        if image == GFD_IMAGE:
            return Foreign(Owner.CHART, Role.GFD, namespace, name)
        if image == MIG_MANAGER_IMAGE:
            return Foreign(Owner.STANDALONE, Role.MIG_MANAGER, namespace, name)
        if image == DCGM_EXPORTER_IMAGE:
            return Foreign(Owner.STANDALONE, Role.DCGM_EXPORTER, namespace, name)
    return None


# --- placement --------------------------------------------------------------------------------------------

def _requirement_holds(req: Mapping[str, Any], node_labels: Mapping[str, str], node_name: str, *,
                       field: bool = False) -> bool:
    key, op = str(req.get("key") or ""), str(req.get("operator") or "")
    values = [str(v) for v in _list(req.get("values"))]
    if field:
        present, value = key == "metadata.name", node_name
    else:
        present, value = key in node_labels, node_labels.get(key, "")
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term_holds(term: Mapping[str, Any], node_labels: Mapping[str, str], node_name: str) -> bool:
    if not _list(term.get("matchExpressions")) and not _list(term.get("matchFields")):
        return False  # "a null or empty node selector term matches no objects" (core/v1 NodeSelectorTerm)
    return (all(_requirement_holds(_map(r), node_labels, node_name) for r in _list(term.get("matchExpressions")))
            and all(_requirement_holds(_map(r), node_labels, node_name, field=True)
                    for r in _list(term.get("matchFields"))))


def selects(spec: Mapping[str, Any], node_labels: Mapping[str, str], node_name: str = "") -> bool:
    """Whether a pod spec's ``nodeSelector`` and required node affinity admit a node with these labels."""
    for key, value in _map(spec.get("nodeSelector")).items():
        if node_labels.get(str(key)) != str(value):
            return False
    required = _map(_map(_map(spec.get("affinity")).get("nodeAffinity"))
                    .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = [_map(t) for t in _list(required.get("nodeSelectorTerms"))]
    return not terms or any(_term_holds(t, node_labels, node_name) for t in terms)


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if not t.get("key") and t.get("operator") == "Exists":
            return True
        if t.get("key") != taint.get("key"):
            continue
        if t.get("operator") == "Exists" or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def admits(spec: Mapping[str, Any], taints: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a pod spec tolerates the taints that keep a new daemon pod off a node."""
    tolerations = [_map(t) for t in _list(spec.get("tolerations"))]
    return all(_tolerated(t, tolerations) for t in taints
               if t.get("effect") in ("NoSchedule", "NoExecute")
               and not str(t.get("key") or "").startswith(_CONDITION_TAINT_PREFIXES))


def group_selects(group: NodeGroup, node: Mapping[str, Any]) -> bool:
    """Whether a Node belongs to the group, by the very selector the stack's agents are placed with."""
    meta = _meta(node)
    terms = node_selector_terms(group, require_setup_complete=False)
    return selects({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}}, _labels(node), str(meta.get("name") or ""))


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(_meta(obj).get("labels")).items()}


def expected_labels(group: NodeGroup, plan: GroupPlan, node: Mapping[str, Any], *, operator: bool) -> dict[str, str]:
    """The node's labels once the stack runs: its own, the group's (the stack sets them), and, beside a GPU
    Operator, the deploy labels the operator would add (``addGPUStateLabels``: only where none is set, on a
    node with GPUs, which every node of a GPU group is, and not where ``nvidia.com/gpu.deploy.operands=false``)."""
    out = {**_labels(node), **desired_node_labels(group, plan)}
    if not operator or out.get(DEPLOY_OPERANDS) == "false":
        return out
    for role in _CONTAINER_OPERANDS:
        if role is Role.MIG_MANAGER and not _operator_mig_capable(group, out):
            continue
        out.setdefault(deploy_label(role), "true")
    return out


def _operator_mig_capable(group: NodeGroup, node_labels: Mapping[str, str]) -> bool:
    if labels.MIG_CAPABLE in node_labels:
        return node_labels[labels.MIG_CAPABLE] == "true"
    product = node_labels.get(GPU_PRODUCT, "").lower()
    if product:
        return any(p in product for p in OPERATOR_MIG_PRODUCTS)
    return may_use_mig(group)


def _taints(group: NodeGroup, node: Mapping[str, Any]) -> list[dict[str, Any]]:
    current = [_map(t) for t in _list(_map(node.get("spec")).get("taints"))]
    return current + [t.as_dict() for t in desired_node_taints(group)]


# --- verdicts ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    severity: Severity
    #: What collides, in a clause ("two device plugins would register nvidia.com/gpu with the kubelet").
    why: str


def verdict(monitoring: Monitoring, group: NodeGroup, plan: GroupPlan, foreign: Foreign) -> Verdict | None:
    """How bad it is that ``foreign`` runs on the group's nodes (``plan``: what the stack decided for the
    group; ``monitoring``: the cluster's); None when it is no concern of ours."""
    role, dra = foreign.role, plan.allocation_mode is AllocationMode.DRA
    if role is Role.DEVICE_PLUGIN:
        return Verdict(Severity.ERROR, "its device plugin would hand out the GPUs the stack's DRA driver allocates"
                       if dra else "two device plugins would register nvidia.com/gpu with one kubelet")
    if role is Role.DRA_PLUGIN:
        return Verdict(Severity.ERROR, "two DRA kubelet plugins would publish and prepare the same GPUs"
                       if dra else "its DRA driver would allocate the GPUs the stack's device plugin hands out")
    if role is Role.GFD:
        return Verdict(Severity.ERROR, "GPU feature discovery and the stack's labeller would both write the "
                                       "nvidia.com/gpu.* node labels")
    if role is Role.MIG_MANAGER:
        return Verdict(Severity.ERROR, "two MIG managers would reconfigure the same GPUs from nvidia.com/mig.config")
    if role in (Role.VFIO_MANAGER, Role.SANDBOX_DEVICE_PLUGIN, Role.VGPU_MANAGER):
        return Verdict(Severity.ERROR, "it takes the GPUs from the host driver for VMs")
    if role is Role.DCGM_EXPORTER:
        if not monitoring.enabled or monitoring.exporter is MetricsExporter.NONE:
            return None
        return Verdict(Severity.WARNING, "two exporters would publish the same DCGM_FI_* series (dashboards "
                                         "and alerts double count)")
    source = group.gpu.driver.source
    if role is Role.DRIVER:
        if source is driverspec.DriverSource.CONTAINER:
            return Verdict(Severity.ERROR, "two driver containers would load the kernel modules (the group's "
                                           "driver.source is container)")
        if source is driverspec.DriverSource.GPU_OPERATOR:
            return Verdict(Severity.WARNING, "the ClusterPolicy's own driver runs here, not the group's "
                                             "NVIDIADriver (set driver.useNvidiaDriverCRD: true in the ClusterPolicy)")
        return Verdict(Severity.WARNING, "the operator installs the driver here while the group declares "
                                         "driver.source preinstalled (declare gpuOperator so the stack knows)")
    if role is Role.TOOLKIT:
        if group.toolkit.container:
            return Verdict(Severity.ERROR, "two toolkit installers would rewrite the container runtime's "
                                           "nvidia runtime (the group's toolkit.source is container)")
        return Verdict(Severity.WARNING, "the operator's toolkit configures the container runtime here and "
                                         "node setup uses it (cluster.cdiHookPath "
                                         "/usr/local/nvidia/toolkit/nvidia-cdi-hook)")
    return None


# --- fixes ------------------------------------------------------------------------------------------------

def selector_text(group: NodeGroup) -> str:
    """The group's node selector as ``kubectl -l`` takes it."""
    parts = [f"{k}={v}" for k, v in sorted(group.match_labels.items())]
    for r in group.match_expressions:
        if r.operator == "In":
            parts.append(f"{r.key} in ({','.join(r.values)})")
        elif r.operator == "NotIn":
            parts.append(f"{r.key} notin ({','.join(r.values)})")
        elif r.operator == "Exists":
            parts.append(r.key)
        else:
            parts.append(f"!{r.key}")
    return ",".join(parts)


def label_command(group: NodeGroup, key: str, value: str = "false") -> str:
    return f"kubectl label nodes -l '{selector_text(group)}' {key}={value} --overwrite"


def node_template_command(node_group: str, key: str, value: str = "false") -> str:
    """Put a label in a Deckhouse NodeGroup's node template, so nodes that join later carry it too."""
    return (f"kubectl patch nodegroups.deckhouse.io {node_group} --type merge "
            f"-p '{{\"spec\":{{\"nodeTemplate\":{{\"labels\":{{\"{key}\":\"{value}\"}}}}}}}}'")


def remove_gpu_command(node_group: str) -> str:
    return (f"kubectl patch nodegroups.deckhouse.io {node_group} --type json "
            "-p '[{\"op\":\"remove\",\"path\":\"/spec/gpu\"}]'")


def policy_command(role: Role) -> str:
    key = POLICY_KEYS[role]
    return (f"kubectl patch clusterpolicies.nvidia.com cluster-policy --type merge "
            f"-p '{{\"spec\":{{\"{key}\":{{\"enabled\":false}}}}}}'")


def use_driver_crd_command(policy: str = "cluster-policy") -> str:
    return (f"kubectl patch clusterpolicies.nvidia.com {policy} --type merge "
            "-p '{\"spec\":{\"driver\":{\"useNvidiaDriverCRD\":true}}}'")


def helm_command(release: str, namespace: str, values: str, chart: str = "<chart>") -> str:
    return f"helm upgrade {release} {chart} -n {namespace} --reuse-values {values}"


def module_off_command() -> str:
    """Switch Deckhouse's ``gpu`` module off (once no NodeGroup needs it)."""
    return (f"kubectl patch moduleconfigs.deckhouse.io {GPU_MODULE} --type merge "
            "-p '{\"spec\":{\"enabled\":false}}'")


def _helm_release(ds: Mapping[str, Any]) -> tuple[str, str]:
    annotations = _map(_meta(ds).get("annotations"))
    release = str(annotations.get(HELM_RELEASE) or "<release>")
    namespace = str(annotations.get(HELM_NAMESPACE) or _meta(ds).get("namespace") or "<namespace>")
    return release, namespace


def fix(group: NodeGroup, plan: GroupPlan, foreign: Foreign, ds: Mapping[str, Any], severity: Severity) -> str:
    """The handover for one group, as commands (for a warning: how to hand it over too, if wanted); ``plan``:
    what the stack decided for the group."""
    lead = "hand the nodes over" if severity is Severity.ERROR else "both can stay; to hand it over too"
    if foreign.owner is Owner.OPERATOR:
        key = deploy_label(foreign.role)
        if foreign.role is Role.DRIVER and severity is Severity.WARNING:  # the driver stays the operator's
            if group.gpu.driver.source is driverspec.DriverSource.GPU_OPERATOR:
                return f"let the group's NVIDIADriver drive it: {use_driver_crd_command()}"
            return f"see {GUIDE}#from-the-gpu-operator"
        if foreign.role is Role.TOOLKIT and severity is Severity.WARNING:  # the toolkit stays the operator's
            envvar = str(plan.accept_envvar).lower()
            return (f"give it the settings node setup gives a toolkit of the node's own: add "
                    f"{TOOLKIT_ENVVAR_ENV}={envvar} and {TOOLKIT_VOLUME_MOUNTS_ENV}=true to the ClusterPolicy's "
                    "spec.toolkit.env")
        text = f"{lead}: {label_command(group, key)}"
        if group.node_group is not None:
            text += f" and, for nodes that join later, {node_template_command(group.node_group, key)}"
        if foreign.role in POLICY_KEYS:
            text += f" (or cluster-wide: {policy_command(foreign.role)})"
        return text
    if foreign.owner is Owner.DECKHOUSE:
        # The device plugin and GFD are rendered per NodeGroup with spec.gpu; the MIG manager, the MPS daemon
        # and the exporter are cluster-wide and go only with Deckhouse's GPU support itself.
        where = (f"remove spec.gpu from NodeGroup {group.node_group} if it is set "
                 f"({remove_gpu_command(group.node_group)})" if group.node_group is not None
                 else "remove spec.gpu from the Deckhouse NodeGroup of these nodes")
        return (f"{where}; Deckhouse's cluster-wide GPU agents leave once no NodeGroup needs its GPU support: "
                f"{module_off_command()}")
    release, namespace = _helm_release(ds)
    if foreign.owner is Owner.DRA_CHART:
        return (f"keep its kubelet plugin off the group's nodes (Helm value kubeletPlugin.affinity: add "
                f"{{key: {deploy_label(Role.DRA_PLUGIN)}, operator: NotIn, values: ['false']}} to each term, then "
                f"{label_command(group, deploy_label(Role.DRA_PLUGIN))}), or turn its GPU plugin off: "
                f"{helm_command(release, namespace, '--set resources.gpus.enabled=false')}")
    # The chart places its plugin, GFD and MPS daemon by one ``affinity`` value: one key excludes them all.
    key = deploy_label(Role.DEVICE_PLUGIN if foreign.owner is Owner.CHART else foreign.role)
    return (f"{lead}: keep it off the group's nodes: add {{key: {key}, operator: NotIn, values: ['false']}} to "
            f"each term of its affinity ({helm_command(release, namespace, '-f affinity.yaml')}), then "
            f"{label_command(group, key)}")


# --- the check --------------------------------------------------------------------------------------------

def _shown(names: Sequence[str]) -> str:
    head = ", ".join(names[:SHOWN_NODES])
    return head if len(names) <= SHOWN_NODES else f"{head} and {len(names) - SHOWN_NODES} more"


def _pod_nodes(cluster: ClusterReader, ds: Mapping[str, Any]) -> set[str]:
    """The nodes the DaemonSet's pods are bound to (not those already going away)."""
    selector = _map(_map(ds.get("spec")).get("selector"))
    match = _map(selector.get("matchLabels"))
    if not match or selector.get("matchExpressions"):
        return set()
    text = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    pods = cluster.list("v1", "Pod", str(_meta(ds).get("namespace") or "") or None, label_selector=text)
    return {str(_map(p.get("spec")).get("nodeName")) for p in pods
            if _map(p.get("spec")).get("nodeName") and not _meta(p).get("deletionTimestamp")
            and _map(p.get("status")).get("phase") not in ("Succeeded", "Failed")}


def _daemonset_findings(config: StackConfig, cluster: ClusterReader, members: Mapping[str, list[dict[str, Any]]],
                        operator: bool) -> list[Finding]:
    out: list[Finding] = []
    plans = [(g, GroupPlan.of(config.cluster, g)) for g in config.node_groups]
    for ds in cluster.list("apps/v1", "DaemonSet"):
        foreign = classify(ds)
        if foreign is None or _driven_by_us(config, ds):
            continue
        spec = _pod_spec(ds)
        pods: set[str] | None = None
        for group, plan in plans:
            nodes = members.get(group.name, [])
            found = verdict(config.cluster.monitoring, group, plan, foreign) if nodes else None
            if found is None:
                continue
            if pods is None:
                pods = _pod_nodes(cluster, ds)
            hit: list[str] = []
            for node in nodes:
                name = str(_meta(node).get("name") or "")
                expected = expected_labels(group, plan, node, operator=operator and foreign.owner is Owner.OPERATOR)
                if name in pods or (selects(spec, expected, name) and admits(spec, _taints(group, node))):
                    hit.append(name)
            if not hit:
                continue
            hit.sort()
            handover = fix(group, plan, foreign, ds, found.severity)
            out.append(Finding(found.severity, foreign.subject, (
                f"the {foreign.owner.value}'s {foreign.role.value} runs (or would run) on {len(hit)} node(s) of "
                f"node group {group.name!r} ({_shown(hit)}): {found.why}; {handover}")))
    return out


def _driven_by_us(config: StackConfig, ds: Mapping[str, Any]) -> bool:
    """A driver DaemonSet the operator runs for one of this stack's NVIDIADriver objects (gpuOperator)."""
    ours = {nvidia_driver(config.cluster.namespace, config.cluster, g)["metadata"]["name"] for g in config.node_groups
            if g.gpu.driver.source is driverspec.DriverSource.GPU_OPERATOR}
    return any(_map(r).get("kind") == "NVIDIADriver" and _map(r).get("name") in ours
               for r in _list(_meta(ds).get("ownerReferences")))


def _policy_findings(config: StackConfig, policies: list[dict[str, Any]],
                     members: Mapping[str, list[dict[str, Any]]]) -> list[Finding]:
    """What the ClusterPolicy says for groups the node reads cannot answer: those without nodes yet, and
    those whose driver the operator installs from the stack's NVIDIADriver objects."""
    out: list[Finding] = []
    gpu_operator_groups = [g.name for g in config.node_groups
                           if g.gpu.driver.source is driverspec.DriverSource.GPU_OPERATOR]
    if not policies:
        if gpu_operator_groups:
            out.append(Finding(Severity.WARNING, f"{CLUSTER_POLICY}/*", (
                f"node group(s) {', '.join(map(repr, gpu_operator_groups))} declare driver.source gpuOperator but the "
                "cluster has no GPU Operator (no ClusterPolicy): nothing would install their driver from the "
                "stack's NVIDIADriver objects")))
        return out
    policy = policies[0]
    name = str(_meta(policy).get("name") or "cluster-policy")
    spec = _map(policy.get("spec"))
    if gpu_operator_groups and _map(spec.get("driver")).get("useNvidiaDriverCRD") is not True:
        out.append(Finding(Severity.ERROR, f"{CLUSTER_POLICY}/{name}", (
            f"node group(s) {', '.join(map(repr, gpu_operator_groups))} declare driver.source gpuOperator, which "
            f"the operator serves only with spec.driver.useNvidiaDriverCRD: true: {use_driver_crd_command(name)}")))
    enabled = [r for r in (Role.DEVICE_PLUGIN, Role.GFD, Role.MIG_MANAGER)
               if _map(spec.get(POLICY_KEYS[r])).get("enabled", True) is not False]
    for group in config.node_groups:
        if members.get(group.name) or not enabled:
            continue
        keys = ", ".join(f"{deploy_label(r)}=false" for r in enabled)
        where = (f"put {keys} in NodeGroup {group.node_group}'s spec.nodeTemplate.labels" if group.node_group
                 else "label each node as it joins")
        out.append(Finding(Severity.WARNING, f"{CLUSTER_POLICY}/{name}", (
            f"node group {group.name!r} has no nodes yet, and the GPU Operator starts its "
            f"{', '.join(r.value for r in enabled)} on every GPU node that joins unless it is labelled: {where} "
            f"({GUIDE}#from-the-gpu-operator)")))
    return out


def _deckhouse_findings(config: StackConfig, cluster: ClusterReader) -> list[Finding]:
    out: list[Finding] = []
    module = cluster.get(MODULE_CONFIG_API, "ModuleConfig", GPU_MODULE)
    module_on = module is not None and _map(module.get("spec")).get("enabled") is True
    deckhouse_groups = [g for g in config.node_groups if g.node_group is not None]
    with_gpu: list[str] = []
    for group in deckhouse_groups:
        assert group.node_group is not None
        ng = cluster.get(NODE_GROUP_API, "NodeGroup", group.node_group)
        gpu = _map(_map(ng.get("spec")).get("gpu")) if ng is not None else {}
        if not gpu:
            continue
        with_gpu.append(group.node_group)
        who = "the gpu module (ModuleConfig gpu is enabled)" if module_on else "node-manager's in-core GPU support"
        out.append(Finding(Severity.ERROR, f"NodeGroup/{group.node_group}", (
            f"spec.gpu is set (sharing {gpu.get('sharing', '?')}), so {who} runs its own device plugin, GFD and "
            f"MIG manager on the nodes of node group {group.name!r} and labels them "
            "node.deckhouse.io/device-gpu.config and nvidia.com/mig.config, the keys the stack's node template sets: "
            f"{remove_gpu_command(group.node_group)} (the stack's gpu.sharing replaces it; "
            f"{GUIDE}#from-deckhouses-gpu-support)")))
    if module_on and not with_gpu:
        settings = _map(_map(module.get("spec") if module else {}).get("settings"))
        dra = _map(settings.get("dra")).get("enabled") is True
        out.append(Finding(Severity.WARNING, f"ModuleConfig/{GPU_MODULE}", (
            "Deckhouse's gpu module is enabled" + (" in DRA mode" if dra else "") + ": it serves NodeGroups with "
            "spec.gpu, so never set spec.gpu on the stack's NodeGroups (its agents on the stack's nodes, if any, "
            f"are reported by DaemonSet); once no NodeGroup needs it: {module_off_command()}")))
    return out


def _device_class_findings(config: StackConfig, cluster: ClusterReader) -> list[Finding]:
    """NVIDIA's DRA driver's DeviceClasses, where this stack would create its own under the same names."""
    if not config.uses_dra or not config.cluster.dra.create_device_classes:
        return []
    out: list[Finding] = []
    for spec in DEVICE_CLASSES:
        live = cluster.get(RESOURCE_API, "DeviceClass", spec.name)
        if live is None:
            continue
        meta = _meta(live)
        chart = str(_map(meta.get("labels")).get("helm.sh/chart") or "")
        if _map(meta.get("labels")).get("app.kubernetes.io/part-of") == PART_OF or "dra-driver" not in chart:
            continue  # a stack's (the shared-definition check's), or nobody we can name
        release, namespace = _helm_release(live)
        out.append(Finding(Severity.ERROR, f"DeviceClass/{spec.name}", (
            f"NVIDIA's DRA driver (Helm chart {chart}, release {release}) defines it and the stack would take it "
            f"over: move the GPUs to the stack first ({GUIDE}#from-nvidias-device-plugin-chart), then "
            f"{helm_command(release, namespace, '--set resources.gpus.enabled=false')}, or keep its classes "
            "with cluster.dra.createDeviceClasses: false")))
    return out


def group_members(config: StackConfig, nodes: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each group's Nodes, by the group's own selector."""
    members: dict[str, list[dict[str, Any]]] = {g.name: [] for g in config.node_groups}
    for node in nodes:
        for group in config.node_groups:
            if group_selects(group, node):
                members[group.name].append(node)
    return members


def findings(config: StackConfig, cluster: ClusterReader) -> list[Finding]:
    """Another GPU installation's agents on the stack's nodes, and its settings that would collide."""
    members = group_members(config, cluster.list("v1", "Node"))
    policies = cluster.list(CLUSTER_POLICY_API, CLUSTER_POLICY)
    out = _daemonset_findings(config, cluster, members, operator=bool(policies))
    out += _policy_findings(config, policies, members)
    out += _deckhouse_findings(config, cluster)
    out += _device_class_findings(config, cluster)
    return out
