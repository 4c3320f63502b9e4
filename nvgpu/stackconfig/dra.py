"""``cluster.dra``: the DRA driver's name, how unhealthy GPUs are withdrawn, claim quotas and DeviceClasses.

Which groups use DRA, and whether the cluster's Kubernetes has it, is checked across the whole config
(:mod:`nvgpu.stackconfig.stack`); this section only checks what it holds itself.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    field_validator,
    model_validator,
)

from nvgpu.errortext import shown
from nvgpu.k8snames import dns_subdomain_problem
from nvgpu.stackconfig.common import INT64_MAX, Bool, ConfigModel, DnsLabel, FieldProblems, first_indices, raise_all


def _driver_name(v: str) -> str:
    problem = dns_subdomain_problem(v)
    if problem or "." not in v or len(v) > 63:
        raise ValueError("must be a DNS subdomain with at least one dot and at most 63 characters, like "
                         "gpu.example.com (lowercase letters, digits, '-' and '.')")
    return v



#: NVIDIA's DRA driver name: the one the DeviceClasses of a cluster running NVIDIA's driver select.
DRA_DEFAULT_DRIVER = "gpu.nvidia.com"
#: DeviceClasses the DRA stack publishes (NVIDIA's names, so claims written for its driver keep working).
DRA_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
#: DRADeviceTaints is beta (on by default) from this minor; before it, device taints are dropped.
DRA_DEVICE_TAINTS_MINOR = 36


class ClaimQuota(ConfigModel):
    """A ResourceQuota on DRA claims in one namespace (``count/resourceclaims.resource.k8s.io`` and
    ``<class>.deviceclass.resource.k8s.io/devices``)."""

    #: The namespace the quota applies to.
    namespace: DnsLabel
    #: Most ResourceClaims the namespace may hold.
    claims: Annotated[int | None, Field(ge=0, le=INT64_MAX)] = None
    #: Most devices the namespace may request per DeviceClass, e.g. ``{gpu.nvidia.com: 4}``.
    devices: dict[str, Annotated[int, Field(ge=0, le=INT64_MAX)]] = {}

    @model_validator(mode="after")
    def _some_limit(self) -> ClaimQuota:
        if self.claims is None and not self.devices:
            raise FieldProblems([((), "set claims and/or devices: a quota without limits would do nothing")])
        unknown = sorted(set(self.devices) - set(DRA_DEVICE_CLASSES))
        raise_all([(("devices", name), f"unknown DeviceClass {shown(name)}; allowed: "
                                        f"{', '.join(DRA_DEVICE_CLASSES)}") for name in unknown])
        return self


class DraSettings(ConfigModel):
    """DRA mode's settings (``cluster.dra``): the driver name, how unhealthy GPUs are withdrawn, claim quotas and
    DeviceClasses."""

    #: ResourceSlice driver (DNS subdomain, at most 63 characters); NVIDIA's name by default.
    driver_name: Annotated[str, AfterValidator(_driver_name)] = "gpu.nvidia.com"
    #: Unhealthy GPUs are withdrawn from the ResourceSlices, or published with a device taint (1.36+).
    health_action: Literal["withdraw", "taint"] = "withdraw"
    #: Per-namespace quotas on DRA claims and devices; one per namespace, and only with a group that uses DRA.
    claim_quotas: list[ClaimQuota] = []
    #: Off when the cluster already has the DeviceClasses (NVIDIA's DRA driver installed them): they have
    #: fixed names, and the provider would take the existing ones over (and ``destroy`` delete them).
    create_device_classes: Bool = True

    @field_validator("claim_quotas")
    @classmethod
    def _unique_namespaces(cls, v: list[ClaimQuota]) -> list[ClaimQuota]:
        first = first_indices([q.namespace for q in v])
        raise_all([((i, "namespace"), f"one quota per namespace: {q.namespace!r} has one already "
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

