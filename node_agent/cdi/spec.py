"""The CDI spec document as typed models mirroring the CDI JSON schema.

``cncf-tags/container-device-interface`` ``schema/schema.json`` and ``defs.json``: unknown fields are
impossible by construction (``extra="forbid"``), and the tests validate rendered specs against the
upstream schema. Runtimes refuse a spec whose ``cdiVersion`` is lower than its fields need, so each
writer names the lowest version covering what it writes.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from nvgpu.nodescripts import facts

#: Where transient (generated) specs go; the runtime also reads ``/etc/cdi`` (later directories win).
CDI_DIR = facts.CDI_DYNAMIC_DIR


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DeviceNode(_Model):
    path: str
    host_path: Annotated[str | None, Field(alias="hostPath")] = None
    permissions: str | None = None


class Mount(_Model):
    host_path: Annotated[str, Field(alias="hostPath")]
    container_path: Annotated[str, Field(alias="containerPath")]
    options: list[str] | None = None


class Hook(_Model):
    """An OCI hook the runtime runs in the host's namespaces (``path`` is a host path)."""

    hook_name: Annotated[str, Field(alias="hookName")]
    path: str
    args: list[str] | None = None
    env: list[str] | None = None


class ContainerEdits(_Model):
    env: list[str] | None = None
    device_nodes: Annotated[list[DeviceNode] | None, Field(alias="deviceNodes")] = None
    mounts: list[Mount] | None = None
    hooks: list[Hook] | None = None

    def merged(self, other: ContainerEdits | None) -> ContainerEdits:
        """These edits followed by ``other``'s (list fields concatenated, empty ones left out)."""
        if other is None:
            return self

        def cat(a: list[Any] | None, b: list[Any] | None) -> list[Any] | None:
            joined = [*(a or []), *(b or [])]
            return joined or None

        return ContainerEdits(env=cat(self.env, other.env), device_nodes=cat(self.device_nodes, other.device_nodes),
                              mounts=cat(self.mounts, other.mounts), hooks=cat(self.hooks, other.hooks))


class CdiDevice(_Model):
    name: str
    container_edits: Annotated[ContainerEdits, Field(alias="containerEdits")]


class CdiSpec(_Model):
    cdi_version: Annotated[str, Field(alias="cdiVersion")]
    kind: str
    annotations: dict[str, str] | None = None
    devices: Annotated[list[CdiDevice], Field(min_length=1)]
    container_edits: Annotated[ContainerEdits | None, Field(alias="containerEdits")] = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True)
        return data


def device_node(path: str, dev_root: str = "/") -> DeviceNode:
    """A device node the container gets at ``path``, from ``path`` under the host's ``dev_root``."""
    host = path if dev_root in ("", "/") else dev_root.rstrip("/") + path
    return DeviceNode(path=path, host_path=host, permissions="rw")
