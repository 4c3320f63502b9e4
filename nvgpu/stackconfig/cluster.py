"""``cluster``: the settings every node group shares (Kubernetes version, namespace, the agent image,
driver root and CDI hook defaults, the MIG manager, the RuntimeClass, CI's preview identity).

What a group ends up with where its own settings and the cluster's meet (its driver root, its CDI hook)
is decided in :mod:`nvgpu.stackconfig.resolved`; ``Cluster``'s methods of those names delegate there.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    field_validator,
    model_validator,
)

from nvgpu.errortext import shown
from nvgpu.k8snames import check_dns_subdomain, dns_subdomain_problem
from nvgpu.nodescripts import facts
from nvgpu.stackconfig import resolved
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
from nvgpu.stackconfig.dra import DraSettings
from nvgpu.stackconfig.modes import AllocationMode, NodeSetupBackend
from nvgpu.stackconfig.monitoring import Monitoring

if TYPE_CHECKING:
    from nvgpu.stackconfig.nodegroup import NodeGroup

#: kubernetes-validate ships schemas for these minors; DRA's resource.k8s.io/v1 needs 1.34.
MIN_KUBERNETES_MINOR = 29
MAX_KUBERNETES_MINOR = 37
DRA_GA_MINOR = 34


class AgentImage(ConfigModel):
    """The node-agent image; pinned by tag and/or digest (``latest`` is refused)."""

    #: The agent image's repository, without tag or digest.
    repository: Repository
    #: The image tag (``latest`` is refused); set ``tag`` and/or ``digest``.
    tag: Tag | None = None
    #: ``sha256:`` and 64 hex digits; the image is pulled by digest when set (the tag then only says which release
    #: it is).
    digest: Digest | None = None
    #: The agent containers' ``imagePullPolicy``.
    pull_policy: PullPolicy = "IfNotPresent"

    @model_validator(mode="after")
    def _pinned(self) -> AgentImage:
        if self.tag is None and self.digest is None:
            raise FieldProblems([(("tag",), "set tag or digest: an unpinned image is not allowed")])
        if self.tag == "latest":
            raise FieldProblems([(("tag",), "'latest' is not allowed: pin a version or a digest")])
        if self.repository.rsplit("/", 1)[-1].count(":"):
            raise FieldProblems([(("repository",), f"{self.repository!r} carries a tag: put it in 'tag'")])
        return self

    @property
    def ref(self) -> str:
        return image_ref(self.repository, self.tag, self.digest)



#: One image reference as ``docker pull`` takes it: ``repository[:tag][@sha256:digest]`` (a colon before
#: the last slash is a registry port's, so it stays in the repository).
_IMAGE_REF = re.compile(r"(?P<repository>[^@]+?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]*))?(?:@(?P<digest>sha256:.*))?",
                        re.DOTALL)


def image_parts(text: str) -> dict[str, str] | None:
    """``text`` split into :class:`AgentImage`'s ``repository``, ``tag`` and ``digest`` (those present), or None
    when it is no reference at all; the parts are judged by the model."""
    m = _IMAGE_REF.fullmatch(text)
    return None if m is None else {k: v for k, v in m.groupdict().items() if v is not None}


def _image_text(v: Any) -> Any:
    """``agentImage`` written as one reference, split into the mapping; anything else is left for the model."""
    return (image_parts(v) or v) if isinstance(v, str) else v


_SYSTEMD_UNIT = re.compile(r"[A-Za-z0-9:_.@-]{1,240}\.(service|socket|target|scope)")


def _systemd_unit(v: str) -> str:
    """A systemd unit name with its type, as ``systemctl stop`` takes it (``nvidia-dcgm.service``)."""
    if not _SYSTEMD_UNIT.fullmatch(v):
        raise ValueError(f"{shown(v)} is not a systemd unit name: letters, digits and :_.@- then .service, .socket, "
                         ".target or .scope, e.g. nvidia-dcgm.service")
    return v


def _network(v: str) -> str:
    """An IPv4 or IPv6 network in CIDR notation, as a NetworkPolicy's ``ipBlock.cidr`` takes it."""
    try:
        return str(ipaddress.ip_network(v, strict=True))
    except ValueError as e:
        raise ValueError(f"not a network in CIDR notation ({e}); e.g. 10.0.0.0/24 or fd00::/64") from None


class MigManagerSettings(ConfigModel):
    """The stack-wide MIG manager (one DaemonSet for every MIG-capable group, so the settings are cluster-wide)."""

    #: Reboot the node when a MIG mode change needs a GPU reset that fails (the manager's ``--allow-reboot``);
    #: off, such a change is rolled back and reported as failed.
    allow_reboot: Bool = False
    #: Host systemd units that hold the GPUs, stopped around the GPU reset of a MIG mode change and started
    #: again after it (the manager's ``--host-gpu-client``). Unset: NVIDIA's list, ``nvsm.service`` and
    #: ``nvidia-dcgm.service`` (mig-parted ``deployments/systemd/hooks.sh``); units a node lacks are skipped.
    host_gpu_clients: Annotated[tuple[Annotated[str, AfterValidator(_systemd_unit)], ...] | None,
                                Field(min_length=1, max_length=32)] = None
    #: Who may reach the eviction guard's webhook port (its NetworkPolicy, where the network plugin enforces
    #: one): the API servers' source addresses as networks, e.g. the control-plane nodes' addresses or a
    #: managed control plane's range. Empty (the default): any source, as the guard cannot know them; its
    #: other ports are closed either way.
    eviction_guard_sources: Annotated[tuple[Annotated[str, AfterValidator(_network)], ...], Field(max_length=64)] = ()



