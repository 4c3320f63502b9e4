"""Tests of node_agent.deviceplugin."""
