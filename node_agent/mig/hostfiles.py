"""The MIG manager's host side besides its files: the step lock, GPU reset and reboot.

The journal and the marker files need no adapter: the manager is handed the agent's
:class:`~node_agent.host.HostRoot` itself as its ``StateFiles`` (atomic writes, root-aware paths that
refuse ``..``). The step lock lives beside the journal in the host's state directory: it orders every
process that acts on this node's GPUs for the manager (the manager, its own ``preStop`` hook, a second
manager pod of a rollout gone wrong), since what it protects, the GPUs and the journal, is the host's. In
the container's ``/tmp`` it ordered only one pod's processes, and every manager on a machine running
several simulated nodes shared one lock file. It is taken with the host layer's one lock primitive,
:func:`node_agent.host.atomic.exclusive_lock`, with a timeout.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from node_agent.host import HostError, HostRoot
from node_agent.host.atomic import LockTimeout, exclusive_lock
from node_agent.mig.hardware import ResetUnavailable
from node_agent.mig.journal import JournalError
from nvgpu.nodescripts.facts import STATE_DIR

log = logging.getLogger(__name__)

REBOOT_TIMEOUT_S = 60.0
#: Longer than any one step holds the lock (a GPU reset alone may take ``RESET_TIMEOUT_S``, 120 s, plus
#: its kill grace), so only a wedged holder makes the other side give up: the loop then retries the
#: round, the preStop hook fails with the message instead of outliving the pod's grace period unseen.
STEP_LOCK_TIMEOUT_S = 300.0


#: The step lock, beside the journal on the host.
STEP_LOCK_PATH = f"{STATE_DIR}/mig/step.lock"


class HostStepLock:
    """:class:`~node_agent.mig.executor.StepLock` on :data:`STEP_LOCK_PATH` under the host root."""

    def __init__(self, host: HostRoot, timeout_s: float = STEP_LOCK_TIMEOUT_S) -> None:
        self.path = host.path(STEP_LOCK_PATH)
        self.timeout_s = timeout_s

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        held = contextlib.ExitStack()
        try:  # only acquiring is translated: the step's own errors pass through unchanged
            held.enter_context(exclusive_lock(self.path, self.timeout_s, poll_s=0.05))
        except LockTimeout:
            raise JournalError(f"the MIG step lock {self.path} is still held after {self.timeout_s:.0f}s") from None
        except OSError as e:
            raise JournalError(f"cannot open the MIG step lock {self.path}: {e.strerror or e}") from e
        with held:
            yield


class HostRebooter:
    """Reboot through the host's systemd (only used with ``--allow-reboot``)."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def reboot(self) -> None:
        try:
            self.host.run(["systemctl", "reboot"], timeout_s=REBOOT_TIMEOUT_S)
        except HostError as e:
            raise JournalError(f"cannot reboot: {e}") from e


#: The host systemd units that keep GPUs open, which NVIDIA's MIG manager stops before a MIG mode change and
#: starts again after it (mig-parted ``deployments/systemd/hooks.sh``: ``driver_services``, stopped in reverse
#: order by ``pre-apply-mode`` and started in order by ``apply-exit``). Units a host lacks are skipped.
DEFAULT_HOST_GPU_CLIENTS: tuple[str, ...] = ("nvsm.service", "nvidia-dcgm.service")
#: How long one ``systemctl`` call may take (stopping DCGM waits for it to close the GPUs).
SYSTEMCTL_TIMEOUT_S = 90.0


class HostGpuClients:
    """The host's GPU clients (systemd units) stopped around a GPU reset and started again after it.

    Only the units that were active are stopped, and only those are started again, whatever the reset did:
    the node is left as it was found (mig-parted's hooks do the same with ``systemctl list-unit-files`` and
    its gpu-operator script keeps ``HOST_GPU_CLIENT_SERVICES_STOPPED``)."""

    def __init__(self, host: HostRoot, units: tuple[str, ...] = DEFAULT_HOST_GPU_CLIENTS) -> None:
        self.host = host
        self.units = units

    def _systemctl(self, *args: str) -> int:
        try:
            return self.host.run(["systemctl", *args], timeout_s=SYSTEMCTL_TIMEOUT_S).returncode
        except HostError as e:
            raise ResetUnavailable(f"systemctl {' '.join(args)}: {e}") from e

    def _start(self, unit: str) -> bool:
        try:
            return self._systemctl("start", unit) == 0
        except ResetUnavailable as e:  # starting the rest matters more than this one's error
            log.error("event=host-gpu-client-start-failed unit=%s error=%s", unit, e)
            return False

    @contextlib.contextmanager
    def stopped(self) -> Iterator[tuple[str, ...]]:
        """Stop the active units (in reverse order) for the ``with`` block; yields the ones stopped."""
        active = [u for u in self.units if self._systemctl("is-active", "--quiet", u) == 0]
        stopped: list[str] = []
        try:
            for unit in reversed(active):
                if self._systemctl("stop", unit) != 0:
                    raise ResetUnavailable(f"cannot stop the host's GPU client {unit}: systemctl stop failed")
                log.info("event=host-gpu-client-stopped unit=%s", unit)
                stopped.append(unit)
            yield tuple(reversed(stopped))
        finally:
            failed = [u for u in reversed(stopped) if not self._start(u)]
            for unit in reversed(stopped):
                if unit not in failed:
                    log.info("event=host-gpu-client-started unit=%s", unit)
            if failed:
                log.error("event=host-gpu-client-start-failed units=%s", ",".join(failed))


class HostCommandRunner:
    """Run ``nvidia-smi`` (the GPU reset) on the host, bounded by a timeout."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str]:
        try:
            result = self.host.run(argv, timeout_s=timeout_s)
        except HostError as e:
            return 127, str(e)
        return result.returncode, (result.stderr or result.stdout)
