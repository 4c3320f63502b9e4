"""Fault injection on simulated machines: init failure, lost and hung GPUs, XID events, processes."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import pynvml
import pytest

from node_agent.nvml import (
    DeviceLost,
    EventKind,
    NvmlBackend,
    NvmlNotSupported,
    NvmlTimeout,
    NvmlUnavailable,
    open_nvml,
)
from node_agent.nvml.calls import CallRunner
from nvml_sim import SimulatedMachine, install, uninstall
from nvml_sim.state import SimProcess, SimStateError


def _backend(machine: SimulatedMachine) -> NvmlBackend:
    return NvmlBackend("simulated", machine.spec.name, machine.store.path)


@pytest.fixture
def h100(tmp_path: Path) -> SimulatedMachine:
    return SimulatedMachine("dgx-h100", tmp_path / "dgx-h100.json")


@pytest.mark.parametrize("error", ["driver-not-loaded", "library-not-found", "lib-rm-version-mismatch"])
def test_init_failure_is_nvml_unavailable_with_cause(h100: SimulatedMachine, error: str) -> None:
    h100.fail_init(error)  # type: ignore[arg-type]
    with pytest.raises(NvmlUnavailable) as info, open_nvml(_backend(h100)):
        pass
    assert isinstance(info.value.__cause__, pynvml.NVMLError)


def test_real_backend_without_driver_is_unavailable() -> None:
    if pynvml.nvmlLib is not None:
        pytest.skip("an NVML library is loaded in this process")
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has a real NVML")
    with pytest.raises(NvmlUnavailable, match="Not Found"), open_nvml("real"):
        pass
    assert pynvml.nvmlLib is None


def test_lost_gpu_stays_per_device(h100: SimulatedMachine) -> None:
    h100.lose_gpu(5)
    with open_nvml(_backend(h100)) as nvml:
        inv = nvml.inventory()
        assert [g.index for g in inv.gpus] == [0, 1, 2, 3, 4, 6, 7]
        assert [lost.index for lost in inv.lost] == [5]
        assert "GPU is lost" in inv.lost[0].reason
        with pytest.raises(DeviceLost) as info:
            nvml.gpu(5)
        assert isinstance(info.value.__cause__, pynvml.NVMLError_GpuIsLost)
        with pytest.raises(DeviceLost):
            nvml.gpus()


def test_hung_gpu_times_out_and_later_calls_still_work(h100: SimulatedMachine) -> None:
    with open_nvml(_backend(h100), timeout_s=0.2) as nvml:
        h100.hang_gpu(2)
        started = time.monotonic()
        with pytest.raises(NvmlTimeout, match=r"within 0\.2s"):
            nvml.gpu(2)
        assert time.monotonic() - started < 2
        inv = nvml.inventory()
        assert [lost.index for lost in inv.lost] == [2]
        h100.hang_gpu(2, False)
        assert nvml.gpu(2).index == 2
        assert nvml.gpu(3).index == 3


def test_xid_event_reaches_the_watcher(h100: SimulatedMachine) -> None:
    with open_nvml(_backend(h100)) as nvml, nvml.watch_events([0, 1]) as watcher:
        assert watcher.failed == {}
        assert watcher.wait(0.01) is None
        h100.inject_xid(3, 48)  # not watched
        h100.inject_xid(1, 79)
        h100.inject_event(0, "double-bit-ecc", 0, gi_id=2, ci_id=0)
        first = watcher.wait(1.0)
        second = watcher.wait(1.0)
        uuid1 = nvml.gpu(1).uuid
    assert first is not None and second is not None
    assert (first.gpu_index, first.gpu_uuid, first.kind, first.data, first.gi_id) == (1, uuid1, EventKind.XID, 79, None)
    assert (second.gpu_index, second.kind, second.gi_id, second.ci_id) == (0, EventKind.DOUBLE_BIT_ECC, 2, 0)


def test_event_from_another_thread_wakes_a_waiting_watcher(h100: SimulatedMachine) -> None:
    with open_nvml(_backend(h100)) as nvml, nvml.watch_events([4]) as watcher:
        timer = threading.Timer(0.05, h100.inject_xid, args=(4, 94))
        timer.start()
        event = watcher.wait(2.0)
        timer.join()
    assert event is not None and (event.gpu_index, event.data) == (4, 94)


def test_watcher_reports_gpus_that_cannot_register(h100: SimulatedMachine) -> None:
    h100.lose_gpu(7)
    with open_nvml(_backend(h100)) as nvml, nvml.watch_events() as watcher:
        assert list(watcher.failed) == [7]
        assert "lost" in watcher.failed[7]


def test_processes_show_a_gpu_in_use(h100: SimulatedMachine) -> None:
    h100.set_processes(1, [SimProcess(pid=4242, used_mib=1024), SimProcess(pid=4343)])
    with open_nvml(_backend(h100)) as nvml:
        assert nvml.processes(0) == ()
        procs = nvml.processes(1)
    assert [(p.pid, p.used_mib, p.gi_id) for p in procs] == [(4242, 1024, None), (4343, None, None)]


def test_overrides_for_bad_nodes(tmp_path: Path) -> None:
    t4 = SimulatedMachine("t4x1", tmp_path / "t4.json")
    t4.set_driver_version("418.67")
    t4.override_gpu(0, name="Tesla M60", compute_capability=(5, 2))
    with open_nvml(_backend(t4)) as nvml:
        gpu = nvml.gpu(0)
        assert nvml.driver().driver_version == "418.67"
    assert (gpu.name, gpu.compute_capability, gpu.architecture) == ("Tesla M60", (5, 2), "maxwell")


def test_function_missing_from_the_library_is_not_supported() -> None:
    with open_nvml("simulated:t4x1") as nvml:
        with pytest.raises(NvmlNotSupported):
            nvml._run("nvmlDeviceGetBoardId", pynvml.nvmlDeviceGetBoardId, nvml._handle(0))
        assert nvml.mig_mode(0) is None


def test_raw_pynvml_insufficient_buffer_and_uninitialised(h100: SimulatedMachine) -> None:
    lib = install(h100.store)
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        buf = ctypes.create_string_buffer(4)
        fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetName")
        assert fn(handle, buf, ctypes.c_uint(4)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        assert pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(handle))
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(8)
        pynvml.nvmlShutdown()
    finally:
        uninstall(lib)


def test_corrupt_state_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"machine": "dgx-h100", "gpus": [], "colour": 1}')
    with pytest.raises(SimStateError, match="colour"):
        SimulatedMachine("dgx-h100", path)
    path.write_text('{"machine": "l4x2", "gpus": [{}, {}]}')
    with pytest.raises(SimStateError, match="not 'dgx-h100'"):
        SimulatedMachine("dgx-h100", path)


def test_closing_a_watcher_mid_wait_returns_at_once_and_frees_the_set_after_the_wait(
        h100: SimulatedMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device plugin restarting for a kubelet restart closes its event set while its health monitor waits
    on it: the close must not sit out the wait, and the set must not be freed under it."""
    real_wait, real_free = pynvml.nvmlEventSetWait, pynvml.nvmlEventSetFree
    in_wait, freed_during_wait = threading.Event(), []

    def wait(event_set: object, ms: int) -> object:
        in_wait.set()
        try:
            return real_wait(event_set, ms)
        finally:
            in_wait.clear()

    def free(event_set: object) -> None:
        freed_during_wait.append(in_wait.is_set())
        real_free(event_set)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait", wait)
    monkeypatch.setattr(pynvml, "nvmlEventSetFree", free)
    with open_nvml(_backend(h100)) as nvml:
        watcher = nvml.watch_events([0])
        waiter = threading.Thread(target=watcher.wait, args=(1.0,))
        waiter.start()
        assert in_wait.wait(5)
        t0 = time.monotonic()
        watcher.close()
        took = time.monotonic() - t0
        assert took < 0.5 and freed_during_wait == [], "the close waited for the wait, or freed under it"
        waiter.join(5)
        assert freed_during_wait == [False], "freed once, after the wait"
        assert watcher.wait(0.01) is None
        watcher.close()
    assert freed_during_wait == [False]


def test_a_gpu_read_is_one_job_on_the_call_runner(h100: SimulatedMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's read (a dozen NVML calls, dozens with MIG devices) is one handoff to the runner's thread, not
    one per call: the DRA plugin reads every GPU this way every few seconds. Its calls still run under the
    runner's deadline, as one."""
    jobs: list[str] = []
    real = CallRunner._bounded

    def counted(self: CallRunner, what: str, fn: object, args: tuple[object, ...], budget: float) -> object:
        jobs.append(what)
        return real(self, what, fn, args, budget)  # type: ignore[arg-type]

    monkeypatch.setattr(CallRunner, "_bounded", counted)
    with open_nvml(_backend(h100)) as nvml:
        nvml.gpu(0)
        jobs.clear()
        gpu = nvml.gpu(1)
        assert jobs == ["read GPU 1"] and gpu.index == 1
