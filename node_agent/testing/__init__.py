"""Test support shipped with the agent: fake host roots for simulated machines (tests, bench, demos)."""
