//go:build tools

// The NVIDIA Container Toolkit's programs, pinned beside cdi-inject at one toolkit release:
// nvidia-cdi-hook, the program the hooks in our CDI specs run (create-symlinks, update-ldcache); and
// nvidia-container-runtime-hook, the prestart hook the nvidia runtime adds in its legacy mode, which reads
// the toolkit config node setup writes and decides which GPUs a container gets.
package main

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook"
)
