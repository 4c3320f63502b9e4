"""Tests of node_agent.labeller."""
