"""The typed stack config: everything under the ``nvidia-gpu:`` namespace of ``Pulumi.<stack>.yaml``.

Parsing is validation: an invalid config never exists in memory. Every model forbids unknown keys and
every error is reported as ``nvidia-gpu:<path>: <problem> (got <value>)`` naming what is allowed, so a
typo fails ``pulumi preview`` before any resource is registered.

The package follows the config's own sections, so the schema of a block is found where the block is:

- :mod:`~nvgpu.stackconfig.common`: the base model, the shared value checks, and how problems are raised;
- :mod:`~nvgpu.stackconfig.renames`: the one deprecation path of a renamed key;
- :mod:`~nvgpu.stackconfig.modes`: the allocation mode and the node-setup backend (cluster-wide, per group);
- :mod:`~nvgpu.stackconfig.cluster`: ``cluster`` (its image, MIG manager, RuntimeClass, preview identity);
- :mod:`~nvgpu.stackconfig.monitoring`: ``cluster.monitoring``;
- :mod:`~nvgpu.stackconfig.dra`: ``cluster.dra``;
- :mod:`~nvgpu.stackconfig.nodegroup`: ``nodeGroups[]`` (selection, taints, the MIG layout check);
- :mod:`~nvgpu.stackconfig.gpu`: ``nodeGroups[].gpu`` (model and sharing);
- :mod:`~nvgpu.stackconfig.driver`: ``nodeGroups[].gpu.driver`` and ``nodeGroups[].toolkit``;
- :mod:`~nvgpu.stackconfig.stack`: the whole config and the checks across groups;
- :mod:`~nvgpu.stackconfig.loading`: reading stack files and turning pydantic's errors into the config's paths;
- :mod:`~nvgpu.stackconfig.resolved`: the decisions derived from the schema (a :class:`GroupPlan` per group),
  kept apart from what the user writes.

Importers keep importing from ``nvgpu.stackconfig``: every name of the former single module is here.
"""

from nvgpu.stackconfig.cluster import (
    DRA_GA_MINOR,
    MAX_KUBERNETES_MINOR,
    MIN_KUBERNETES_MINOR,
    PREVIEW_IDENTITY_MIN_MINOR,
    AgentImage,
    Cluster,
    MigManagerSettings,
    PreviewIdentity,
    RuntimeClassSettings,
    image_parts,
)
from nvgpu.stackconfig.common import (
    CONFIG_FILE_ENV,
    CONFIG_NAMESPACE,
    Bool,
    ConfigModel,
    DnsLabel,
    FieldProblems,
    Loc,
    StackConfigError,
)
from nvgpu.stackconfig.dra import (
    DRA_DEFAULT_DRIVER,
    DRA_DEVICE_CLASSES,
    DRA_DEVICE_TAINTS_MINOR,
    ClaimQuota,
    DraSettings,
)
from nvgpu.stackconfig.driver import Driver, DriverImage, DriverUpgrade, Toolkit, ToolkitImage
from nvgpu.stackconfig.gpu import (
    MPS_MAX_CLIENTS,
    Gpu,
    Mig,
    MigCustomConfig,
    MigSlice,
    MigStrategy,
    Mps,
    Sharing,
    TimeSlicing,
)
from nvgpu.stackconfig.loading import (
    load_namespaced_config,
    load_stack_config,
    load_stack_file,
    load_stack_text,
    misplaced_keys,
    namespace_values,
    read_stack_text,
)
from nvgpu.stackconfig.modes import AllocationMode, NodeSetupBackend
from nvgpu.stackconfig.monitoring import (
    Dashboards,
    DcgmExporterImage,
    DcgmExporterSettings,
    MetricsExporter,
    Monitoring,
    ScrapeMode,
)
from nvgpu.stackconfig.nodegroup import (
    CONTROLLER_TAINTS,
    MAX_SELECTOR_REQUIREMENTS,
    LabelKey,
    LabelSelectorRequirement,
    LabelValue,
    NodeGroup,
    NodeSelector,
    Taint,
)
from nvgpu.stackconfig.renames import ConfigDeprecationWarning, Rename
from nvgpu.stackconfig.resolved import GroupPlan, mig_layout_problems
from nvgpu.stackconfig.stack import StackConfig

__all__ = [
    "CONFIG_FILE_ENV",
    "CONFIG_NAMESPACE",
    "CONTROLLER_TAINTS",
    "DRA_DEFAULT_DRIVER",
    "DRA_DEVICE_CLASSES",
    "DRA_DEVICE_TAINTS_MINOR",
    "DRA_GA_MINOR",
    "MAX_KUBERNETES_MINOR",
    "MAX_SELECTOR_REQUIREMENTS",
    "MIN_KUBERNETES_MINOR",
    "MPS_MAX_CLIENTS",
    "PREVIEW_IDENTITY_MIN_MINOR",
    "AgentImage",
    "AllocationMode",
    "Bool",
    "ClaimQuota",
    "Cluster",
    "ConfigDeprecationWarning",
    "ConfigModel",
    "Dashboards",
    "DcgmExporterImage",
    "DcgmExporterSettings",
    "DnsLabel",
    "DraSettings",
    "Driver",
    "DriverImage",
    "DriverUpgrade",
    "FieldProblems",
    "Gpu",
    "GroupPlan",
    "LabelKey",
    "LabelSelectorRequirement",
    "LabelValue",
    "Loc",
    "MetricsExporter",
    "Mig",
    "MigCustomConfig",
    "MigManagerSettings",
    "MigSlice",
    "MigStrategy",
    "Monitoring",
    "Mps",
    "NodeGroup",
    "NodeSelector",
    "NodeSetupBackend",
    "PreviewIdentity",
    "Rename",
    "RuntimeClassSettings",
    "ScrapeMode",
    "Sharing",
    "StackConfig",
    "StackConfigError",
    "Taint",
    "TimeSlicing",
    "Toolkit",
    "ToolkitImage",
    "image_parts",
    "load_namespaced_config",
    "load_stack_config",
    "load_stack_file",
    "load_stack_text",
    "mig_layout_problems",
    "misplaced_keys",
    "namespace_values",
    "read_stack_text",
]
