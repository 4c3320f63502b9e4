"""Tests of nvidia_gpu.policies."""
