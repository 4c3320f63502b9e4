"""One ``device-plugin`` process's pieces run in-process against the kit's kubelet: what the live
config-switch tests (a label read from a stub, or watched on an API server) start alike."""

from __future__ import annotations

import argparse
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from node_agent import nvml
from node_agent.cli import device_plugin as device_plugin_cli
from node_agent.deviceplugin.nodelabel import LabelSource
from node_agent.host import HostRoot
from node_agent.kubelet.deviceplugin import process as device_plugin_cmd
from tests.kit.fakehost import build_fake_host
from tests.kit.kubelet.deviceplugin import DevicePluginKubelet

#: A config that time-slices every GPU two ways under a renamed resource (``nvidia.com/gpu.shared``).
TS = ("version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n"
      "    resources:\n    - name: gpu\n      replicas: 2\n")
MACHINE = "l4x2"


@contextmanager
def switching_plugin(tmp_path: Path, sock_dir: Path, labels: LabelSource, *, default: str,
                     poll_interval: str) -> Iterator[tuple[device_plugin_cmd.PluginProcess, DevicePluginKubelet]]:
    """The plugin process on a simulated :data:`MACHINE` with two named configs, ``default`` (plain) and
    ``shared`` (:data:`TS`), chosen by ``labels``; its supervisor running and its config watcher polling the
    files every ``poll_interval`` seconds; registered with a started kubelet stand-in on ``sock_dir``.
    Stopped (supervisor, process, kubelet) on the way out."""
    configs = tmp_path / "available"
    configs.mkdir()
    (configs / default).write_text("version: v1\n")
    (configs / "shared").write_text(TS)
    host = build_fake_host(tmp_path / "host", MACHINE)
    p = argparse.ArgumentParser()
    device_plugin_cli.add_arguments(p)
    args = p.parse_args(["--config-dir", str(configs), "--socket-dir", str(sock_dir), "--metrics-port", "0",
                         "--config-poll-interval", poll_interval])
    args.host_root = str(host.root)
    kubelet = DevicePluginKubelet(sock_dir)
    kubelet.start()
    with nvml.open_nvml(nvml.NvmlBackend.parse(f"simulated:{MACHINE}")) as session:
        proc = device_plugin_cmd.PluginProcess(device_plugin_cli.options(args), {}, session, labels,
                                               host=HostRoot(args.host_root))
        t = threading.Thread(target=proc.supervisor.run, daemon=True)
        t.start()
        proc.watcher.start()
        try:
            yield proc, kubelet
        finally:
            proc.supervisor.request_stop()
            t.join(10)
            proc.close()
            kubelet.stop()
