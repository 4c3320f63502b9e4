"""Every component is in the registry (nvidia_gpu.components.registry), and from it in all three places: the
Python library's exports, the multi-language package and the reference page."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

import nvidia_gpu
from nvidia_gpu import package, reference
from nvidia_gpu.components import registry

NAMES = ["GpuPlatform", "GpuNodeGroup", "SharingPolicy", "MigProfile", "DraStack", "GpuMonitoring", "DriverUpgrade"]


def test_the_registry_lists_every_component_once() -> None:
    assert [c.name for c in registry.COMPONENTS] == NAMES
    # Every ComponentResource of nvidia_gpu.components is one of them.
    defined = set()
    for c in registry.COMPONENTS:
        module = importlib.import_module(c.module)
        defined |= {name for name, value in vars(module).items() if inspect.isclass(value)
                    and value.__module__ == c.module and issubclass(value, nvidia_gpu.GpuPlatform.__mro__[1])}
    assert defined == set(NAMES)


@pytest.mark.parametrize("component", registry.COMPONENTS, ids=lambda c: c.name)
def test_each_component_is_exported_with_its_args_and_its_token(component: registry.Component) -> None:
    module = importlib.import_module(component.module)
    assert {component.name, component.args} <= set(nvidia_gpu.__all__)
    assert getattr(nvidia_gpu, component.name) is getattr(module, component.name)
    assert getattr(nvidia_gpu, component.args) is getattr(module, component.args)
    # The URN's type, unchanged since the component was released: the registry's token is the module's.
    assert module.TYPE == component.token == f"nvidia-gpu:index:{component.name}"


@pytest.mark.parametrize("component", registry.COMPONENTS, ids=lambda c: c.name)
def test_each_component_is_served_as_its_python_component(component: registry.Component) -> None:
    served = {cls.__name__: cls for cls in package.COMPONENTS}
    cls = served[component.name]
    assert issubclass(cls, getattr(nvidia_gpu, component.name))  # same children, names and token
    resource = json.loads(package.schema())["resources"][component.token]
    assert resource["isComponent"] is True
    assert set(component.settings) <= set(resource["requiredInputs"])
    assert resource["description"].startswith(component.doc[:40].replace("``", "`"))


def test_the_exports_are_the_registry_and_build_stack() -> None:
    assert sorted(nvidia_gpu.__all__) == sorted([*(n for c in registry.COMPONENTS for n in (c.name, c.args)),
                                                "build_stack"])
    assert [cls.__name__ for cls in package.COMPONENTS] == NAMES


def test_the_reference_page_documents_every_component() -> None:
    """docs/reference/components.md (``make docs-reference``; its staleness is tests/repo/test_docs_reference.py's):
    every component with its token, and the settings' types."""
    page = reference.body()
    for c in registry.COMPONENTS:
        assert f"\n## {c.name}\n" in page and f"`{c.token}`" in page
    assert "\n### Sharing\n" in page and "| `TimeSlicing` |" in page
