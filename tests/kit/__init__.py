"""The test kit: fake host roots for simulated machines, a fake CRI-O, a fake kernel, a driver installer, shared
by the tests and the benchmarks. It lives under ``tests/`` so nothing test-only ships in the agent image."""
