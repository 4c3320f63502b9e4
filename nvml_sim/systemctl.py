"""A stand-in ``systemctl`` on a simulated host: records every call, and runs the host's GPU clients.

Each call is appended to the host's ``/var/log/simulated-systemctl.log`` (as the recording stand-in
always did). ``start``, ``stop``, ``restart`` and ``is-active`` of a unit the simulated machine lists in its
``host_services`` (``SimulatedMachine.set_host_service``: ``nvidia-dcgm.service``, ``nvsm.service`` ...)
change or answer its state, so the host's GPU clients hold the GPUs while active, as they do on a real node
(an A100's MIG mode stays pending, ``nvidia-smi -r`` refuses) until NVIDIA's MIG manager hooks stop them
(mig-parted ``deployments/systemd/hooks.sh``). Other units start and stop without effect; ``is-active`` of
one answers ``inactive`` (exit 3), as systemctl does for a unit that is not running.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nvml_sim import SimulatedMachine

#: systemctl's exit status for a unit that is not active (``is-active``).
INACTIVE = 3


def main(argv: list[str]) -> int:
    """``argv``: this program, then ``--machine M --state PATH --log PATH -- <systemctl arguments>``."""
    if len(argv) < 8 or argv[1:8:2] != ["--machine", "--state", "--log", "--"]:
        print("usage: systemctl --machine M --state PATH --log PATH -- ARGS", file=sys.stderr)
        return 2
    machine, state, log, args = argv[2], Path(argv[4]), Path(argv[6]), argv[8:]
    with log.open("a") as f:
        f.write(" ".join(args) + "\n")
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] not in ("start", "stop", "restart", "is-active"):
        return 0
    sim = SimulatedMachine(machine, state)
    known = sim.state.host_services
    verb, units = words[0], words[1:]
    if verb == "is-active":
        active = all(known.get(u, False) for u in units)
        if "--quiet" not in args and "-q" not in args:
            print("\n".join("active" if known.get(u, False) else "inactive" for u in units))
        return 0 if active else INACTIVE
    for u in units:
        if u in known:
            sim.set_host_service(u, verb != "stop")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
