"""Entry point the Pulumi CLI runs (``python -m pulumi.policy <engine> .``): serve the pack, never return."""

from pulumi_policy import PolicyPack

from nvidia_gpu.policies import sdk
from nvidia_gpu.policies.pack import DEFAULT_ENFORCEMENT, DESCRIPTION, PACK_NAME, POLICIES

sdk.install()
PolicyPack(
    name=PACK_NAME,
    policies=list(POLICIES),
    enforcement_level=DEFAULT_ENFORCEMENT,
    description=DESCRIPTION,
)
