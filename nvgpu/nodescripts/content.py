"""File contents written on the node: the containerd drop-in (nvidia runtime and CDI, both config
layouts), the CRI-O drop-in, the sysctl drop-in and our lines in the NVIDIA toolkit's config (the edit that puts
them there is ``plan.toolkit_config``).

One function renders it for the agent (concrete values) and for the bash script (shell variables
as values), so the two paths write byte-identical files. containerd 1.x (config ``version = 2``)
keeps the CRI settings under ``io.containerd.grpc.v1.cri``; containerd 2.x (``version = 3``) under
``io.containerd.cri.v1.runtime``. Deckhouse's bashible deep-merges drop-ins (``conf.d`` for 1.x,
``conf2.d`` for 2.x) into ``config.toml``, so the drop-in carries only our keys.
"""

from __future__ import annotations

from nvgpu.nodescripts.facts import (
    CDI_SPEC_DIRS,
    CRI_PLUGIN,
    NVIDIA_CONTAINER_RUNTIME,
    NVIDIA_RUNTIME_NAME,
    SYSCTLS,
    TOOLKIT_BLOCK_BEGIN,
    TOOLKIT_BLOCK_END,
    TOOLKIT_ENVVAR_KEY,
    TOOLKIT_VOLUME_MOUNTS_KEY,
)

HEADER = "# Managed by nvidia-gpu (gpu-runtime.sh or the node agent); removed by teardown."


def render_dropin(cri_plugin: str, systemd_cgroup: str, default_runtime_line: str,
                  runtime_binary: str = NVIDIA_CONTAINER_RUNTIME) -> str:
    """The drop-in text. ``systemd_cgroup`` is ``true``/``false``; ``default_runtime_line`` is the
    whole ``default_runtime_name = "nvidia"`` line or empty (runc stays default while the nvidia
    runtime binary is absent, as Deckhouse does)."""
    dirs = ", ".join(f'"{d}"' for d in CDI_SPEC_DIRS)
    base = f'plugins."{cri_plugin}"'
    lines = [
        HEADER,
        f"[{base}]",
        "  enable_cdi = true",
        f"  cdi_spec_dirs = [{dirs}]",
        f"[{base}.containerd]",
    ]
    if default_runtime_line:
        lines.append(f"  {default_runtime_line}")
    lines += [
        f"[{base}.containerd.runtimes.{NVIDIA_RUNTIME_NAME}]",
        '  runtime_type = "io.containerd.runc.v2"',
        "  privileged_without_host_devices = false",
        f"[{base}.containerd.runtimes.{NVIDIA_RUNTIME_NAME}.options]",
        f'  BinaryName = "{runtime_binary}"',
        f"  SystemdCgroup = {systemd_cgroup}",
    ]
    return "\n".join(lines) + "\n"


def dropin_for(config_version: int, systemd_cgroup: bool, nvidia_default: bool,
               runtime_binary: str = NVIDIA_CONTAINER_RUNTIME) -> str:
    """``runtime_binary``: the nvidia runtime's binary (the node's own, or a toolkit container's install)."""
    default = f'default_runtime_name = "{NVIDIA_RUNTIME_NAME}"' if nvidia_default else ""
    return render_dropin(CRI_PLUGIN[config_version], "true" if systemd_cgroup else "false", default, runtime_binary)


def render_crio_dropin(monitor_path: str | None, runtime_binary: str = NVIDIA_CONTAINER_RUNTIME) -> str:
    """The CRI-O drop-in (``/etc/crio/crio.conf.d/99-nvidia.conf``): the nvidia runtime handler, as
    ``nvidia-ctk runtime configure --runtime=crio`` registers it, made the default (as the containerd
    drop-in does), and the CDI spec dirs (CRI-O's defaults, spelled out as for containerd).
    ``monitor_path`` is conmon's path (``${conmon}`` in the script) or None to let CRI-O find it.
    Only written when the nvidia runtime binary exists: CRI-O will not start with a handler whose
    ``runtime_path`` is missing."""
    dirs = ", ".join(f'"{d}"' for d in CDI_SPEC_DIRS)
    lines = [
        HEADER,
        "[crio.runtime]",
        f'  default_runtime = "{NVIDIA_RUNTIME_NAME}"',
        f"  cdi_spec_dirs = [{dirs}]",
        f"[crio.runtime.runtimes.{NVIDIA_RUNTIME_NAME}]",
        f'  runtime_path = "{runtime_binary}"',
        '  runtime_type = "oci"',
    ]
    if monitor_path is not None:
        lines.append(f'  monitor_path = "{monitor_path}"')
    return "\n".join(lines) + "\n"


def sysctl_dropin() -> str:
    """``/etc/sysctl.d`` drop-in with the sysctls the NVIDIA container toolkit needs."""
    body = "".join(f"{name} = {value}\n" for name, value in SYSCTLS.items())
    return f"{HEADER}\n{body}"


def toolkit_block(accept_envvar: bool) -> list[str]:
    """Our lines at the top of the toolkit's config. ``accept_envvar`` is true only for a node group that
    chose the device plugin's ``envvar`` strategy, which cannot work without it."""
    return [
        TOOLKIT_BLOCK_BEGIN,
        f"{TOOLKIT_ENVVAR_KEY} = {'true' if accept_envvar else 'false'}",
        f"{TOOLKIT_VOLUME_MOUNTS_KEY} = true",
        TOOLKIT_BLOCK_END,
    ]
