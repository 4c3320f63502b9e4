"""GPU feature discovery side by side: NVIDIA's ``gpu-feature-discovery --oneshot`` and our ``labels`` on
one mock machine, with the same device-plugin config file (``--config-file`` on both sides, as our
labeller reads the plugin's config) and MIG strategy; the label sets compared key by key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.compare.peers import (
    DMI_PRODUCT,
    Difference,
    Machine,
    agent,
    feature_file,
    label_differences,
    namespaced,
    run,
)

#: NVIDIA's own example configs (copied verbatim, see SOURCES.md there).
DATA = Path(__file__).resolve().parents[1] / "node_agent" / "deviceplugin" / "data"


@dataclass(frozen=True)
class Case:
    """One sharing config: NVIDIA's config file (NVIDIA's own examples), given to both labellers."""

    name: str
    config: Path | None

    @property
    def config_args(self) -> list[str]:
        return ["--config-file", str(self.config)] if self.config else []


CASES = (
    Case("default", None),
    Case("time-slicing", DATA / "nvidia-device-plugin-config-time-slicing.yaml"),
    Case("mps", DATA / "nvidia-device-plugin-config-mps.yaml"),
)
STRATEGIES = ("none", "single", "mixed")


def nvidia_labels(m: Machine, case: Case, strategy: str, out: Path) -> dict[str, str]:
    argv = [str(m.tools / "gpu-feature-discovery"), "--oneshot", "--no-timestamp", "--use-node-feature-api=false",
            "--output-file", str(out), "--machine-type-file", str(m.root / DMI_PRODUCT.lstrip("/")),
            "--mig-strategy", strategy, *case.config_args]
    run(namespaced(m, argv), m.env())
    return feature_file(out.read_text())


def our_labels(m: Machine, case: Case, strategy: str) -> dict[str, str]:
    doc = agent(m, "labels", "--no-timestamp", "--no-output-file", "--mig-strategy", strategy, *case.config_args)
    return dict(doc["labels"])


def compare(m: Machine, case: Case, strategy: str, work: Path) -> tuple[list[Difference], int]:
    """The differences, and how many labels NVIDIA's GFD wrote."""
    theirs = nvidia_labels(m, case, strategy, work / f"gfd-{case.name}-{strategy}")
    ours = our_labels(m, case, strategy)
    return label_differences("gfd", f"{m.name}/{case.name}/{strategy}", ours, theirs), len(theirs)
