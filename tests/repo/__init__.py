"""Tests of the repository itself: its docs, workflows, packaging, release, tool builds, vendored data and the
suite's own guards (not of one production package)."""
