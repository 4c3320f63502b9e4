"""A simulated machine's state in a few lines: what ``sim`` prints, so an operator sees the faults at a glance."""

from __future__ import annotations

from nvml_sim import SimulatedMachine


def summary(m: SimulatedMachine) -> str:
    """The driver, each GPU's MIG mode, instances, processes and faults, and the last five events."""
    state = m.state
    lines = [f"{state.machine}: driver {state.driver_version or m.spec.driver_version}"
             + (f", init fails: {state.init_error}" if state.init_error else "")
             + (f", lacks {', '.join(state.missing_functions)}" if state.missing_functions else "")]
    for i, g in enumerate(state.gpus):
        faults = [name for name, on in (("lost", g.lost), ("hung", g.hang)) if on]
        faults += [f"{fn} fails ({code})" for fn, code in sorted(g.call_errors.items())]
        if g.fabric is not None:
            faults.append(f"fabric {g.fabric.cluster_uuid}.{g.fabric.clique_id} {g.fabric.state}"
                          + (f" (status {g.fabric.status})" if g.fabric.status else ""))
        mig = f"mig {'on' if g.mig_current else 'off'}" + (" (pending)" if g.mig_current != g.mig_pending else "")
        lines.append(f"  GPU {i}: {mig}, {len(g.instances)} GPU instance(s), {len(g.processes)} process(es)"
                     + (f", {', '.join(faults)}" if faults else ""))
    lines += [f"  event #{e.seq}: GPU {e.gpu} {e.kind} {e.data}" for e in state.events[-5:]]
    return "\n".join(lines)
