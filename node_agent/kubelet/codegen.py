"""Generates the Python gRPC stubs from the ``.proto`` files of the kubelet sub-packages (``deviceplugin``, ``dra``).

Stubs are build products, never committed: ``make proto`` (and the image build) run
``python -m node_agent.kubelet.codegen``, and :func:`load` regenerates lazily on import when a stub is
missing or older than its ``.proto``, so a fresh clone works without a separate step. Generation runs
``grpc_tools.protoc`` in-process into a temporary directory and renames the results into place, so a
concurrent importer never sees half-written modules.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
#: protoc's include root: the directory holding the ``node_agent`` package, so generated modules import
#: each other by their package path (``node_agent.kubelet.deviceplugin.<name>_pb2``).
SOURCE_ROOT = PACKAGE_DIR.parent.parent

_lock = threading.Lock()


class CodegenError(RuntimeError):
    """The stubs are missing or stale and could not be generated."""


def _outputs(stem: str, directory: Path) -> tuple[Path, ...]:
    return (directory / f"{stem}_pb2.py", directory / f"{stem}_pb2_grpc.py", directory / f"{stem}_pb2.pyi")


def is_stale(stem: str, directory: Path) -> bool:
    proto = directory / f"{stem}.proto"
    src_mtime = proto.stat().st_mtime
    return any(not out.exists() or out.stat().st_mtime < src_mtime for out in _outputs(stem, directory))


def generate(stem: str, directory: Path) -> None:
    """Run protoc for one ``.proto`` file of a sub-package ``directory`` such as ``kubelet/dra``
    (atomically replaces the three outputs)."""
    try:
        from grpc_tools import protoc  # noqa: PLC0415 - a development tool, optional (not in the image)
    except ImportError as e:
        raise CodegenError(
            f"stubs for {stem}.proto are missing or stale and grpcio-tools is not installed; "
            "run `make proto` where grpcio-tools is available"
        ) from e
    rel = (directory / f"{stem}.proto").relative_to(SOURCE_ROOT)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".codegen-") as tmp:
        args = ["grpc_tools.protoc", f"-I{SOURCE_ROOT}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                f"--pyi_out={tmp}", str(rel)]
        rc = protoc.main(args)
        if rc != 0:
            raise CodegenError(f"protoc failed for {rel} (exit {rc})")
        generated = Path(tmp) / rel.parent
        for out in _outputs(stem, directory):
            os.replace(generated / out.name, out)
    log.info("event=stubs-generated proto=%s", rel)


def ensure(stem: str, directory: Path) -> None:
    with _lock:
        if is_stale(stem, directory):
            generate(stem, directory)


def load(stem: str, directory: Path) -> tuple[ModuleType, ModuleType]:
    """Return ``(<stem>_pb2, <stem>_pb2_grpc)``, generating them first when needed."""
    ensure(stem, directory)
    importlib.invalidate_caches()
    package = ".".join(directory.relative_to(SOURCE_ROOT).parts)
    return (importlib.import_module(f"{package}.{stem}_pb2"), importlib.import_module(f"{package}.{stem}_pb2_grpc"))


def protos() -> list[Path]:
    """Every ``.proto`` file of the kubelet package's sub-packages (``deviceplugin``, ``dra``)."""
    return sorted(PACKAGE_DIR.rglob("*.proto"))


def main() -> int:
    """Generate (or refresh) the stubs of every kubelet protocol: ``make proto``."""
    for proto in protos():
        try:
            ensure(proto.stem, proto.parent)
        except CodegenError as e:
            print(f"codegen: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
