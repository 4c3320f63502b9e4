"""The typed stack config: everything under the ``nvidia-gpu:`` namespace of ``Pulumi.<stack>.yaml``.

Parsing is validation: an invalid config never exists in memory. Every model forbids unknown keys and
every error is reported as ``nvidia-gpu:<path>: <problem> (got <value>)`` naming what is allowed, so a
typo fails ``pulumi preview`` before any resource is registered.

Patterns validate with ``re.fullmatch`` (``re.match`` with ``$`` also accepts a trailing newline, so
``a100-mig\n`` was a second group beside ``a100-mig`` and the API server refused its objects halfway
through ``up``). Errors stay bounded whatever the input: a value is quoted cut
(:func:`nvgpu.errortext.shown`; a 5,000-digit integer cannot even be written by ``repr``), a key of a
path too, the message lists as many problems as fit in 2,000 characters. A stack file is read with
:func:`nvgpu.yamltext.load` (size, nesting, integers and aliases bounded).

A MIG group's layout is checked here by :func:`mig_layout_problems`, which the MigProfile manifests
(``mig_config``) run again on the config they render (a caller may hand over groups built past these
validators, and extra configs are only known there): both go through
:func:`nvgpu.migparted.fit_problems`, the one MIG layout check.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Hashable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from nvgpu import catalogue, dcgmcounters, devicelist, labels, yamltext
from nvgpu import driver as driverspec
from nvgpu import toolkit as toolkitspec
from nvgpu.devicelist import DeviceListStrategy
from nvgpu.errortext import capped, clip, index_part, listed, path_part, shown
from nvgpu.k8snames import check_dns_label, check_dns_subdomain, check_key, check_label_value, dns_subdomain_problem
from nvgpu.mig import balanced_layout
from nvgpu.migparted import (
    CustomGpuLayout,
    CustomSlice,
    MigConfigSpec,
    MigPartedConfig,
    MigPartedError,
    build_config,
    custom_config_name,
    custom_specs,
    fit_problems,
)
from nvgpu.nodescripts import facts

CONFIG_NAMESPACE = "nvidia-gpu"
#: The environment variable naming a file that holds the stack config as ``PULUMI_CONFIG`` would (a JSON
#: object of full keys to strings): how the offline preview hands a policy pack the config, since one
#: environment string may not pass 128 KiB on Linux (about 800 node groups).
CONFIG_FILE_ENV = "NVIDIA_GPU_STACK_CONFIG_FILE"
#: kubernetes-validate ships schemas for these minors; DRA's resource.k8s.io/v1 needs 1.34.
MIN_KUBERNETES_MINOR = 29
MAX_KUBERNETES_MINOR = 37
DRA_GA_MINOR = 34
#: MPS control daemons accept at most 48 clients per GPU on Volta and newer.
MPS_MAX_CLIENTS = 48

#: mig-parted's config names: ``all-<profile>`` with ``+`` spelled ``.``, including the RTX PRO 6000's
#: ``all-1g.24gb.me.all``, ``all-1g.24gb.gfx`` and ``all-1g.24gb-me`` (NVIDIA's config-default.yaml).
_PARTED_NAME = re.compile(r"all-(balanced|disabled|enabled|[0-9]g\.[0-9]+gb(\.me|\.me\.all|\.gfx|-me)?)|custom")
#: The largest integer a Kubernetes quantity or count holds (int64): a larger one renders, and the API
#: server refuses it.
_INT64_MAX = 2**63 - 1
#: Most requirements of one node selector: Kubernetes sets no limit, but a node group is selected by a
#: handful, and checking them for contradictions compares every pair.
MAX_SELECTOR_REQUIREMENTS = 100


#: A path below the model that raised the problem, in the config's own key names.
Loc = tuple[int | str, ...]
_K = TypeVar("_K", bound=Hashable)


class FieldProblems(ValueError):
    """Problems a model validator finds across fields, each at the path of the field to change.

    A validator of the whole model is reported by pydantic at the model's own location (the top-level
    one printed as the empty path ``nvidia-gpu:``); raising this instead puts each problem where the
    user has to look, relative to that model (:func:`_problems` joins the two).
    """

    def __init__(self, problems: list[tuple[Loc, str]]):
        self.problems = problems
        super().__init__("; ".join(message for _, message in problems))


def _raise_all(problems: list[tuple[Loc, str]]) -> None:
    if problems:
        raise FieldProblems(problems)


def _first_indices(items: list[_K]) -> dict[_K, int]:
    """Where each item first appears: duplicates found in one pass (``list.index`` per item was
    quadratic, minutes for a list of 50,000 entries)."""
    first: dict[_K, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item, i)
    return first


def _strict_bool(v: Any) -> Any:
    """A boolean, never its spelling: pydantic would read ``"false"``, ``"no"`` or ``0`` as False, but a
    quoted ``"false"`` in YAML is a string, and a reader that is not this program (a policy, kubectl,
    another Pulumi language) may take it as true."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        raise ValueError("must be a boolean, not a string: write true or false without quotes")
    raise ValueError("must be a boolean: true or false")


Bool = Annotated[bool, BeforeValidator(_strict_bool)]
DnsLabel = Annotated[str, AfterValidator(check_dns_label)]


def _group_name(v: str) -> str:
    check_dns_label(v)
    if len(v) > 32:
        raise ValueError(f"{v!r} is {len(v)} characters; at most 32: the objects named after a group "
                         "(DaemonSets, ConfigMaps, NodeGroupConfigurations) must stay within 63")
    return v


def _driver_name(v: str) -> str:
    problem = dns_subdomain_problem(v)
    if problem or "." not in v or len(v) > 63:
        raise ValueError("must be a DNS subdomain with at least one dot and at most 63 characters, like "
                         "gpu.example.com (lowercase letters, digits, '-' and '.')")
    return v


