"""Tests of node_agent.nvml."""
