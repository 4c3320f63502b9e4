"""The test suite, one package: tiers by marker (unit; cluster, compare, image), shared doubles in tests.kit."""
