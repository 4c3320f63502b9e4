"""The cluster-wide definitions every stack on a cluster shares, and the rule that lets stacks share them.

Most of what a stack creates is named after its namespace (ClusterRoles, admission policies, the
NodeGroupConfiguration steps, the NodeGroup patches' field manager), so two stacks never meet. Three
kinds of object cannot be: the GPU inventory's CustomResourceDefinition (its name is its API group),
the ``nvidia`` RuntimeClass users' pods name, and the DRA DeviceClasses claims name. For those the rule
is *shared by design*:

- every stack applies the same object, labelled without anything that names the stack or its version
  (:func:`~nvidia_gpu.components.manifests.meta.shared_labels`), so two stacks' server-side applies hold
  equal values and co-own them instead of conflicting;
- each stack adds an owner reference to its own Namespace, and Pulumi retains the object on destroy
  (:func:`~nvidia_gpu.components.register.register_shared`): Kubernetes' garbage collector deletes it
  when the last owning namespace is gone, so the stacks can be destroyed in any order and the object
  lives exactly as long as some stack uses it;
- a stack that would define it otherwise (another nvidia-gpu version's CRD, another DRA driver's
  classes) or find one nobody of ours created (the GPU Operator's RuntimeClass) is stopped by the
  preflight (:mod:`nvidia_gpu.preflight.stacks`) before ``up`` applies anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvgpu.stackconfig import AllocationMode, StackConfig
from nvidia_gpu.components.manifests import Manifest, dra, inventory, platform


@dataclass(frozen=True)
class SharedObject:
    manifest: Manifest
    #: The stack config key that stops the stack from creating it (None: it always does).
    opt_out: str | None


def shared_objects(config: StackConfig) -> list[SharedObject]:
    """What this stack would apply of the shared definitions, as the components register them."""
    cluster = config.cluster
    out = [SharedObject(inventory.crd(), None)]
    if cluster.runtime_class.create:
        out.append(SharedObject(platform.runtime_class(cluster.runtime_class.name),
                                "nvidia-gpu:cluster.runtimeClass.create: false"))
    dra_groups = [g for g in config.node_groups if config.allocation_mode(g) is AllocationMode.DRA]
    if dra_groups and cluster.dra.create_device_classes:
        out += [SharedObject(dra.device_class(cluster.dra.driver_name, spec),
                             "nvidia-gpu:cluster.dra.createDeviceClasses: false")
                for spec in dra.DEVICE_CLASSES]
    return out
