"""The device-plugin config flags, shared by ``device-plugin`` and ``labels``.

NVIDIA's plugin and config-manager spell them so and read the same environment variables (their
defaults are read when the parser is built). Both commands take them so the labeller reads the very
config the plugin serves (``node_agent.deviceplugin.nodelabel.ConfigSource``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from node_agent.deviceplugin.named import DEFAULT_FALLBACKS
from node_agent.deviceplugin.nodelabel import CONFIG_LABEL, ConfigSource


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def add_config_source_arguments(g: argparse._ActionsContainer) -> None:
    """``--config-file``, ``--config-dir``, ``--config-label``, ``--default-config``, ``--fallback-strategies``."""
    g.add_argument("--config-file", type=Path, default=_env_path("CONFIG_FILE"),
                   help="the device plugin's config file (NVIDIA's format), when no named config applies")
    g.add_argument("--config-dir", type=Path, default=_env_path("CONFIG_FILE_SRCDIR"),
                   help="directory of named configs (one file per name), chosen by the node label")
    g.add_argument("--config-label", default=os.environ.get("CONFIG_LABEL") or CONFIG_LABEL,
                   help=f"node label naming the config in --config-dir (default {CONFIG_LABEL})")
    g.add_argument("--default-config", default=os.environ.get("DEFAULT_CONFIG") or None,
                   help="the named config in --config-dir used while the node label names none")
    g.add_argument("--fallback-strategies", default=os.environ.get("FALLBACK_STRATEGIES", ",".join(DEFAULT_FALLBACKS)),
                   help="comma list of how a config is chosen without a label or default: named (the config "
                        "called default), single (the only config), empty (no config file)")


def config_source(args: argparse.Namespace) -> ConfigSource:
    """The flags of :func:`add_config_source_arguments`, parsed."""
    fallbacks = tuple(s.strip() for s in args.fallback_strategies.split(",") if s.strip())
    return ConfigSource(args.config_file, args.config_dir, args.config_label, args.default_config, fallbacks)
