"""An in-memory :class:`~nvidia_gpu.preflight.model.ClusterReader` for the preflight's unit tests.

It answers as the API server does for the reads the checks make: ``get`` by name, ``list`` by namespace and
an equality-only label selector (``a=b,c=d``, what the checks send), absent kinds as None / []; it records
every read so the tests can hold the checks to a few reads on a large fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeReader:
    objects: list[dict[str, Any]] = field(default_factory=list)
    reads: list[tuple[str, str, str | None]] = field(default_factory=list)

    def add(self, *objs: dict[str, Any]) -> FakeReader:
        self.objects.extend(objs)
        return self

    def _of(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o.get("apiVersion") == api_version and o.get("kind") == kind]

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.reads.append(("get", kind, name))
        for o in self._of(api_version, kind):
            meta = o.get("metadata", {})
            if meta.get("name") == name and meta.get("namespace") == namespace:
                return o
        return None

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        self.reads.append(("list", kind, label_selector))
        wanted = dict(p.split("=", 1) for p in label_selector.split(",")) if label_selector else {}
        out = []
        for o in self._of(api_version, kind):
            meta = o.get("metadata", {})
            if namespace is not None and meta.get("namespace") != namespace:
                continue
            have = meta.get("labels", {})
            if all(have.get(k) == v for k, v in wanted.items()):
                out.append(o)
        return out
