"""Reads this node's device-plugin config label and notices when the chosen config changes.

The node label ``nvidia.com/device-plugin.config`` names one of the configs mounted from the
components' ConfigMap. :class:`ConfigWatcher` checks the selection and the mounted files every few
seconds, and at once when the label watch (``node_agent.deviceplugin.nodewatch``) reports a change,
and asks for a reload when the selection or its content changes, which is NVIDIA's config-manager
sidecar folded into the plugin. The label itself comes from a :class:`LabelSource`: the plugin's node
label watch, or the labeller's one read per run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from node_agent.deviceplugin.named import DEFAULT_FALLBACKS, NamedConfigError, Selection, available_configs, select
from node_agent.kube.errors import KubeError

log = logging.getLogger(__name__)

CONFIG_LABEL = "nvidia.com/device-plugin.config"


class LabelSource(Protocol):
    def label(self) -> str | None:
        """The label's current value (``None`` when unset); raises ``KubeError`` (or ``OSError``) when unreadable."""
        ...


@dataclass(frozen=True)
class ConfigSource:
    """Where the device-plugin config comes from: NVIDIA's plugin and config-manager flags
    (``--config-file``, ``--config-dir``, ``--config-label``, ``--default-config``,
    ``--fallback-strategies``) and the environment variables they read. The device plugin and the
    labeller share them, so the labeller reads the very config the plugin serves."""

    config_file: Path | None = None
    config_dir: Path | None = None
    config_label: str = CONFIG_LABEL
    default_config: str | None = None
    fallbacks: tuple[str, ...] = DEFAULT_FALLBACKS

    def selector(self, labels: LabelSource | None) -> ConfigSelector:
        """The selector for these settings, reading the node label from ``labels``."""
        return ConfigSelector(self.config_file, self.config_dir, labels, self.default_config, self.fallbacks)


class ConfigSelector:
    """Chooses the config text: a fixed file, or a named config picked by the node label."""

    def __init__(self, config_file: Path | None = None, config_dir: Path | None = None,
                 labels: LabelSource | None = None, default: str | None = None,
                 fallbacks: Sequence[str] = DEFAULT_FALLBACKS):
        self.config_file = config_file
        self.config_dir = config_dir
        self.labels = labels
        self.default = default
        self.fallbacks = tuple(fallbacks)
        self.current: Selection | None = None
        self._last_label: str | None = None

    def _label(self) -> str | None:
        if self.labels is None:
            return None
        try:
            self._last_label = self.labels.label()
        except (KubeError, OSError) as e:  # API hiccup: keep the last known label, do not flap
            log.warning("event=label-read-failed error=%s", e)
        return self._last_label

    def select(self) -> Selection:
        if self.config_dir is None:
            path = self.config_file
            return Selection(path.name if path else None, path, "file" if path else "none")
        available = available_configs(self.config_dir)
        label = self._label()
        try:
            return select(available, label, self.default, self.fallbacks)
        except NamedConfigError as e:
            if self.current is not None or not label or label in available:
                raise  # running: the watcher keeps the current config and says why
            # Starting with a label that names no config: serve the default (as if unlabelled) and
            # say so, instead of failing to start (NVIDIA's plugin skips such a label too).
            log.error("event=config-label-unknown label=%s action=use-default error=%s", label, e)
            return select(available, None, self.default, self.fallbacks)

    def read(self) -> tuple[Selection, str | None]:
        sel = self.select()
        text = sel.read()
        self.current = sel
        return sel, text


class ConfigWatcher:
    """Polls the selection and content; calls ``on_change`` when either differs from the last read."""

    def __init__(self, selector: ConfigSelector, on_change: Callable[[str], None], interval_s: float = 5.0):
        self.selector = selector
        self.on_change = on_change
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="config-watch", daemon=True)
        self._seen: tuple[str | None, str | None] | None = None

    def remember(self, selection: Selection, text: str | None) -> None:
        self._seen = (selection.name, text)

    def poll(self) -> bool:
        try:
            sel = self.selector.select()
            text = sel.read()
        except (NamedConfigError, OSError) as e:
            log.error("event=config-selection-failed error=%s action=keep-current", e)
            return False
        if self._seen is not None and (sel.name, text) != self._seen:
            log.info("event=config-changed name=%s reason=%s", sel.name, sel.reason)
            self._seen = (sel.name, text)
            self.on_change("config-changed")
            return True
        self._seen = (sel.name, text)
        return False

    def wake(self) -> None:
        """Check now instead of at the next interval (the node label watch saw the label change)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            self.poll()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
