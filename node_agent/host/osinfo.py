"""The node's OS release and kernel, as Node Feature Discovery labels them, and whether its driver is its own.

Node setup publishes these before its check (``nvgpu.labels.OS_LABELS``): a driver container is chosen by
them, and it has to run before the check can pass. ``ID`` and ``VERSION_ID`` come from os-release(5),
the kernel from ``/proc/sys/kernel/osrelease`` (``uname -r``).
"""

from __future__ import annotations

import shlex

from node_agent.host.root import HostRoot
from nvgpu import labels
from nvgpu.k8snames import label_value_problem
from nvgpu.nodescripts import facts


def os_release(host: HostRoot) -> dict[str, str]:
    """os-release(5)'s ``KEY=value`` pairs (quotes removed), from the first file that exists; {} if none."""
    for path in facts.OS_RELEASE_FILES:
        text = host.read_text_or_none(path)
        if text is None:
            continue
        out: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if not sep or key.startswith("#"):
                continue
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            out[key] = words[0] if words else ""
        return out
    return {}


def kernel_release(host: HostRoot) -> str | None:
    text = host.read_text_or_none(facts.KERNEL_RELEASE_FILE)
    return text.strip() or None if text is not None else None


def os_labels(host: HostRoot) -> dict[str, str | None]:
    """NFD's OS and kernel labels for this node; a value a label cannot hold is left off (None)."""
    release = os_release(host)
    values = {labels.OS_RELEASE_ID: release.get("ID"), labels.OS_RELEASE_VERSION_ID: release.get("VERSION_ID"),
              labels.KERNEL_VERSION_FULL: kernel_release(host)}
    return {k: v if v and label_value_problem(v) is None else None for k, v in values.items()}


def host_driver_installed(host: HostRoot) -> bool:
    """A driver installed on the host itself (its nvidia-smi on the host's path), not by a driver container."""
    return any(host.exists(p) for p in facts.HOST_DRIVER_MARKERS)
