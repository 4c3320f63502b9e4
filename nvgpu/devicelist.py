"""How a container is given the GPUs it was allocated: the device plugin's device-list strategies.

One definition for the stack config (``gpu.deviceListStrategy``), the device plugin's config file, the
policy pack and node setup, because the strategy decides what the NVIDIA container toolkit must accept:

* ``volume-mounts`` (the default): the plugin mounts ``/dev/null`` at
  ``/var/run/nvidia-container-devices/<id>`` for each allocated device; the toolkit reads that list
  (``accept-nvidia-visible-devices-as-volume-mounts = true``). A pod cannot forge it without a hostPath
  volume, which Pod Security's baseline level forbids.
* ``cdi-cri`` / ``cdi-annotations``: the plugin names CDI devices and the container runtime injects them.
* ``envvar``: the plugin sets ``NVIDIA_VISIBLE_DEVICES``, which works only while the toolkit honours that
  variable in unprivileged containers, so any pod can set ``NVIDIA_VISIBLE_DEVICES=all`` itself and get
  every GPU of the node, whatever it was allocated. NVIDIA's and Deckhouse's default; ours only on request,
  with a policy-pack warning.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class DeviceListStrategy(StrEnum):
    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"

    @property
    def is_cdi(self) -> bool:
        return self in (DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI)


DEFAULT = (DeviceListStrategy.VOLUME_MOUNTS,)


def needs_envvar(strategies: Iterable[DeviceListStrategy]) -> bool:
    """Whether the toolkit must honour unprivileged containers' ``NVIDIA_VISIBLE_DEVICES`` for these."""
    return DeviceListStrategy.ENVVAR in set(strategies)
