"""Shared core of nvidia-gpu: the GPU catalogue, MIG placement rules, label names and the stack config schema.

This package is the single source of truth used by the Pulumi components, the policy packs and the
node agent. It must never import Pulumi: the agent image ships it without the Pulumi SDK.
"""
