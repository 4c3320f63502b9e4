"""Node-setup scripts for Deckhouse ``NodeGroupConfiguration`` resources, and the facts they share
with the node agent's Python path.

API (for the components)::

    from nvgpu.nodescripts import NodeScript, render_node_scripts

    scripts: list[NodeScript] = render_node_scripts(vfio=dra_mode)
    for s in scripts:  # frozen dataclass: name, weight, content
        NodeGroupConfiguration(name=f"{group}-{s.name}", spec={"weight": s.weight,
            "content": s.content, "nodeGroups": [group], "bundles": ["*"]})

* ``gpu-devices.sh`` (weight 24): on a freshly booted node, ``modprobe nvidia-uvm`` (when ``nvidia`` is loaded
  and it is not) and ``mknod`` the missing ``/dev/nvidiactl``, ``nvidia-modeset``, ``nvidia-uvm``,
  ``nvidia-uvm-tools``, ``/dev/nvidia<minor>`` and ``/dev/nvidia-caps/nvidia-cap{config,monitor}`` with the
  kernel's majors (``/proc/devices``) and minors, as ``nvidia-ctk system create-device-nodes`` and the agent's
  setup (``node_agent.setup.devnodes``) do (both from ``plan.DEVICES``), each recorded first in the agent's
  setup journal (``/var/lib/nvidia-gpu-agent/rollback/devnodes/manifest.json``), so the agent's teardown
  removes exactly those. Prints ``nvidia-gpu-devices result=ok|failed loaded=… made=…``; a failure (``nvidia-uvm`` that
  cannot be loaded) is left to the check, which finds it missing, unless rendered with ``strict_check=True``.
* ``gpu-check.sh`` (weight 25): the node check (it reports device nodes, never makes them). Silent
  success without an NVIDIA GPU; otherwise it checks the driver version (catalogue minima), kernel
  modules, device nodes, ``nvidia-smi`` (each call bounded by ``timeout -k 5 15``) and compute
  capability, writes its verdict to
  ``/var/lib/nvidia-gpu-agent/check.verdict`` and prints ``nvidia-gpu-check verdict=… reasons=…``.
  It exits 0 (it must not block bashible) unless rendered with ``strict_check=True``.
* ``gpu-runtime.sh`` (31): the containerd drop-in (nvidia runtime, ``enable_cdi``, CDI spec dirs)
  in ``conf.d`` (containerd 1.x) or ``conf2.d`` (2.x), before bashible merges them (step 032).
* ``gpu-vfio.sh`` (35, only with ``vfio=True`` for DRA mode): VFIO modules, IOMMU check, label
  ``node.deckhouse.io/gpu-vfio-ready``.
* ``gpu-sysctl.sh`` (40): ``net.core.bpf_jit_harden=1`` drop-in and live value (the previous value
  is kept in the agent state dir for rollback), then sets ``node.deckhouse.io/gpu-setup-complete``
  when the check said ok and the runtime is ready, and removes it otherwise.

Steps declared once as plans (``plan``: the sysctl, VFIO and device-node steps, the runtime's drop-in, the toolkit
config's block, the check's requirements and judgements) are rendered into these scripts by ``bashplan`` and
applied by the agent's ``node_agent.setup.executor``; the rest is written per backend from shared ``facts`` and
``content`` (docs/node-setup.md).

``root_prefix`` (default ``""``) is the default of ``$NVIDIA_GPU_ROOT``, which prefixes every host
path; ``check_phase="all"`` makes the check also require a ready runtime. Commands come from PATH.
"""

from nvgpu.nodescripts.render import WEIGHTS, NodeScript, render_node_scripts

__all__ = ["WEIGHTS", "NodeScript", "render_node_scripts"]
