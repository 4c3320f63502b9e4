"""Mutation check of the commands only real hardware runs, and of the driver-file choices in CDI specs.

Each mutant changes one line of the agent the way a plausible slip would (reset every GPU instead of the
listed ones, power off instead of reboot, a constant time-slice level, the driver's tool run outside its
root, an older driver's libraries mounted, ...), runs the tests that pin those paths, and must make at
least one of them fail. The file is restored after each mutant, whatever happens.

    .venv/bin/python bench/mutate_hardware_paths.py        # prints one line per mutant, exits 1 if one survives
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = ["tests/node_agent/test_exec_pinned.py", "tests/node_agent/deviceplugin/test_exec_pinned.py",
         "tests/node_agent/dra/test_exec_pinned.py", "tests/node_agent/host/test_host_layer.py",
         "tests/node_agent/setup/test_vfio_command.py", "tests/node_agent/cdi/test_driver_files.py",
         "tests/node_agent/mig"]

#: (file, original text, mutated text, what the slip would do on a node)
MUTANTS: list[tuple[str, str, str, str]] = [
    ("node_agent/mig/nvmlbackend.py", '[self.nvidia_smi, "-r", "-i", ",".join(g.bus_id for g in gpus)]',
     '[self.nvidia_smi, "-r"]', "MIG reset resets every GPU on the node"),
    ("node_agent/mig/hostfiles.py", '["systemctl", "reboot"]', '["systemctl", "poweroff"]',
     "a MIG mode change powers the node off"),
    ("node_agent/dra/sharing.py", '"--set-timeslice", str(level)', '"--set-timeslice", "0"',
     "every DRA time-slicing claim gets the default slice"),
    ("node_agent/dra/sharing.py", '[self._smi, "-i", uuid, "-c", mode]', '[self._smi, "-c", mode]',
     "compute mode set on every GPU, not the claim's"),
    ("node_agent/dra/sharing.py", 'self._run([self._mps, "-d"], env, "")', 'self._run([self._mps], env, "")',
     "the DRA MPS control daemon is never started"),
    ("node_agent/dra/sharing.py", '{"CUDA_MPS_PIPE_DIRECTORY": self._host.command_path(pipe_dir)}, "quit\\n"',
     '{"CUDA_MPS_PIPE_DIRECTORY": self._host.command_path(pipe_dir)}, ""', "MPS daemons are never stopped"),
    ("node_agent/deviceplugin/mps.py", 'return [*self._env(), MPS_CONTROL, "-d"]', 'return [*self._env(), MPS_CONTROL]',
     "the device plugin's MPS daemon is never started"),
    ("node_agent/setup/vfio.py", 'host.run(["modprobe", module], timeout_s=MODPROBE_TIMEOUT_S)',
     'host.run(["modprobe", "-r", module], timeout_s=MODPROBE_TIMEOUT_S)', "VFIO modules unloaded, not loaded"),
    ("node_agent/setup/vfio.py", 'host.write_kernel(f"{base}/driver_override", override + "\\n")',
     'host.write_kernel(f"{base}/driver_override", "vfio-pci\\n")', "unbind leaves the GPU on vfio-pci"),
    ("node_agent/setup/runtime.py", '["systemctl", "restart", unit]', '["systemctl", "stop", unit]',
     "the container runtime is stopped, not restarted"),
    ("node_agent/host/exec.py",
     'return ["chroot", str(driver.path), "/" + str(tool.relative_to(driver.path)), *argv[1:]]',
     'return [str(tool), *argv[1:]]', "the driver's nvidia-smi runs without the driver's libraries"),
    ("node_agent/host/exec.py", "if argv[0] in DRIVER_BINARIES and not driver.is_own_root:",
     "if not driver.is_own_root:", "any command may come from the driver root"),
    ("node_agent/cdi/driverfiles.py", 'if not (name.startswith("lib") and name.endswith(suffix)):',
     'if not (name.startswith("lib") and ".so." in name):', "an older driver's libraries are mounted too"),
    ("node_agent/cdi/driveredits.py", "if tool is None and lib.soname and lib.soname != name:",
     "if False:", "without the hook, nothing resolves libcuda.so.1"),
    ("node_agent/cdi/driveredits.py",
     "return HookTool(host_path) if seen_at.is_file() and os.access(seen_at, os.X_OK) else None",
     "return HookTool(host_path)", "specs name a hook the node does not have: every container fails"),
]


def run_tests() -> bool:
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS], cwd=REPO,
                          capture_output=True, text=True, check=False)
    return done.returncode == 0


def main() -> int:
    assert run_tests(), "the pinned tests fail without any mutant"
    survivors = 0
    start = time.monotonic()
    for path, old, new, what in MUTANTS:
        file = REPO / path
        original = file.read_text()
        assert original.count(old) == 1, f"{path}: the mutated text must occur once: {old!r}"
        try:
            file.write_text(original.replace(old, new))
            passed = run_tests()
        finally:
            file.write_text(original)
        survivors += passed
        print(f"{'SURVIVED' if passed else 'killed  '}  {path}: {what}")
    print(f"{len(MUTANTS) - survivors}/{len(MUTANTS)} mutants killed in {time.monotonic() - start:.0f} s")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
