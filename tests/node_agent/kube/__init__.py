"""Tests of node_agent.kube."""
