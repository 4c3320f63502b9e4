"""Tests of node_agent.exporter."""
