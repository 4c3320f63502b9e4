"""CDI (Container Device Interface) specs for both allocation modes.

The device plugin (``cdi-annotations``/``cdi-cri``) and the DRA kubelet plugin hand the container runtime
fully qualified CDI device names; the runtime turns them into container edits from spec files in
``/var/run/cdi``. This package holds what both write alike: the typed spec document (:mod:`.spec`),
the driver's user-space files found under the driver root (:mod:`.driverfiles`, reading sonames with
:mod:`.elf`), and the container edits that make those files work in any container (:mod:`.driveredits`:
mounts plus the NVIDIA Container Toolkit's ``nvidia-cdi-hook`` hooks), so a workload on a node whose
default runtime is plain runc gets a working GPU without the NVIDIA runtime.
"""
