"""Container images for real nodes without a registry: OCI image archives written from layer tars, which
``ctr images import`` loads into a node's containerd (:meth:`localcluster.node.Node.import_image`).

- :func:`pause_archive`: the sandbox image containerd pins (``registry.k8s.io/pause:3.10.1``), a static
  binary compiled here from a few lines of C (what Kubernetes' own ``build/pause`` does: sleep until
  SIGINT/SIGTERM, reap orphans).
- :func:`rootfs_archive`: a tiny image of host binaries and the shared libraries ``ldd`` lists for them
  (``sh``, ``cat``, ``sleep``, ...), enough for a workload that prints, sleeps and takes ``kubectl exec``.

Layers are stored uncompressed (``application/vnd.oci.image.layer.v1.tar``): their diff IDs are their own
digests, and nothing is pulled, so compression would only cost time.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction s = {0}, r = {0};
  s.sa_handler = stop; r.sa_handler = reap; r.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGINT, &s, NULL); sigaction(SIGTERM, &s, NULL); sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
"""


class ImageError(RuntimeError):
    """An image archive could not be built (the message carries the tool's words)."""


def _digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def write_archive(out: Path, ref: str, layers: Sequence[Path], *, entrypoint: Sequence[str] | None = None,
                  cmd: Sequence[str] | None = None, env: Sequence[str] = ()) -> str:
    """An OCI image archive at ``out`` named ``ref`` (``io.containerd.image.name``); answers the manifest
    digest, which is what a pod can reference the image by once imported (``ref@digest``)."""
    descs = []
    for layer in layers:
        digest, size = _digest(layer)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size})
    run_config: dict[str, Any] = {"Env": list(env) or [DEFAULT_PATH]}
    if entrypoint:
        run_config["Entrypoint"] = list(entrypoint)
    if cmd:
        run_config["Cmd"] = list(cmd)
    config = {"architecture": "amd64", "os": "linux", "config": run_config,
              "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}, "history": []}
    config_b = json.dumps(config, sort_keys=True).encode()
    config_d = "sha256:" + hashlib.sha256(config_b).hexdigest()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d,
                           "size": len(config_b)}, "layers": descs}
    manifest_b = json.dumps(manifest, sort_keys=True).encode()
    manifest_d = "sha256:" + hashlib.sha256(manifest_b).hexdigest()
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_d,
                            "size": len(manifest_b),
                            "annotations": {"io.containerd.image.name": ref,
                                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]}}]}

    def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        add_bytes(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_bytes(tar, "index.json", json.dumps(index).encode())
        add_bytes(tar, f"blobs/sha256/{config_d[7:]}", config_b)
        add_bytes(tar, f"blobs/sha256/{manifest_d[7:]}", manifest_b)
        for layer, desc in zip(layers, descs, strict=True):
            tar.add(layer, arcname=f"blobs/sha256/{str(desc['digest'])[7:]}")
    partial.replace(out)
    (out.with_name(out.name + ".digest")).write_text(manifest_d + "\n")
    return manifest_d


def archive_digest(out: Path) -> str:
    """The manifest digest :func:`write_archive` recorded beside ``out``."""
    return out.with_name(out.name + ".digest").read_text().strip()


def _layer(out: Path, files: dict[str, Path], dirs: Sequence[str] = ()) -> None:
    """A layer tar holding ``files`` (path in the image -> host file, symlinks resolved) and empty ``dirs``."""
    with tarfile.open(out, "w") as tar:
        for d in dirs:
            info = tarfile.TarInfo(d.strip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d.strip("/") == "tmp" else 0o755
            tar.addfile(info)
        for inside, host in sorted(files.items()):
            tar.add(host.resolve(), arcname=inside.strip("/"), recursive=False)


def pause_archive(out: Path) -> str:
    """The sandbox image, built once (kept at ``out`` with its digest beside it)."""
    if out.exists() and out.with_name(out.name + ".digest").exists():
        return archive_digest(out)
    with tempfile.TemporaryDirectory() as tmp:
        src, binary, layer = Path(tmp) / "pause.c", Path(tmp) / "pause", Path(tmp) / "layer.tar"
        src.write_text(PAUSE_C)
        done = subprocess.run(["gcc", "-static", "-Os", "-o", str(binary), str(src)], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise ImageError(f"compiling pause: {done.stderr.strip()}")
        _layer(layer, {"pause": binary})
        return write_archive(out, PAUSE_IMAGE, [layer], entrypoint=["/pause"])


def _libraries(binary: Path) -> set[Path]:
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if "not a dynamic executable" in done.stdout + done.stderr:
        return set()
    if done.returncode != 0:
        raise ImageError(f"ldd {binary}: {done.stderr.strip()}")
    return {Path(m) for m in re.findall(r"(/\S+)\s+\(0x", done.stdout)}


def rootfs_archive(out: Path, ref: str, programs: Sequence[str], *, cmd: Sequence[str] | None = None) -> str:
    """An image of the host's ``programs`` (found on PATH, placed in ``/bin``) and their libraries at their
    host paths, plus ``/tmp``, ``/proc``, ``/sys``, ``/dev``, ``/etc`` mount points; rebuilt every call."""
    files: dict[str, Path] = {}
    for program in programs:
        found = shutil.which(program)
        if found is None:
            raise ImageError(f"{program} is not on PATH")
        files[f"bin/{program}"] = Path(found)
        for lib in _libraries(Path(found)):
            files[str(lib)] = lib
    with tempfile.TemporaryDirectory() as tmp:
        layer = Path(tmp) / "layer.tar"
        _layer(layer, files, dirs=("tmp", "proc", "sys", "dev", "etc", "bin"))
        return write_archive(out, ref, [layer], cmd=cmd, env=["PATH=/bin"])
