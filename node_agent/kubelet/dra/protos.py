"""Build-time generation and loading of the gRPC stubs for the kubelet DRA and registration protos.

Stubs are never committed: they are generated from the ``.proto`` files beside this module by
``grpc_tools.protoc`` (``python -m node_agent.kubelet.dra.protos`` at image build time, or lazily on first
import in a development checkout). Generation happens under a file lock into a temporary directory and is
moved into place atomically, so concurrent test processes never import a half-written module.

The generated modules are loaded dynamically and typed as ``Any``: their shapes are defined by the
``.proto`` files, and the servicers treat messages as plain attribute bags.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO_DIR = Path(__file__).resolve().parent
#: Imports inside generated stubs are rooted at the directory holding the ``node_agent`` package.
_IMPORT_ROOT = PROTO_DIR.parents[2]
_PACKAGE = "node_agent.kubelet.dra"
PROTOS = ("pluginregistration", "dra_v1", "dra_v1beta1")


class ProtoStubError(RuntimeError):
    """The stubs are missing and cannot be generated (no grpc_tools, or protoc failed)."""


def _outputs(name: str) -> tuple[Path, Path]:
    return PROTO_DIR / f"{name}_pb2.py", PROTO_DIR / f"{name}_pb2_grpc.py"


def _stale(name: str) -> bool:
    source = PROTO_DIR / f"{name}.proto"
    return any(not out.exists() or out.stat().st_mtime < source.stat().st_mtime for out in _outputs(name))


def generate(force: bool = False) -> list[str]:
    """Generate stale or missing stubs; returns the names regenerated."""
    stale = [n for n in PROTOS if force or _stale(n)]
    if not stale:
        return []
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as e:
        raise ProtoStubError(
            "generated gRPC stubs are missing and grpc_tools is not installed; "
            "run `python -m node_agent.kubelet.dra.protos` where grpcio-tools is available"
        ) from e
    # Lock the directory itself: no lock file to clean up or ignore, and protoc runs once per checkout.
    fd = os.open(PROTO_DIR, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        stale = [n for n in PROTOS if force or _stale(n)]
        if not stale:
            return []
        include = str(Path(protoc.__file__).parent / "_proto")
        with tempfile.TemporaryDirectory(dir=PROTO_DIR, prefix=".gen-") as tmp:
            rel = [str((PROTO_DIR / f"{n}.proto").relative_to(_IMPORT_ROOT)) for n in stale]
            args = ["protoc", f"-I{_IMPORT_ROOT}", f"-I{include}", f"--python_out={tmp}",
                    f"--grpc_python_out={tmp}", *rel]
            code = protoc.main(args)
            if code != 0:
                raise ProtoStubError(f"protoc failed with exit code {code} for {', '.join(rel)}")
            produced = Path(tmp) / PROTO_DIR.relative_to(_IMPORT_ROOT)
            for f in sorted(produced.iterdir()):
                target = PROTO_DIR / f.name
                shutil.copyfile(f, f"{target}.tmp")
                os.replace(f"{target}.tmp", target)
        importlib.invalidate_caches()
    finally:
        os.close(fd)
    return stale


def load(name: str) -> tuple[Any, Any]:
    """Return ``(messages, services)`` modules for one proto, generating them first when needed."""
    if name not in PROTOS:
        raise ValueError(f"unknown proto {name!r}; known: {', '.join(PROTOS)}")
    if _stale(name):
        generate()
    if str(_IMPORT_ROOT) not in sys.path and importlib.util.find_spec("node_agent") is None:
        sys.path.insert(0, str(_IMPORT_ROOT))
    pb2: ModuleType = importlib.import_module(f"{_PACKAGE}.{name}_pb2")
    grpc_mod: ModuleType = importlib.import_module(f"{_PACKAGE}.{name}_pb2_grpc")
    return pb2, grpc_mod


if __name__ == "__main__":
    done = generate(force="--force" in sys.argv)
    print("generated: " + (", ".join(done) if done else "nothing (up to date)"))
