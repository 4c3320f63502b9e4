"""The Node taint value shared by the components (node templates, tolerations) and the agent's labeller.

Its own module, free of the stack config, so the agent's ``labels`` command can use it without loading
pydantic (the labeller's startup time and memory are benchmarked).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeTaint:
    """One taint of a Node: the one taint type of the components, the labeller and the MIG manager."""

    key: str
    value: str
    effect: str
    #: RFC 3339, as read (the node lifecycle controller stamps its NoExecute taints). Kept so that
    #: rewriting a Node's whole list gives other controllers' taints back unchanged; not part of equality.
    time_added: str = field(default="", compare=False)

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out

    def flag(self) -> str:
        """kubectl's ``KEY=VALUE:EFFECT`` spelling (``KEY:EFFECT`` without a value), as the labeller takes it."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
