"""Peak RSS of every agent process that talks to the Kubernetes API, against one loopback API server.

The agent's Kubernetes layer (``node_agent.kube``) is shared by five processes: the device plugin (its
node label watch), the DRA kubelet plugin, the MIG manager, the labeller loop and the one-shot
``labels --patch-node``. Each runs here as its own process on a simulated DGX H100 and a fake host
root, exactly as its DaemonSet runs it, with ``--kubeconfig`` naming a kmock emulator on loopback
(``tests.kit.kmock``). Long-running ones are sampled (``VmHWM``) after ``SETTLE_S``; the one-shot
command's peak RSS comes from GNU time (a child of this process would inherit its high-water mark).
Run: ``python bench/bench_agent_memory.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.kit.fakehost import build_fake_host  # noqa: E402
from tests.kit.kmock import fake_api_server, kubeconfig  # noqa: E402

NODE = "gpu-node-1"
SETTLE_S = float(os.environ.get("BENCH_SETTLE_S", "6"))
MIG_CONFIG = "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n"


def vm_hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def long_running(argv: list[str], env: dict[str, str]) -> str:
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(SETTLE_S)
        if proc.poll() is not None:
            return f"exited {proc.returncode}"
        return f"{vm_hwm_mib(proc.pid):.1f} MiB"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def one_shot(argv: list[str], env: dict[str, str]) -> str:
    timer = shutil.which("time", path="/usr/bin:/bin")
    if not timer:
        return "no /usr/bin/time"
    proc = subprocess.run([timer, "-f", "maxrss_kib=%M", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    kib = int(re.findall(r"maxrss_kib=(\d+)", proc.stderr)[-1])
    return f"{kib / 1024:.1f} MiB" + ("" if proc.returncode == 0 else f" (exit {proc.returncode})")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp, fake_api_server() as server:
        work = Path(tmp)
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE, "labels": {"nvidia.com/mig.config": "all-disabled"}}}
        req = urllib.request.Request(f"{server.url}/api/v1/nodes", data=json.dumps(node).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
        kcfg = kubeconfig(server.url, work / "kubeconfig")
        host = build_fake_host(work / "host", "dgx-h100", containerd=2)
        configs = work / "configs"
        configs.mkdir()
        (configs / "default").write_text("version: v1\n")
        (work / "mig.yaml").write_text(MIG_CONFIG)
        (work / "dp").mkdir()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_ARENA_MAX": "2", "KUBECONFIG": "",
               "NODE_NAME": NODE}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        base = [sys.executable, "-m", "node_agent", "--host-root", str(host.root), "--host-exec", "direct",
                "--nvml", "simulated:dgx-h100", "--node-name", NODE, "--kubeconfig", str(kcfg)]
        rows = {
            "device plugin (label watch)": long_running(
                [*base, "device-plugin", "--socket-dir", str(work / "dp"), "--metrics-port", "0",
                 "--config-dir", str(configs), "--default-config", "default"], env),
            "device plugin (one fixed config)": long_running(
                [*base, "device-plugin", "--socket-dir", str(work / "dp"), "--metrics-port", "0"], env),
            "DRA kubelet plugin": long_running([*base, "dra-driver"], env),
            "MIG manager": long_running([*base, "mig-manager", "--config", str(work / "mig.yaml")], env),
            "labeller (--loop --patch-node)": long_running(
                [*base, "labels", "--no-output-file", "--patch-node", "--loop", "--interval", "2"], env),
            "labels --patch-node (one-shot)": one_shot([*base, "labels", "--no-output-file", "--patch-node"], env),
            "python -c pass (floor)": one_shot([sys.executable, "-c", "pass"], env),
        }
    print(f"peak RSS per agent process (VmHWM after {SETTLE_S:g} s, or GNU time for one-shots)")
    for name, value in rows.items():
        print(f"  {name:<34} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
