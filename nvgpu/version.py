"""The release version of nvidia-gpu: the one number the library, the node agent, the component package,
the policy pack and the example stacks' agent image tag all carry.

Defined here, in the shared core, because that is the one package every consumer has: the agent image
copies ``nvgpu/`` but never installs the distribution (so ``importlib.metadata`` would not find it there),
and an editable install's metadata keeps the version it was installed with. ``pyproject.toml`` reads it
(``[tool.setuptools.dynamic]``); the files that cannot import it (``policies/PulumiPolicy.yaml``, the example
stacks' ``agentImage.tag``) are checked against it by ``tools/release.py check`` and tests/repo/test_release.py.
A release changes this line, adds its CHANGELOG.md entry and tags ``v<VERSION>``.
"""

from __future__ import annotations

#: ``MAJOR.MINOR.PATCH`` (semantic versioning); the release tag is ``v`` followed by it.
VERSION = "0.1.0"
