"""Container images for real nodes without a registry: OCI image archives written from layer tars, which
``ctr images import`` loads into a node's containerd (:meth:`localcluster.node.Node.import_image`).

- :func:`pause_archive`: the sandbox image containerd pins (``registry.k8s.io/pause:3.10.1``), a static
  binary compiled here from a few lines of C (what Kubernetes' own ``build/pause`` does: sleep until
  SIGINT/SIGTERM, reap orphans).
- :func:`rootfs_archive`: a tiny image of host binaries and the shared libraries ``ldd`` lists for them
  (``sh``, ``cat``, ``sleep``, ...), enough for a workload that prints, sleeps and takes ``kubectl exec``.
- :func:`probe_archive`: such an image around ``tests/cluster/gpu_probe.c`` (a CUDA workload's view of the
  driver), laid out like a Debian image for the NVIDIA CDI hook: multiarch library directories,
  ``/etc/ld.so.conf(.d)``, ``/sbin/ldconfig`` and a linker cache.
- :func:`agent_archive`: the node agent image as ``node_agent/image/build.sh`` builds it (buildah, no
  registry), exported from buildah's storage.

Layers written here are stored uncompressed (``application/vnd.oci.image.layer.v1.tar``): their diff IDs are
their own digests, and nothing is pulled, so compression would only cost time. The agent's archive keeps the
gzip layers buildah stores and pushes as they are (74 MB; the image is 177 MB unpacked).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AGENT_BUILD = Path(__file__).resolve().parents[1] / "node_agent" / "image" / "build.sh"
#: Debian's multiarch library directories: where a CDI spec mounts the driver's libraries, and what the
#: image's ``/etc/ld.so.conf.d`` lists (as ``tests/kit/oci.py``'s root file systems do).
MULTIARCH = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu")

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


def _layer(out: Path, files: Mapping[str, Path], dirs: Sequence[str] = (),
           data: Mapping[str, bytes] | None = None) -> None:
    """A layer tar holding ``files`` (path in the image -> host file, symlinks resolved), empty ``dirs`` and
    ``data`` (path in the image -> contents of a 0644 file)."""
    with tarfile.open(out, "w") as tar:
        for d in dirs:
            info = tarfile.TarInfo(d.strip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d.strip("/") == "tmp" else 0o755
            tar.addfile(info)
        for inside, host in sorted(files.items()):
            tar.add(host.resolve(), arcname=inside.strip("/"), recursive=False)
        for inside, content in sorted((data or {}).items()):
            info = tarfile.TarInfo(inside.strip("/"))
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))


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


def rootfs_archive(out: Path, ref: str, programs: Sequence[str], *, cmd: Sequence[str] | None = None,
                   extra: Mapping[str, Path] | None = None, data: Mapping[str, bytes] | None = None,
                   dirs: Sequence[str] = (), env: Sequence[str] = ("PATH=/bin",), ld_cache: bool = False) -> str:
    """An image of the host's ``programs`` (found on PATH, placed in ``/bin``) and their libraries at their
    host paths, plus ``/tmp``, ``/proc``, ``/sys``, ``/dev``, ``/etc`` mount points; rebuilt every call.
    ``extra`` adds host files (path in the image -> host file, their libraries too), ``data`` small files
    by contents, ``dirs`` empty directories; ``ld_cache`` adds the ``/etc/ld.so.cache`` the host's
    ``ldconfig -r`` builds for the image (what a distribution image ships)."""
    files: dict[str, Path] = {}
    wanted: dict[str, Path] = {}
    for program in programs:
        found = shutil.which(program)
        if found is None:
            raise ImageError(f"{program} is not on PATH")
        wanted[f"bin/{program}"] = Path(found)
    for inside, host in (extra or {}).items():
        if not host.is_file():
            raise ImageError(f"extra file for {inside}: {host} is not a file")
        wanted[inside.strip("/")] = host
    for inside, host in wanted.items():
        files[inside] = host
        for lib in _libraries(host):
            files[str(lib)] = lib
    contents = dict(data or {})
    if ld_cache:
        contents["etc/ld.so.cache"] = _ld_cache(files, contents)
    with tempfile.TemporaryDirectory() as tmp:
        layer = Path(tmp) / "layer.tar"
        _layer(layer, files, dirs=("tmp", "proc", "sys", "dev", "etc", "bin", *dirs), data=contents)
        return write_archive(out, ref, [layer], cmd=cmd, env=env)


def _ld_cache(files: Mapping[str, Path], data: Mapping[str, bytes]) -> bytes:
    """The linker cache of an image of ``files`` and ``data``, as the host's ``ldconfig -r`` writes it (it
    reads the image's ``/etc/ld.so.conf``), from a copy of the image staged here."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for inside, host in files.items():
            (root / inside.strip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(host.resolve(), root / inside.strip("/"))
        for inside, content in data.items():
            (root / inside.strip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / inside.strip("/")).write_bytes(content)
        (root / "etc").mkdir(exist_ok=True)
        done = subprocess.run([ldconfig, "-r", str(root)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ImageError(f"{ldconfig} -r (the image's linker cache): {done.stderr.strip()}")
        return (root / "etc" / "ld.so.cache").read_bytes()


def probe_archive(out: Path, ref: str, probe_source: Path) -> str:
    """An image whose command is ``probe_source`` (C, compiled here as ``/usr/bin/gpu-probe``) with ``sh``,
    ``cat``, ``sleep`` and ``ls``, laid out for the NVIDIA CDI hook: the CDI spec mounts the driver's
    libraries into the multiarch directories, and ``update-ldcache`` runs ``ldconfig`` in the container
    with its ``/etc/ld.so.conf``, so the image has both, ``/sbin/ldconfig`` (the host's: static on Debian)
    and a linker cache of its own; rebuilt every call."""
    ldconfig = shutil.which("ldconfig")
    if ldconfig is None:
        raise ImageError("ldconfig is not on PATH (the probe image carries the host's)")
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "gpu-probe"
        done = subprocess.run(["cc", "-O1", "-o", str(probe), str(probe_source), "-ldl"], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise ImageError(f"compiling {probe_source}: {done.stderr.strip()}")
        conf = {"etc/ld.so.conf": b"include /etc/ld.so.conf.d/*.conf\n",
                "etc/ld.so.conf.d/x86_64-linux-gnu.conf": ("\n".join(MULTIARCH) + "\n").encode()}
        return rootfs_archive(out, ref, ["sh", "cat", "sleep", "ls"],
                              extra={"usr/bin/gpu-probe": probe, "sbin/ldconfig": Path(ldconfig)}, data=conf,
                              dirs=("etc/ld.so.conf.d", "usr", "usr/bin", "usr/lib", "sbin",
                                    *(d.strip("/") for d in MULTIARCH)),
                              env=["PATH=/usr/bin:/sbin:/bin"], ld_cache=True, cmd=["/usr/bin/gpu-probe"])


def _buildah(buildah_root: Path, *args: str, env: Mapping[str, str] | None = None,
             timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    storage = ["--storage-driver", "vfs", "--root", str(buildah_root / "root"), "--runroot", str(buildah_root / "run")]
    return subprocess.run(["buildah", *storage, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)


#: Where a Debian host keeps the local CAs its pip trusts (a proxy's, a private index's).
LOCAL_CAS = Path("/usr/local/share/ca-certificates")


def local_ca_dir() -> Path | None:
    """This machine's local CAs for the image build's package index (``build.sh``'s ``CA_DIR``), if it has any:
    a site behind a TLS-intercepting proxy or with a private index needs them in the build too."""
    return LOCAL_CAS if any(LOCAL_CAS.glob("*.crt")) else None


def build_agent_image(tag: str, *, buildah_root: Path, ca_dir: Path | None = None, timeout: float = 1800.0) -> None:
    """``node_agent/image/build.sh TAG`` into buildah's vfs storage under ``buildah_root`` (kept between calls,
    it keeps the imported base; the debootstrap base itself is cached by the script). ``ca_dir``: extra CA
    certificates for the Python package index (the script's ``CA_DIR``)."""
    if shutil.which("buildah") is None:
        raise ImageError("buildah is not on PATH (apt-get install buildah debootstrap)")
    env = dict(os.environ, BUILDAH_ROOT=str(buildah_root))
    if ca_dir is not None:
        env["CA_DIR"] = str(ca_dir)
    buildah_root.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["bash", str(AGENT_BUILD), tag], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise ImageError(f"{AGENT_BUILD} {tag} failed: {done.stderr.strip()[-4000:]}")


def buildah_archive(tag: str, out: Path, *, buildah_root: Path) -> str:
    """The image ``tag`` in buildah's storage as an OCI archive at ``out`` named ``tag``; answers its manifest
    digest (also recorded beside ``out``, as :func:`write_archive` does). ``buildah push`` names the image
    only by ``org.opencontainers.image.ref.name``; ``ctr import`` names images by
    ``io.containerd.image.name``, added here to the pushed layout's index before it is archived."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        layout = Path(tmp) / "oci"
        done = _buildah(buildah_root, "push", "--quiet", tag, f"oci:{layout}:{tag.rsplit(':', 1)[-1]}")
        if done.returncode != 0:
            raise ImageError(f"buildah push {tag}: {done.stderr.strip()}")
        index = json.loads((layout / "index.json").read_text())
        manifests = index.get("manifests", [])
        if len(manifests) != 1:
            raise ImageError(f"buildah push {tag}: {len(manifests)} manifests in the layout's index, expected 1")
        manifests[0].setdefault("annotations", {})["io.containerd.image.name"] = tag
        (layout / "index.json").write_text(json.dumps(index))
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w") as tar:
            for name in ("oci-layout", "index.json", "blobs"):
                tar.add(layout / name, arcname=name)
        partial.replace(out)
    digest = str(manifests[0]["digest"])
    out.with_name(out.name + ".digest").write_text(digest + "\n")
    return digest


def agent_archive(out: Path, ref: str, *, buildah_root: Path, ca_dir: Path | None = None) -> str:
    """The node agent image built (:func:`build_agent_image`) and archived (:func:`buildah_archive`) as
    ``ref``; answers its manifest digest."""
    build_agent_image(ref, buildah_root=buildah_root, ca_dir=ca_dir)
    return buildah_archive(ref, out, buildah_root=buildah_root)
