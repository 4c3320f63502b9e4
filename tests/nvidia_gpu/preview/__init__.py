"""Tests of nvidia_gpu.preview."""
