//go:build tools

// The CNI reference plugins a real node's pods are networked with: bridge and host-local give each pod
// an address on the node's own bridge, loopback its lo, portmap hostPort (all inside the node's netns).
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
