//go:build tools

// The NVIDIA Container Toolkit's nvidia-cdi-hook, pinned beside cdi-inject: the program the hooks in
// our CDI specs run (create-symlinks, update-ldcache), built at the toolkit release of the hooks we use.
package main

import _ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
