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
    """How the device plugin names the GPUs it allocates to the container (NVIDIA's ``deviceListStrategy``)."""

    #: ``NVIDIA_VISIBLE_DEVICES``: lets any pod take every GPU of its node.
    ENVVAR = "envvar"
    #: ``/dev/null`` volume mounts the toolkit reads (the default).
    VOLUME_MOUNTS = "volume-mounts"
    #: CDI device names in pod annotations.
    CDI_ANNOTATIONS = "cdi-annotations"
    #: CDI devices in the CRI's ``CDIDevices`` field.
    CDI_CRI = "cdi-cri"

    @property
    def is_cdi(self) -> bool:
        return self in (DeviceListStrategy.CDI_ANNOTATIONS, DeviceListStrategy.CDI_CRI)


DEFAULT = (DeviceListStrategy.VOLUME_MOUNTS,)
#: Where the toolkit reads a device list from ``/dev/null`` volume mounts (``volume-mounts``).
VOLUME_MOUNT_ROOT = "/var/run/nvidia-container-devices"


def split(value: object) -> object:
    """NVIDIA's config takes one strategy, a comma list or a list: the names as a list (other values as they are,
    for the caller's validation to refuse)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def check(strategies: list[DeviceListStrategy]) -> list[DeviceListStrategy]:
    """At least one strategy, none twice (a validator for the stack config and the device plugin's config)."""
    if not strategies:
        raise ValueError("must name at least one of " + ", ".join(s.value for s in DeviceListStrategy))
    twice = sorted({s.value for s in strategies if strategies.count(s) > 1})
    if twice:
        raise ValueError(f"names {', '.join(twice)} twice")
    return strategies


def needs_envvar(strategies: Iterable[DeviceListStrategy]) -> bool:
    """Whether the toolkit must honour unprivileged containers' ``NVIDIA_VISIBLE_DEVICES`` for these."""
    return DeviceListStrategy.ENVVAR in set(strategies)
