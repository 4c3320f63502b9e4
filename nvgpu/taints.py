"""The Node taint value shared by the components (node templates, tolerations) and the agent's labeller.

Its own module, free of the stack config, so the agent's ``labels`` command can use it without loading
pydantic (the labeller's startup time and memory are benchmarked).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeTaint:
    key: str
    value: str
    effect: str

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def flag(self) -> str:
        """kubectl's ``KEY=VALUE:EFFECT`` spelling (``KEY:EFFECT`` without a value), as the labeller takes it."""
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
