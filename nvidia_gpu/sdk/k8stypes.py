"""The type-token table of the installed ``pulumi_kubernetes``: which API versions of a kind have a typed class.

``nvidia_gpu.components.register`` registers manifests under the provider's type tokens without the
typed classes (see its docstring), but keeps the aliases those classes declare: the same kind in its
group's other API versions. Importing every typed class to read them would cost seconds, so this reads
the SDK's file layout instead, which is no API: ``pulumi_kubernetes/<group>/<version>/<Class>.py``,
``<group>`` being the API group's first label (``core`` for the core group), one file per typed class
(``<Kind>.py``, ``<Kind>Patch.py``, ...), each declaring ``@pulumi.type_token("kubernetes:...")``.
``tests/nvidia_gpu/sdk`` checks the layout against the classes themselves.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pulumi_kubernetes

#: Where the installed SDK's modules are.
SDK_DIR = Path(pulumi_kubernetes.__file__).parent
#: The line that declares a typed class's token, as the SDK's generator writes it.
_TOKEN_DECORATOR = '@pulumi.type_token("kubernetes:'


def group_dir(api_group: str) -> Path | None:
    """The SDK's package for ``api_group`` (``""`` for the core group), or None when the SDK has none: a group
    outside Kubernetes' own (``deckhouse.io``, a CRD's) has no typed classes."""
    if api_group and not api_group.endswith(".k8s.io") and "." in api_group:
        return None
    path = SDK_DIR / (api_group.split(".", maxsplit=1)[0] if api_group else "core")
    return path if path.is_dir() else None


def typed_versions(api_group: str, class_name: str) -> tuple[str, ...]:
    """The API versions (sorted by name) of ``api_group`` in which the SDK has a typed class ``class_name``
    (a kind, or ``<Kind>Patch``); empty for a group the SDK does not know."""
    module = group_dir(api_group)
    if module is None:
        return ()
    name = f"{class_name}.py"
    return tuple(sorted(d.name for d in module.iterdir() if d.is_dir() and (d / name).is_file()))


@cache
def known_type_tokens() -> frozenset[str]:
    """Every type token the SDK's typed classes declare (``kubernetes:apps/v1:DaemonSet``, ...)."""
    tokens: set[str] = set()
    for path in SDK_DIR.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(_TOKEN_DECORATOR):
                tokens.add(line.split('"')[1])
    return frozenset(tokens)
