//go:build tools

// containerd 2.x, the CRI runtime of the local cluster's real nodes: the daemon, the runc shim it starts
// every pod sandbox with, and ctr, which imports the tests' images into a node without a registry.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
