"""File contents written on the node: the containerd drop-in (nvidia runtime and CDI, both config
layouts) and the sysctl drop-in.

One function renders it for the agent (concrete values) and for the bash script (shell variables
as values), so the two paths write byte-identical files. containerd 1.x (config ``version = 2``)
keeps the CRI settings under ``io.containerd.grpc.v1.cri``; containerd 2.x (``version = 3``) under
``io.containerd.cri.v1.runtime``. Deckhouse's bashible deep-merges drop-ins (``conf.d`` for 1.x,
``conf2.d`` for 2.x) into ``config.toml``, so the drop-in carries only our keys.
"""

from __future__ import annotations

from nvgpu.nodescripts.facts import CDI_SPEC_DIRS, CRI_PLUGIN, NVIDIA_CONTAINER_RUNTIME, NVIDIA_RUNTIME_NAME, SYSCTLS

HEADER = "# Managed by nvidia-gpu (gpu-runtime.sh or the node agent); removed by teardown."


def render_dropin(cri_plugin: str, systemd_cgroup: str, default_runtime_line: str) -> str:
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
        f'  BinaryName = "{NVIDIA_CONTAINER_RUNTIME}"',
        f"  SystemdCgroup = {systemd_cgroup}",
    ]
    return "\n".join(lines) + "\n"


def dropin_for(config_version: int, systemd_cgroup: bool, nvidia_default: bool) -> str:
    default = f'default_runtime_name = "{NVIDIA_RUNTIME_NAME}"' if nvidia_default else ""
    return render_dropin(CRI_PLUGIN[config_version], "true" if systemd_cgroup else "false", default)


def sysctl_dropin() -> str:
    """``/etc/sysctl.d`` drop-in with the sysctls the NVIDIA container toolkit needs."""
    body = "".join(f"{name} = {value}\n" for name, value in SYSCTLS.items())
    return f"{HEADER}\n{body}"
