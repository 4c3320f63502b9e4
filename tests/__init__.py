"""The test suite, one package: tiers by marker (unit; cluster, compare, image), folders mirroring the production
packages, shared doubles in tests.kit (docs/architecture.md, "Where a test lives")."""
