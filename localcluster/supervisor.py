"""A real node's service manager: what systemd is to containerd and the kubelet on a production node.

This machine's PID 1 is not systemd, yet a node needs one: node setup's ``runtime apply`` restarts containerd
with ``systemctl restart containerd`` (``node_agent.setup.runtime.restart_service``, through ``chroot`` into
the host root), and a kubelet or containerd that dies is started again (both units ship ``Restart=always``).
One supervisor per node (``python -m localcluster.supervisor NODE_DIR``, started by
:meth:`localcluster.node.Node.add`, in its own session) starts the two daemons inside the node, starts again
whichever exits unasked after :data:`RESTART_S`, and serves requests.

Requests are files, so that the node's ``systemctl`` (a ``/bin/sh`` script in the node's ``/usr/bin``,
:data:`localcluster.node.SYSTEMCTL`) needs nothing but ``sh`` wherever it runs, a setup container's
``chroot`` included: it writes ``<NODE_DIR>/control/ID.req`` holding ``ACTION UNIT`` and waits for ``ID.done``
holding the exit code and a message. Actions: ``start``, ``stop``, ``restart``, ``kill`` (SIGKILL, then the
usual restart: a crash), ``is-active``. Units: ``containerd``, ``kubelet``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from localcluster.node import Node
from localcluster.processes import stop_child

UNITS = ("containerd", "kubelet")
ACTIONS = ("start", "stop", "restart", "kill", "is-active")
#: Seconds between a unit's unasked exit and its next start (systemd's RestartSec; the packaged units say
#: 5 s for containerd and 10 s for the kubelet: shorter here, the tests wait on it).
RESTART_S = 1.0
#: Seconds a unit gets between SIGTERM and SIGKILL when stopped.
STOP_GRACE_S = 10.0
POLL_S = 0.1


@dataclass
class Unit:
    """One daemon: its command, its process while it runs, whether it should run."""

    name: str
    argv: list[str]
    log: Path
    wanted: bool = False
    proc: subprocess.Popen[bytes] | None = None
    exited_at: float | None = None
    starts: int = 0

    def start(self) -> None:
        self.wanted = True
        if self.proc is not None and self.proc.poll() is None:
            return
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.exited_at = None
        self.starts += 1

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self.wanted = False
        if self.proc is not None:
            stop_child(self.proc, grace_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def active(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Supervisor:
    node_dir: Path
    units: dict[str, Unit] = field(default_factory=dict)
    stopping: bool = False

    @property
    def control(self) -> Path:
        return self.node_dir / "control"

    def handle(self, request: Path) -> None:
        words = request.read_text().split()
        action, unit = [*words, "", ""][:2]
        if action not in ACTIONS or unit not in self.units:
            rc, message = 5, (f"unit {unit!r} or action {action!r} unknown: units {', '.join(UNITS)}; "
                              f"actions {', '.join(ACTIONS)}")
        else:
            rc, message = self.act(action, self.units[unit])
        done = request.with_suffix(".tmp-done")
        done.write_text(f"{rc}\n{message}\n" if message else f"{rc}\n")
        done.rename(request.with_suffix(".done"))
        request.unlink()

    def act(self, action: str, unit: Unit) -> tuple[int, str]:
        print(json.dumps({"event": action, "unit": unit.name}), flush=True)
        if action == "start":
            unit.start()
        elif action == "stop":
            unit.stop()
        elif action == "restart":
            unit.stop()
            unit.start()
        elif action == "kill":
            unit.kill()  # wanted stays: restarted like a crash
        elif action == "is-active":
            return (0, "active") if unit.active else (3, "inactive")
        self.save()
        return 0, ""

    def save(self) -> None:
        """The units' pids and start counts for :class:`localcluster.node.Node` (``supervisor.json``)."""
        state = {name: {"pid": u.proc.pid if u.active and u.proc else None, "starts": u.starts, "wanted": u.wanted}
                 for name, u in self.units.items()}
        tmp = self.node_dir / "supervisor.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.rename(self.node_dir / "supervisor.json")

    def tick(self) -> None:
        now = time.monotonic()
        for unit in self.units.values():
            if unit.wanted and unit.proc is not None and unit.proc.poll() is not None:
                if unit.exited_at is None:
                    unit.exited_at = now
                    print(json.dumps({"event": "exited", "unit": unit.name, "code": unit.proc.returncode}), flush=True)
                elif now - unit.exited_at >= RESTART_S:
                    unit.start()
                    print(json.dumps({"event": "restarted", "unit": unit.name}), flush=True)
                    self.save()
        for request in sorted(self.control.glob("*.req")):
            with contextlib.suppress(OSError):
                self.handle(request)

    def run(self, commands: dict[str, list[str]], start: list[str]) -> None:
        self.control.mkdir(exist_ok=True)
        for name in UNITS:
            self.units[name] = Unit(name, commands[name], self.node_dir / "logs" / f"{name}.log")

        def _stop(signum: int, frame: FrameType | None) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        for name in start:
            self.units[name].start()
        self.save()
        while not self.stopping:
            self.tick()
            time.sleep(POLL_S)
        for name in reversed(UNITS):  # the kubelet first
            self.units[name].stop()
        self.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("node_dir", type=Path)
    parser.add_argument("--start", action="append", default=[], choices=UNITS, help="units to start at once")
    args = parser.parse_args(argv)
    node_dir: Path = args.node_dir.resolve()
    node = Node.attach(node_dir.parent.parent, node_dir.name)
    Supervisor(node_dir).run({name: node.command(name) for name in UNITS}, list(args.start))
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
