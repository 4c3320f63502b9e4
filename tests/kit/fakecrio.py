"""Fake CRI-O hosts: ``build_fake_host`` without containerd, plus what a CRI-O node carries.

``/etc/crio/crio.conf`` and ``crio.conf.d/10-crio.conf`` as the CRI-O packages ship them (crun the
default runtime, conmon at ``/usr/libexec/crio/conmon``), a ``crio`` binary that answers
``--version``, ``crun`` and the CRI-O socket. Options drop pieces to make the odd hosts tests need.
"""

from __future__ import annotations

from pathlib import Path

from tests.kit.fakehost import FakeHost, build_fake_host

CRIO_VERSION = "1.31.2"

CRIO_CONF = """\
# The CRI-O configuration file (distribution default; settings live in crio.conf.d).
[crio]
  log_dir = "/var/log/crio/pods"

[crio.api]
  listen = "/var/run/crio/crio.sock"
"""

CRIO_10_CONF = """\
[crio.image]
  pause_image = "registry.k8s.io/pause:3.10"

[crio.runtime]
  default_runtime = "crun"
  cgroup_manager = "systemd"
  conmon_cgroup = "pod"

[crio.runtime.runtimes.crun]
  runtime_path = "/usr/bin/crun"
  runtime_type = "oci"
  runtime_root = "/run/crun"
  monitor_path = "/usr/libexec/crio/conmon"
"""


def _write(host: FakeHost, host_path: str, text: str, mode: int = 0o644) -> None:
    p = host.path(host_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    p.chmod(mode)


def build_crio_host(
    root: Path,
    machine: str | None = "l4x2",
    *,
    nvidia_container_runtime: bool = True,
    conmon: bool = True,
    crio_binary: bool = True,
    crio_conf: bool = True,
    containerd: bool = False,
    toolkit_runtimes: list[str] | None = None,
) -> FakeHost:
    """A GPU node running CRI-O (``containerd=True`` adds containerd's config too, for the ambiguous case)."""
    host = build_fake_host(root, machine, containerd=1 if containerd else None, deckhouse=False,
                           nvidia_container_runtime=nvidia_container_runtime)
    if crio_conf:
        _write(host, "/etc/crio/crio.conf", CRIO_CONF)
        _write(host, "/etc/crio/crio.conf.d/10-crio.conf", CRIO_10_CONF)
    if crio_binary:
        _write(host, "/usr/bin/crio", f'#!/bin/sh\necho "crio version {CRIO_VERSION}"\n', 0o755)
    _write(host, "/usr/bin/crun", "#!/bin/sh\nexit 0\n", 0o755)
    if conmon:
        _write(host, "/usr/libexec/crio/conmon", "#!/bin/sh\nexit 0\n", 0o755)
    _write(host, "/var/run/crio/crio.sock", "")
    if toolkit_runtimes is not None:
        names = ", ".join(f'"{n}"' for n in toolkit_runtimes)
        _write(host, "/etc/nvidia-container-runtime/config.toml", f"[nvidia-container-runtime]\nruntimes = [{names}]\n")
    return host