#: ``driverVersion`` as written in the config: the release alone, ASCII digits, nothing around it.
_DRIVER_RELEASE = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}(\.[0-9]{1,4})?")
_REPOSITORY = re.compile(r"[a-z0-9]+([._/:-][a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
#: A GPU model the catalogue lacks, named like the catalogue's keys (``B200-180GB``): it is written into a
#: label value (``nvidia-gpu.io/gpu-model``), so label-value characters, at most 63.
_UNLISTED_MODEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def _repository(v: str) -> str:
    if len(v) > 255 or not _REPOSITORY.fullmatch(v):
        raise ValueError("must be an image repository without tag or digest, like "
                         "registry.example.com/platform/nvidia-gpu-agent (lowercase, at most 255 characters)")
    return v


def _tag(v: str) -> str:
    if not _TAG.fullmatch(v):
        raise ValueError("must be an image tag: letters, digits, '_', '.' or '-', at most 128 characters, "
                         "not starting with '.' or '-'")
    return v


def _digest(v: str) -> str:
    if not _DIGEST.fullmatch(v):
        raise ValueError("must be an image digest: 'sha256:' and 64 lowercase hexadecimal digits")
    return v


class StackConfigError(ValueError):
    """Raised with every problem found, one per line, each naming its config path."""

    def __init__(self, problems: list[str]):
        self.problems = capped(problems, CONFIG_NAMESPACE)
        super().__init__(listed(self.problems, "invalid stack config:"))


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, use_enum_values=False
    )


class AllocationMode(StrEnum):
    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class NodeSetupBackend(StrEnum):
    DECKHOUSE = "deckhouse"
    DAEMONSET = "daemonset"


