"""Pulumi components of nvidia-gpu: ``GpuPlatform``, ``GpuNodeGroup`` and ``SharingPolicy``.

Each component wraps pure manifest builders from :mod:`nvidia_gpu.components.manifests` (testable without the
engine); :func:`nvidia_gpu.components.program.build_stack` is what ``__main__.py`` runs.
"""
