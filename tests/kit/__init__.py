"""The test kit: what two or more test folders (and the benchmarks) share. It lives under ``tests/`` so
nothing test-only ships in the agent image (import-linter forbids ``node_agent`` -> ``tests``); every user
imports it absolutely, ``from tests.kit.<module> import ...``.

- :mod:`tests.kit.kubelet`: kubelet stand-ins speaking the real protocols (``deviceplugin.DevicePluginKubelet``,
  ``dra.DraKubelet``) on one ``common`` module (kubelet's socket dirs, short roots, dialing, waiting);
- :mod:`tests.kit.kmock`: one kmock Kubernetes emulator on loopback, and a kubeconfig for it;
- :mod:`tests.kit.fakehost`: fake host roots for the simulated machines (PCI devices under their root
  complex, ``/proc``, ``/dev``, fake tools); :class:`~tests.kit.fakehost.FakeHost` is also the device
  plugin's ``HostFiles``;
- :mod:`tests.kit.mockhost`: a host root matching NVIDIA's mock NVML, built on the fake host;
- :mod:`tests.kit.migcaps`: the driver's ``nvidia-caps`` MIG minor table;
- :mod:`tests.kit.gpus`: how made-up GPUs are named (UUIDs, PCI addresses, MIG profiles);
- :mod:`tests.kit.dra_builders`: DRA inventories, claims and recording stand-ins;
- :mod:`tests.kit.fakecrio`, :mod:`tests.kit.fakekernel`, :mod:`tests.kit.driverinstall`: a fake CRI-O, the
  kernel's part in PCI driver binding, a driver installed into a root;
- :mod:`tests.kit.tools`: the pinned binaries (``make tools``), skipped or failed on one rule when missing;
  :mod:`tests.kit.oci`: real containers (OCI bundles run by the pinned runc, devices added by the CDI library).

What only one folder uses stays in that folder (``tests/node_agent/deviceplugin/builders.py``,
``tests/node_agent/mig/fakes.py``, ``tests/compare/peers.py``, ...).
"""
