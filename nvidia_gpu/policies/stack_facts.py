"""Stack-level facts a policy needs but a single manifest does not carry.

Two sources, in this order:

1. The stack's own config. ``pulumi preview --policy-pack`` starts the pack with the stack config in
   ``PULUMI_CONFIG`` (JSON; structured values are JSON strings), the way it starts a language host. The
   offline analyzer client writes the same JSON object to a file and names it in
   :data:`CONFIG_FILE_ENV` instead: one environment string may not exceed 128 KiB on Linux
   (``MAX_ARG_STRLEN``), which a stack of about 800 node groups passes, and the Python policy SDK drops
   the config that the protocol's ``ConfigureStack`` call carries. The file wins when both are set.
   It is read leniently here, by its camelCase keys
   (:mod:`nvgpu.stackconfig` defines them): a policy must still report on a config the schema would
   reject, e.g. DRA on a cluster that is too old.
2. Signals the components put on the emitted objects, so a pack run without the stack config (or
   against hand-written manifests) still knows: the stack Namespace's
   ``gpu.nvidia-gpu.io/kubernetes-version`` annotation or label, else its Pod Security
   ``pod-security.kubernetes.io/enforce-version`` label (``v1.34``), which the components pin to the
   cluster's version.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvgpu import labels
from nvgpu.stackconfig import CONFIG_FILE_ENV, CONFIG_NAMESPACE
from nvidia_gpu.policies.manifests import annotations_of, as_list, as_map, as_str, kind_of, labels_of, name_of

KUBERNETES_VERSION_KEY = labels.KUBERNETES_VERSION
PSA_ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
#: ``fullmatch``ed on the stripped text (a label or annotation value); ASCII digits only.
_VERSION = re.compile(r"v?1\.([0-9]{1,4})(?:\.[0-9]{1,6})?")


@dataclass(frozen=True)
class KubernetesVersion:
    minor: int
    source: str  #: where the version came from, quoted in violation messages

    @property
    def text(self) -> str:
        return f"1.{self.minor}"


def parse_minor(text: str) -> int | None:
    m = _VERSION.fullmatch(text.strip())
    return int(m.group(1)) if m else None


def _decode(value: Any) -> Any:
    """Structured config values travel as JSON text; scalars stay as they are."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _raw_config(env: Mapping[str, str]) -> str | None:
    """The config's JSON text: the file :data:`CONFIG_FILE_ENV` names, else ``PULUMI_CONFIG``. An unreadable
    file reads as no config (the signals on the objects still decide), as a malformed variable does."""
    path = env.get(CONFIG_FILE_ENV)
    if path:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
    return env.get("PULUMI_CONFIG")


def config_values(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``nvidia-gpu:*`` values of the stack config (keys without the namespace), JSON decoded."""
    env = os.environ if environ is None else environ
    raw = _raw_config(env)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    out: dict[str, Any] = {}
    if not isinstance(doc, dict):
        return out
    for key, value in doc.items():
        ns, _, rest = str(key).partition(":")
        short = rest.removeprefix("config:")  # old-style "project:config:key"
        if ns != CONFIG_NAMESPACE or not short:
            continue
        out[short] = _decode(value)
    return out


def kubernetes_version(
    resources: Iterable[tuple[str, Mapping[str, Any]]], values: Mapping[str, Any]
) -> KubernetesVersion | None:
    """The stack's Kubernetes version: the stack config first, then a Namespace's annotation/label."""
    text = as_str(as_map(values.get("cluster")).get("kubernetesVersion"))
    minor = parse_minor(text) if text else None
    if minor is not None:
        return KubernetesVersion(minor, f"{CONFIG_NAMESPACE}:cluster.kubernetesVersion")
    for resource_type, props in resources:
        kind = kind_of(resource_type, props)
        if kind is None or kind.kind != "Namespace":
            continue
        candidates = (
            (annotations_of(props), KUBERNETES_VERSION_KEY),
            (labels_of(props), KUBERNETES_VERSION_KEY),
            (labels_of(props), PSA_ENFORCE_VERSION),
        )
        for source, key in candidates:
            text = as_str(source.get(key))
            minor = parse_minor(text) if text else None
            if minor is not None:
                return KubernetesVersion(minor, f"Namespace {name_of(props)!r} {key}")
    return None


def node_groups(values: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The raw ``nvidia-gpu:nodeGroups`` entries (mappings only)."""
    return [as_map(g) for g in as_list(values.get("nodeGroups")) if as_map(g)]
