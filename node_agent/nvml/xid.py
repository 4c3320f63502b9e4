"""XID classification: which driver error events say the GPU failed and which an application caused.

The device plugin and the DRA driver both turn XID events into device health; they share this one
list so a GPU is never unhealthy for one and healthy for the other on the same event. Every waiter on
XID events (their health loops, the labeller's and exporter's recorder) waits in the same slices.
"""

from __future__ import annotations

#: Longest single wait on an NVML event set. ``nvmlEventSetWait`` cannot be interrupted, so this bounds
#: how long stopping a waiter takes; at rest each waiter wakes once a slice (NVIDIA's plugin waits 5 s).
EVENT_WAIT_SLICE_S = 1.0

#: XIDs NVIDIA's device plugin never treats as device failures (they are caused by applications):
#: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive
#: cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})


def is_application_xid(xid: int) -> bool:
    """True for XIDs an application caused (the GPU itself is fine)."""
    return xid in APPLICATION_XIDS
