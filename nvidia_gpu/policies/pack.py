"""The pack's identity and the policies it serves, importable without starting a gRPC server."""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, ResourceValidationPolicy, StackValidationPolicy

from nvidia_gpu.policies import gpu_validity, k8s_security

PACK_NAME = "nvidia-gpu"
DESCRIPTION = "Rejects GPU configurations a node cannot run and Kubernetes objects a security review would reject."
#: Policies without their own level; every policy here sets one.
DEFAULT_ENFORCEMENT = EnforcementLevel.ADVISORY

POLICIES: list[ResourceValidationPolicy | StackValidationPolicy] = [*gpu_validity.POLICIES, *k8s_security.POLICIES]
