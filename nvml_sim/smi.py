"""A stand-in ``nvidia-smi`` over a simulated machine or a real NVML library, for the bash scripts' side.

Fake host roots put a two-line ``/usr/bin/nvidia-smi`` in place that runs this module, so a script
that shells out to ``nvidia-smi`` sees the same GPUs, driver and faults as the agent does through
NVML: ``--machine M`` reads the simulated machine, ``--driver-root R`` the ``libnvidia-ml.so.1`` under
that driver root (NVIDIA's mock library on a node laid out like a real one), as the driver's own
``nvidia-smi`` reads the driver's NVML. It goes through the NVML facade itself, so both paths read one
source. Only the forms the scripts use are implemented: ``-L``, ``-q`` (the lines of nvidia-smi's report the
scripts read: driver version, GPUs, product names, virtualization mode, fabric state and status) and
``--query-gpu=<fields> --format=csv,noheader[,nounits]``, and ``-r [-i <bus IDs>]`` (a GPU reset, refused while
anything holds the GPUs); anything else exits 2 like nvidia-smi does for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from node_agent.nvml import DeviceLost, FabricInfo, FabricState, NvmlBackend, NvmlError, NvmlUnavailable, open_nvml
from nvml_sim import ResetRefused, SimulatedMachine, provider

FIELDS = ("index", "name", "uuid", "pci.bus_id", "pci.device_id", "driver_version", "compute_cap", "memory.total")


#: How ``nvidia-smi -q`` words a GPU's fabric state (its "Fabric" section: "N/A" without a fabric, "In Progress"
#: with Status "N/A" while Fabric Manager runs, "Completed" with Status "Success" once done).
_FABRIC_STATE_TEXT = {FabricState.NOT_SUPPORTED: "N/A", FabricState.NOT_STARTED: "Not Started",
                      FabricState.IN_PROGRESS: "In Progress", FabricState.COMPLETED: "Completed"}


def _fabric_lines(info: FabricInfo | None) -> tuple[str, str]:
    """State and Status of ``nvidia-smi -q``'s Fabric section; a failed registration's status is NVML's
    return code, worded here as ``Failure (<code>)``."""
    if info is None:
        return "N/A", "N/A"
    if info.state is not FabricState.COMPLETED:
        return _FABRIC_STATE_TEXT[info.state], "N/A"
    return "Completed", "Success" if info.status == 0 else f"Failure ({info.status})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi", add_help=False)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--machine")
    source.add_argument("--driver-root", type=Path)
    parser.add_argument("--state", type=Path)
    parser.add_argument("-L", "--list-gpus", action="store_true")
    parser.add_argument("-q", "--query", action="store_true")
    parser.add_argument("--query-gpu")
    parser.add_argument("--format")
    parser.add_argument("-r", "--gpu-reset", action="store_true")
    parser.add_argument("-i", "--id")
    args, rest = parser.parse_known_args(argv)
    if args.gpu_reset:
        return _reset(args)
    if rest or not (args.list_gpus or args.query_gpu or args.query):
        print(f"Invalid combination of input arguments: {' '.join(rest)}", file=sys.stderr)
        return 2
    if args.machine:
        provider.register()  # a program of its own: the agent's NVML facade finds the machine through it
    backend = (NvmlBackend("simulated", args.machine, args.state) if args.machine
               else NvmlBackend("real", driver_root=args.driver_root))
    try:
        with open_nvml(backend, timeout_s=10.0) as nvml:
            driver = nvml.driver().driver_version
            inv = nvml.inventory()
            fabrics = {g.index: nvml.fabric_info(g.index) for g in inv.gpus} if args.query else {}
    except NvmlUnavailable:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    except NvmlError as e:
        print(f"Unknown Error: {e}", file=sys.stderr)
        return 15
    for lost in inv.lost:
        print(f"Unable to determine the device handle for GPU{lost.index}: {lost.reason}", file=sys.stderr)
    if args.query:
        print("\n==============NVSMI LOG==============\n")
        print(f"{'Driver Version':<42}: {driver}\n")
        print(f"{'Attached GPUs':<42}: {len(inv.gpus)}")
        for g in inv.gpus:
            print(f"GPU {g.pci_bus_id}")
            print(f"    {'Product Name':<38}: {g.name}")
            print("    GPU Virtualization Mode")
            print(f"        {'Virtualization Mode':<34}: {g.virtualization.value if g.virtualization else 'N/A'}")
            state, status = _fabric_lines(fabrics.get(g.index))
            print("    Fabric")
            print(f"        {'State':<34}: {state}")
            print(f"        {'Status':<34}: {status}")
        return 15 if inv.lost else 0
    if args.list_gpus:
        for g in inv.gpus:
            print(f"GPU {g.index}: {g.name} (UUID: {g.uuid})")
        return 15 if inv.lost else 0
    fields = [f.strip() for f in (args.query_gpu or "").split(",")]
    unknown = [f for f in fields if f not in FIELDS]
    if unknown or not (args.format or "").startswith("csv"):
        print(f'Field "{unknown[0] if unknown else args.format}" is not a valid field to query.', file=sys.stderr)
        return 2
    units = "nounits" not in (args.format or "")
    header = "noheader" not in (args.format or "")
    if header:
        print(", ".join(fields))
    for g in inv.gpus:
        values = {
            "index": str(g.index),
            "name": g.name,
            "uuid": g.uuid,
            "pci.bus_id": g.pci_bus_id,
            "pci.device_id": f"0x{g.pci_device_id:04X}10DE",  # nvidia-smi's form: device, then vendor
            "driver_version": driver,
            "compute_cap": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
            "memory.total": f"{g.memory_mib} MiB" if units else str(g.memory_mib),
        }
        print(", ".join(values[f] for f in fields))
    return 15 if inv.lost else 0


def _reset(args: argparse.Namespace) -> int:
    """``nvidia-smi -r [-i <bus IDs or indices>]`` on a simulated machine: refused "In use by another client"
    while anything holds the GPUs (``SimulatedMachine.reset_refusal``), as the real one refuses."""
    if not args.machine:
        print("GPU reset is not supported on this driver root", file=sys.stderr)
        return 3
    machine = SimulatedMachine(args.machine, args.state)
    buses = [b.lower() for b in machine.spec.bus_ids]
    wanted: list[int] = []
    for item in (args.id.split(",") if args.id else [str(i) for i in range(len(buses))]):
        key = item.strip().lower()
        if key.isdigit() and int(key) < len(buses):
            wanted.append(int(key))
        elif key in buses:
            wanted.append(buses.index(key))
        else:
            print(f"No devices were found matching {item!r}", file=sys.stderr)
            return 6
    try:
        machine.smi_reset(wanted)
    except ResetRefused as e:
        print(f"{e}\nPlease first kill all processes using this device and all compute applications running "
              "in the system.", file=sys.stderr)
        return 255
    for i in wanted:
        print(f"GPU {machine.spec.bus_ids[i]} was successfully reset.")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DeviceLost as e:
        print(str(e), file=sys.stderr)
        sys.exit(15)
