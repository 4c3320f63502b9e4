"""Pulumi components of nvidia-gpu: ``GpuPlatform``, ``GpuNodeGroup`` and ``SharingPolicy``.

Each component wraps pure manifest builders from :mod:`components.manifests` (testable without the
engine); :func:`components.program.build_stack` is what ``__main__.py`` runs.
"""
