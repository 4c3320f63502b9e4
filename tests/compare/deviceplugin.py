"""The device plugin side by side: NVIDIA's ``nvidia-device-plugin`` and our ``device-plugin`` on one mock
machine, each registering with its own kubelet stand-in (the real gRPC protocol), compared on what the
kubelet sees: resource names, device IDs, health and NUMA topology from ListAndWatch, and the Allocate
response (envs, mounts, device specs, annotations, CDI devices) for the same request."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from tests.compare.gfd import DATA
from tests.compare.peers import Difference, Machine, namespaced
from tests.deviceplugin.kubelet_standin import KubeletStandIn

RESOURCE = "nvidia.com/gpu"
#: Device lists NVIDIA's plugin joins in Go map order (a different order on every call), compared as sets.
UNORDERED_ENVS = ("NVIDIA_VISIBLE_DEVICES",)
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass(frozen=True)
class Case:
    name: str
    flags: tuple[str, ...]  #: the same NVIDIA flags for both sides
    config: Path | None = None
    #: A MIG layout NVIDIA's mig-parted applies first (:func:`~tests.compare.peers.with_mig`), and the resource
    #: whose devices are allocated then.
    mig_config: str | None = None
    resource: str = RESOURCE


CASES = (
    Case("envvar-uuid", ("--device-list-strategy", "envvar", "--device-id-strategy", "uuid")),
    Case("envvar-index", ("--device-list-strategy", "envvar", "--device-id-strategy", "index")),
    Case("volume-mounts", ("--device-list-strategy", "volume-mounts", "--device-id-strategy", "uuid")),
    Case("device-specs", ("--device-list-strategy", "envvar", "--pass-device-specs=true")),
    Case("time-slicing", ("--device-list-strategy", "envvar"), DATA / "nvidia-device-plugin-config-time-slicing.yaml"),
)
#: On a MIG layout (NVIDIA's ``all-balanced``): each profile its own resource (``mixed``), or MIG devices as
#: ``nvidia.com/gpu`` (``single``, which needs one profile everywhere: ``all-3g`` is 2 x 3g per GPU).
MIG_CASES = (
    Case("mig-mixed", ("--mig-strategy", "mixed", "--device-list-strategy", "envvar"), mig_config="all-balanced",
         resource="nvidia.com/mig-1g"),  # the machine's 1-slice profile (the test names it)
    Case("mig-single", ("--mig-strategy", "single", "--device-list-strategy", "envvar"), mig_config="uniform"),
)


@dataclass
class Seen:
    """What one plugin showed its kubelet."""

    registered: list[str]
    seconds_to_register: float
    devices: dict[str, str]
    topology: dict[str, list[int]]
    allocate: dict[str, Any]


def _watch(kubelet_dir: Path, argv: list[str], env: dict[str, str], log: Path, resource: str = RESOURCE) -> Seen:
    kubelet = KubeletStandIn(kubelet_dir)
    kubelet.start()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    start = time.monotonic()
    try:
        try:
            kubelet.wait_registered({resource}, timeout=30)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{log.read_text()[-3000:]}") from None
        took = time.monotonic() - start
        time.sleep(0.5)  # a plugin registers its resources one after the other: let the rest arrive
        ep = kubelet.wait_devices(resource, bool, timeout=10)
        ids = sorted(ep.devices)
        response = kubelet.allocate(resource, ids[:2])
        doc = json.loads(json_format.MessageToJson(response.container_responses[0]))
        return Seen(sorted({r for _, _, r, _ in kubelet.registrations}), took, dict(ep.devices),
                    {k: list(v) for k, v in ep.topology.items()}, doc)
    finally:
        proc.terminate()
        proc.wait(15)
        kubelet.stop()


def nvidia(m: Machine, case: Case, work: Path) -> Seen:
    kubelet = work / "kubelet-nvidia"
    kubelet.mkdir(parents=True, exist_ok=True)
    argv = [str(m.tools / "nvidia-device-plugin"), "--fail-on-init-error=true", *case.flags,
            *(["--config-file", str(case.config)] if case.config else [])]
    return _watch(kubelet, namespaced(m, argv, {PLUGIN_DIR: kubelet}), m.env(), work / "nvidia.log", case.resource)


def ours(m: Machine, case: Case, work: Path) -> Seen:
    kubelet = work / "kubelet-ours"
    kubelet.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "node_agent", "--host-root", str(m.root), "--nvml", "real", "device-plugin",
            "--socket-dir", str(kubelet), "--metrics-port", "0", "--fail-on-init-error", "true", *case.flags,
            *(["--config-file", str(case.config)] if case.config else [])]
    return _watch(kubelet, argv, m.env(), work / "ours.log", case.resource)


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    elif isinstance(value, list):
        out[prefix] = json.dumps(sorted(value, key=lambda v: json.dumps(v, sort_keys=True)), sort_keys=True)
    else:
        out[prefix] = str(value)


def _items(seen: Seen) -> dict[str, str]:
    """What the kubelet saw, as comparable items: the ListAndWatch view and the Allocate response's fields."""
    items = {"registered": json.dumps(seen.registered), "deviceIDs": json.dumps(sorted(seen.devices)),
             "health": json.dumps(sorted(set(seen.devices.values()))),
             "topology": json.dumps(seen.topology, sort_keys=True)}
    _flatten("allocate", seen.allocate, items)
    for name in UNORDERED_ENVS:
        key = f"allocate.envs.{name}"
        if key in items:
            items[key] = ",".join(sorted(items[key].split(",")))
    return items


def differences(m: Machine, case: Case, a: Seen, b: Seen) -> list[Difference]:
    """Ours (``a``) against NVIDIA's (``b``), item by item (``-``: the item is absent on that side)."""
    left, right = _items(a), _items(b)
    return [Difference("device-plugin", f"{m.name}/{case.name}", k, left.get(k, "-"), right.get(k, "-"))
            for k in sorted(set(left) | set(right)) if left.get(k, "-") != right.get(k, "-")]
