//go:build tools

// Package tools pins NVIDIA's mig-parted (see tools/build.sh).
package tools

import _ "github.com/NVIDIA/mig-parted/cmd/nvidia-mig-parted"
