"""Tests of nvidia_gpu.monitoring."""
