"""``python -m node_agent mig-manager`` and ``python -m node_agent mig plan|apply|assert``.

``mig-manager`` is the DaemonSet: it converges its own Node to the layout named by
``nvidia.com/mig.config`` (see :mod:`node_agent.mig.executor`), and ``mig-manager --pre-stop`` is its
``preStop`` hook. ``mig`` is the one-shot tool for operators and tests; it does not touch Kubernetes:

* ``plan``: the instances and placements the named config would create on each GPU;
* ``apply``: apply it now (mode, reset, layout), putting the previous layout back if NVML fails;
* ``assert``: exit 0 when the GPUs already match, 1 with the differences otherwise.

Exit codes (the agent's, see :mod:`node_agent.cli.exitcodes`): 0 success; 1 not applied / failed (reason printed);
2 bad input on the command line (unreadable config file, unknown config name, a layout for another GPU
model); 4 Kubernetes API error; 5 refused: the mode change needs a GPU reset the driver refuses (a
reboot is needed). ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry

from node_agent.cli import exitcodes, simulation
from node_agent.cli.statusflags import add_status_arguments
from node_agent.host import HostError, HostRoot
from node_agent.host.proc import boot_id
from node_agent.kube.errors import KubeError
from node_agent.kube.transport import Kube
from node_agent.mig import apply
from node_agent.mig.executor import MigManager, Settings
from node_agent.mig.hardware import GpuInfo, MigBackend, MigHardwareError, ResetUnavailable, snapshot
from node_agent.mig.hostfiles import (
    DEFAULT_HOST_GPU_CLIENTS,
    HostCommandRunner,
    HostGpuClients,
    HostRebooter,
    HostStepLock,
)
from node_agent.mig.journal import JournalError
from node_agent.mig.kube import KubeNodeApi
from node_agent.mig.machine import DrainMode, Timeouts
from node_agent.mig.nvmlbackend import (
    GpuClients,
    GpuResetter,
    NoGpuClients,
    NvidiaSmiReset,
    NvmlMigBackend,
    SimulatedReset,
)
from node_agent.mig.plan import NodePlan, PlanError, diff, plan
from node_agent.nvml import NvmlBackend, NvmlError, open_nvml, simulator
from node_agent.setup import devnodes
from node_agent.status.server import RegistryRenderer, StatusServer
from nvgpu.migparted import MigPartedConfig, MigPartedError, load_config_text

log = logging.getLogger(__name__)

#: The agent's exit codes as the MIG commands use them: bad input on the command line is a usage error,
#: a mode change that needs a reboot is refused.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_KUBE, EXIT_REBOOT = (
    exitcodes.OK, exitcodes.FAILED, exitcodes.USAGE, exitcodes.KUBE, exitcodes.REFUSED)
#: The MIG manager's status port (exporter 9400, device plugin 9401, DRA plugin 9402).
DEFAULT_METRICS_PORT = 9403


# --- shared plumbing ----------------------------------------------------------------------------------


def _host(args: argparse.Namespace) -> HostRoot:
    root = getattr(args, "host_root", None) or "/"
    chroot = (getattr(args, "host_exec", None) or ("direct" if root == "/" else "chroot")) == "chroot"
    sim = simulation.installed() if root != "/" else None
    if sim is not None and sim.is_simulated_host(Path(root)):  # its device nodes are regular files (no mknod)
        return HostRoot(root, exec_mode="chroot" if chroot else "direct", mknod=sim.device_node_stand_in)
    return HostRoot(root, exec_mode="chroot" if chroot else "direct")


def _device_nodes(args: argparse.Namespace, host: HostRoot, backend: MigBackend) -> Callable[[], None] | None:
    """The manager's :attr:`~node_agent.mig.executor.MigManager.device_nodes`: the caps nodes of the instances
    NVML lists now, and the control nodes, through the host root (``node_agent.setup.devnodes``). None for a
    simulated machine on this machine's own root, whose ``/dev`` is not the simulated node's."""
    simulated = (getattr(args, "nvml", None) or "real").startswith("simulated")
    if not isinstance(backend, NvmlMigBackend) or (simulated and host.is_real_root):
        return None
    nvml_backend = backend

    def make() -> None:
        result = devnodes.ensure(host, load_modules=False, mig_caps=nvml_backend.mig_caps())
        if result.created:
            log.info("event=device-nodes-made paths=%s", ",".join(result.created))
        for problem in result.missing:
            log.warning("event=device-node-missing detail=%r", problem)

    return make


def load_config(path: Path) -> MigPartedConfig:
    try:
        text = path.read_text()
    except OSError as e:
        raise MigPartedError([f"{path}: cannot read: {e.strerror or e}"]) from e
    return load_config_text(text, str(path))


@contextlib.contextmanager
def open_backend(args: argparse.Namespace) -> Iterator[MigBackend]:
    """The NVML facade (real or simulated) wrapped as the MIG manager's backend, with its GPU reset."""
    raw_state = getattr(args, "nvml_state", None)
    state = Path(raw_state) if raw_state else None
    backend = NvmlBackend.parse(getattr(args, "nvml", None) or "real", state)
    host = _host(args)
    if backend.kind == "simulated" and state is None and not host.is_real_root:
        # As every other agent command: the simulated machine's state lives in the host root, so the
        # manager, ``sim`` and the device plugin on the same (fake) host see the same GPUs.
        state = host.path(f"{simulator.get().state_dir}/{backend.machine}.json")
        backend = NvmlBackend("simulated", backend.machine, state)
    resetter: GpuResetter
    if backend.kind == "simulated":
        assert backend.machine is not None
        resetter = SimulatedReset(backend.machine, state)
    else:
        resetter = NvidiaSmiReset(HostCommandRunner(_host(args)))
    # The host's GPU clients stopped around a reset (NVIDIA's defaults, or --host-gpu-client); never the
    # machine's own units under a simulated NVML on the real root.
    units = tuple(getattr(args, "host_gpu_client", None) or DEFAULT_HOST_GPU_CLIENTS)
    clients: GpuClients = NoGpuClients() if backend.kind == "simulated" and host.is_real_root \
        else HostGpuClients(host, units)
    with open_nvml(backend) as session:
        yield NvmlMigBackend(session, resetter, clients)


