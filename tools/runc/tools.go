//go:build tools

// runc, the OCI runtime containerd and CRI-O run containers with by default, for the tests that start
// real containers from CDI-injected specs.
package tools

import _ "github.com/opencontainers/runc"
