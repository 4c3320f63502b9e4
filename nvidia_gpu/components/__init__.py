"""Pulumi components of nvidia-gpu: ``GpuPlatform``, ``GpuNodeGroup`` and the others that
:mod:`~nvidia_gpu.components.registry` lists (the exports, the multi-language package and the reference page
are derived from that list).

Each component wraps pure manifest builders from :mod:`nvidia_gpu.components.manifests` (testable without the
engine); :func:`nvidia_gpu.components.program.build_stack` is what ``__main__.py`` runs.
"""
