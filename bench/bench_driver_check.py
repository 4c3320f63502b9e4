"""What the driver pod's check costs a node, on an 8-GPU simulated DGX H100 (the agent's NVML layer).

Every driver pod the stack deploys runs ``setup-monitor --phase host`` beside NVIDIA's driver container,
every 30 s, and node setup's monitor runs ``check`` (phase ``all``) every 5 minutes. Measured in one run,
so the ratios hold on a noisy machine:

* the floor: one NVML session listing the GPUs (what any check must do),
* the driver pod's check (phase ``host``, the declared release, modules and type compared),
* node setup's check (phase ``all``: also the container runtime and the toolkit),

and the share of one CPU the driver pod's check takes at its 30 s interval.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.timing import median_ms  # noqa: E402
from node_agent.host import HostRoot  # noqa: E402
from node_agent.nvml import NvmlBackend, open_nvml  # noqa: E402
from node_agent.setup.check import run_check  # noqa: E402
from nvgpu.driver import DriverExpectation, DriverType, KernelModules, parse_version  # noqa: E402
from nvidia_gpu.components.manifests.driver import CHECK_INTERVAL_S  # noqa: E402
from nvml_sim import provider  # noqa: E402
from tests.kit.fakehost import build_fake_host, sim_state_file  # noqa: E402

provider.register()  # in-process simulated:<machine> sessions, as node_agent.cli registers it

MACHINE = "dgx-h100"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-driver-check-") as tmp:
        host = build_fake_host(Path(tmp) / "host", MACHINE)
        state = sim_state_file(host.root, MACHINE)
        root = HostRoot(host.root)
        backend = NvmlBackend("simulated", MACHINE, state)
        expect = DriverExpectation(parse_version("550.90.07"), KernelModules.OPEN, DriverType.GPU)

        def floor() -> object:
            with open_nvml(backend) as nvml:
                return nvml.inventory()

        def driver_pod() -> object:
            report = run_check(root, lambda: open_nvml(backend), "host", expect)
            assert report.verdict.value == "ok", report.findings
            return report

        def node_setup() -> object:
            return run_check(root, lambda: open_nvml(backend), "all", expect)

        floor_ms, pod_ms, setup_ms = median_ms(floor), median_ms(driver_pod), median_ms(node_setup)
        print(f"NVML floor (list 8 GPUs):        {floor_ms:7.1f} ms")
        print(f"driver pod's check (host):       {pod_ms:7.1f} ms  ({pod_ms / floor_ms:.2f}x the floor)")
        print(f"node setup's check (all):        {setup_ms:7.1f} ms  ({setup_ms / floor_ms:.2f}x the floor)")
        share = pod_ms / (CHECK_INTERVAL_S * 1000) * 100
        print(f"driver pod's check, per {CHECK_INTERVAL_S} s:    {share:7.3f} % of one CPU")


if __name__ == "__main__":
    main()
