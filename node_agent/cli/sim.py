"""``sim``: look at and inject faults into a simulated machine (``--nvml simulated:<machine>``).

The state lives in the simulated machine's JSON file (``--nvml-state``, or by default under the host
root's ``/run/nvidia-gpu-agent/nvml-sim/``), so a fault injected here reaches every agent process
using the same machine: the device plugin's health loop sees the XID, ``check`` sees the lost GPU.

    sim host                        lay out the simulated machine's node under --host-root (PCI
                                    devices, /proc/driver/nvidia, device nodes, modules, containerd,
                                    stand-in tools); an empty --host-root is laid out on first use
    sim host --fresh-boot           the node as right after boot: nvidia_uvm not loaded, no /dev/nvidia*
                                    node (node setup loads it and makes them, as nvidia-ctk does)
    sim host --unloadable-module M  the host's modprobe fails for M as kmod's does ("Module M not found in
                                    directory /lib/modules/<kernel>"), e.g. nvidia-uvm
    sim persistence GPU on|off      the GPU's persistence mode (on: the driver holds the GPU, so an
                                    unbind from nvidia blocks; `vfio bind` turns it off first)
    sim status                      GPUs, MIG mode and instances, faults, queued events
    sim xid GPU XID [--gi N --ci N] raise an XID event (79 = fell off the bus, 48 = DBE, ...) and leave
                                    what it leaves on a real GPU: 95 a reset needed and a row remap
                                    pending, 64 a failed remap, 48 on a T4 a pending retired page
    sim recovery GPU ACTION         the GPU's NVML recovery action (none, reset, reboot, drain-p2p,
                                    drain-and-reset; drivers from 565 report it)
    sim ecc GPU single|double       raise an ECC event
    sim lose GPU | sim hang GPU     the GPU falls off the bus | stops answering
    sim restore GPU                 undo lose/hang/fail
    sim fail GPU FUNCTION [CODE]    every call of C function FUNCTION on the GPU returns CODE
                                    (default 999, NVML_ERROR_UNKNOWN; "none" stops failing it)
    sim missing [FUNCTION ...]      the library lacks these C functions (none given: it has all);
                                    an old `sim driver` also lacks the symbols newer drivers added
    sim processes GPU [PID[:MIB]..] set the processes on a GPU (none: idle)
    sim fail-init REASON|none       NVML init fails (driver-not-loaded, library-not-found, ...)
    sim driver VERSION|default      report another driver version
    sim reset GPU                   GPU reset: a pending MIG mode, row remap or page retirement takes
                                    effect, a recovery action a reset settles is cleared
    sim service UNIT on|off         a host GPU client (systemd unit, e.g. nvidia-dcgm.service) running
                                    or not: while one runs an A100 keeps a MIG mode pending and the
                                    simulated `nvidia-smi -r` refuses (the host's systemctl stops it)
    sim fabric UUID CLIQUE [--gpu N ..] [--state S] [--status CODE]
                                    the GPUs (default all) registered with an NVLink fabric
                                    (GB200 NVL72 style); `sim fabric none`: no fabric
    sim mig-monitor required|off    NVML refuses a MIG GPU's memory and GPU instances
                                    (NO_PERMISSION) to a caller without NVIDIA_MIG_MONITOR_DEVICES=all
    sim mig-empty-slot GPU not-found|invalid-argument
                                    what a MIG device slot with no device answers (drivers answer both)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, get_args

from node_agent.cli import exitcodes
from node_agent.cli.commands import summary as command_summary
from node_agent.cli.context import AgentContext, UsageError
from nvml_sim import SimulatedMachine, UnknownMachineError
from nvml_sim import host as sim_host
from nvml_sim.state import FabricStateName, InitError, SimProcess
from nvml_sim.summary import summary

#: ``nvmlDeviceGpuRecoveryAction_t`` values 0-4 by position, as ``sim recovery`` spells them.
RECOVERY_ACTIONS = ("none", "reset", "reboot", "drain-p2p", "drain-and-reset")


def _machine(ctx: AgentContext) -> SimulatedMachine:
    backend = ctx.nvml_backend
    if backend.kind != "simulated" or backend.machine is None:
        raise UsageError("sim needs --nvml simulated:<machine>")
    if backend.state_file is None:
        raise UsageError("sim needs a state file shared with the agent: pass --nvml-state PATH "
                         "(or a --host-root other than /)")
    return SimulatedMachine(backend.machine, backend.state_file)


def _gpu(machine: SimulatedMachine, index: int) -> int:
    if not 0 <= index < machine.spec.gpu_count:
        raise UsageError(f"GPU {index} does not exist; {machine.spec.name} has GPUs 0-{machine.spec.gpu_count - 1}")
    return index


def _processes(specs: list[str]) -> list[SimProcess]:
    out = []
    for spec in specs:
        pid, _, mib = spec.partition(":")
        if not pid.isdigit() or (mib and not mib.isdigit()):
            raise UsageError(f"process {spec!r}: expected PID or PID:MIB")
        out.append(SimProcess(pid=int(pid), used_mib=int(mib) if mib else None))
    return out


def _code(text: str) -> int | None:
    if text == "none":
        return None
    try:
        return int(text, 0)
    except ValueError:
        raise UsageError(f"NVML return code {text!r}: expected a number (999 = unknown error) or none") from None


def _fabric(m: SimulatedMachine, args: argparse.Namespace) -> None:
    gpus = [_gpu(m, i) for i in args.gpu] or None
    if args.cluster_uuid == "none":
        m.set_fabric(None, gpus=gpus)
        return
    if args.clique is None:
        raise UsageError("sim fabric UUID CLIQUE: the clique ID is missing")
    try:
        m.set_fabric(args.cluster_uuid, args.clique, gpus=gpus, state=args.state, status=_code(args.status) or 0)
    except ValueError as e:
        raise UsageError(f"sim fabric: {e}") from None


def _host(args: argparse.Namespace) -> int:
    """``sim host``: an empty directory, or one laid out before for the same machine, becomes the machine's node."""
    root = Path(str(getattr(args, "host_root", "/") or "/"))
    spec = str(getattr(args, "nvml", "") or "")
    if not spec.startswith("simulated:"):
        raise UsageError(f"sim host needs --nvml simulated:<machine> (got {spec or 'real'!r})")
    if root == Path("/"):
        raise UsageError("sim host lays out a simulated node under --host-root, never on this machine's own root /: "
                         "pass --host-root DIR (an empty directory)")
    machine = spec.removeprefix("simulated:")
    if root.exists() and not sim_host.is_simulated_host(root) and (not root.is_dir() or any(root.iterdir())):
        print(f"error: --host-root {root} is not empty and not a simulated host: lay out an empty directory",
              file=sys.stderr)
        return exitcodes.HOST_INPUT
    ctx = AgentContext.from_args(args)  # an empty root is laid out here; another machine's is refused
    try:
        # brings an earlier layout back, the machine's state kept; --fresh-boot: as right after a reboot
        # --unloadable-module: the host's modprobe fails for it as kmod's does (a driver without nvidia-uvm)
        sim_host.lay_out(root, machine, fresh_boot=bool(getattr(args, "fresh_boot", False)),
                         unloadable_modules=tuple(getattr(args, "unloadable_module", None) or ()))
    except UnknownMachineError as e:
        raise UsageError(str(e)) from None
    m = _machine(ctx)
    ctx.emit({"hostRoot": str(root), "machine": machine, "gpus": m.spec.gpu_count},
             f"{root}: a simulated {machine} node ({m.spec.gpu_count} GPUs)")
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    if args.action == "host":
        return _host(args)
    ctx = AgentContext.from_args(args)
    m = _machine(ctx)
    action = args.action
    if action == "xid":
        m.inject_xid(_gpu(m, args.gpu), args.xid, args.gi, args.ci)
    elif action == "ecc":
        m.inject_event(_gpu(m, args.gpu), "single-bit-ecc" if args.kind == "single" else "double-bit-ecc")
    elif action == "lose":
        m.lose_gpu(_gpu(m, args.gpu))
    elif action == "hang":
        m.hang_gpu(_gpu(m, args.gpu))
    elif action == "fail":
        m.fail_call(_gpu(m, args.gpu), args.function, _code(args.code))
    elif action == "missing":
        m.remove_functions(args.functions)
    elif action == "restore":
        m.restore_gpu(_gpu(m, args.gpu))
    elif action == "processes":
        m.set_processes(_gpu(m, args.gpu), _processes(args.processes))
    elif action == "fail-init":
        m.fail_init(None if args.reason == "none" else args.reason)
    elif action == "driver":
        m.set_driver_version(None if args.version == "default" else args.version)
    elif action == "reset":
        m.reset_gpu(_gpu(m, args.gpu))
    elif action == "service":
        m.set_host_service(args.unit, args.state == "on")
    elif action == "recovery":
        m.set_recovery_action(_gpu(m, args.gpu), RECOVERY_ACTIONS.index(args.recovery_action))
    elif action == "fabric":
        _fabric(m, args)
    elif action == "persistence":
        m.set_persistence_mode(_gpu(m, args.gpu), args.mode == "on")
    elif action == "mig-monitor":
        m.require_mig_monitor(args.mode == "required")
    elif action == "mig-empty-slot":
        m.set_mig_empty_slot_error(_gpu(m, args.gpu), _EMPTY_SLOT_CODES[args.answer])
    ctx.emit(m.state.model_dump(mode="json"), summary(m))
    return exitcodes.OK


