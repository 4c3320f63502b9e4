"""Tests of nvidia_gpu."""
