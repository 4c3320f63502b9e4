"""The kubelet DRA and plugin-registration protos beside this module, through the kubelet codegen.

Stubs are never committed: :mod:`node_agent.kubelet.codegen` generates them from the ``.proto`` files
here (``make proto`` and the image build run ``python -m node_agent.kubelet.dra.protos``; a development
checkout generates them on first import). The generated modules are typed ``Any``: their shapes are
defined by the ``.proto`` files, and the servicers treat messages as plain attribute bags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from node_agent.kubelet import codegen

PROTO_DIR = Path(__file__).resolve().parent
PROTOS = ("pluginregistration", "dra_v1", "dra_v1beta1")


def load(name: str) -> tuple[Any, Any]:
    """Return ``(messages, services)`` modules for one proto, generating them first when needed."""
    if name not in PROTOS:
        raise ValueError(f"unknown proto {name!r}; known: {', '.join(PROTOS)}")
    return codegen.load(name, PROTO_DIR)


def main() -> int:
    for name in PROTOS:
        try:
            codegen.ensure(name, PROTO_DIR)
        except codegen.CodegenError as e:
            print(f"codegen: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
