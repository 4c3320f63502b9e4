"""Tests of nvidia_gpu.components."""