class RuntimeClassSettings(ConfigModel):
    """The ``node.k8s.io/v1`` RuntimeClass for the nvidia runtime the node setup registers (pods written from
    NVIDIA's docs ask for ``runtimeClassName: nvidia``)."""

    #: Off when the cluster already has one under that name (NVIDIA's GPU Operator, another stack).
    create: Bool = True
    #: Its name; the handler is always ``nvidia``.
    name: Annotated[str, AfterValidator(check_dns_subdomain)] = "nvidia"


#: ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), which keeps the preview identity to dry-runs: GA.
PREVIEW_IDENTITY_MIN_MINOR = 30
#: A user or group name as it goes into the admission policy's CEL string literal (no quote, no backslash).
_USER_NAME = re.compile(r"[^\x00-\x1f\x7f'\\]{1,253}")


class PreviewIdentity(ConfigModel):
    """Who runs ``pulumi preview`` in CI: the stack grants it what a server-side dry-run of every object the
    stack applies needs (RBAC authorizes a dry-run create or patch like the write itself) and a
    ValidatingAdmissionPolicy refuses it every request that is not a dry-run, so it validates but never writes
    (``nvidia_gpu.components.manifests.previewaccess``)."""

    #: What the identity is: a user or a group as the authenticator reports it, or a ServiceAccount.
    kind: Literal["User", "Group", "ServiceAccount"]
    #: The user or group name as the cluster's authenticator reports it, or the ServiceAccount's name.
    name: str
    #: The ServiceAccount's namespace (ServiceAccounts only).
    namespace: DnsLabel | None = None

    @model_validator(mode="after")
    def _shape(self) -> PreviewIdentity:
        problems: list[tuple[Loc, str]] = []
        if self.kind == "ServiceAccount":
            if dns_subdomain_problem(self.name):
                problems.append((("name",), f"{shown(self.name)} is not a ServiceAccount name: a DNS subdomain "
                                            "(lowercase letters, digits, '-' and '.')"))
            if self.namespace is None:
                problems.append((("namespace",), "required for a ServiceAccount: the namespace it lives in"))
        else:
            if not _USER_NAME.fullmatch(self.name):
                problems.append((("name",), f"{shown(self.name)} is not a {self.kind.lower()} name: 1 to 253 "
                                            "characters, no quote, backslash or control character"))
            if self.namespace is not None:
                problems.append((("namespace",), f"only a ServiceAccount has a namespace, not a {self.kind}"))
        raise_all(problems)
        return self

    @property
    def username(self) -> str | None:
        """What the API server reports as ``userInfo.username`` (None for a group)."""
        if self.kind == "ServiceAccount":
            return f"system:serviceaccount:{self.namespace}:{self.name}"
        return self.name if self.kind == "User" else None

    def subject(self) -> dict[str, str]:
        """The RBAC binding's subject."""
        if self.kind == "ServiceAccount":
            return {"kind": "ServiceAccount", "name": self.name, "namespace": str(self.namespace)}
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": self.kind, "name": self.name}



