"""Where the simulated machines are wired in: ``--nvml simulated:<machine>`` registers ``nvml_sim``.

The simulator is a package of its own beside the agent (``nvml_sim``: simulated GPU machines with fault
injection, a simulated ``nvidia-smi``, simulated hosts), which the agent image may leave out. Production
code reaches it only through ``node_agent.nvml.simulator`` (the protocol and its registry); this module,
and the ``sim`` command that drives the machines' faults (``node_agent.cli.sim``), are the only agent
modules that import it (``.importlinter``, "Only node_agent.cli imports the simulator"). Where it is not
installed, ``--nvml simulated:<machine>`` is a usage error naming why, and ``sim`` is not available.
"""

from __future__ import annotations

from node_agent.nvml import simulator

#: The simulator's package: what a missing import of it is called (``ModuleNotFoundError.name``).
PACKAGE = "nvml_sim"


def is_missing(error: ModuleNotFoundError) -> bool:
    """Whether ``error`` is the simulator's package missing from this install (not a module it lacks)."""
    return error.name is not None and error.name.split(".")[0] == PACKAGE


def installed() -> simulator.Simulator | None:
    """The simulated machines, registered on first use; None where the package is not installed.

    ``mig`` asks whatever ``--nvml`` says: a host root the simulator laid out (the compare tier's mock hosts
    are, under a real NVML library) keeps its stand-in device nodes."""
    found = simulator.registered()
    if found is not None:
        return found
    try:
        from nvml_sim import provider  # noqa: PLC0415 - optional: the agent image leaves the simulator out
    except ModuleNotFoundError as e:
        if not is_missing(e):
            raise
        return None
    return provider.register()


def enable(nvml: str | None) -> None:
    """Register the simulated machines when the ``--nvml`` spec asks for one.

    Without the package nothing is registered: ``NvmlBackend.parse`` then refuses the spec, saying why."""
    if (nvml or "").startswith("simulated:"):
        installed()
