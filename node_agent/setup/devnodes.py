"""The NVIDIA device nodes, made the way NVIDIA's tools make them: nothing else on a node does.

The ``nvidia`` kernel module registers its character devices (``/proc/devices``) but makes no ``/dev`` node;
``nvidia_uvm`` is not loaded at boot by anything but the first CUDA program (through the setuid
``nvidia-modprobe``). So on a freshly booted node ``/dev/nvidia-uvm`` and often ``/dev/nvidiactl`` and
``/dev/nvidia<N>`` are absent, and the MIG capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of a new GPU or
compute instance appear only when something makes them. NVIDIA's stack makes them itself:

- ``nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules`` (nvidia-container-toolkit
  ``cmd/nvidia-ctk/system/create-device-nodes``, ``internal/system/nvdevices/control-device-nodes.go``,
  ``internal/system/nvmodules/modules.go``): ``modprobe`` the modules, then ``nvidiactl`` (minor 255) and
  ``nvidia-modeset`` (254) under the ``nvidia`` major (``nvidia-frontend`` before driver 550.40),
  ``nvidia-uvm`` (0) and ``nvidia-uvm-tools`` (1) under the ``nvidia-uvm`` major, majors read from
  ``/proc/devices`` (``internal/info/proc/devices/devices.go``), and the ``nvidia-caps`` ``config`` and
  ``monitor`` nodes with the minors of ``/proc/driver/nvidia-caps/mig-minors`` (``internal/nvcaps``); a node
  already there is left as it is (``mknod.go``);
- the MIG manager runs it (and ``nvidia-smi``, whose ``nvidia-modprobe`` makes the caps nodes) after every
  change (mig-parted ``Reconfigure.handleCDI`` / ``runNvidiaSMI``), so the new instances' caps nodes exist.

Here the same: what is loaded and which nodes are wanted, with their numbers, modes and messages, is one plan,
``nvgpu.nodescripts.plan.DEVICES``, applied by the agent's plan interpreter (``node_agent.setup.executor.
apply_devices``: ``HostRoot.make_char_device``, mknod(2), and the host's ``modprobe``) under the step's lock. Every
node made is first recorded in the setup journal (feature ``devnodes``), so :func:`rollback` removes exactly the
nodes made and never one the driver or an admin made. On Deckhouse, bashible's ``gpu-devices.sh`` is the same plan
rendered as bash (``nvgpu.nodescripts.bashplan.render_devices``) and writes the same journal, so this module's
:func:`rollback` undoes it too.
"""

from __future__ import annotations

from collections.abc import Iterable

from node_agent.host.proc import parse_proc_devices
from node_agent.host.root import HostRoot
from node_agent.setup.executor import DevicesResult, apply_devices, rollback_devices
from nvgpu.nodescripts.plan import DEVICES

__all__ = ["FEATURE", "Result", "ensure", "parse_proc_devices", "rollback"]
#: The step's journal feature and lock name.
FEATURE = DEVICES.name
Result = DevicesResult


def ensure(host: HostRoot, *, load_modules: bool = True, mig_caps: Iterable[str] = ()) -> Result:
    """Load ``nvidia-uvm`` (``load_modules``), then make every wanted node that is absent, each recorded in the
    journal before it is made. ``mig_caps``: ``mig-minors`` keys (``gpu0/gi1/access``) of instances that exist,
    whose caps nodes are wanted as well. Idempotent: a second run makes nothing."""
    with host.lock(FEATURE):
        return apply_devices(host, DEVICES, load_modules=load_modules, mig_caps=mig_caps)


def rollback(host: HostRoot) -> list[str]:
    """Remove the nodes :func:`ensure` (or ``gpu-devices.sh``) made, and the directories made for them; nothing
    else."""
    with host.lock(FEATURE):
        return rollback_devices(host, DEVICES)
