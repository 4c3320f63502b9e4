//go:build tools

// crictl, the CRI client: what a node's containerd reports (crictl info: runtimes, CDI) and runs.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