class Sharing(StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"
    MIG = "MIG"


class MigStrategy(StrEnum):
    MIXED = "mixed"
    SINGLE = "single"


class AgentImage(_Model):
    """The node-agent image; pinned by tag and/or digest (``latest`` is refused)."""

    repository: Annotated[str, AfterValidator(_repository)]
    tag: Annotated[str, AfterValidator(_tag)] | None = None
    digest: Annotated[str, AfterValidator(_digest)] | None = None
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"

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
        ref = self.repository
        if self.tag:
            ref += f":{self.tag}"
        if self.digest:
            ref += f"@{self.digest}"
        return ref


class MetricsExporter(StrEnum):
    """Who serves the GPUs' metrics under dcgm-exporter's names."""

    #: The agent image's exporter (NVML; no DCGM on the node; profiling fields not served).
    AGENT = "agent"
    #: NVIDIA's dcgm-exporter image, for DCGM's profiling fields (``cluster.monitoring.dcgm.image``).
    DCGM = "dcgm"
    #: No GPU metrics (the agents' own metrics are still scraped).
    NONE = "none"


class ScrapeMode(StrEnum):
    """How Prometheus finds the targets."""

    SERVICE_MONITOR = "serviceMonitor"
    POD_MONITOR = "podMonitor"
    #: ``prometheus.io/*`` pod annotations only: for scrapers without the Prometheus Operator.
    ANNOTATIONS = "annotations"


_DURATION = re.compile(r"([1-9][0-9]{0,6})(ms|s|m|h)")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def _scrape_interval(v: str) -> str:
    m = _DURATION.fullmatch(v)
    if not m:
        raise ValueError("must be a Prometheus duration like 30s or 1m (a whole number and ms, s, m or h)")
    seconds = int(m.group(1)) * _DURATION_SECONDS[m.group(2)]
    if not 1 <= seconds <= 600:
        raise ValueError("must be between 1s and 10m: GPU counters change within seconds, and a longer "
                         "interval leaves the alerts' rate() windows without samples")
    return v


class DcgmExporterImage(_Model):
    """NVIDIA's dcgm-exporter image, pinned by digest (an image with host access is never taken by tag alone)."""

    repository: Annotated[str, AfterValidator(_repository)] = "nvcr.io/nvidia/k8s/dcgm-exporter"
    #: The release, e.g. ``4.4.1-4.6.0-ubuntu22.04`` (informational: the digest decides).
    tag: Annotated[str, AfterValidator(_tag)] | None = None
    digest: Annotated[str, AfterValidator(_digest)]
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"

    @property
    def ref(self) -> str:
        return f"{self.repository}{':' + self.tag if self.tag else ''}@{self.digest}"


class DcgmExporterSettings(_Model):
    image: DcgmExporterImage | None = None


class Dashboards(_Model):
    """Grafana dashboards as ConfigMaps for Grafana's dashboard sidecar (NVIDIA's, unchanged, and ours)."""

    enabled: Bool = True
    #: The label Grafana's sidecar selects (its ``sidecar.dashboards.label`` and ``labelValue``).
    label: Annotated[str, AfterValidator(check_key)] = "grafana_dashboard"
    label_value: Annotated[str, AfterValidator(check_label_value)] = "1"
    #: Where the ConfigMaps go (default: the stack's namespace); the sidecar must watch it.
    namespace: DnsLabel | None = None


class Monitoring(_Model):
    """GPU metrics, scrape objects, alerts and dashboards."""

    #: Off: no exporter, scrape objects, alerts or dashboards at all.
    enabled: Bool = True
    exporter: MetricsExporter = MetricsExporter.AGENT
    #: ``annotations`` needs nothing in the cluster; the two monitors need the Prometheus Operator's CRDs.
    scrape: ScrapeMode = ScrapeMode.ANNOTATIONS
    interval: Annotated[str, AfterValidator(_scrape_interval)] = "30s"
    #: A PrometheusRule with the GPU alerts (README, "Alerts"); default: on wherever the scrape is by the
    #: Prometheus Operator, which is what loads it.
    alerts: Bool | None = None
    #: Labels the cluster's Prometheus selects monitors and rules by (kube-prometheus-stack's
    #: ``release: <name>``, say). On Deckhouse its own (``prometheus: main``) are added.
    labels: dict[Annotated[str, AfterValidator(check_key)], Annotated[str, AfterValidator(check_label_value)]] = {}
    #: The fields to serve, in dcgm-exporter's counters format (default: NVIDIA's default file); one
    #: ConfigMap feeds whichever exporter runs.
    counters: str | None = None
    dcgm: DcgmExporterSettings = DcgmExporterSettings()
    dashboards: Dashboards = Dashboards()
    #: What an agent does when another process holds its status port (``/metrics`` and its probes): by
    #: default the device plugin, DRA plugin, MIG manager and node setup's monitor log it, keep doing
    #: their job (the kubelet keeps its GPUs) and bind the port once it is free, their pods NotReady
    #: meanwhile; ``true`` makes them exit instead, so the conflict shows as restarts. The exporter
    #: always needs its port.
    require_status_port: Bool = False

    @field_validator("counters")
    @classmethod
    def _counters(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                dcgmcounters.read(v, "counters")
            except dcgmcounters.CountersError as e:
                raise ValueError(str(e)) from None
        return v

    @model_validator(mode="after")
    def _cross(self) -> Monitoring:
        problems: list[tuple[Loc, str]] = []
        if self.exporter is MetricsExporter.DCGM and self.dcgm.image is None:
            problems.append((("dcgm", "image"), "required with exporter 'dcgm': NVIDIA's dcgm-exporter image, "
                                                "pinned by digest (repository, tag, digest)"))
        if self.dcgm.image is not None and self.exporter is not MetricsExporter.DCGM:
            problems.append((("dcgm", "image"), f"set, but exporter is {self.exporter.value!r}: the image would "
                                                "not run (set exporter: dcgm, or remove it)"))
        if self.alerts and self.scrape is ScrapeMode.ANNOTATIONS:
            problems.append((("alerts",), "true needs the Prometheus Operator, which loads the PrometheusRule, but "
                                          "scrape is 'annotations' (a cluster without it): set scrape to "
                                          "serviceMonitor or podMonitor, or alerts: false"))
        if self.labels and self.scrape is ScrapeMode.ANNOTATIONS:
            problems.append((("labels",), "set, but scrape is 'annotations': these labels select monitors and "
                                          "rules of the Prometheus Operator, and none is created"))
        _raise_all(problems)
        return self

    @property
    def operator(self) -> bool:
        """Scraped by the Prometheus Operator (monitors, and a PrometheusRule unless alerts is false)."""
        return self.enabled and self.scrape is not ScrapeMode.ANNOTATIONS

    @property
    def rules(self) -> bool:
        return self.operator and self.alerts is not False

    @property
    def counters_text(self) -> str:
        return self.counters if self.counters is not None else dcgmcounters.default_text()


def _folded(name: str) -> str:
    return re.sub(r"[-_. ]", "", name).lower()


def _catalogue_spelling(name: str) -> str | None:
    """The catalogue key ``name`` spells with other case or separators (``h100_80gb``), or None."""
    return next((k for k in catalogue.MODEL_KEYS if _folded(k) == _folded(name)), None)


def _did_you_mean(word: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    if not close:
        folded = {c.lower(): c for c in choices}
        close = [folded[word.lower()]] if word.lower() in folded else []
    return f" (did you mean {close[0]!r}?)" if close else ""


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


class MigManagerSettings(_Model):
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


#: NVIDIA's DRA driver name: the one the DeviceClasses of a cluster running NVIDIA's driver select.
DRA_DEFAULT_DRIVER = "gpu.nvidia.com"
#: DeviceClasses the DRA stack publishes (NVIDIA's names, so claims written for its driver keep working).
DRA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
#: DRADeviceTaints is beta (on by default) from this minor; before it, device taints are dropped.
DRA_DEVICE_TAINTS_MINOR = 36


class ClaimQuota(_Model):
    """A ResourceQuota on DRA claims in one namespace (``count/resourceclaims.resource.k8s.io`` and
    ``<class>.deviceclass.resource.k8s.io/devices``)."""

    namespace: DnsLabel
    #: Most ResourceClaims the namespace may hold.
    claims: Annotated[int | None, Field(ge=0, le=_INT64_MAX)] = None
    #: Most devices the namespace may request per DeviceClass, e.g. ``{gpu.nvidia.com: 4}``.
    devices: dict[str, Annotated[int, Field(ge=0, le=_INT64_MAX)]] = {}

    @model_validator(mode="after")
    def _some_limit(self) -> ClaimQuota:
        if self.claims is None and not self.devices:
            raise FieldProblems([((), "set claims and/or devices: a quota without limits would do nothing")])
        unknown = sorted(set(self.devices) - set(DRA_DEVICE_CLASSES))
        _raise_all([(("devices", name), f"unknown DeviceClass {shown(name)}; allowed: "
                                        f"{', '.join(DRA_DEVICE_CLASSES)}") for name in unknown])
        return self


class DraSettings(_Model):
    #: ResourceSlice driver (DNS subdomain, at most 63 characters); NVIDIA's name by default.
    driver_name: Annotated[str, AfterValidator(_driver_name)] = "gpu.nvidia.com"
    #: Unhealthy GPUs are withdrawn from the ResourceSlices, or published with a device taint (1.36+).
    health_action: Literal["withdraw", "taint"] = "withdraw"
    claim_quotas: list[ClaimQuota] = []
    #: Off when the cluster already has the DeviceClasses (NVIDIA's DRA driver installed them): they have
    #: fixed names, and the provider would take the existing ones over (and ``destroy`` delete them).
    create_device_classes: Bool = True

    @field_validator("claim_quotas")
    @classmethod
    def _unique_namespaces(cls, v: list[ClaimQuota]) -> list[ClaimQuota]:
        first = _first_indices([q.namespace for q in v])
        _raise_all([((i, "namespace"), f"one quota per namespace: {q.namespace!r} has one already "
                                       f"(claimQuotas[{first[q.namespace]}])")
                    for i, q in enumerate(v) if first[q.namespace] != i])
        return v

    @model_validator(mode="after")
    def _classes_select_the_driver(self) -> DraSettings:
        if not self.create_device_classes and self.driver_name != DRA_DEFAULT_DRIVER:
            raise FieldProblems([(("driverName",), (
                f"{self.driver_name!r} with createDeviceClasses false: the cluster's existing DeviceClasses "
                f"({', '.join(DRA_DEVICE_CLASSES)}) select devices of driver {DRA_DEFAULT_DRIVER!r}, so no claim "
                "would ever get one of this driver's GPUs; keep the driver name or let the stack create the classes"))])
        return self


class RuntimeClassSettings(_Model):
    """The ``node.k8s.io/v1`` RuntimeClass for the nvidia runtime the node setup registers (pods written from
    NVIDIA's docs ask for ``runtimeClassName: nvidia``)."""

    #: Off when the cluster already has one under that name (NVIDIA's GPU Operator, another stack).
    create: Bool = True
    name: Annotated[str, AfterValidator(check_dns_subdomain)] = "nvidia"


#: ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), which keeps the preview identity to dry-runs: GA.
PREVIEW_IDENTITY_MIN_MINOR = 30
#: A user or group name as it goes into the admission policy's CEL string literal (no quote, no backslash).
_USER_NAME = re.compile(r"[^\x00-\x1f\x7f'\\]{1,253}")


class PreviewIdentity(_Model):
    """Who runs ``pulumi preview`` in CI: the stack grants it what a server-side dry-run of every object the
    stack applies needs (RBAC authorizes a dry-run create or patch like the write itself) and a
    ValidatingAdmissionPolicy refuses it every request that is not a dry-run, so it validates but never writes
    (``nvidia_gpu.components.manifests.previewaccess``)."""

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
        _raise_all(problems)
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


def _absolute(v: str, example: str) -> str:
    parts = v.split("/")
    if not v.startswith("/") or ".." in parts or any(c in v for c in "\0\n"):
        raise ValueError(f"must be an absolute path without '..', {example}")
    return "/" + "/".join(p for p in parts if p not in ("", "."))


class Cluster(_Model):
    kubernetes_version: str
    namespace: DnsLabel = "nvidia-gpu"
    allocation_mode: AllocationMode = AllocationMode.DEVICE_PLUGIN
    node_setup: NodeSetupBackend = NodeSetupBackend.DAEMONSET
    #: A mapping, or one reference as ``docker pull`` takes it (``registry/agent:1.2.0`` or with ``@sha256:``).
    agent_image: Annotated[AgentImage, BeforeValidator(_image_text)]
    monitoring: Monitoring = Monitoring()
    #: A PriorityClass's name is a DNS subdomain; the API server refuses the agents' pods otherwise.
    priority_class_name: Annotated[str, AfterValidator(check_dns_subdomain)] = "system-node-critical"
    dra: DraSettings = DraSettings()
    mig: MigManagerSettings = MigManagerSettings()
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
    #: and nothing else (README, "CI for your clusters").
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
        return _absolute(v, "e.g. / or /run/nvidia/driver")

    def driver_root_for(self, group: NodeGroup) -> str:
        """Where ``group``'s driver is on its nodes: under ``/run/nvidia/driver`` where a driver container
        (the stack's or NVIDIA's operator's) installs it, else ``driverRoot``."""
        if group.gpu.driver.source is not driverspec.DriverSource.PREINSTALLED:
            return driverspec.CONTAINER_DRIVER_ROOT
        return self.driver_root

    def cdi_hook_for(self, group: NodeGroup) -> str:
        """The ``nvidia-cdi-hook`` the CDI specs of ``group``'s nodes name: the one NVIDIA's toolkit container
        installed, or ``cdiHookPath`` where the node has its own toolkit."""
        if group.toolkit.container:
            return toolkitspec.cdi_hook(group.toolkit.install_dir)
        return self.cdi_hook_path

    @field_validator("cdi_hook_path")
    @classmethod
    def _cdi_hook_path(cls, v: str) -> str:
        path = _absolute(v, "e.g. /usr/bin/nvidia-cdi-hook")
        if path.rsplit("/", 1)[1] not in ("nvidia-cdi-hook", "nvidia-ctk"):
            raise ValueError(f"must name nvidia-cdi-hook or nvidia-ctk (got {v!r})")
        return path

    @property
    def kubernetes_minor(self) -> int:
        return int(self.kubernetes_version.split(".")[1])


LabelKey = Annotated[str, AfterValidator(check_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]


class LabelSelectorRequirement(_Model):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = []

    @model_validator(mode="after")
    def _values(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class NodeSelector(_Model):
    match_labels: dict[LabelKey, LabelValue] = {}
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=MAX_SELECTOR_REQUIREMENTS)] = []

    @model_validator(mode="after")
    def _non_empty(self) -> NodeSelector:
        if not self.match_labels and not self.match_expressions:
            raise ValueError("an empty selector would match every node; set matchLabels or matchExpressions")
        _raise_all(self._never_matching())
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


class Taint(_Model):
    key: LabelKey
    value: LabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class TimeSlicing(_Model):
    partition_count: Annotated[int, Field(ge=2, le=100)] = 4


class Mps(_Model):
    partition_count: Annotated[int, Field(ge=2, le=MPS_MAX_CLIENTS)] = 4


class MigSlice(_Model):
    profile: str
    count: Annotated[int, Field(ge=1, le=7)] = 1


class MigCustomConfig(_Model):
    index: Annotated[int, Field(ge=0, le=15)]
    slices: Annotated[list[MigSlice], Field(min_length=1)]


class Mig(_Model):
    parted_config: str = "all-1g.10gb"
    strategy: MigStrategy = MigStrategy.MIXED
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
        first = _first_indices([c.index for c in self.custom_configs])
        _raise_all([(("customConfigs", i, "index"), f"GPU {c.index} has a layout already "
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


def _driver_version(v: str) -> str:
    driverspec.parse_version(v)
    return v


def _kernel_release(v: str) -> str:
    if len(v) > 64 or not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9._+-]*", v):
        raise ValueError(f"{shown(v)} is not a kernel release as `uname -r` prints it, like 5.15.0-105-generic")
    return v


class DriverImage(_Model):
    """NVIDIA's driver image: ``<repository>/<name>:<version>-<os>``, pinned by digest per tag where given."""

    repository: Annotated[str, AfterValidator(_repository)] = driverspec.DEFAULT_REPOSITORY
    name: DnsLabel = driverspec.DEFAULT_IMAGE
    #: Image tag (``550.90.07-ubuntu22.04``) to its digest; a tag listed here is pulled by digest.
    digests: dict[Annotated[str, AfterValidator(_tag)], Annotated[str, AfterValidator(_digest)]] = {}
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"


class DriverUpgrade(_Model):
    """How a version change rolls through the group's nodes (the driver container and gpuOperator sources)."""

    #: Nodes whose driver is replaced at once.
    max_unavailable: Annotated[int, Field(ge=1, le=100)] = 1
    #: Evict the node's pods first (cordon-and-drain, or Deckhouse's disruption approval); without it only
    #: the pods holding GPUs are evicted.
    drain: Bool = True
    drain_timeout_seconds: Annotated[int, Field(ge=30, le=86400)] = 1800
    #: How long the old driver has to stop and the new one to load and pass ``check`` before the node counts
    #: as failed: at least what NVIDIA's startup probe allows a compiling driver (``nvgpu.driver``).
    validation_timeout_seconds: Annotated[int, Field(ge=driverspec.STARTUP_ALLOWANCE_S, le=7200)] = 1800
    #: Evict pods no controller owns too (``kubectl drain --force``): they are not recreated anywhere.
    force: Bool = False
    #: Evict pods with ``emptyDir`` volumes too (``kubectl drain --delete-emptydir-data``): their data is lost.
    delete_empty_dir: Bool = False


class Driver(_Model):
    """The group's NVIDIA driver: who installs it, which one, and how it is upgraded (see ``nvgpu.driver``)."""

    source: driverspec.DriverSource = driverspec.DriverSource.PREINSTALLED
    driver_type: driverspec.DriverType = Field(driverspec.DriverType.GPU, alias="type")
    #: A release (``550.90.07``) or a branch (``550``; precompiled drivers are chosen by branch).
    version: Annotated[str, AfterValidator(_driver_version)] | None = None
    precompiled: Bool = False
    kernel_modules: driverspec.KernelModules = driverspec.KernelModules.AUTO
    #: ``container``: the OS releases of the group's nodes, one driver DaemonSet each (``ubuntu22.04``).
    os_releases: list[Annotated[str, AfterValidator(driverspec.check_os_release)]] = []
    #: ``container`` and precompiled: the kernels of the group's nodes (``uname -r``), one DaemonSet each.
    kernels: list[Annotated[str, AfterValidator(_kernel_release)]] = []
    image: DriverImage = DriverImage()
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
        _raise_all(problems)
        return self

    @property
    def parsed_version(self) -> driverspec.DriverVersion | None:
        return driverspec.parse_version(self.version) if self.version else None


class ToolkitImage(_Model):
    """NVIDIA's toolkit image (``<repository>/<name>:<tag>``), pinned by digest where given."""

    repository: Annotated[str, AfterValidator(_repository)] = toolkitspec.DEFAULT_REPOSITORY
    name: DnsLabel = toolkitspec.DEFAULT_IMAGE
    tag: Annotated[str, AfterValidator(_tag)] = toolkitspec.DEFAULT_TAG
    digest: Annotated[str, AfterValidator(_digest)] | None = None
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"

    @property
    def ref(self) -> str:
        ref = f"{self.repository}/{self.name}:{self.tag}"
        return f"{ref}@{self.digest}" if self.digest else ref


class Toolkit(_Model):
    """The NVIDIA Container Toolkit of the group's nodes: the node's own, or NVIDIA's toolkit container
    installing it under ``installDir`` (``nvgpu.toolkit``)."""

    source: toolkitspec.ToolkitSource = toolkitspec.ToolkitSource.PREINSTALLED
    image: ToolkitImage = ToolkitImage()
    install_dir: str = toolkitspec.DEFAULT_INSTALL_DIR

    @field_validator("install_dir")
    @classmethod
    def _install_dir(cls, v: str) -> str:
        path = _absolute(v, "e.g. /usr/local/nvidia")
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


class Gpu(_Model):
    model: str | None = None
    sharing: Sharing = Sharing.EXCLUSIVE
    time_slicing: TimeSlicing | None = None
    mps: Mps | None = None
    mig: Mig | None = None
    #: The driver installed on the nodes, when known; checked against the model's minimum. The older
    #: spelling of ``driver: {version: ...}`` with a pre-installed driver.
    driver_version: str | None = None
    driver: Driver = Driver()
    #: How the device plugin names allocated GPUs to the container (``nvgpu.devicelist``); node setup makes
    #: the NVIDIA toolkit accept exactly that. ``envvar`` lets any pod take any GPU of its node.
    device_list_strategy: Annotated[list[DeviceListStrategy], BeforeValidator(devicelist.split),
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

    @field_validator("driver_version")
    @classmethod
    def _driver(cls, v: str | None) -> str | None:
        # The catalogue's parser strips what the host prints; a config value must be the version alone
        # (it is written into labels and node scripts as it is).
        if v is not None and not _DRIVER_RELEASE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a driver version MAJOR.MINOR[.PATCH] (like 550.54.14)")
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
        if self.driver_version and self.driver.version:
            problems.append((("driverVersion",), "set the version once: driver.version replaces driverVersion"))
        version_at: Loc = ("driverVersion",) if self.driver_version else ("driver", "version")
        version = self.declared_driver_version
        if model is not None and version is not None:
            minimum = model.effective_min_driver
            what = f"the {model.key} minimum"
            mig_floor = model.mig.min_driver if self.sharing is Sharing.MIG and model.mig else None
            if mig_floor and catalogue.parse_driver_version(mig_floor) > catalogue.parse_driver_version(minimum):
                minimum, what = mig_floor, f"the minimum for MIG on {model.key}"
            if not version.at_least(minimum):
                problems.append((version_at, f"{version.text} is below {what}, {minimum}"))
        if (self.driver.kernel_modules is driverspec.KernelModules.OPEN and self.driver_version and version is not None
                and version.branch < driverspec.OPEN_MODULES_MIN_BRANCH):  # driver.version: Driver checks it
            problems.append((("driver", "kernelModules"), f"the open kernel modules exist from the "
                                                          f"{driverspec.OPEN_MODULES_MIN_BRANCH} branch on "
                                                          f"(driverVersion is {self.driver_version})"))
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
        _raise_all(problems)
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
        """``driver.version``, or the older ``driverVersion``."""
        text = self.driver.version or self.driver_version
        return driverspec.parse_version(text) if text else None

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


class NodeGroup(_Model):
    name: Annotated[str, AfterValidator(_group_name)]
    #: The Deckhouse NodeGroup whose nodes form this group (selects ``node.deckhouse.io/group=<name>``).
    node_group: Annotated[str, AfterValidator(check_dns_label)] | None = None
    #: An explicit label selector, for clusters without Deckhouse NodeGroups.
    node_selector: NodeSelector | None = None
    gpu: Gpu = Gpu()
    #: Taint GPU nodes ``nvidia.com/gpu=present:NoSchedule`` so only GPU workloads land there.
    gpu_taint: Bool = True
    extra_taints: list[Taint] = []
    allocation_mode: AllocationMode | None = None
    #: DRA only: GPUs of this group may be bound to vfio-pci and handed to VMs (IOMMU on, gpu-vfio.sh).
    passthrough: Bool = False
    toolkit: Toolkit = Toolkit()

    def toolkit_accepts_envvar(self, mode: AllocationMode) -> bool:
        """Whether node setup must let the toolkit honour unprivileged containers' ``NVIDIA_VISIBLE_DEVICES``
        (``mode``: the group's allocation mode): only for a device-plugin group that chose the ``envvar``
        strategy, which hands out GPUs no other way."""
        return mode is AllocationMode.DEVICE_PLUGIN and devicelist.needs_envvar(self.gpu.device_list_strategy)

    @model_validator(mode="after")
    def _selection(self) -> NodeGroup:
        if (self.node_group is None) == (self.node_selector is None):
            raise ValueError("set exactly one of nodeGroup (a Deckhouse NodeGroup name) or nodeSelector")
        return self

    @model_validator(mode="after")
    def _taints(self) -> NodeGroup:
        """Taints the API server refuses (two with one key and effect) or that would be lost or fought over:
        the GPU taint's key while ``gpuTaint`` sets it, a key the node lifecycle controller or the cloud
        provider owns, the MIG manager's own taint."""
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
            elif t.key in CONTROLLER_TAINTS:
                problems.append((where, f"{t.key} is a taint Kubernetes' node controllers set and remove by "
                                        "themselves; choose another key"))
        _raise_all(problems)
        return self

    @model_validator(mode="after")
    def _mig_layout(self) -> NodeGroup:
        if self.gpu.sharing is not Sharing.MIG:
            return self
        mig = self.gpu.effective_mig
        field = "customConfigs" if mig.parted_config == "custom" else "partedConfig"
        problems: list[tuple[Loc, str]] = [(("gpu", "mig", field), p.removeprefix(f"node group {self.name!r}: "))
                                           for p in mig_layout_problems(self)]
        if not problems and mig.strategy is MigStrategy.SINGLE:
            mixed = self._mixed_profiles()
            if len(mixed) > 1:
                problems.append((("gpu", "mig", "strategy"), (
                    f"'single' exposes every MIG device as nvidia.com/gpu, so the GPUs must all carry one profile; "
                    f"partedConfig {self.mig_config_name!r} mixes {', '.join(mixed)}: use strategy 'mixed' "
                    "(nvidia.com/mig-<profile> resources) or an all-<profile> config")))
        _raise_all(problems)
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
        """The ``nvidia.com/mig.config`` value: the parted config, the custom name, or ``all-disabled``.

        A custom layout is named as Deckhouse names it (:func:`nvgpu.migparted.custom_config_name`).
        """
        if self.gpu.sharing is not Sharing.MIG:
            return "all-disabled"
        mig = self.gpu.effective_mig
        if mig.parted_config == "custom":
            return custom_config_name(self.name, mig.custom_layouts)
        return mig.parted_config

    def custom_mig_configs(self) -> dict[str, list[MigConfigSpec]]:
        """The group's custom layout as mig-parted entries (per GPU index), under its Deckhouse-style name.

        Raises :class:`~nvgpu.migparted.MigPartedError` for a slice whose profile is not spelled like one.
        """
        mig = self.gpu.effective_mig
        if self.gpu.sharing is not Sharing.MIG or mig.parted_config != "custom":
            return {}
        return {self.mig_config_name: custom_specs(mig.custom_layouts, self.gpu.declared_model)}

    @property
    def match_labels(self) -> dict[str, str]:
        if self.node_group is not None:
            return {"node.deckhouse.io/group": self.node_group}
        assert self.node_selector is not None
        return dict(self.node_selector.match_labels)

    @property
    def match_expressions(self) -> list[LabelSelectorRequirement]:
        return [] if self.node_selector is None else list(self.node_selector.match_expressions)


class StackConfig(_Model):
    cluster: Cluster
    node_groups: Annotated[list[NodeGroup], Field(min_length=1)]

    @model_validator(mode="after")
    def _cross(self) -> StackConfig:
        problems: list[tuple[Loc, str]] = []
        first = _first_indices([g.name for g in self.node_groups])
        problems += [(("nodeGroups", i, "name"), f"{g.name!r} is the name of nodeGroups[{first[g.name]}] already; "
                                                 "node group names must be unique")
                     for i, g in enumerate(self.node_groups) if first[g.name] != i]
        on_node_group = _first_indices([g.node_group or f"\0{i}" for i, g in enumerate(self.node_groups)])
        problems += [(("nodeGroups", i, "nodeGroup"), (
            f"{g.node_group!r} is the Deckhouse NodeGroup of nodeGroups[{on_node_group[g.node_group]}] "
            f"({self.node_groups[on_node_group[g.node_group]].name!r}) already: its nodes would get two groups' "
            "labels, taints and node scripts; one node group per Deckhouse NodeGroup"))
            for i, g in enumerate(self.node_groups) if g.node_group and on_node_group[g.node_group] != i]
        for i, g in enumerate(self.node_groups):
            if self.cluster.node_setup is NodeSetupBackend.DECKHOUSE and g.toolkit.container:
                problems.append((("nodeGroups", i, "toolkit", "source"), (
                    "'container' needs cluster.nodeSetup 'daemonset': on Deckhouse, bashible configures the "
                    "runtime when the node joins, before any pod could install the toolkit; bake the toolkit "
                    "into the node image (source preinstalled)")))
            tag = g.toolkit.image.tag
            toolkit_release = toolkitspec.release(tag) if g.toolkit.container else None
            if g.gpu.sharing is Sharing.MIG and toolkit_release and toolkit_release < toolkitspec.MIG_MONITOR_SINCE:
                since = "v" + ".".join(map(str, toolkitspec.MIG_MONITOR_SINCE))
                problems.append((("nodeGroups", i, "toolkit", "image", "tag"), (
                    f"{tag!r} is older than {since}: on MIG GPUs the toolkit would not give the device plugin, "
                    "labeller and exporter the MIG monitor capability (/dev/nvidia-caps/nvidia-cap2; "
                    "NVIDIA/nvidia-container-toolkit#1740), and NVML refuses them the GPUs; use "
                    f"{since} or later (the default is {toolkitspec.DEFAULT_TAG})")))
            if self.cluster.node_setup is NodeSetupBackend.DECKHOUSE and g.node_group is None:
                problems.append((("nodeGroups", i, "nodeGroup"), "required with cluster.nodeSetup 'deckhouse', which "
                                                                 "configures Deckhouse NodeGroups (nodeSelector is for "
                                                                 "nodeSetup 'daemonset')"))
            if self.allocation_mode(g) is AllocationMode.DRA and self.cluster.kubernetes_minor < DRA_GA_MINOR:
                where: Loc = ("nodeGroups", i, "allocationMode") if g.allocation_mode else ("cluster", "allocationMode")
                problems.append((where, f"'dra' needs Kubernetes 1.{DRA_GA_MINOR}+ (resource.k8s.io/v1) and "
                                        f"cluster.kubernetesVersion is {self.cluster.kubernetes_version}"
                                        + ("" if g.allocation_mode else f" (node group {g.name!r} inherits it)")))
        _raise_all(problems + self._dra_problems())
        return self

    def _dra_problems(self) -> list[tuple[Loc, str]]:
        problems: list[tuple[Loc, str]] = []
        for i, g in enumerate(self.node_groups):
            if g.passthrough and self.allocation_mode(g) is not AllocationMode.DRA:
                problems.append((("nodeGroups", i, "passthrough"), "needs allocationMode 'dra' (VFIO devices "
                                                                   "are offered through the vfio.gpu.nvidia.com "
                                                                   "DeviceClass)"))
            if "device_list_strategy" in g.gpu.model_fields_set and self.allocation_mode(g) is AllocationMode.DRA:
                problems.append((("nodeGroups", i, "gpu", "deviceListStrategy"), (
                    "only for allocationMode 'devicePlugin': under DRA the kubelet plugin hands out GPUs as CDI "
                    "devices; remove it")))
        dra = self.cluster.dra
        if dra.health_action == "taint" and self.cluster.kubernetes_minor < DRA_DEVICE_TAINTS_MINOR:
            problems.append((("cluster", "dra", "healthAction"), (
                f"'taint' needs DRADeviceTaints, on by default from Kubernetes 1.{DRA_DEVICE_TAINTS_MINOR}, and "
                f"cluster.kubernetesVersion is {self.cluster.kubernetes_version} (use 'withdraw')")))
        if dra.claim_quotas and not self.uses_dra:
            problems.append((("cluster", "dra", "claimQuotas"), "set, but no node group uses allocationMode 'dra': "
                                                                "the quotas would limit claims nobody can satisfy"))
        return problems

    @property
    def uses_dra(self) -> bool:
        return any(self.allocation_mode(g) is AllocationMode.DRA for g in self.node_groups)

    def allocation_mode(self, group: NodeGroup) -> AllocationMode:
        return group.allocation_mode or self.cluster.allocation_mode


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
        cfg = config if config is not None else build_config(None, group.custom_mig_configs())
        if group.gpu.model_unlisted:
            # Deferred to the node: the catalogue cannot say which profiles a model it lacks has. The config
            # must exist and be well formed; the MIG manager fits it to NVML's own profiles and placements.
            cfg.get(group.mig_config_name)
            return []
    except MigPartedError as e:
        problems = e.problems
    else:
        problems = fit_problems(cfg, group.mig_config_name, group.gpu.declared_model)
    return [f"node group {group.name!r}: {p}" for p in problems]


def _format_loc(loc: tuple[int | str, ...]) -> str:
    """``nvidia-gpu:nodeGroups[0].gpu``; a key that is long or not printable is quoted and cut."""
    out = CONFIG_NAMESPACE + ":"
    first = True
    for part in loc:
        if isinstance(part, int):
            out += index_part(part)
        else:
            out += ("" if first else ".") + path_part(part)
        first = False
    return out


def _allowed_keys(loc: tuple[int | str, ...]) -> list[str] | None:
    """Walk the schema along ``loc`` (minus the last part) to list the keys allowed there."""
    model: Any = StackConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        info = fields.get(part)
        if info is None:
            return None
        model = _model_of(info.annotation)
        if model is None:
            return None
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _problems(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if p not in ("function-after",))
        where = _format_loc(loc)
        kind = e["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(loc)
            hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            guess = _did_you_mean(str(loc[-1]), allowed) if allowed and loc else ""
            problems.append(clip(f"{where}: unknown key{guess}{hint}"))
            continue
        error = (e.get("ctx") or {}).get("error")
        if isinstance(error, FieldProblems):
            problems += [f"{_format_loc(loc + rel)}: {message}" for rel, message in error.problems]
            continue
        msg = clip(e["msg"].removeprefix("Value error, "))
        if kind == "enum":
            msg = "not an allowed value; allowed: " + e.get("ctx", {}).get("expected", "")
        elif kind == "missing":
            problems.append(f"{where}: required key is missing")
            continue
        value = e.get("input")
        if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML reads an unquoted 550 or 1.0 as a number (and 1.10 as 1.1): the text is what was meant.
            number = shown(value)
            example = f", e.g. \"{number}\"" if number[:1].isdigit() or number[:1] == "-" else ""
            problems.append(clip(f"{where}: must be text, and YAML reads an unquoted {number} as a number; "
                                 f"quote it as it should read{example}"))
            continue
        got = "" if isinstance(value, (dict, list)) else f" (got {shown(value)})"
        problems.append(clip(f"{where}: {msg}{got}"))
    return problems


def load_stack_config(values: Mapping[str, Any]) -> StackConfig:
    """Validate the ``nvidia-gpu:`` namespace (keys without the prefix: ``cluster``, ``nodeGroups``)."""
    try:
        return StackConfig.model_validate(dict(values))
    except ValidationError as e:
        raise StackConfigError(_problems(e)) from None


def namespace_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """Pick the ``nvidia-gpu:*`` keys out of a stack file's ``config:`` map; other namespaces are not ours."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        ns, _, short = key.partition(":")
        if ns == CONFIG_NAMESPACE and short:
            out[short] = value
    return out


def misplaced_keys(config: Mapping[str, Any]) -> dict[str, str]:
    """Our top-level keys (``cluster``, ``nodeGroups``) written in another namespace: short key -> problem.

    Pulumi puts a key without a namespace in the project's (``cluster:`` in a project named ``gpu-platform``
    is ``gpu-platform:cluster``), so a stack of a project with another name that forgets the prefix reaches
    this program without its config; say which key and how to write it instead of "required key is missing".
    """
    top = {f.alias or n for n, f in StackConfig.model_fields.items()}
    out: dict[str, str] = {}
    for key in config:
        ns, sep, short = str(key).rpartition(":")
        if short in top and ns != CONFIG_NAMESPACE:
            where = f"in the namespace {ns!r}" if sep else "without a namespace"
            out[short] = (f"{CONFIG_NAMESPACE}:{short}: missing, but the config has {shown(key)} {where}; write "
                          f"{CONFIG_NAMESPACE}:{short} (Pulumi gives a key without a namespace the project's name)")
    return out


def load_namespaced_config(config: Mapping[str, Any], decode: Callable[[Any], Any] | None = None) -> StackConfig:
    """Validate a whole ``config:`` map of namespaced keys: ours picked out (and decoded), and our
    top-level keys that are missing because they were written in another namespace named as such."""
    values = namespace_values(config)
    if decode is not None:
        values = {k: decode(v) for k, v in values.items()}
    try:
        return load_stack_config(values)
    except StackConfigError as e:
        hints = {short: why for short, why in misplaced_keys(config).items() if short not in values}
        if not hints:
            raise
        missing = {f"{CONFIG_NAMESPACE}:{s}: required key is missing" for s in hints}
        rest = [p for p in e.problems if p not in missing]
        raise StackConfigError([*hints.values(), *rest]) from None


def read_stack_text(text: str, source: str) -> dict[str, Any]:
    """The ``nvidia-gpu:*`` values of a stack file's text (``source`` names it in errors), unvalidated.

    YAML aliases are allowed, as Pulumi's own reader allows them (a block shared between node groups),
    up to :data:`nvgpu.yamltext.MAX_EXPANDED_NODES` values expanded; size, nesting and integers are
    bounded too (:func:`nvgpu.yamltext.load`). A problem raises :class:`StackConfigError`.
    """
    return namespace_values(_config_map(text, source))


def _config_map(text: str, source: str) -> dict[str, Any]:
    try:
        doc = yamltext.load(text, source, aliases=True) or {}
    except yamltext.YamlLoadError as e:
        raise StackConfigError([f"{source}: cannot read stack file: {e.where + ': ' if e.where else ''}"
                                f"{e.problem}"]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise StackConfigError([f"{source}: expected a mapping with a 'config:' mapping"])
    return dict(doc.get("config") or {})


def load_stack_text(text: str, source: str = "stack file") -> StackConfig:
    """Read and validate a stack file's text (:func:`load_namespaced_config` on its ``config:`` map)."""
    return load_namespaced_config(_config_map(text, source))


def load_stack_file(path: Path) -> StackConfig:
    """Read ``Pulumi.<stack>.yaml`` directly (the offline preview and the policy tools use this)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise StackConfigError([f"{path}: cannot read stack file: {clip(str(e), 300)}"]) from None
    return load_stack_text(text, str(path))
