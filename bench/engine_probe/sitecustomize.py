"""The process probe of ``bench/bench_engine.py``: every Python process the Pulumi engine's language host
starts (the program, and the short ones it runs to list plugins and packages) imports this at start-up,
because the bench puts this directory first on their ``PYTHONPATH``. At exit each appends one JSON line to
the file ``$NVIDIA_GPU_BENCH_PROBE`` names: its command line, its own CPU seconds (user and system), its
wall seconds since the kernel started it (interpreter start-up and imports included) and its peak RSS.

Nothing happens without that variable, so the directory on a path by mistake changes nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import time

PROBE_ENV = "NVIDIA_GPU_BENCH_PROBE"


def _started_at() -> float:
    """``CLOCK_BOOTTIME`` seconds at which the kernel started this process (``/proc/self/stat`` field 22,
    in clock ticks since boot): the wall time then includes the interpreter's own start-up."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.clock_gettime(time.CLOCK_BOOTTIME)


def _record(path: str, started: float) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    line = {"argv": sys.argv[:4], "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "maxrss_kib": usage.ru_maxrss, "pid": os.getpid()}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


if (_path := os.environ.get(PROBE_ENV)):
    atexit.register(_record, _path, _started_at())