#: What an empty MIG device slot answers (``sim mig-empty-slot``): NVML's return codes by name.
_EMPTY_SLOT_CODES = {"not-found": 6, "invalid-argument": 2}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("sim", help="inspect a simulated machine or inject faults into it",
                              description=command_summary(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="\n".join((__doc__ or "").splitlines()[6:]))
    sub = p.add_subparsers(dest="action", required=True, metavar="<action>")
    host = sub.add_parser("host", help="lay out the simulated machine's node under --host-root")
    host.add_argument("--fresh-boot", action="store_true",
                      help="as right after boot: nvidia_uvm not loaded, no /dev/nvidia* node (node setup makes them)")
    host.add_argument("--unloadable-module", action="append", metavar="MODULE",
                      help="the host's modprobe fails for MODULE (not in /lib/modules/<kernel>), e.g. nvidia-uvm")
    sub.add_parser("status", help="show the machine's state")
    persistence = sub.add_parser("persistence", help="turn a GPU's persistence mode on or off")
    persistence.add_argument("gpu", type=int)
    persistence.add_argument("mode", choices=("on", "off"))
    xid = sub.add_parser("xid", help="raise an XID event")
    xid.add_argument("gpu", type=int)
    xid.add_argument("xid", type=int)
    xid.add_argument("--gi", type=int, default=None)
    xid.add_argument("--ci", type=int, default=None)
    service = sub.add_parser("service", help="a host GPU client (systemd unit) running or not")
    service.add_argument("unit")
    service.add_argument("state", choices=("on", "off"))
    recovery = sub.add_parser("recovery", help="set the GPU's NVML recovery action")
    recovery.add_argument("gpu", type=int)
    recovery.add_argument("recovery_action", choices=RECOVERY_ACTIONS, metavar="ACTION")
    ecc = sub.add_parser("ecc", help="raise an ECC event")
    ecc.add_argument("gpu", type=int)
    ecc.add_argument("kind", choices=("single", "double"))
    for name, text in (("lose", "the GPU falls off the bus"), ("hang", "the GPU stops answering"),
                       ("restore", "undo lose/hang"), ("reset", "reset the GPU (pending MIG mode applies)")):
        sub.add_parser(name, help=text).add_argument("gpu", type=int)
    fail = sub.add_parser("fail", help="make one C function fail on one GPU")
    fail.add_argument("gpu", type=int)
    fail.add_argument("function", help="C function name, e.g. nvmlDeviceGetMemoryInfo")
    fail.add_argument("code", nargs="?", default="999", help="NVML return code (default 999) or none")
    missing = sub.add_parser("missing", help="remove C functions from the simulated library")
    missing.add_argument("functions", nargs="*", metavar="FUNCTION")
    procs = sub.add_parser("processes", help="set the processes running on a GPU")
    procs.add_argument("gpu", type=int)
    procs.add_argument("processes", nargs="*", metavar="PID[:MIB]")
    init = sub.add_parser("fail-init", help="make NVML init fail")
    init.add_argument("reason", choices=(*get_args(InitError), "none"))
    drv = sub.add_parser("driver", help="report another driver version")
    drv.add_argument("version")
    monitor = sub.add_parser("mig-monitor", help="whether NVML refuses MIG GPUs' memory and instances to a caller "
                                                 "without NVIDIA_MIG_MONITOR_DEVICES=all")
    monitor.add_argument("mode", choices=("required", "off"))
    empty = sub.add_parser("mig-empty-slot", help="what a MIG device slot with no device answers")
    empty.add_argument("gpu", type=int)
    empty.add_argument("answer", choices=tuple(_EMPTY_SLOT_CODES))
    fabric = sub.add_parser("fabric", help="register GPUs with an NVLink fabric (none: no fabric)")
    fabric.add_argument("cluster_uuid", metavar="UUID|none")
    fabric.add_argument("clique", nargs="?", type=int, default=None, metavar="CLIQUE")
    fabric.add_argument("--gpu", type=int, action="append", default=[], help="only this GPU (repeatable)")
    fabric.add_argument("--state", choices=get_args(FabricStateName), default="completed")
    fabric.add_argument("--status", default="0", help="NVML return code of the registration (default 0)")
    p.set_defaults(run=run)