class Cluster(ConfigModel):
    """The settings every node group shares: the ``nvidia-gpu:cluster`` stack-config object."""

    #: The cluster's Kubernetes version, ``major.minor`` as a quoted string (``"1.34"``): the manifests are
    #: validated against this version's schemas, and the features it has decide what is rendered.
    kubernetes_version: str
    #: The namespace of every agent object; it also prefixes the stack's cluster-scoped names.
    namespace: DnsLabel = "nvidia-gpu"
    #: How pods get GPUs, for the groups that do not choose: the device plugin (``nvidia.com/gpu`` resources) or
    #: DRA (ResourceClaims; Kubernetes 1.34 or later).
    allocation_mode: AllocationMode = AllocationMode.DEVICE_PLUGIN
    #: Who sets the GPU nodes up: Deckhouse's bashible (NodeGroupConfiguration scripts, the NodeGroups' node
    #: templates) or the stack's setup DaemonSet.
    node_setup: NodeSetupBackend = NodeSetupBackend.DAEMONSET
    #: A mapping, or one reference as ``docker pull`` takes it (``registry/agent:1.2.0`` or with ``@sha256:``).
    agent_image: Annotated[AgentImage, BeforeValidator(_image_text, json_schema_input_type=AgentImage | str)]
    #: GPU metrics, scrape objects, alerts and dashboards.
    monitoring: Monitoring = Monitoring()
    #: A PriorityClass's name is a DNS subdomain; the API server refuses the agents' pods otherwise.
    priority_class_name: Annotated[str, AfterValidator(check_dns_subdomain)] = "system-node-critical"
    #: The DRA driver's settings (groups with allocation mode ``dra``).
    dra: DraSettings = DraSettings()
    #: The MIG manager's settings.
    mig: MigManagerSettings = MigManagerSettings()
    #: The RuntimeClass for users' GPU pods.
    runtime_class: RuntimeClassSettings = RuntimeClassSettings()
    #: NVIDIA driver root on the nodes of groups with a pre-installed driver (NVIDIA's ``nvidiaDriverRoot``):
    #: ``/`` for a driver installed on the host, ``/run/nvidia/driver`` for a driver container run by someone
    #: else. Groups whose driver the stack deploys use ``/run/nvidia/driver`` (``driver_root_for``). Every
    #: agent pod mounts its group's root read-only at ``/driver-root`` and loads NVML from there.
    driver_root: str = "/"
    #: The NVIDIA Container Toolkit's hook program on the nodes (``nvidia-cdi-hook``, or ``nvidia-ctk`` of
    #: toolkits before 1.16), named in the CDI specs the device plugin and the DRA plugin write so that
    #: containers get the driver's soname links and linker cache; ``/usr/local/nvidia/toolkit/nvidia-cdi-hook``
    #: where NVIDIA's GPU Operator installed the toolkit. The plugins use it only where they see it.
    cdi_hook_path: str = facts.CDI_HOOK_PATH
    #: The kubeconfig context the stack's Kubernetes provider uses (default: the current context).
    kube_context: str | None = None
    #: The identity CI's ``pulumi preview`` runs as: the stack grants it server-side dry-runs of what it applies,
    #: and nothing else (docs/guides/ci.md).
    preview_identity: PreviewIdentity | None = None

    @field_validator("kubernetes_version", mode="before")
    @classmethod
    def _version_is_text(cls, v: Any) -> Any:
        """YAML reads an unquoted ``1.30`` as the number 1.3: say so instead of refusing a 'number'."""
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**6:
            raise ValueError("must be a quoted string like \"1.34\", not a number")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            text = repr(v)
            major, _, minor = text.partition(".")
            meant = f"{major}.{minor}0" if len(minor) == 1 and MIN_KUBERNETES_MINOR <= int(minor) * 10 <= \
                MAX_KUBERNETES_MINOR else text
            why = f" ({meant} becomes {text})" if meant != text else ""
            raise ValueError(f"must be a quoted string: YAML reads an unquoted version as a number{why}; "
                             f"write kubernetesVersion: \"{meant}\"")
        return v

    @field_validator("kube_context")
    @classmethod
    def _context(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty: leave kubeContext out to use the kubeconfig's current context")
        return v

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, v: str) -> str:
        m = re.fullmatch(r"v?1\.([0-9]{1,4})(\.[0-9]{1,6})?", v)
        if not m:
            raise ValueError("must look like '1.34' (major.minor, optionally .patch)")
        minor = int(m.group(1))
        if not MIN_KUBERNETES_MINOR <= minor <= MAX_KUBERNETES_MINOR:
            raise ValueError(
                f"Kubernetes 1.{minor} is not supported; "
                f"supported: 1.{MIN_KUBERNETES_MINOR} to 1.{MAX_KUBERNETES_MINOR}"
            )
        return f"1.{minor}"

    @model_validator(mode="after")
    def _preview_identity_needs_admission_policies(self) -> Cluster:
        if self.preview_identity is not None and self.kubernetes_minor < PREVIEW_IDENTITY_MIN_MINOR:
            raise FieldProblems([(("previewIdentity",), (
                f"needs Kubernetes 1.{PREVIEW_IDENTITY_MIN_MINOR} or later (ValidatingAdmissionPolicy keeps the "
                f"identity to dry-runs), but kubernetesVersion is {self.kubernetes_version}: leave it out and give "
                "previews a read-only identity (server-side validation then skipped)"))])
        return self

    @field_validator("driver_root")
    @classmethod
    def _driver_root(cls, v: str) -> str:
        return absolute_path(v, "e.g. / or /run/nvidia/driver")

    def driver_root_for(self, group: NodeGroup) -> str:
        """Where ``group``'s driver is on its nodes (:func:`nvgpu.stackconfig.resolved.driver_root`)."""
        return resolved.driver_root(self, group)

    def cdi_hook_for(self, group: NodeGroup) -> str:
        """The CDI hook ``group``'s CDI specs name (:func:`nvgpu.stackconfig.resolved.cdi_hook`)."""
        return resolved.cdi_hook(self, group)

    @field_validator("cdi_hook_path")
    @classmethod
    def _cdi_hook_path(cls, v: str) -> str:
        path = absolute_path(v, "e.g. /usr/bin/nvidia-cdi-hook")
        if path.rsplit("/", 1)[1] not in ("nvidia-cdi-hook", "nvidia-ctk"):
            raise ValueError(f"must name nvidia-cdi-hook or nvidia-ctk (got {v!r})")
        return path

    @property
    def kubernetes_minor(self) -> int:
        return int(self.kubernetes_version.split(".")[1])

