"""Pure builders of the Kubernetes objects the components register.

Every function here takes validated stack config (``nvgpu.stackconfig``) and returns plain manifest
dicts in Kubernetes' own camelCase shape, so they are testable without the Pulumi engine and the
offline preview can write exactly what a real ``pulumi up`` would send.
"""

from __future__ import annotations

from typing import Any

#: One Kubernetes object as a plain dict (``apiVersion``, ``kind``, ``metadata``, ...).
Manifest = dict[str, Any]
