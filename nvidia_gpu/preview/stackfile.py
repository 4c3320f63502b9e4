"""Step 1: read ``Pulumi.yaml`` and ``Pulumi.<stack>.yaml``, validate ``nvidia-gpu:``, encode config for the engine.

The engine hands a program its config as strings: scalars as text, objects and lists as JSON. The
preview does the same (:func:`engine_config`), so ``__main__.py`` reads identical values either way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from nvgpu import yamltext
from nvgpu.stackconfig import CONFIG_NAMESPACE, StackConfigError, load_namespaced_config
from nvidia_gpu.preview.model import PreviewResult, Problem

STEP = "config"


def project_name(project_dir: Path) -> str:
    doc = yaml.load((project_dir / "Pulumi.yaml").read_text(), Loader=yamltext.SAFE_LOADER)
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ValueError(f"{project_dir / 'Pulumi.yaml'}: no project 'name'")
    return str(doc["name"])


def engine_config(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """``(key → string value, keys that are secrets)``; secrets cannot be decrypted without the CLI."""
    out: dict[str, str] = {}
    secrets: list[str] = []
    for key, value in config.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            secrets.append(key)
            continue
        out[key] = value if isinstance(value, str) else json.dumps(value)
    return out, secrets


def load(result: PreviewResult) -> None:
    # The bounded reader: a stack file is one of the inputs a config can crash or exhaust (a 5,000-digit
    # integer, an alias bomb); aliases stay allowed, as Pulumi's own reader allows them.
    try:
        doc = yamltext.load(result.stack_file.read_text(), str(result.stack_file), aliases=True) or {}
    except OSError as e:
        result.problems.append(Problem(STEP, str(result.stack_file), f"cannot read stack file: {e}"))
        return
    except yamltext.YamlLoadError as e:
        result.problems.append(Problem(STEP, str(result.stack_file), f"cannot read stack file: {e}"))
        return
    raw = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        result.problems.append(Problem(STEP, str(result.stack_file), "expected a mapping with a 'config:' mapping"))
        return
    encoded, secrets = engine_config(raw)
    for key in secrets:
        if key.startswith(f"{CONFIG_NAMESPACE}:"):
            result.problems.append(Problem(STEP, key, "is a secret, which the offline preview cannot decrypt"))
    if result.problems:
        return
    try:
        result.config = load_namespaced_config(raw)
    except StackConfigError as e:
        for line in e.problems:
            subject, _, message = line.partition(": ")
            result.problems.append(Problem(STEP, subject, message or line))
        return
    result.engine_config = encoded