def _emit(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    print(json.dumps(doc, indent=1, sort_keys=True) if getattr(args, "json", False) else text)


def _fail(args: argparse.Namespace, code: int, message: str) -> int:
    _emit(args, {"ok": False, "error": message}, f"error: {message}")
    return code


# --- mig plan | apply | assert -----------------------------------------------------------------------


def _add_host_gpu_clients(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host-gpu-client", action="append", metavar="UNIT",
                   help="a host systemd unit that holds the GPUs, stopped around a GPU reset (repeatable; "
                        f"default: {', '.join(DEFAULT_HOST_GPU_CLIENTS)}, as NVIDIA's MIG manager)")


def add_mig_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="mig_command", required=True, metavar="plan|apply|assert")
    for name, text in (("plan", "show the instances and placements per GPU"),
                       ("apply", "apply the layout now"), ("assert", "check that the layout is applied")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--config", type=Path, required=True, help="mig-parted config file (version: v1)")
        s.add_argument("--name", required=True, help="the named config, e.g. all-1g.10gb")
        s.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
        _add_host_gpu_clients(s)


def _plan_doc(node_plan: NodePlan, gpus: Sequence[GpuInfo]) -> dict[str, Any]:
    names = {g.index: g.name for g in gpus}
    return {
        "config": node_plan.config,
        "gpus": [
            {
                "index": t.index,
                "uuid": t.uuid,
                "name": names.get(t.index, ""),
                "model": t.model,
                "migEnabled": t.mig_enabled,
                "instances": [{"profile": i.profile, "start": i.start} for i in t.instances],
            }
            for t in node_plan.targets
        ],
    }


def _plan_text(doc: dict[str, Any]) -> str:
    lines = [f"MIG config {doc['config']}:"]
    for g in doc["gpus"]:
        if not g["migEnabled"]:
            lines.append(f"  GPU {g['index']} ({g['model']}): MIG disabled")
            continue
        placed = ", ".join(f"{i['profile']}@{i['start']}" for i in g["instances"]) or "no instances"
        lines.append(f"  GPU {g['index']} ({g['model']}): MIG enabled: {placed}")
    return "\n".join(lines)


def run_mig(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except MigPartedError as e:
        return _fail(args, EXIT_BAD_INPUT, str(e))
    try:
        with open_backend(args) as backend:
            gpus = list(backend.gpus())
            node_plan = plan(cfg, args.name, gpus)
            doc = _plan_doc(node_plan, gpus)
            if args.mig_command == "plan":
                _emit(args, {"ok": True, **doc}, _plan_text(doc))
                return EXIT_OK
            if args.mig_command == "assert":
                d = diff(node_plan, snapshot(backend, gpus))
                ok = d.applied
                text = f"MIG config {args.name!r} is applied" if ok else (
                    f"MIG config {args.name!r} is not applied: mode differs on GPU {list(d.mode)}, "
                    f"instances differ on GPU {list(d.layout)}")
                _emit(args, {"ok": ok, "modeDiffers": list(d.mode), "layoutDiffers": list(d.layout)}, text)
                return EXIT_OK if ok else EXIT_FAILED
            return _apply_once(args, backend, node_plan, gpus, doc)
    except PlanError as e:
        return _fail(args, EXIT_BAD_INPUT, str(e))
    except (MigHardwareError, NvmlError) as e:
        return _fail(args, EXIT_FAILED, str(e))


def _apply_once(
    args: argparse.Namespace, backend: MigBackend, node_plan: NodePlan, gpus: Sequence[GpuInfo], doc: dict[str, Any]
) -> int:
    before = snapshot(backend, gpus)
    if diff(node_plan, before).applied:
        _emit(args, {"ok": True, "changed": [], **doc}, f"MIG config {args.name!r} is already applied")
        return EXIT_OK
    try:
        apply.apply_modes(backend, node_plan)
        changed = apply.apply_layouts(backend, node_plan, gpus)
        d = diff(node_plan, snapshot(backend, gpus))
        if not d.applied:
            raise MigHardwareError(f"verification failed: GPUs {sorted({*d.mode, *d.layout})} do not match")
    except ResetUnavailable as e:
        problems = apply.restore(backend, before)
        return _fail(args, EXIT_REBOOT, f"{e}; a reboot is needed{_restored(problems)}")
    except MigHardwareError as e:
        problems = apply.restore(backend, before)
        return _fail(args, EXIT_FAILED, f"{e}{_restored(problems)}")
    make_nodes = _device_nodes(args, _host(args), backend)
    if make_nodes is not None:
        try:
            make_nodes()
        except (HostError, MigHardwareError) as e:
            log.warning("event=device-nodes-failed error=%s", e)
    _emit(args, {"ok": True, "changed": list(changed), **doc}, _plan_text(doc) + "\napplied")
    return EXIT_OK


def _restored(problems: list[str]) -> str:
    return f"; rollback incomplete: {'; '.join(problems)}" if problems else "; previous layout restored"


# --- mig-manager ---------------------------------------------------------------------------------------


def add_manager_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=Path("/etc/nvidia-gpu/mig/config.yaml"),
                   help="mig-parted config file (the MigProfile ConfigMap)")
    p.add_argument("--drain", choices=[m.value for m in DrainMode], default=DrainMode.DECKHOUSE.value,
                   help="deckhouse: disruption approval and node-manager drain; cordon: cordon and evict")
    p.add_argument("--allow-reboot", action="store_true", help="reboot when a MIG mode change needs it")
    _add_host_gpu_clients(p)
    p.add_argument("--approval-timeout", type=float, metavar="SECONDS", help="default: wait forever")
    p.add_argument("--drain-timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="how long the node's GPU pods may take to leave before the change fails")
    p.add_argument("--clients-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long the GPUs' host clients may take to stop (NVIDIA's manager: 5 minutes)")
    p.add_argument("--once", action="store_true", help="converge as far as possible, then exit (tests)")
    add_status_arguments(p, DEFAULT_METRICS_PORT)
    p.add_argument("--pre-stop", action="store_true", help="the preStop hook: finish or abort, restore the node")
    p.add_argument("--timeout", type=float, default=100.0, metavar="SECONDS", help="--pre-stop: wait this long")


def run_manager(args: argparse.Namespace) -> int:
    node_name = getattr(args, "node_name", None) or os.environ.get("NODE_NAME")
    if not node_name:
        return _fail(args, EXIT_BAD_INPUT, "the Node name is unknown: pass --node-name or set NODE_NAME")
    host = _host(args)
    settings = Settings(
        drain=DrainMode(args.drain),
        allow_reboot=args.allow_reboot,
        timeouts=Timeouts(approval=args.approval_timeout, drain=args.drain_timeout, clients=args.clients_timeout),
    )
    registry = CollectorRegistry()
    try:
        node = KubeNodeApi(Kube.connect(getattr(args, "kubeconfig", None)), node_name)
        with open_backend(args) as backend:
            manager = MigManager(
                node=node,
                backend=backend,
                load_config=lambda: load_config(args.config),
                files=host,
                step_lock=HostStepLock(host),
                boot_id=lambda: boot_id(host),
                clock=time.time,
                monotonic=time.monotonic,
                rebooter=HostRebooter(host),
                settings=settings,
                registry=registry,
                device_nodes=_device_nodes(args, host, backend),
            )
            if args.pre_stop:
                outcome = manager.pre_stop(args.timeout)
                log.info("event=pre-stop outcome=%s", outcome.value if outcome else "none")
                return EXIT_OK
            if args.once:
                action = manager.run_until_blocked()
                _emit(args, {"ok": True, "action": action.act.value, "reason": action.reason},
                      f"{action.act.value}: {action.reason}")
                return EXIT_OK
            status = None
            if args.metrics_port:
                try:
                    status = StatusServer(RegistryRenderer(registry), live=lambda: True, ready=lambda: True,
                                          host=args.metrics_address, port=args.metrics_port,
                                          required=args.metrics_port_required)
                except OSError as e:  # a required port is taken or not ours to bind
                    return _fail(args, EXIT_BAD_INPUT, f"--metrics-port {args.metrics_port}: {e}")
                status.start()
            previous = _stop_on_signals(manager.request_stop)
            try:
                manager.run()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                if status is not None:
                    status.stop()
            return EXIT_OK
    except KubeError as e:
        return _fail(args, EXIT_KUBE, str(e))
    except (JournalError, MigHardwareError, NvmlError) as e:
        return _fail(args, EXIT_FAILED, str(e))


def _stop_on_signals(stop: Callable[[], None]) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("event=signal signal=%s action=stop", signal.Signals(signum).name)
        stop()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


# --- registration ----------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``mig-manager`` and ``mig`` to the agent CLI (each parser's ``run`` default is its handler)."""
    manager = subparsers.add_parser("mig-manager", help="converge this node's MIG layout to its label")
    add_manager_arguments(manager)
    manager.set_defaults(run=run_manager)
    mig = subparsers.add_parser("mig", help="plan, apply or assert a MIG layout (no Kubernetes)")
    add_mig_arguments(mig)
    mig.set_defaults(run=run_mig)
