"""Host paths that both sides must agree on: what the manifests mount is what the agent uses there.

A DaemonSet that mounts ``/var/lib/kubelet/plugins`` and an agent that serves under another directory
deploy fine and never register; so each such path is spelled once, here, and the manifest builders
(``nvidia_gpu.components.manifests``) and the agent (``node_agent``) import it. Node-setup paths (the
agent's state directory, CDI directories, the runtime's configs) are the node scripts' facts,
:mod:`nvgpu.nodescripts.facts`, for the same reason.
"""

from __future__ import annotations

#: kubelet's device-plugin directory: its ``kubelet.sock`` (Registration) and the plugins' sockets.
KUBELET_DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
#: kubelet's PodResources API directory; ``kubelet.sock`` in it answers which pod holds which device.
KUBELET_POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
#: kubelet's plugin directory: each DRA driver's socket lives in ``<dir>/<driver name>/``.
KUBELET_PLUGINS_DIR = "/var/lib/kubelet/plugins"
#: kubelet's plugin watcher directory: the registration sockets it discovers.
KUBELET_PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
#: The device plugin's MPS root: pipes and shared memory per resource, mounted into the plugin and MPS clients.
DEVICE_PLUGIN_MPS_ROOT = "/run/nvidia/mps"
#: The agent's runtime directory on the host (cleared at boot): the DRA driver's MPS daemons live under it.
AGENT_RUN_DIR = "/run/nvidia-gpu-agent"
#: The DRA driver's MPS root (one directory per shared claim).
DRA_MPS_ROOT = f"{AGENT_RUN_DIR}/mps"
#: The DRA driver's MPS daemons' ``/dev/shm`` (its plugin container mounts it there), bind-mounted at
#: ``/dev/shm`` into every MPS claim's containers: a client reaches the server through its segments.
DRA_MPS_SHM = f"{DRA_MPS_ROOT}/shm"
