#!/usr/bin/python3 -I
"""``runc`` of a simulated GPU node: each container gets the node's kernel view of its GPUs in ``/sys``.

On a GPU node sysfs is the kernel's and the same in every container: a pod that mounts nothing from the host
still finds the GPUs' PCI functions in ``/sys/bus/pci/devices`` (NVIDIA's GPU feature discovery and our
labeller read them there) and the driver's modules in ``/sys/module``. Here the GPUs exist only in the node's
mount namespace, as overlays on this machine's sysfs (:mod:`localcluster.node`), and runc gives each
container a fresh sysfs mount, which is this machine's. So the node's runc is this program: for ``create`` and
``run`` it adds read-only binds of the node's ``/sys/devices``, ``/sys/bus/pci/devices``, ``/sys/module`` and
``/sys/class`` (its DMI board name) over the container's fresh ``/sys`` (right after the sysfs mount in the
bundle's ``config.json``), read-only where that ``/sys`` is (every container but a privileged one, whose sysfs
containerd mounts writable: the MIG manager writes the node's MIG state there,
``localcluster.node.MIG_STATE_PATH``); and the node's driver entries in procfs (:data:`PROC_VIEW`, through a
hook: see :data:`PROC_HOOK`) over its fresh ``/proc``, read-only; then
executes the real runc with the same arguments. Nothing else in the spec changes, and a container that asks
for no ``/sys`` gets none. The NVIDIA runtime finds it as ``runc`` on containerd's ``PATH``, so its containers
get the same.

Standard library only, run by the node's ``/usr/bin/python3`` (``-I``: nothing from the environment).
``@RUNC@`` is the real runc, filled in by :mod:`localcluster.node` when it installs this file.
"""

import json
import os
import sys

RUNC = "@RUNC@"
#: The node's sysfs entries that are not this machine's (its GPU functions, their links, the driver's modules).
KERNEL_VIEW = ("/sys/devices", "/sys/bus/pci/devices", "/sys/module", "/sys/class")
#: The node's procfs entries: the driver's ``/proc/driver`` (``nvidia/``, and ``nvidia-caps/mig-minors``, where a
#: MIG device plugin finds its capabilities' minors) and ``/proc/devices`` (its majors), and the node's boot ID
#: (a reboot changes it; agents and the node's NVML key state on it).
PROC_VIEW = ("/proc/driver", "/proc/devices", "/proc/sys/kernel/random/boot_id")
#: runc refuses a spec mount over ``/proc`` whose source is not procfs ("check proc-safety"), and the node's
#: entries are binds of files: a ``createContainer`` hook, which runc runs in the container's mount namespace
#: after its mounts and before ``pivot_root``, binds them read-only over the container's fresh procfs instead.
PROC_HOOK = """set -e
for p in {paths}; do
  mount --bind "$p" "{root}$p"
  mount -o remount,bind,ro "{root}$p"
done
"""


def _bundle(args: list[str]) -> str:
    for flag in ("--bundle", "-b"):
        if flag in args[:-1]:
            return args[args.index(flag) + 1]
        for arg in args:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return "."


def add_kernel_view(config_path: str) -> None:
    with open(config_path) as f:
        spec = json.load(f)
    mounts = spec.get("mounts") or []
    at = next((i for i, m in enumerate(mounts) if m.get("destination") == "/sys"), None)
    if at is None or any(m.get("destination") in KERNEL_VIEW for m in mounts):
        return
    mode = "ro" if "ro" in (mounts[at].get("options") or []) else "rw"
    binds = [{"destination": path, "type": "bind", "source": path,
              "options": ["rbind", mode, "nosuid", "nodev", "noexec"]} for path in KERNEL_VIEW]
    spec["mounts"] = mounts[:at + 1] + binds + mounts[at + 1:]
    if any(m.get("destination") == "/proc" and m.get("type") == "proc" for m in mounts):
        root = os.path.join(os.path.dirname(config_path), spec.get("root", {}).get("path", "rootfs"))
        hooks = spec.setdefault("hooks", {}).setdefault("createContainer", [])
        hooks.append({"path": "/bin/sh", "args": ["sh", "-c", PROC_HOOK.format(paths=" ".join(PROC_VIEW),
                                                                                  root=os.path.abspath(root))]})
    tmp = config_path + ".kernelview"
    with open(tmp, "w") as f:
        json.dump(spec, f)
    os.replace(tmp, config_path)


def main() -> None:
    args = sys.argv[1:]
    if "create" in args or "run" in args:
        add_kernel_view(os.path.join(_bundle(args), "config.json"))
    os.execv(RUNC, [RUNC, *args])


if __name__ == "__main__":
    main()
